from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CHAT_ROLE_ASSISTANT: ChatRole
CHAT_ROLE_DEVELOPER: ChatRole
CHAT_ROLE_SYSTEM: ChatRole
CHAT_ROLE_TOOL: ChatRole
CHAT_ROLE_UNSPECIFIED: ChatRole
CHAT_ROLE_USER: ChatRole
CONVERSATION_API_ANTHROPIC_MESSAGES: ConversationAPI
CONVERSATION_API_CHAT_COMPLETIONS: ConversationAPI
CONVERSATION_API_RESPONSES: ConversationAPI
CONVERSATION_API_UNSPECIFIED: ConversationAPI
DESCRIPTOR: _descriptor.FileDescriptor
FINISH_REASON_CONTENT_FILTER: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_PAUSE: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
FINISH_REASON_UNSPECIFIED: FinishReason
RESPONSE_FORMAT_TYPE_JSON_OBJECT: ResponseFormatType
RESPONSE_FORMAT_TYPE_JSON_SCHEMA: ResponseFormatType
RESPONSE_FORMAT_TYPE_TEXT: ResponseFormatType
RESPONSE_FORMAT_TYPE_UNSPECIFIED: ResponseFormatType
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NAMED: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode

class ChatMessage(_message.Message):
    __slots__ = ["content", "content_as_parts", "extra", "is_error", "name", "refusal", "role", "tool_call_id", "tool_calls"]
    CONTENT_AS_PARTS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    content: _containers.RepeatedCompositeFieldContainer[ContentPart]
    content_as_parts: bool
    extra: _struct_pb2.Struct
    is_error: bool
    name: str
    refusal: str
    role: ChatRole
    tool_call_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, role: _Optional[_Union[ChatRole, str]] = ..., content: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., is_error: bool = ..., name: _Optional[str] = ..., refusal: _Optional[str] = ..., content_as_parts: bool = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ["finish_reason", "index", "message", "native_finish_reason", "stop_sequence"]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    index: int
    message: ChatMessage
    native_finish_reason: str
    stop_sequence: str
    def __init__(self, index: _Optional[int] = ..., message: _Optional[_Union[ChatMessage, _Mapping]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., native_finish_reason: _Optional[str] = ..., stop_sequence: _Optional[str] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ["extra", "image", "text"]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    extra: _struct_pb2.Struct
    image: ImagePart
    text: str
    def __init__(self, text: _Optional[str] = ..., image: _Optional[_Union[ImagePart, _Mapping]] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Conversation(_message.Message):
    __slots__ = ["api", "drop_all_params", "drop_params", "messages", "options"]
    API_FIELD_NUMBER: _ClassVar[int]
    DROP_ALL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    DROP_PARAMS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    api: ConversationAPI
    drop_all_params: bool
    drop_params: _containers.RepeatedScalarFieldContainer[str]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    options: ModelOptions
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., options: _Optional[_Union[ModelOptions, _Mapping]] = ..., api: _Optional[_Union[ConversationAPI, str]] = ..., drop_params: _Optional[_Iterable[str]] = ..., drop_all_params: bool = ...) -> None: ...

class ImagePart(_message.Message):
    __slots__ = ["detail", "url"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    detail: str
    url: str
    def __init__(self, url: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ModelOptions(_message.Message):
    __slots__ = ["extra", "frequency_penalty", "max_completion_tokens", "max_tokens", "metadata", "n", "parallel_tool_calls", "presence_penalty", "response_format", "seed", "stop", "temperature", "tool_choice", "tools", "top_k", "top_p", "user"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    extra: _struct_pb2.Struct
    frequency_penalty: float
    max_completion_tokens: int
    max_tokens: int
    metadata: _containers.ScalarMap[str, str]
    n: int
    parallel_tool_calls: bool
    presence_penalty: float
    response_format: ResponseFormat
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    temperature: float
    tool_choice: ToolChoice
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    top_k: int
    top_p: float
    user: str
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., max_completion_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., user: _Optional[str] = ..., n: _Optional[int] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: bool = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., top_k: _Optional[int] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class OutputDelta(_message.Message):
    __slots__ = ["choice", "offset", "text", "tool_call"]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    choice: int
    offset: int
    text: str
    tool_call: ToolCallDelta
    def __init__(self, choice: _Optional[int] = ..., text: _Optional[str] = ..., tool_call: _Optional[_Union[ToolCallDelta, _Mapping]] = ..., offset: _Optional[int] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ["description", "name", "schema", "strict", "type"]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    description: str
    name: str
    schema: _struct_pb2.Struct
    strict: bool
    type: ResponseFormatType
    def __init__(self, type: _Optional[_Union[ResponseFormatType, str]] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., strict: bool = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ["description", "extra", "name", "parameters", "strict"]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    description: str
    extra: _struct_pb2.Struct
    name: str
    parameters: _struct_pb2.Struct
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., strict: bool = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ["arguments", "id", "name"]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    arguments: str
    id: str
    name: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ["arguments", "id", "index", "name"]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    arguments: str
    id: str
    index: int
    name: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ["mode", "name"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    name: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., name: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ["cache_read_tokens", "cache_write_tokens", "input_tokens", "output_tokens", "reasoning_tokens", "total_tokens"]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cache_read_tokens: int
    cache_write_tokens: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    total_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class ConversationAPI(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ChatRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ResponseFormatType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
