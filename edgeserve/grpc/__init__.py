"""KServe v2 over gRPC, as Triton serves it (`inference.GRPCInferenceService`), beside HTTP.

    messages.py  the protobuf messages, described at run time (names and numbers of Triton's)
    tensors.py   ModelInferRequest <-> the data plane's InferRequest / OutputTensors
    status.py    errors of the tree -> gRPC status codes, once
    service.py   the RPCs over DataPlane, the shared-memory registry and the credentials
    server.py    the grpc.aio server beside uvicorn: start, drain, stop

grpcio is an extra (`pip install 'edgeserve[grpc]'`): nothing here is imported unless `serve`
is asked for a gRPC port.
"""

from __future__ import annotations

from edgeserve.errors import ConfigError


def check_installed() -> None:
    """Refuse a gRPC port, before the model loads, where grpcio is missing."""
    try:
        import grpc  # noqa: F401 - only whether it imports
    except ImportError:
        raise ConfigError(
            "gRPC (--grpc-port, or [resources] grpc_port) needs the grpcio package, which is "
            "not installed. "
            "Hint: pip install 'edgeserve[grpc]'"
        ) from None


def address(host: str, port: int) -> str:
    """gRPC's way to write an address: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
