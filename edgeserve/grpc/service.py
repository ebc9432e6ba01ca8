"""`inference.GRPCInferenceService` over the data plane: each RPC as the HTTP side answers the
same operation (same checks, same errors, same registry of shared-memory regions).

Requests arrive as bytes and are parsed here, so a message that is not protobuf is the
client's error (INVALID_ARGUMENT), not a failure of the server's deserializer. Every RPC but
the health ones passes the credentials the HTTP side requires (`authorization: Bearer` or
`x-api-key` metadata); ServerLive and ServerReady count as /v2/health/live and /ready, which
`[auth] open_paths` may leave open for probes.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from edgeserve import __version__
from edgeserve.dataplane import DataPlane, ServedFunction, repository
from edgeserve.dataplane.metadata import server_metadata
from edgeserve.dataplane.regions import ClientRegions, check_local
from edgeserve.dataplane.settings import LogSettings, trace_settings
from edgeserve.errors import InvalidInput, ModelNotFound
from edgeserve.grpc import tensors
from edgeserve.grpc.messages import SERVICE, message
from edgeserve.grpc.status import status_of
from edgeserve.http.auth import Credentials
from edgeserve.http.drain import Drain
from edgeserve.http.inference import off_loop
from edgeserve.sharedmemory import Regions
from edgeserve.transport import GRPC

Context = Any  # grpc.aio.ServicerContext (grpcio ships no type hints)
IN_FLIGHT = 256
"""Requests of one ModelStreamInfer read but not yet answered: past it the stream reads on as
its answers are written; and calls open at once on one connection (HTTP/2's
MAX_CONCURRENT_STREAMS, server.py): past it a client waits for one to end. A client that sent
on and never read its answers made the server hold every one (a stream: 600 of 0.8 MB, 480 MB,
growing; unary calls: 1,800 of 0.8 MB, 4.7 GB). A load generator keeps its concurrency in
flight on a stream or a channel; the sweeps of DESIGN.md go to 64."""
OPEN_AS = {"ServerLive": "/v2/health/live", "ServerReady": "/v2/health/ready"}
"""RPCs that `[auth] open_paths` may leave open, by the HTTP path of the same operation."""
FINAL_ASKED, FINAL = "triton_enable_empty_final_response", "triton_final_response"
"""A stream's request parameter asking that each response say whether it is the request's
last (tritonclient's `enable_empty_final_response`), and the response's parameter saying it."""


class InferenceService:
    """The RPCs of one function; `handler()` is what the gRPC server registers."""

    def __init__(
        self,
        function: ServedFunction,
        regions: Regions,
        limit: int,
        credentials: Credentials | None = None,
        drain: Drain | None = None,
        logs: LogSettings | None = None,
    ) -> None:
        self.function = function
        self.logs = logs or LogSettings()
        self.drain = drain or Drain()
        self.plane = DataPlane(function)
        self.regions = regions
        self.limit = limit
        self.credentials = credentials

    def handler(self) -> grpc.GenericRpcHandler:
        unary = {
            name: grpc.unary_unary_rpc_method_handler(
                self._answering(name, rpc), response_serializer=_serialize
            )
            for name, rpc in self._unary().items()
        }
        stream = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer, response_serializer=_serialize
        )
        return grpc.method_handlers_generic_handler(SERVICE, {**unary, "ModelStreamInfer": stream})

    def _unary(self) -> dict[str, Callable[[bytes, Context], Awaitable[Any]]]:
        return {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata,
            "ModelMetadata": self.model_metadata,
            "ModelConfig": self.model_config,
            "ModelInfer": self.model_infer,
            "ModelStatistics": self.model_statistics,
            "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_model_load,
            "RepositoryModelUnload": self.repository_model_unload,
            "SystemSharedMemoryStatus": self._shm_status("system"),
            "SystemSharedMemoryRegister": self.system_shm_register,
            "SystemSharedMemoryUnregister": self._shm_unregister("system"),
            "CudaSharedMemoryStatus": self._shm_status("cuda"),
            "CudaSharedMemoryRegister": self.cuda_shm_register,
            "CudaSharedMemoryUnregister": self._shm_unregister("cuda"),
            "TraceSetting": self.trace_setting,
            "LogSettings": self.log_settings,
        }

    def _answering(
        self, name: str, rpc: Callable[[bytes, Context], Awaitable[Any]]
    ) -> Callable[[bytes, Context], Awaitable[Any]]:
        """`rpc` behind the credentials check, its errors answered as status codes; a call
        still running at the drain bound is answered UNAVAILABLE, as HTTP answers 503."""
        path = OPEN_AS.get(name, f"/{SERVICE}/{name}")

        async def answered(request: bytes, context: Context) -> Any:
            try:
                self._check_credentials(path, context)
                return await self._drained(rpc(request, context))
            except Exception as exc:
                code, text = status_of(exc, f"{SERVICE}/{name}")
                await context.abort(code, text)

        return answered

    async def _drained(self, work: Awaitable[Any]) -> Any:
        """`work`, counted among the calls the drain cuts at its bound."""
        task = asyncio.current_task()
        assert task is not None
        self.drain.tasks.add(task)
        try:
            return await work
        except asyncio.CancelledError as cancelled:
            raise self.drain.answer(cancelled) from None  # the bound's UNAVAILABLE, or re-raised
        finally:
            self.drain.tasks.discard(task)

    def _check_credentials(self, path: str, context: Context) -> None:
        if self.credentials is not None:
            metadata = context.invocation_metadata() or ()
            headers = [(key.encode(), _bytes(value)) for key, value in metadata]
            self.credentials.check(path, headers)

    async def server_live(self, request: bytes, context: Context) -> Any:
        return message("ServerLiveResponse")(live=True)

    async def server_ready(self, request: bytes, context: Context) -> Any:
        return message("ServerReadyResponse")(ready=self.function.ready)

    async def model_ready(self, request: bytes, context: Context) -> Any:
        """Not ready, without an error, for a model or version not served: Triton's answer
        (tritonclient's is_model_ready returns False; it raised NOT_FOUND here)."""
        asked = _parse("ModelReadyRequest", request)
        try:
            self._check_model(asked)
        except (InvalidInput, ModelNotFound):
            return message("ModelReadyResponse")(ready=False)
        return message("ModelReadyResponse")(ready=self.function.ready)

    async def server_metadata(self, request: bytes, context: Context) -> Any:
        return _from_json("ServerMetadataResponse", server_metadata(__version__))

    async def model_metadata(self, request: bytes, context: Context) -> Any:
        self._check_model(_parse("ModelMetadataRequest", request))
        return _from_json("ModelMetadataResponse", self.plane.model_metadata())

    async def model_config(self, request: bytes, context: Context) -> Any:
        self._check_model(_parse("ModelConfigRequest", request))
        return _from_json("ModelConfigResponse", {"config": self.plane.model_config()})

    async def model_statistics(self, request: bytes, context: Context) -> Any:
        asked = _parse("ModelStatisticsRequest", request)
        if asked.name or asked.version:  # none: every model, as Triton answers
            self._check_model(asked)
        stats = {"model_stats": [self.function.stats.triton_stats()]}
        return _from_json("ModelStatisticsResponse", stats)

    async def model_infer(self, raw: bytes, context: Context, streamed: bool = False) -> Any:
        """A request's answer; a large one is parsed and decoded on a worker thread, as HTTP
        decodes a large body (the event loop serves every other client meanwhile). On a stream
        (`streamed`) it says it is the request's last where the request asked, as Triton's does:
        a client waiting for that flag, as clients of decoupled models do, waited forever."""
        arrived = time.monotonic()
        plane, function = self.plane, self.function
        self.drain.check_open()
        request = await off_loop(raw, _parse, "ModelInferRequest", raw)
        plane.check_model(request.model_name, request.model_version or None)
        await function.admit(arrived)
        shared = ClientRegions(self.regions, _peer_host(context), self.limit, GRPC)
        decoded = await off_loop(
            raw, tensors.decode_request, request, shared.read, function.signature
        )
        shared.check_outputs(decoded.outputs or ())
        outputs = await plane.infer(decoded, arrived=arrived)
        shared.write_outputs(outputs)
        response = tensors.encode_response(
            function.name, function.model_version, decoded.id, outputs
        )
        if streamed and decoded.parameters.get(FINAL_ASKED) is True:
            response.parameters[FINAL].bool_param = True  # one response a request: the last
        return response

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Context) -> None:
        """One ModelStreamInferResponse per request, in the order they finish (each carries
        its request's id); a bad request's is its error_message, and the stream goes on. At
        most IN_FLIGHT requests are read ahead of the answers written. Answers are
        written here, not yielded to grpcio: a client gone while one was being written made
        grpcio log an ERROR with its traceback; here the stream just ends."""
        try:
            self._check_credentials(f"/{SERVICE}/ModelStreamInfer", context)
        except Exception as exc:
            await context.abort(*status_of(exc, f"{SERVICE}/ModelStreamInfer"))
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(IN_FLIGHT)  # taken per request, given back once written

        async def answer(raw: bytes) -> None:
            try:
                response = await self._drained(self.model_infer(raw, context, streamed=True))
                await answers.put(message("ModelStreamInferResponse")(infer_response=response))
            except Exception as exc:
                _, text = status_of(exc, f"{SERVICE}/ModelStreamInfer")
                await answers.put(self._stream_error(text, raw))

        async def read() -> None:
            async for raw in requests:
                await room.acquire()
                task = asyncio.ensure_future(answer(raw))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)
            await answers.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (response := await answers.get()) is not None:
                try:
                    await context.write(response)  # returns once written: the client reads
                except Exception:  # grpcio's own (internal) error of a write into a call
                    return  # its client has left, raised before the call says it has ended
                room.release()
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    def _stream_error(self, text: str, raw: bytes) -> Any:
        """The answer to a failed request of a stream: its error, and its id to match it by
        (tritonclient hands the error alone to its callback)."""
        function = self.function
        try:
            request_id = message("ModelInferRequest").FromString(raw).id
        except DecodeError:
            request_id = ""
        response = message("ModelInferResponse")(
            model_name=function.name, model_version=function.model_version, id=request_id
        )
        return message("ModelStreamInferResponse")(error_message=text, infer_response=response)

    async def repository_index(self, request: bytes, context: Context) -> Any:
        ready = _parse("RepositoryIndexRequest", request).ready
        return _from_json(
            "RepositoryIndexResponse", {"models": repository.index(self.function, ready)}
        )

    async def repository_model_load(self, request: bytes, context: Context) -> Any:
        load = _parse("RepositoryModelLoadRequest", request)
        repository.check_load(self.function, load.model_name, list(load.parameters))
        return message("RepositoryModelLoadResponse")()

    async def repository_model_unload(self, request: bytes, context: Context) -> Any:
        unload = _parse("RepositoryModelUnloadRequest", request)
        raise repository.refuse_unload(self.function, unload.model_name)

    async def system_shm_register(self, request: bytes, context: Context) -> Any:
        region = _parse("SystemSharedMemoryRegisterRequest", request)
        check_local(_peer_host(context), GRPC, "system")
        body = {"key": region.key, "offset": region.offset, "byte_size": region.byte_size}
        self.regions.register("system", region.name, body, GRPC)
        return message("SystemSharedMemoryRegisterResponse")()

    async def cuda_shm_register(self, request: bytes, context: Context) -> Any:
        region = _parse("CudaSharedMemoryRegisterRequest", request)
        check_local(_peer_host(context), GRPC, "cuda")
        handle = {"b64": base64.b64encode(region.raw_handle).decode("ascii")}
        body = {"raw_handle": handle, "device_id": region.device_id, "byte_size": region.byte_size}
        self.regions.register("cuda", region.name, body, GRPC)
        return message("CudaSharedMemoryRegisterResponse")()

    def _shm_status(self, kind: str) -> Callable[[bytes, Context], Awaitable[Any]]:
        prefix = "System" if kind == "system" else "Cuda"

        async def status(request: bytes, context: Context) -> Any:
            name = _parse(f"{prefix}SharedMemoryStatusRequest", request).name
            check_local(_peer_host(context), GRPC, kind)
            found = self.regions.status(kind, name or None)
            regions = {region["name"]: region for region in found}
            return _from_json(f"{prefix}SharedMemoryStatusResponse", {"regions": regions})

        return status

    def _shm_unregister(self, kind: str) -> Callable[[bytes, Context], Awaitable[Any]]:
        prefix = "System" if kind == "system" else "Cuda"

        async def unregister(request: bytes, context: Context) -> Any:
            name = _parse(f"{prefix}SharedMemoryUnregisterRequest", request).name
            check_local(_peer_host(context), GRPC, kind)
            self.regions.unregister(kind, name or None)
            return message(f"{prefix}SharedMemoryUnregisterResponse")()

        return unregister

    async def trace_setting(self, request: bytes, context: Context) -> Any:
        asked = _parse("TraceSettingRequest", request)
        if asked.model_name:
            self.plane.check_model(asked.model_name, None)
        settings = {key: list(value.value) for key, value in asked.settings.items()}
        answer = trace_settings(settings, f"{SERVICE}/TraceSetting")
        return _from_json(
            "TraceSettingResponse",
            {
                "settings": {
                    key: {"value": v if isinstance(v, list) else [v]} for key, v in answer.items()
                }
            },
        )

    async def log_settings(self, request: bytes, context: Context) -> Any:
        asked = _parse("LogSettingsRequest", request).settings
        settings = {key: _log_value(value) for key, value in asked.items()}
        answer = self.logs.update(settings) if settings else self.logs.current()
        response = message("LogSettingsResponse")()
        for key, value in answer.items():
            setattr(response.settings[key], _LOG_FIELDS[type(value)], value)
        return response

    def _check_model(self, request: Any) -> None:
        self.plane.check_model(request.name, request.version or None)


def _parse(name: str, data: bytes) -> Any:
    try:
        return message(name).FromString(data)
    except DecodeError as exc:
        raise InvalidInput(
            f"{name}: {len(data)} bytes that are not its protobuf message ({exc})"
        ) from None


def _from_json(name: str, value: dict[str, Any]) -> Any:
    """A response from the JSON the HTTP side answers; what the schema leaves out is left out."""
    return json_format.ParseDict(value, message(name)(), ignore_unknown_fields=True)


_LOG_FIELDS = {bool: "bool_param", int: "uint32_param", str: "string_param"}


def _log_value(value: Any) -> Any:
    """A LogSettings value as the HTTP side's JSON has it (none set: null, left as it is)."""
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def _bytes(value: str | bytes) -> bytes:
    """A metadata value (binary ones, keys ending in -bin, arrive as bytes)."""
    return value if isinstance(value, bytes) else value.encode("latin-1")


def _serialize(response: Any) -> bytes:
    data: bytes = response.SerializeToString()
    return data


def _peer_host(context: Context) -> str:
    """The client's address from gRPC's peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000")."""
    kind, _, address = unquote(context.peer()).partition(":")
    if kind == "ipv6":
        return address.rpartition("]")[0].lstrip("[")
    return address.rpartition(":")[0] if kind == "ipv4" else ""
