"""The messages of Triton's gRPC service, described at run time: the fields edgeserve reads or
writes, under the names and numbers of Triton's grpc_service.proto and model_config.proto
(package `inference`), so `tritonclient.grpc` and perf_analyzer read them as Triton's.

No generated code and no .proto file ship: `MESSAGES` below is the schema, one line a field
(`[repeated] TYPE NAME = NUMBER`, `map<string, TYPE>`, and `oneof NAME` for the fields after
it), built into a private descriptor pool, so the classes meet no other copy of Triton's
(a test process holding tritonclient's own). A field the schema leaves out is skipped on
reading, as protobuf skips unknown fields; `json_format` is told to skip it on writing.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"

_SCALARS = {
    name: getattr(descriptor_pb2.FieldDescriptorProto, f"TYPE_{name.upper()}")
    for name in ("bool", "int32", "int64", "uint32", "uint64", "float", "double", "string", "bytes")
}

ENUMS: dict[str, tuple[str, ...]] = {
    "DataType": tuple(
        f"TYPE_{name}"
        for name in [
            "INVALID",
            "BOOL",
            "UINT8",
            "UINT16",
            "UINT32",
            "UINT64",
            "INT8",
            "INT16",
            "INT32",
            "INT64",
            "FP16",
            "FP32",
            "FP64",
            "STRING",
            "BF16",
        ]
    ),
    "ModelInput.Format": ("FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"),
    "ModelInstanceGroup.Kind": ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"),
    "ModelQueuePolicy.TimeoutAction": ("REJECT", "DELAY"),
}
"""Enums whose values are numbered in order from 0, as Triton's are."""

MESSAGES: dict[str, str] = {
    "ServerLiveRequest": "",
    "ServerLiveResponse": "bool live = 1",
    "ServerReadyRequest": "",
    "ServerReadyResponse": "bool ready = 1",
    "ModelReadyRequest": "string name = 1; string version = 2",
    "ModelReadyResponse": "bool ready = 1",
    "ServerMetadataRequest": "",
    "ServerMetadataResponse": "string name = 1; string version = 2; repeated string extensions = 3",
    "ModelMetadataRequest": "string name = 1; string version = 2",
    "ModelMetadataResponse": (
        "string name = 1; repeated string versions = 2; string platform = 3; "
        "repeated ModelMetadataResponse.TensorMetadata inputs = 4; "
        "repeated ModelMetadataResponse.TensorMetadata outputs = 5"
    ),
    "ModelMetadataResponse.TensorMetadata": (
        "string name = 1; string datatype = 2; repeated int64 shape = 3"
    ),
    "InferParameter": (
        "oneof parameter_choice; bool bool_param = 1; int64 int64_param = 2; "
        "string string_param = 3; double double_param = 4; uint64 uint64_param = 5"
    ),
    "InferTensorContents": (
        "repeated bool bool_contents = 1; repeated int32 int_contents = 2; "
        "repeated int64 int64_contents = 3; repeated uint32 uint_contents = 4; "
        "repeated uint64 uint64_contents = 5; repeated float fp32_contents = 6; "
        "repeated double fp64_contents = 7; repeated bytes bytes_contents = 8"
    ),
    "ModelInferRequest": (
        "string model_name = 1; string model_version = 2; string id = 3; "
        "map<string, InferParameter> parameters = 4; "
        "repeated ModelInferRequest.InferInputTensor inputs = 5; "
        "repeated ModelInferRequest.InferRequestedOutputTensor outputs = 6; "
        "repeated bytes raw_input_contents = 7"
    ),
    "ModelInferRequest.InferInputTensor": (
        "string name = 1; string datatype = 2; repeated int64 shape = 3; "
        "map<string, InferParameter> parameters = 4; InferTensorContents contents = 5"
    ),
    "ModelInferRequest.InferRequestedOutputTensor": (
        "string name = 1; map<string, InferParameter> parameters = 2"
    ),
    "ModelInferResponse": (
        "string model_name = 1; string model_version = 2; string id = 3; "
        "map<string, InferParameter> parameters = 4; "
        "repeated ModelInferResponse.InferOutputTensor outputs = 5; "
        "repeated bytes raw_output_contents = 6"
    ),
    "ModelInferResponse.InferOutputTensor": (
        "string name = 1; string datatype = 2; repeated int64 shape = 3; "
        "map<string, InferParameter> parameters = 4"
    ),
    "ModelStreamInferResponse": "string error_message = 1; ModelInferResponse infer_response = 2",
    "ModelConfigRequest": "string name = 1; string version = 2",
    "ModelConfigResponse": "ModelConfig config = 1",
    "ModelStatisticsRequest": "string name = 1; string version = 2",
    "StatisticDuration": "uint64 count = 1; uint64 ns = 2",
    "InferStatistics": (
        "StatisticDuration success = 1; StatisticDuration fail = 2; StatisticDuration queue = 3; "
        "StatisticDuration compute_input = 4; StatisticDuration compute_infer = 5; "
        "StatisticDuration compute_output = 6; StatisticDuration cache_hit = 7; "
        "StatisticDuration cache_miss = 8"
    ),
    "InferBatchStatistics": (
        "uint64 batch_size = 1; StatisticDuration compute_input = 2; "
        "StatisticDuration compute_infer = 3; StatisticDuration compute_output = 4"
    ),
    "ModelStatistics": (
        "string name = 1; string version = 2; uint64 last_inference = 3; "
        "uint64 inference_count = 4; uint64 execution_count = 5; "
        "InferStatistics inference_stats = 6; repeated InferBatchStatistics batch_stats = 7"
    ),
    "ModelStatisticsResponse": "repeated ModelStatistics model_stats = 1",
    "RepositoryIndexRequest": "string repository_name = 1; bool ready = 2",
    "RepositoryIndexResponse": "repeated RepositoryIndexResponse.ModelIndex models = 1",
    "RepositoryIndexResponse.ModelIndex": (
        "string name = 1; string version = 2; string state = 3; string reason = 4"
    ),
    "ModelRepositoryParameter": (
        "oneof parameter_choice; bool bool_param = 1; int64 int64_param = 2; "
        "string string_param = 3; bytes bytes_param = 4"
    ),
    "TraceSettingValue": "repeated string value = 1",
    "TraceSettingRequest": "map<string, TraceSettingValue> settings = 1; string model_name = 2",
    "TraceSettingResponse": "map<string, TraceSettingValue> settings = 1",
    "LogSettingValue": (
        "oneof parameter_choice; bool bool_param = 1; uint32 uint32_param = 2; "
        "string string_param = 3"
    ),
    "LogSettingsRequest": "map<string, LogSettingValue> settings = 1",
    "LogSettingsResponse": "map<string, LogSettingValue> settings = 1",
    "RepositoryModelLoadRequest": (
        "string repository_name = 1; string model_name = 2; "
        "map<string, ModelRepositoryParameter> parameters = 3"
    ),
    "RepositoryModelLoadResponse": "",
    "RepositoryModelUnloadRequest": (
        "string repository_name = 1; string model_name = 2; "
        "map<string, ModelRepositoryParameter> parameters = 3"
    ),
    "RepositoryModelUnloadResponse": "",
    "SystemSharedMemoryStatusRequest": "string name = 1",
    "SystemSharedMemoryStatusResponse": (
        "map<string, SystemSharedMemoryStatusResponse.RegionStatus> regions = 1"
    ),
    "SystemSharedMemoryStatusResponse.RegionStatus": (
        "string name = 1; string key = 2; uint64 offset = 3; uint64 byte_size = 4"
    ),
    "SystemSharedMemoryRegisterRequest": (
        "string name = 1; string key = 2; uint64 offset = 3; uint64 byte_size = 4"
    ),
    "SystemSharedMemoryRegisterResponse": "",
    "SystemSharedMemoryUnregisterRequest": "string name = 1",
    "SystemSharedMemoryUnregisterResponse": "",
    "CudaSharedMemoryStatusRequest": "string name = 1",
    "CudaSharedMemoryStatusResponse": (
        "map<string, CudaSharedMemoryStatusResponse.RegionStatus> regions = 1"
    ),
    "CudaSharedMemoryStatusResponse.RegionStatus": (
        "string name = 1; uint64 device_id = 2; uint64 byte_size = 3"
    ),
    "CudaSharedMemoryRegisterRequest": (
        "string name = 1; bytes raw_handle = 2; int64 device_id = 3; uint64 byte_size = 4"
    ),
    "CudaSharedMemoryRegisterResponse": "",
    "CudaSharedMemoryUnregisterRequest": "string name = 1",
    "CudaSharedMemoryUnregisterResponse": "",
    # model_config.proto: what metadata.model_config fills
    "ModelConfig": (
        "string name = 1; string platform = 2; string backend = 17; "
        "ModelVersionPolicy version_policy = 3; int32 max_batch_size = 4; "
        "repeated ModelInput input = 5; repeated ModelOutput output = 6; "
        "ModelDynamicBatching dynamic_batching = 11; "
        "repeated ModelInstanceGroup instance_group = 7; "
        "string default_model_filename = 8; map<string, ModelParameter> parameters = 14; "
        "ModelTransactionPolicy model_transaction_policy = 19"
    ),
    "ModelVersionPolicy": "ModelVersionPolicy.Latest latest = 1",
    "ModelVersionPolicy.Latest": "uint32 num_versions = 1",
    "ModelInput": (
        "string name = 1; DataType data_type = 2; ModelInput.Format format = 3; "
        "repeated int64 dims = 4; bool is_shape_tensor = 6; bool allow_ragged_batch = 7; "
        "bool optional = 8"
    ),
    "ModelOutput": (
        "string name = 1; DataType data_type = 2; repeated int64 dims = 3; "
        "string label_filename = 4; bool is_shape_tensor = 6"
    ),
    "ModelInstanceGroup": (
        "string name = 1; ModelInstanceGroup.Kind kind = 4; int32 count = 2; "
        "repeated int32 gpus = 3; repeated string profile = 5; bool passive = 7; "
        "string host_policy = 9"
    ),
    "ModelDynamicBatching": (
        "repeated int32 preferred_batch_size = 1; uint64 max_queue_delay_microseconds = 2; "
        "bool preserve_ordering = 3; uint64 priority_levels = 4; "
        "uint64 default_priority_level = 5; ModelQueuePolicy default_queue_policy = 6"
    ),
    "ModelQueuePolicy": (
        "ModelQueuePolicy.TimeoutAction timeout_action = 1; "
        "uint64 default_timeout_microseconds = 2; bool allow_timeout_override = 3; "
        "uint32 max_queue_size = 4"
    ),
    "ModelParameter": "string string_value = 1",
    "ModelTransactionPolicy": "bool decoupled = 1",
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="edgeserve/inference.proto", package=PACKAGE, syntax="proto3"
    )
    made: dict[str, Any] = {}  # dotted name -> DescriptorProto or EnumDescriptorProto

    def container(dotted: str) -> Any:
        """Where a (possibly nested) type is declared: the file or its parent message."""
        parent, _, _ = dotted.rpartition(".")
        return made[parent] if parent else proto

    for dotted in sorted(MESSAGES, key=lambda n: n.count(".")):  # parents before children
        where = container(dotted)
        made[dotted] = where.message_type.add() if where is proto else where.nested_type.add()
        made[dotted].name = dotted.rpartition(".")[2]
    for dotted, names in ENUMS.items():
        where = container(dotted)
        enum = where.enum_type.add(name=dotted.rpartition(".")[2])
        enum.value.extend(
            descriptor_pb2.EnumValueDescriptorProto(name=name, number=number)
            for number, name in enumerate(names)
        )
        made[dotted] = enum
    for dotted, spec in MESSAGES.items():
        _fields(made[dotted], dotted, spec)
    return proto


def _fields(message: descriptor_pb2.DescriptorProto, dotted: str, spec: str) -> None:
    oneof: int | None = None
    Field = descriptor_pb2.FieldDescriptorProto
    for line in filter(None, (part.strip() for part in spec.split(";"))):
        words = line.split()
        if words[0] == "oneof":
            message.oneof_decl.add(name=words[1])
            oneof = len(message.oneof_decl) - 1
            continue
        field = message.field.add(name=words[-3], number=int(words[-1]))
        kind = words[-4] if words[0] != "map<string," else f"{words[0]} {words[1]}"
        field.label = Field.LABEL_REPEATED if words[0] == "repeated" else Field.LABEL_OPTIONAL
        if kind.startswith("map<string,"):
            _map_field(message, dotted, field, kind.removeprefix("map<string,").strip(" >"))
        elif kind in _SCALARS:
            field.type = _SCALARS[kind]
        else:
            field.type = Field.TYPE_ENUM if kind in ENUMS else Field.TYPE_MESSAGE
            field.type_name = f".{PACKAGE}.{kind}"
        if oneof is not None:
            field.oneof_index = oneof


def _map_field(
    message: descriptor_pb2.DescriptorProto,
    dotted: str,
    field: descriptor_pb2.FieldDescriptorProto,
    value: str,
) -> None:
    """A map field: a repeated nested `<Name>Entry {key = 1; value = 2}`, as protoc makes it."""
    Field = descriptor_pb2.FieldDescriptorProto
    entry = message.nested_type.add(
        name="".join(p.title() for p in field.name.split("_")) + "Entry"
    )
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL)
    kind = Field.TYPE_ENUM if value in ENUMS else Field.TYPE_MESSAGE
    entry.field.add(
        name="value",
        number=2,
        type=kind,
        type_name=f".{PACKAGE}.{value}",
        label=Field.LABEL_OPTIONAL,
    )
    field.label = Field.LABEL_REPEATED
    field.type = Field.TYPE_MESSAGE
    field.type_name = f".{PACKAGE}.{dotted}.{entry.name}"


def _classes() -> dict[str, Any]:
    proto = _file()
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in MESSAGES
    }


CLASSES = _classes()
"""Message classes by name ("ModelInferRequest", "ModelInferRequest.InferInputTensor", ...)."""


def message(name: str) -> Any:
    """The class of message `name` (protobuf's classes are made at run time: typed as Any)."""
    return CLASSES[name]
