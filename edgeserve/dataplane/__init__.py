"""The data plane: inference and model information with no transport in it.

    front (HTTP v2 JSON/binary, /invoke, a Lambda event, shared memory, another process, gRPC)
      decodes its bytes ──▶ InferRequest ──▶ DataPlane.infer ──▶ ServedFunction.infer ──▶ outputs
                                             (model, outputs,        (the door: checks.py,
                                              parameters checked)     then the batcher)

`ServedFunction` is the seam between every front and a runtime (edgeserve.runtime.Runtime, or
a proxy to an inference process); `serving()` is the one owner of its start and stop, however
many fronts serve it. A protocol is a converter onto `DataPlane` and a server beside uvicorn
(edgeserve/grpc/; docs/ARCHITECTURE.md, "Adding a target, a backend, a protocol").
"""

from edgeserve.dataplane.checks import InputChecks, check_names
from edgeserve.dataplane.function import DataPlane, ServedFunction
from edgeserve.dataplane.lifecycle import serving
from edgeserve.dataplane.requests import (
    InferRequest,
    OutputTensor,
    Parameters,
    RequestedOutput,
    check_outputs,
    response_outputs,
)

__all__ = [
    "DataPlane",
    "InferRequest",
    "InputChecks",
    "OutputTensor",
    "Parameters",
    "RequestedOutput",
    "ServedFunction",
    "check_names",
    "check_outputs",
    "response_outputs",
    "serving",
]
