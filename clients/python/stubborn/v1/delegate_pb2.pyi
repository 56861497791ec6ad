from google.protobuf import struct_pb2 as _struct_pb2
from stubborn.v1 import conversation_pb2 as _conversation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExecuteRequest(_message.Message):
    __slots__ = ["attempt", "brief", "brief_addition", "conversation", "idempotency_key", "messages", "metadata", "model_params", "run_id"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BRIEF_ADDITION_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    brief: str
    brief_addition: str
    conversation: _conversation_pb2.Conversation
    idempotency_key: str
    messages: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    metadata: _containers.ScalarMap[str, str]
    model_params: _struct_pb2.Struct
    run_id: str
    def __init__(self, brief: _Optional[str] = ..., run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., messages: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., model_params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., conversation: _Optional[_Union[_conversation_pb2.Conversation, _Mapping]] = ..., brief_addition: _Optional[str] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ["result"]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: Result
    def __init__(self, result: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class ExecuteStreamRequest(_message.Message):
    __slots__ = ["attempt", "brief", "brief_addition", "conversation", "idempotency_key", "messages", "metadata", "model_params", "run_id"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BRIEF_ADDITION_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    brief: str
    brief_addition: str
    conversation: _conversation_pb2.Conversation
    idempotency_key: str
    messages: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    metadata: _containers.ScalarMap[str, str]
    model_params: _struct_pb2.Struct
    run_id: str
    def __init__(self, brief: _Optional[str] = ..., run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., messages: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., model_params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., conversation: _Optional[_Union[_conversation_pb2.Conversation, _Mapping]] = ..., brief_addition: _Optional[str] = ...) -> None: ...

class ExecuteStreamResponse(_message.Message):
    __slots__ = ["delta", "result", "text_delta"]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    delta: _conversation_pb2.OutputDelta
    result: Result
    text_delta: str
    def __init__(self, text_delta: _Optional[str] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., delta: _Optional[_Union[_conversation_pb2.OutputDelta, _Mapping]] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ["choices", "data", "model", "text", "usage"]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.Choice]
    data: _struct_pb2.Value
    model: str
    text: str
    usage: _conversation_pb2.Usage
    def __init__(self, text: _Optional[str] = ..., data: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., choices: _Optional[_Iterable[_Union[_conversation_pb2.Choice, _Mapping]]] = ..., usage: _Optional[_Union[_conversation_pb2.Usage, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class UpstreamStatus(_message.Message):
    __slots__ = ["http_status"]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    http_status: int
    def __init__(self, http_status: _Optional[int] = ...) -> None: ...
