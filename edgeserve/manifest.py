"""function.toml: the schema, loading, and errors that name the file, the field and the fix."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    NonNegativeInt,
    ValidationError,
    field_validator,
    model_validator,
)

from edgeserve.errors import ConfigError
from edgeserve.validation import StrictTable, describe_validation_error

MANIFEST_NAME = "function.toml"
TRITON_GRPC_PORT = 8001
DEFAULT_PORT = 8080  # `serve`'s, where neither --port nor [resources] port says
BackendName = Literal["tensorrt", "openvino", "onnxruntime"]
"""The schema's backend names: edgeserve.backends.BACKENDS, in its order (a test keeps them so)."""
BACKEND_NAMES: tuple[BackendName, ...] = get_args(BackendName)
_VERSION = re.compile(r"v?(?P<major>\d{1,9})(\.\d+){0,2}([-+][0-9A-Za-z.+-]+)?")


_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


class FunctionInfo(StrictTable):
    name: str
    version: str = "1"
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name_is_a_label(cls, name: str) -> str:
        """A name routes, images and Kubernetes objects can carry; a wrong one is told the
        nearest that fits (it read pydantic's "String should match pattern '^[a-z0-9]...'")."""
        if _NAME.fullmatch(name):
            return name
        fitted = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:63]
        hint = f'. Hint: name = "{fitted}"' if _NAME.fullmatch(fitted) else ""
        raise ValueError(
            "expected lowercase letters, digits, '-' or '_', starting with a letter or digit, "
            f"at most 63 characters{hint}"
        )

    @field_validator("version")
    @classmethod
    def _version_maps_to_a_model_version(cls, version: str) -> str:
        if not _VERSION.fullmatch(version):
            raise ValueError(
                'expected an integer ("3") or a semantic version ("1.2.0", "v2.0.1-rc1")'
            )
        return version

    @property
    def model_version(self) -> str:
        """The KServe v2 / Triton model version: the version itself when it is an integer,
        else its major number ("1.2.0" -> "1"). Triton's tools (perf_analyzer, Model Analyzer)
        want integer versions; semver's major is the interface promise clients pin, while
        deploy targets name releases by the full version (docs/ARCHITECTURE.md)."""
        match = _VERSION.fullmatch(self.version)
        assert match is not None  # the validator admitted it
        return str(int(match["major"]))


class TensorOverride(StrictTable):
    """Per-tensor overrides of what the model file says."""

    dims: tuple[int, ...] | None = None
    min_dims: tuple[int, ...] | None = None  # inputs only: the smallest size per axis (-1: any)
    max_dims: tuple[int, ...] | None = None  # inputs only: the largest size per axis (-1: any)
    pad_axis: int | None = Field(default=None, ge=1)
    pad_value: float = 0.0
    follows: str | None = None  # outputs only: the padded input their pad_axis follows
    ratio: float = Field(default=1.0, gt=0)  # outputs only: length = floor(input length x ratio)
    labels: str | None = None  # outputs only: a text file of class labels, one a line


class ModelSection(StrictTable):
    path: str = "model.onnx"
    inputs: dict[str, TensorOverride] = {}
    outputs: dict[str, TensorOverride] = {}


class HandlerSection(StrictTable):
    module: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    requirements: tuple[str, ...] = ()
    options: dict[str, Any] = {}

    @field_validator("requirements")
    @classmethod
    def _requirements_are_pep_508(cls, requirements: tuple[str, ...]) -> tuple[str, ...]:
        """Each a requirement pip reads as one ("pillow>=10"), never an option or a second
        line ("-r file", "numpy\\n--index-url URL" went into requirements files as written)."""
        if not requirements:
            return requirements
        from packaging.requirements import InvalidRequirement, Requirement

        for text in requirements:
            try:
                Requirement(text)
            except InvalidRequirement as exc:
                reason = str(exc).splitlines()[0]  # packaging adds the text and a caret
                raise ValueError(
                    f"{text!r} is not a requirement like 'pillow>=10' (PEP 508): {reason}"
                ) from None
        return requirements


class BatchingSection(StrictTable):
    max_batch_size: int = Field(default=32, ge=0, le=4096)
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float = Field(default=2.0, ge=0)
    max_queue_size: int = Field(default=1024, ge=1)
    timeout_ms: float = Field(default=30_000, gt=0)
    instances: int = Field(default=1, ge=1, le=64)
    latency_slo_ms: float | None = Field(default=None, gt=0)  # set: the SLO decides waits, sheds

    @model_validator(mode="after")
    def _preferred_within_max(self) -> BatchingSection:
        too_big = [size for size in self.preferred_batch_sizes if size > self.max_batch_size]
        if too_big or any(size < 1 for size in self.preferred_batch_sizes):
            raise ValueError(
                f"preferred_batch_sizes {list(self.preferred_batch_sizes)} must lie in "
                f"1..max_batch_size ({self.max_batch_size})"
            )
        return self


class BackendSection(StrictTable):
    prefer: tuple[BackendName, ...] = BACKEND_NAMES
    precision: Literal["fp32", "fp16", "int8", "auto"] = "auto"  # bf16 where the CPU has it
    threads: int = Field(default=0, ge=0)
    cuda_graphs: bool = False  # ONNX Runtime on CUDA: each bucket's run launched as one graph
    max_abs_diff: float | None = Field(default=None, gt=0)  # build refuses more drift vs fp32


ProcessCount = Annotated[int, Field(ge=1, le=64)] | Literal["auto"]


class PerDeviceKind(StrictTable):
    """processes_per_device by the kind of device serving: a bundle runs on a laptop's CPU and
    on a GPU host alike, and the count that suits one does not suit the other."""

    gpu: ProcessCount = "auto"
    cpu: ProcessCount = "auto"


class ResourcesSection(StrictTable):
    memory_mb: int = Field(default=1024, ge=128)
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    # KServe v2 over gRPC beside HTTP (Triton's 8001); None: HTTP only
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    max_body_mb: float = Field(default=64, gt=0)
    header_timeout_s: float = Field(default=10, gt=0)  # connection or last response -> headers
    body_timeout_s: float = Field(default=60, gt=0)  # headers -> the whole body
    idle_timeout_s: float = Field(default=5, gt=0)  # a kept-alive connection with no request
    drain_timeout_s: float = Field(default=30, ge=0)  # SIGTERM -> exit; what is left gets 503
    # front processes of `serve` (edgeserve/workers): a count, or chosen from cores and devices
    workers: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = "auto"
    # where inference processes run (Triton's instance_group): every visible GPU ("auto"; the
    # CPU without one), the CPU, or these GPUs; and how many processes on each ("auto": one per
    # GPU, one per two cores on the CPU; { gpu = 2 }: a count for one kind of device only)
    devices: Literal["auto", "cpu"] | Annotated[tuple[NonNegativeInt, ...], Field(min_length=1)] = (
        "auto"
    )
    processes_per_device: ProcessCount | PerDeviceKind = "auto"

    @property
    def fixed_grpc_port(self) -> int | None:
        """The gRPC port a device or a container publishes: `grpc_port`, where 0 (any free
        port, for `serve` on a laptop) becomes Triton's 8001 (8002 when HTTP has 8001)."""
        if self.grpc_port != 0:
            return self.grpc_port
        return TRITON_GRPC_PORT + (self.port == TRITON_GRPC_PORT)

    @model_validator(mode="after")
    def _grpc_port_is_its_own(self) -> ResourcesSection:
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(
                f"grpc_port {self.grpc_port} is the HTTP port too (`port`): gRPC needs a port "
                "of its own (Triton's is 8001)"
            )
        return self


class AuthSection(StrictTable):
    """Who may call the function; the tokens themselves come from the environment (http/auth)."""

    required: bool = False  # refuse to start without a token (a device on a shared network)
    open_paths: tuple[Annotated[str, Field(pattern=r"^/")], ...] = (
        "/v2/health/live",
        "/v2/health/ready",
        "/metrics",
    )  # paths as requested ("/metrics"): one without its "/" matches nothing


_ORIGIN = re.compile(
    r"(?P<scheme>https?)://(?P<host>[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(?P<port>\d{1,5}))?"
)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def cors_origin(text: str) -> str:
    """`text` as an origin a browser sends (`https://app.example.com`, `http://127.0.0.1:3000`)
    or "*"; ValueError saying what is wrong: one that can never match (a path, a trailing
    slash, a default port, capitals), which a browser would only report as a CORS failure."""
    if text == "*":
        return text
    match = _ORIGIN.fullmatch(text)
    if match is None or text != text.lower():
        raise ValueError(
            f"{text!r} is not an origin: expected scheme://host[:port] in lower case, as "
            "browsers send it (https://app.example.com, http://127.0.0.1:3000; no path, no "
            'trailing slash), or "*" for any page'
        )
    if _DEFAULT_PORTS[match["scheme"]] == match["port"]:
        bare = f"{match['scheme']}://{match['host']}"
        raise ValueError(f"{text!r}: browsers leave the default port out; write {bare!r}")
    return text


class CorsSection(StrictTable):
    """Web pages of other origins that may call the function from a browser (http/cors.py)."""

    origins: tuple[str, ...] = ()  # empty: no CORS (browsers keep other pages out)
    credentials: bool = False  # cookies, HTTP auth and client certificates (mTLS) sent along
    max_age_s: int = Field(default=600, ge=0, le=86400)  # how long browsers keep a preflight

    @field_validator("origins")
    @classmethod
    def _origins_are_origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            cors_origin(origin)
        if "*" in origins and len(origins) > 1:
            raise ValueError('"*" already allows every origin: list it alone, or list origins')
        return origins

    @model_validator(mode="after")
    def _no_credentials_for_any_origin(self) -> CorsSection:
        if self.credentials and "*" in self.origins:
            raise ValueError(
                'credentials = true with origins = ["*"]: browsers refuse credentials from a '
                "server that allows every origin. Hint: list the origins that may send them"
            )
        return self


class Manifest(StrictTable):
    function: FunctionInfo
    model: ModelSection = ModelSection()
    handler: HandlerSection = HandlerSection()
    batching: BatchingSection = BatchingSection()
    backend: BackendSection = BackendSection()
    resources: ResourcesSection = ResourcesSection()
    auth: AuthSection = AuthSection()
    cors: CorsSection = CorsSection()

    @field_validator("model")
    @classmethod
    def _model_path_is_relative(cls, model: ModelSection) -> ModelSection:
        path = Path(model.path)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"must be a path inside the function folder, got {model.path!r}")
        return model


def no_manifest_here(folder: Path) -> str:
    """What a folder without a function.toml lacks, and the init that writes it."""
    models = sorted(folder.glob("*.onnx"))
    does = f"writes one for {models[0].name}" if len(models) == 1 else "makes one"
    return f"no {MANIFEST_NAME} here. Hint: `edgeserve init {folder}` {does}"


def load_manifest(path: Path) -> Manifest:
    """Read and validate a function.toml (or the folder holding one)."""
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: {no_manifest_here(path.parent)}.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML (UTF-8 text): {exc}") from None
    except OSError as exc:  # a folder named function.toml, no permission
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    return parse_manifest(data, source=str(path))


def parse_manifest(data: dict[str, Any], source: str) -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source, Manifest)) from None
