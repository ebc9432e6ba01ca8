"""The words of the protocol a request came by, for the messages HTTP and gRPC share.

One check answers callers of both (the data plane, the shared-memory registry): where its
message points the client elsewhere, it takes the place from here, so an HTTP caller reads
`/v2/systemsharedmemory` and "body", a gRPC caller the RPC and "message" it would use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transport:
    system_shm: str  # where system shared memory is registered
    payload: str  # what carries a request's tensors


HTTP = Transport(system_shm="/v2/systemsharedmemory", payload="body")
GRPC = Transport(system_shm="the SystemSharedMemoryRegister RPC", payload="message")
