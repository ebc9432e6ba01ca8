"""Shared-memory regions as one infer request may use them, whatever its transport: only a
client on this machine may (a remote one could otherwise map any object in /dev/shm and read
it back through an identity-like model), and its inputs there count against the request-size
limit, as a body's would (they are copied in)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from edgeserve.dataplane import raw
from edgeserve.dataplane.requests import OutputTensor, RequestedOutput
from edgeserve.datatypes import Datatype
from edgeserve.errors import Forbidden, PayloadTooLarge
from edgeserve.sharedmemory import Regions, Slice
from edgeserve.transport import HTTP, Transport

ReadSlice = Callable[[str, Slice], memoryview]
"""Reads an input's bytes from a registered shared-memory region (`ClientRegions.read`)."""


@dataclass
class ClientRegions:
    """The regions as one infer request may use them: only a client on this machine may, and
    its inputs there may add up to `limit` bytes, as its body may (they are copied in)."""

    regions: Regions
    client: str
    limit: int
    transport: Transport = HTTP
    taken: int = 0

    def read(self, where: str, place: Slice) -> memoryview:
        """An input's bytes (v2.ReadSlice)."""
        check_local(self.client, self.transport)
        self.taken += place.byte_size
        if self.taken > self.limit:
            raise PayloadTooLarge(
                f"{where}: the request's inputs in shared memory add up to {self.taken} bytes, "
                f"over the limit of {self.limit} bytes that a request's inputs may hold (in its "
                f"{self.transport.payload} or in shared memory). Hint: raise [resources] "
                "max_body_mb in function.toml"
            )
        return self.regions.read(where, place)

    def check_outputs(self, wanted: Iterable[RequestedOutput]) -> None:
        """Refuse, before running, outputs asked into a region that cannot take them."""
        for output in wanted:
            if output.place is not None:
                check_local(self.client, self.transport)
                self.regions.check(f"output `{output.name}`", output.place)

    def write_outputs(self, outputs: Iterable[OutputTensor]) -> None:
        for output in outputs:
            if output.place is not None:
                data = raw.tensor_bytes(output.data, output.datatype)
                self.regions.write(f"output `{output.name}`", output.place, data)


def region_tensor(
    read_slice: ReadSlice, where: str, datatype: Datatype, shape: tuple[int, ...], place: Slice
) -> np.ndarray:
    """An input read from the region its parameters name, its size checked against its shape
    before its bytes are read (a copy); BYTES elements are unframed, their count checked."""
    if datatype.name != "BYTES":
        raw.check_size(where, datatype, shape, place.byte_size, "shared_memory_byte_size")
    return raw.from_raw(where, datatype, shape, read_slice(where, place))


def check_local(host: str, transport: Transport = HTTP, kind: str | None = None) -> None:
    """Refuse (403) shared memory (of `kind`, "system" or "cuda", where the call is about one)
    to a client that is not on a loopback address."""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        what = {"system": "system shared memory", "cuda": "CUDA shared memory"}.get(
            kind or "", "shared memory"
        )
        raise Forbidden(
            f"{what} is for clients on this machine; {host or 'a client'} is not "
            f"on a loopback address. Hint: send the tensors in the request {transport.payload} "
            "instead"
        )
