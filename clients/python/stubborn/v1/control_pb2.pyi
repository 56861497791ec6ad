from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from stubborn.v1 import conversation_pb2 as _conversation_pb2
from stubborn.v1 import delegate_pb2 as _delegate_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ATTEMPT_OUTCOME_CANCELLED: AttemptOutcome
ATTEMPT_OUTCOME_ERROR: AttemptOutcome
ATTEMPT_OUTCOME_INTERRUPTED: AttemptOutcome
ATTEMPT_OUTCOME_REJECTED: AttemptOutcome
ATTEMPT_OUTCOME_SKIPPED: AttemptOutcome
ATTEMPT_OUTCOME_SUCCEEDED: AttemptOutcome
ATTEMPT_OUTCOME_UNSPECIFIED: AttemptOutcome
ATTEMPT_START_REASON_AT_ONCE: AttemptStartReason
ATTEMPT_START_REASON_BALANCE_PICK: AttemptStartReason
ATTEMPT_START_REASON_EARLIER_FAILED: AttemptStartReason
ATTEMPT_START_REASON_HEDGE_DELAY: AttemptStartReason
ATTEMPT_START_REASON_UNSPECIFIED: AttemptStartReason
BALANCE_STRATEGY_LATENCY: BalanceStrategy
BALANCE_STRATEGY_LEAST_BUSY: BalanceStrategy
BALANCE_STRATEGY_UNSPECIFIED: BalanceStrategy
BALANCE_STRATEGY_USAGE: BalanceStrategy
BALANCE_STRATEGY_WEIGHTED: BalanceStrategy
BREAKER_STATE_CLOSED: BreakerState
BREAKER_STATE_HALF_OPEN: BreakerState
BREAKER_STATE_OPEN: BreakerState
BREAKER_STATE_UNSPECIFIED: BreakerState
DECISION_FAIL: Decision
DECISION_RETRY: Decision
DECISION_UNSPECIFIED: Decision
DELEGATE_HEALTH_NOT_SERVING: DelegateHealth
DELEGATE_HEALTH_SERVING: DelegateHealth
DELEGATE_HEALTH_UNREACHABLE: DelegateHealth
DELEGATE_HEALTH_UNSPECIFIED: DelegateHealth
DESCRIPTOR: _descriptor.FileDescriptor
FAILURE_SOURCE_BULKHEAD: FailureSource
FAILURE_SOURCE_CANCELLED: FailureSource
FAILURE_SOURCE_CEL: FailureSource
FAILURE_SOURCE_CIRCUIT_BREAKER: FailureSource
FAILURE_SOURCE_ERROR: FailureSource
FAILURE_SOURCE_HEALTH: FailureSource
FAILURE_SOURCE_JUDGE: FailureSource
FAILURE_SOURCE_RATE_LIMIT: FailureSource
FAILURE_SOURCE_UNSPECIFIED: FailureSource
GUARD_SCOPE_FLEET: GuardScope
GUARD_SCOPE_LOCAL: GuardScope
GUARD_SCOPE_UNSPECIFIED: GuardScope
NOT_RETRIED_BUDGET: NotRetried
NOT_RETRIED_DEADLINE: NotRetried
NOT_RETRIED_EXHAUSTED: NotRetried
NOT_RETRIED_HINT_NO_RETRY: NotRetried
NOT_RETRIED_HINT_OVER_CAP: NotRetried
NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT: NotRetried
NOT_RETRIED_NOT_IDEMPOTENT: NotRetried
NOT_RETRIED_NOT_TRANSIENT: NotRetried
NOT_RETRIED_OTHER: NotRetried
NOT_RETRIED_REFUSED: NotRetried
NOT_RETRIED_REJECTED: NotRetried
NOT_RETRIED_UNSPECIFIED: NotRetried
ON_EXHAUSTED_ASK: OnExhausted
ON_EXHAUSTED_FAIL: OnExhausted
ON_EXHAUSTED_UNSPECIFIED: OnExhausted
REFUSED_BY_BULKHEAD: RefusedBy
REFUSED_BY_CIRCUIT_BREAKER: RefusedBy
REFUSED_BY_RATE_LIMIT: RefusedBy
REFUSED_BY_UNSPECIFIED: RefusedBy
RUN_STATUS_AWAITING_DECISION: RunStatus
RUN_STATUS_BACKING_OFF: RunStatus
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_EXHAUSTED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_PENDING: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_SUCCEEDED: RunStatus
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_VIEW_FULL: RunView
RUN_VIEW_SUMMARY: RunView
RUN_VIEW_UNSPECIFIED: RunView
STATUS_REASON_ALL_FAILED: StatusReason
STATUS_REASON_CANCELLED: StatusReason
STATUS_REASON_DECISION_FAIL: StatusReason
STATUS_REASON_DECISION_TIMEOUT: StatusReason
STATUS_REASON_INTERNAL_ERROR: StatusReason
STATUS_REASON_NONDETERMINISTIC_REPLAY: StatusReason
STATUS_REASON_NOT_RECORDED: StatusReason
STATUS_REASON_NOT_RETRIED: StatusReason
STATUS_REASON_NO_CONTROL: StatusReason
STATUS_REASON_OTHER: StatusReason
STATUS_REASON_RETRIES_EXHAUSTED: StatusReason
STATUS_REASON_RETRY_PAST_DEADLINE: StatusReason
STATUS_REASON_RUN_TIMEOUT: StatusReason
STATUS_REASON_SPEND_LIMIT_REACHED: StatusReason
STATUS_REASON_STORE_REFUSED: StatusReason
STATUS_REASON_UNRECOVERABLE: StatusReason
STATUS_REASON_UNSPECIFIED: StatusReason

class Attempt(_message.Message):
    __slots__ = ["brief", "cost", "cost_estimated", "delegate", "end_time", "error", "number", "outcome", "path", "result", "start_detail", "start_reason", "start_time", "total_tokens", "wait_before"]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    COST_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    START_DETAIL_FIELD_NUMBER: _ClassVar[int]
    START_REASON_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAIT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    brief: str
    cost: float
    cost_estimated: bool
    delegate: str
    end_time: _timestamp_pb2.Timestamp
    error: AttemptError
    number: int
    outcome: AttemptOutcome
    path: str
    result: _delegate_pb2.Result
    start_detail: str
    start_reason: AttemptStartReason
    start_time: _timestamp_pb2.Timestamp
    total_tokens: int
    wait_before: _duration_pb2.Duration
    def __init__(self, number: _Optional[int] = ..., delegate: _Optional[str] = ..., brief: _Optional[str] = ..., start_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[AttemptOutcome, str]] = ..., result: _Optional[_Union[_delegate_pb2.Result, _Mapping]] = ..., error: _Optional[_Union[AttemptError, _Mapping]] = ..., wait_before: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., path: _Optional[str] = ..., start_reason: _Optional[_Union[AttemptStartReason, str]] = ..., start_detail: _Optional[str] = ..., cost: _Optional[float] = ..., cost_estimated: bool = ..., total_tokens: _Optional[int] = ...) -> None: ...

class AttemptError(_message.Message):
    __slots__ = ["code", "http_status", "message", "not_sent", "refused", "refused_by", "retry_hint"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NOT_SENT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BY_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    RETRY_HINT_FIELD_NUMBER: _ClassVar[int]
    code: int
    http_status: int
    message: str
    not_sent: bool
    refused: bool
    refused_by: RefusedBy
    retry_hint: _duration_pb2.Duration
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., http_status: _Optional[int] = ..., retry_hint: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., not_sent: bool = ..., refused: bool = ..., refused_by: _Optional[_Union[RefusedBy, str]] = ...) -> None: ...

class AttemptFinished(_message.Message):
    __slots__ = ["attempt", "calls", "note", "output_bytes", "output_discarded"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    attempt: Attempt
    calls: _containers.RepeatedCompositeFieldContainer[CallCost]
    note: str
    output_bytes: int
    output_discarded: bool
    def __init__(self, attempt: _Optional[_Union[Attempt, _Mapping]] = ..., note: _Optional[str] = ..., output_discarded: bool = ..., output_bytes: _Optional[int] = ..., calls: _Optional[_Iterable[_Union[CallCost, _Mapping]]] = ...) -> None: ...

class AttemptOutput(_message.Message):
    __slots__ = ["attempt", "deltas", "offset", "provisional", "text"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    deltas: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.OutputDelta]
    offset: int
    provisional: bool
    text: str
    def __init__(self, attempt: _Optional[int] = ..., text: _Optional[str] = ..., offset: _Optional[int] = ..., provisional: bool = ..., deltas: _Optional[_Iterable[_Union[_conversation_pb2.OutputDelta, _Mapping]]] = ...) -> None: ...

class AttemptStarted(_message.Message):
    __slots__ = ["attempt"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: Attempt
    def __init__(self, attempt: _Optional[_Union[Attempt, _Mapping]] = ...) -> None: ...

class BackoffScheduled(_message.Message):
    __slots__ = ["bound", "from_hint", "next_attempt", "until", "wait"]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    FROM_HINT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    bound: _duration_pb2.Duration
    from_hint: bool
    next_attempt: int
    until: _timestamp_pb2.Timestamp
    wait: _duration_pb2.Duration
    def __init__(self, next_attempt: _Optional[int] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., bound: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., from_hint: bool = ...) -> None: ...

class BalanceSpec(_message.Message):
    __slots__ = ["failure_criteria", "failure_when", "max_attempts", "strategy", "targets"]
    FAILURE_CRITERIA_FIELD_NUMBER: _ClassVar[int]
    FAILURE_WHEN_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    failure_criteria: str
    failure_when: str
    max_attempts: int
    strategy: BalanceStrategy
    targets: _containers.RepeatedCompositeFieldContainer[BalanceTarget]
    def __init__(self, targets: _Optional[_Iterable[_Union[BalanceTarget, _Mapping]]] = ..., strategy: _Optional[_Union[BalanceStrategy, str]] = ..., max_attempts: _Optional[int] = ..., failure_criteria: _Optional[str] = ..., failure_when: _Optional[str] = ...) -> None: ...

class BalanceTarget(_message.Message):
    __slots__ = ["name", "weight"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: int
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[int] = ...) -> None: ...

class CallCost(_message.Message):
    __slots__ = ["cost", "delegate", "estimated", "total_tokens"]
    COST_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cost: float
    delegate: str
    estimated: bool
    total_tokens: int
    def __init__(self, delegate: _Optional[str] = ..., cost: _Optional[float] = ..., total_tokens: _Optional[int] = ..., estimated: bool = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ["run_id"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ["state"]
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ControlState
    def __init__(self, state: _Optional[_Union[ControlState, _Mapping]] = ...) -> None: ...

class ControlSpec(_message.Message):
    __slots__ = ["balance", "fallback_chain", "race", "retry", "retry_with_learning"]
    BALANCE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CHAIN_FIELD_NUMBER: _ClassVar[int]
    RACE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    RETRY_WITH_LEARNING_FIELD_NUMBER: _ClassVar[int]
    balance: BalanceSpec
    fallback_chain: FallbackChainSpec
    race: RaceSpec
    retry: RetrySpec
    retry_with_learning: RetryWithLearningSpec
    def __init__(self, retry: _Optional[_Union[RetrySpec, _Mapping]] = ..., retry_with_learning: _Optional[_Union[RetryWithLearningSpec, _Mapping]] = ..., fallback_chain: _Optional[_Union[FallbackChainSpec, _Mapping]] = ..., race: _Optional[_Union[RaceSpec, _Mapping]] = ..., balance: _Optional[_Union[BalanceSpec, _Mapping]] = ...) -> None: ...

class ControlState(_message.Message):
    __slots__ = ["attempt_log", "attempts", "control", "conversation", "cost", "create_time", "end_time", "failure_history", "model_params", "options", "presets", "result", "run_id", "status", "status_reason", "status_reason_code", "task_brief", "task_messages", "tenant", "traceparent", "update_time", "winner"]
    class PresetsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ControlSpec
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ControlSpec, _Mapping]] = ...) -> None: ...
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_LOG_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_HISTORY_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PRESETS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_BRIEF_FIELD_NUMBER: _ClassVar[int]
    TASK_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    WINNER_FIELD_NUMBER: _ClassVar[int]
    attempt_log: _containers.RepeatedCompositeFieldContainer[Attempt]
    attempts: int
    control: ControlSpec
    conversation: _conversation_pb2.Conversation
    cost: RunCost
    create_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    failure_history: _containers.RepeatedCompositeFieldContainer[FailureRecord]
    model_params: _struct_pb2.Struct
    options: RunOptions
    presets: _containers.MessageMap[str, ControlSpec]
    result: _delegate_pb2.Result
    run_id: str
    status: RunStatus
    status_reason: str
    status_reason_code: StatusReason
    task_brief: str
    task_messages: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    tenant: str
    traceparent: str
    update_time: _timestamp_pb2.Timestamp
    winner: str
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., result: _Optional[_Union[_delegate_pb2.Result, _Mapping]] = ..., winner: _Optional[str] = ..., attempts: _Optional[int] = ..., failure_history: _Optional[_Iterable[_Union[FailureRecord, _Mapping]]] = ..., attempt_log: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., task_brief: _Optional[str] = ..., control: _Optional[_Union[ControlSpec, _Mapping]] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ..., status_reason: _Optional[str] = ..., status_reason_code: _Optional[_Union[StatusReason, str]] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ..., tenant: _Optional[str] = ..., presets: _Optional[_Mapping[str, ControlSpec]] = ..., task_messages: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., model_params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., conversation: _Optional[_Union[_conversation_pb2.Conversation, _Mapping]] = ..., cost: _Optional[_Union[RunCost, _Mapping]] = ...) -> None: ...

class DecideRunRequest(_message.Message):
    __slots__ = ["decision", "run_id", "spend_limit"]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    run_id: str
    spend_limit: SpendLimit
    def __init__(self, run_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, str]] = ..., spend_limit: _Optional[_Union[SpendLimit, _Mapping]] = ...) -> None: ...

class DecideRunResponse(_message.Message):
    __slots__ = ["state"]
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ControlState
    def __init__(self, state: _Optional[_Union[ControlState, _Mapping]] = ...) -> None: ...

class DecisionReceived(_message.Message):
    __slots__ = ["decision", "spend_limit"]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SPEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    spend_limit: SpendLimit
    def __init__(self, decision: _Optional[_Union[Decision, str]] = ..., spend_limit: _Optional[_Union[SpendLimit, _Mapping]] = ...) -> None: ...

class DecisionRequested(_message.Message):
    __slots__ = ["deadline", "failure_history", "reason", "reason_code"]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_HISTORY_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    deadline: _timestamp_pb2.Timestamp
    failure_history: _containers.RepeatedCompositeFieldContainer[FailureRecord]
    reason: str
    reason_code: StatusReason
    def __init__(self, reason: _Optional[str] = ..., failure_history: _Optional[_Iterable[_Union[FailureRecord, _Mapping]]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., reason_code: _Optional[_Union[StatusReason, str]] = ...) -> None: ...

class DelegateDescription(_message.Message):
    __slots__ = ["circuit_breaker", "circuit_breaker_open_until", "circuit_breaker_opened_by", "circuit_breaker_reason", "failing_since", "first_output_timeout", "guard_scope", "guard_scope_reason", "health", "idempotent", "idle_timeout", "in_flight", "kind", "last_call_code", "last_call_time", "max_concurrent", "name", "price", "read_only", "recent_failures", "requests_last_minute", "requests_per_minute", "retry_on", "stream", "timeout", "tokens_last_minute", "tokens_per_minute"]
    CIRCUIT_BREAKER_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_BREAKER_OPENED_BY_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_BREAKER_OPEN_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_BREAKER_REASON_FIELD_NUMBER: _ClassVar[int]
    FAILING_SINCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_OUTPUT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    GUARD_SCOPE_FIELD_NUMBER: _ClassVar[int]
    GUARD_SCOPE_REASON_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAST_CALL_CODE_FIELD_NUMBER: _ClassVar[int]
    LAST_CALL_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    RECENT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    RETRY_ON_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    circuit_breaker: BreakerState
    circuit_breaker_open_until: _timestamp_pb2.Timestamp
    circuit_breaker_opened_by: str
    circuit_breaker_reason: str
    failing_since: _timestamp_pb2.Timestamp
    first_output_timeout: _duration_pb2.Duration
    guard_scope: GuardScope
    guard_scope_reason: str
    health: DelegateHealth
    idempotent: bool
    idle_timeout: _duration_pb2.Duration
    in_flight: int
    kind: str
    last_call_code: int
    last_call_time: _timestamp_pb2.Timestamp
    max_concurrent: int
    name: str
    price: Price
    read_only: bool
    recent_failures: _containers.RepeatedCompositeFieldContainer[DelegateFailure]
    requests_last_minute: int
    requests_per_minute: int
    retry_on: RetryOn
    stream: str
    timeout: _duration_pb2.Duration
    tokens_last_minute: int
    tokens_per_minute: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., idempotent: bool = ..., read_only: bool = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., health: _Optional[_Union[DelegateHealth, str]] = ..., circuit_breaker: _Optional[_Union[BreakerState, str]] = ..., circuit_breaker_reason: _Optional[str] = ..., in_flight: _Optional[int] = ..., max_concurrent: _Optional[int] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ..., retry_on: _Optional[_Union[RetryOn, _Mapping]] = ..., first_output_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., idle_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., stream: _Optional[str] = ..., circuit_breaker_open_until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., requests_last_minute: _Optional[int] = ..., tokens_last_minute: _Optional[int] = ..., recent_failures: _Optional[_Iterable[_Union[DelegateFailure, _Mapping]]] = ..., last_call_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_call_code: _Optional[int] = ..., failing_since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., guard_scope: _Optional[_Union[GuardScope, str]] = ..., guard_scope_reason: _Optional[str] = ..., circuit_breaker_opened_by: _Optional[str] = ..., price: _Optional[_Union[Price, _Mapping]] = ...) -> None: ...

class DelegateFailure(_message.Message):
    __slots__ = ["attempt", "code", "message", "run_id", "time"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    code: int
    message: str
    run_id: str
    time: _timestamp_pb2.Timestamp
    def __init__(self, time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., run_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class DeleteRunRequest(_message.Message):
    __slots__ = ["cancel", "run_id"]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    cancel: bool
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., cancel: bool = ...) -> None: ...

class DeleteRunResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class FailureAnalyzed(_message.Message):
    __slots__ = ["analysis_cost", "failure", "next_brief", "will_retry"]
    ANALYSIS_COST_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    NEXT_BRIEF_FIELD_NUMBER: _ClassVar[int]
    WILL_RETRY_FIELD_NUMBER: _ClassVar[int]
    analysis_cost: CallCost
    failure: FailureRecord
    next_brief: str
    will_retry: bool
    def __init__(self, failure: _Optional[_Union[FailureRecord, _Mapping]] = ..., will_retry: bool = ..., next_brief: _Optional[str] = ..., analysis_cost: _Optional[_Union[CallCost, _Mapping]] = ...) -> None: ...

class FailureRecord(_message.Message):
    __slots__ = ["analysis", "analysis_error", "attempt", "delegate", "not_retried_code", "not_retried_reason", "path", "reason", "source", "summary", "transient"]
    ANALYSIS_ERROR_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    NOT_RETRIED_CODE_FIELD_NUMBER: _ClassVar[int]
    NOT_RETRIED_REASON_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TRANSIENT_FIELD_NUMBER: _ClassVar[int]
    analysis: str
    analysis_error: str
    attempt: int
    delegate: str
    not_retried_code: NotRetried
    not_retried_reason: str
    path: str
    reason: str
    source: FailureSource
    summary: str
    transient: bool
    def __init__(self, attempt: _Optional[int] = ..., delegate: _Optional[str] = ..., summary: _Optional[str] = ..., reason: _Optional[str] = ..., transient: bool = ..., not_retried_reason: _Optional[str] = ..., not_retried_code: _Optional[_Union[NotRetried, str]] = ..., analysis: _Optional[str] = ..., path: _Optional[str] = ..., source: _Optional[_Union[FailureSource, str]] = ..., analysis_error: _Optional[str] = ...) -> None: ...

class FallbackChainSpec(_message.Message):
    __slots__ = ["chain", "failure_criteria", "failure_when"]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CRITERIA_FIELD_NUMBER: _ClassVar[int]
    FAILURE_WHEN_FIELD_NUMBER: _ClassVar[int]
    chain: _containers.RepeatedScalarFieldContainer[str]
    failure_criteria: str
    failure_when: str
    def __init__(self, chain: _Optional[_Iterable[str]] = ..., failure_criteria: _Optional[str] = ..., failure_when: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ["run_id"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ["server_time", "state"]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    server_time: _timestamp_pb2.Timestamp
    state: ControlState
    def __init__(self, state: _Optional[_Union[ControlState, _Mapping]] = ..., server_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDelegatesRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListDelegatesResponse(_message.Message):
    __slots__ = ["delegates", "presets", "server_time"]
    DELEGATES_FIELD_NUMBER: _ClassVar[int]
    PRESETS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    delegates: _containers.RepeatedCompositeFieldContainer[DelegateDescription]
    presets: _containers.RepeatedCompositeFieldContainer[PresetDescription]
    server_time: _timestamp_pb2.Timestamp
    def __init__(self, delegates: _Optional[_Iterable[_Union[DelegateDescription, _Mapping]]] = ..., presets: _Optional[_Iterable[_Union[PresetDescription, _Mapping]]] = ..., server_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ["control", "delegate", "page_size", "page_token", "status", "view"]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    control: str
    delegate: str
    page_size: int
    page_token: str
    status: RunStatus
    view: RunView
    def __init__(self, status: _Optional[_Union[RunStatus, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., view: _Optional[_Union[RunView, str]] = ..., control: _Optional[str] = ..., delegate: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ["next_page_token", "runs", "server_time", "summaries"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    runs: _containers.RepeatedCompositeFieldContainer[ControlState]
    server_time: _timestamp_pb2.Timestamp
    summaries: _containers.RepeatedCompositeFieldContainer[RunSummary]
    def __init__(self, runs: _Optional[_Iterable[_Union[ControlState, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., summaries: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ..., server_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PresetDescription(_message.Message):
    __slots__ = ["name", "spec", "spend_limit"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SPEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: ControlSpec
    spend_limit: SpendLimit
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[ControlSpec, _Mapping]] = ..., spend_limit: _Optional[_Union[SpendLimit, _Mapping]] = ...) -> None: ...

class Price(_message.Message):
    __slots__ = ["cached_input_per_mtok", "input_per_mtok", "output_per_mtok", "per_call"]
    CACHED_INPUT_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    INPUT_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    PER_CALL_FIELD_NUMBER: _ClassVar[int]
    cached_input_per_mtok: float
    input_per_mtok: float
    output_per_mtok: float
    per_call: float
    def __init__(self, input_per_mtok: _Optional[float] = ..., output_per_mtok: _Optional[float] = ..., cached_input_per_mtok: _Optional[float] = ..., per_call: _Optional[float] = ...) -> None: ...

class RaceSpec(_message.Message):
    __slots__ = ["accept_when", "acceptance_criteria", "candidates", "hedge_delay"]
    ACCEPTANCE_CRITERIA_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_WHEN_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    HEDGE_DELAY_FIELD_NUMBER: _ClassVar[int]
    accept_when: str
    acceptance_criteria: str
    candidates: _containers.RepeatedScalarFieldContainer[str]
    hedge_delay: _duration_pb2.Duration
    def __init__(self, candidates: _Optional[_Iterable[str]] = ..., acceptance_criteria: _Optional[str] = ..., accept_when: _Optional[str] = ..., hedge_delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RetryOn(_message.Message):
    __slots__ = ["grpc_codes", "http_statuses"]
    GRPC_CODES_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUSES_FIELD_NUMBER: _ClassVar[int]
    grpc_codes: _containers.RepeatedScalarFieldContainer[str]
    http_statuses: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, grpc_codes: _Optional[_Iterable[str]] = ..., http_statuses: _Optional[_Iterable[int]] = ...) -> None: ...

class RetrySpec(_message.Message):
    __slots__ = ["attempts", "base_wait", "decision_timeout", "max_wait", "on_exhausted", "retry_on", "target"]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BASE_WAIT_FIELD_NUMBER: _ClassVar[int]
    DECISION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    ON_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    RETRY_ON_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    attempts: int
    base_wait: _duration_pb2.Duration
    decision_timeout: _duration_pb2.Duration
    max_wait: _duration_pb2.Duration
    on_exhausted: OnExhausted
    retry_on: RetryOn
    target: str
    def __init__(self, target: _Optional[str] = ..., attempts: _Optional[int] = ..., max_wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., on_exhausted: _Optional[_Union[OnExhausted, str]] = ..., base_wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., decision_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., retry_on: _Optional[_Union[RetryOn, _Mapping]] = ...) -> None: ...

class RetryWithLearningSpec(_message.Message):
    __slots__ = ["analyst", "failure_criteria", "failure_when", "max_retries", "target"]
    ANALYST_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CRITERIA_FIELD_NUMBER: _ClassVar[int]
    FAILURE_WHEN_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    analyst: str
    failure_criteria: str
    failure_when: str
    max_retries: int
    target: str
    def __init__(self, target: _Optional[str] = ..., max_retries: _Optional[int] = ..., failure_criteria: _Optional[str] = ..., failure_when: _Optional[str] = ..., analyst: _Optional[str] = ...) -> None: ...

class RunCost(_message.Message):
    __slots__ = ["by_delegate", "estimated", "total", "total_tokens"]
    class ByDelegateEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    BY_DELEGATE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    by_delegate: _containers.ScalarMap[str, float]
    estimated: bool
    total: float
    total_tokens: int
    def __init__(self, total: _Optional[float] = ..., by_delegate: _Optional[_Mapping[str, float]] = ..., total_tokens: _Optional[int] = ..., estimated: bool = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ["attempt_finished", "attempt_output", "attempt_started", "backoff_scheduled", "decision_received", "decision_requested", "failure_analyzed", "path", "run_finished", "run_id", "run_resumed", "run_started", "seq", "status", "time"]
    ATTEMPT_FINISHED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_STARTED_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    DECISION_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    DECISION_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_ANALYZED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_RESUMED_FIELD_NUMBER: _ClassVar[int]
    RUN_STARTED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    attempt_finished: AttemptFinished
    attempt_output: AttemptOutput
    attempt_started: AttemptStarted
    backoff_scheduled: BackoffScheduled
    decision_received: DecisionReceived
    decision_requested: DecisionRequested
    failure_analyzed: FailureAnalyzed
    path: str
    run_finished: RunFinished
    run_id: str
    run_resumed: RunResumed
    run_started: RunStarted
    seq: int
    status: RunStatus
    time: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., path: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., run_started: _Optional[_Union[RunStarted, _Mapping]] = ..., attempt_started: _Optional[_Union[AttemptStarted, _Mapping]] = ..., attempt_finished: _Optional[_Union[AttemptFinished, _Mapping]] = ..., failure_analyzed: _Optional[_Union[FailureAnalyzed, _Mapping]] = ..., backoff_scheduled: _Optional[_Union[BackoffScheduled, _Mapping]] = ..., decision_requested: _Optional[_Union[DecisionRequested, _Mapping]] = ..., decision_received: _Optional[_Union[DecisionReceived, _Mapping]] = ..., run_finished: _Optional[_Union[RunFinished, _Mapping]] = ..., run_resumed: _Optional[_Union[RunResumed, _Mapping]] = ..., attempt_output: _Optional[_Union[AttemptOutput, _Mapping]] = ...) -> None: ...

class RunFinished(_message.Message):
    __slots__ = ["state"]
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ControlState
    def __init__(self, state: _Optional[_Union[ControlState, _Mapping]] = ...) -> None: ...

class RunOptions(_message.Message):
    __slots__ = ["attempt_timeout", "first_output_timeout", "idempotency_key", "idle_timeout", "judge", "metadata", "never_ask", "run_timeout", "spend_limit"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    FIRST_OUTPUT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NEVER_ASK_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    SPEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    attempt_timeout: _duration_pb2.Duration
    first_output_timeout: _duration_pb2.Duration
    idempotency_key: str
    idle_timeout: _duration_pb2.Duration
    judge: str
    metadata: _containers.ScalarMap[str, str]
    never_ask: bool
    run_timeout: _duration_pb2.Duration
    spend_limit: SpendLimit
    def __init__(self, idempotency_key: _Optional[str] = ..., run_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., attempt_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., judge: _Optional[str] = ..., first_output_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., idle_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., never_ask: bool = ..., spend_limit: _Optional[_Union[SpendLimit, _Mapping]] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ["balance", "conversation", "fallback_chain", "model_params", "options", "race", "retry", "retry_with_learning", "task_brief", "task_messages"]
    BALANCE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CHAIN_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RACE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    RETRY_WITH_LEARNING_FIELD_NUMBER: _ClassVar[int]
    TASK_BRIEF_FIELD_NUMBER: _ClassVar[int]
    TASK_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    balance: BalanceSpec
    conversation: _conversation_pb2.Conversation
    fallback_chain: FallbackChainSpec
    model_params: _struct_pb2.Struct
    options: RunOptions
    race: RaceSpec
    retry: RetrySpec
    retry_with_learning: RetryWithLearningSpec
    task_brief: str
    task_messages: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, task_brief: _Optional[str] = ..., retry: _Optional[_Union[RetrySpec, _Mapping]] = ..., retry_with_learning: _Optional[_Union[RetryWithLearningSpec, _Mapping]] = ..., fallback_chain: _Optional[_Union[FallbackChainSpec, _Mapping]] = ..., race: _Optional[_Union[RaceSpec, _Mapping]] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ..., task_messages: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., model_params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., conversation: _Optional[_Union[_conversation_pb2.Conversation, _Mapping]] = ..., balance: _Optional[_Union[BalanceSpec, _Mapping]] = ...) -> None: ...

class RunResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: RunEvent
    def __init__(self, event: _Optional[_Union[RunEvent, _Mapping]] = ...) -> None: ...

class RunResumed(_message.Message):
    __slots__ = ["owner", "reason"]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    owner: str
    reason: str
    def __init__(self, owner: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RunStarted(_message.Message):
    __slots__ = ["state"]
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ControlState
    def __init__(self, state: _Optional[_Union[ControlState, _Mapping]] = ...) -> None: ...

class RunSummary(_message.Message):
    __slots__ = ["attempts", "brief", "control", "cost", "create_time", "delegates", "run_id", "status", "update_time", "winner"]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DELEGATES_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    WINNER_FIELD_NUMBER: _ClassVar[int]
    attempts: int
    brief: str
    control: str
    cost: float
    create_time: _timestamp_pb2.Timestamp
    delegates: _containers.RepeatedScalarFieldContainer[str]
    run_id: str
    status: RunStatus
    update_time: _timestamp_pb2.Timestamp
    winner: str
    def __init__(self, run_id: _Optional[str] = ..., control: _Optional[str] = ..., delegates: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., attempts: _Optional[int] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., winner: _Optional[str] = ..., brief: _Optional[str] = ..., cost: _Optional[float] = ...) -> None: ...

class SpendLimit(_message.Message):
    __slots__ = ["max_cost", "max_total_tokens", "on_exhausted"]
    MAX_COST_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ON_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    max_cost: float
    max_total_tokens: int
    on_exhausted: OnExhausted
    def __init__(self, max_cost: _Optional[float] = ..., max_total_tokens: _Optional[int] = ..., on_exhausted: _Optional[_Union[OnExhausted, str]] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ["balance", "conversation", "fallback_chain", "model_params", "options", "race", "retry", "retry_with_learning", "task_brief", "task_messages"]
    BALANCE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CHAIN_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RACE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    RETRY_WITH_LEARNING_FIELD_NUMBER: _ClassVar[int]
    TASK_BRIEF_FIELD_NUMBER: _ClassVar[int]
    TASK_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    balance: BalanceSpec
    conversation: _conversation_pb2.Conversation
    fallback_chain: FallbackChainSpec
    model_params: _struct_pb2.Struct
    options: RunOptions
    race: RaceSpec
    retry: RetrySpec
    retry_with_learning: RetryWithLearningSpec
    task_brief: str
    task_messages: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, task_brief: _Optional[str] = ..., retry: _Optional[_Union[RetrySpec, _Mapping]] = ..., retry_with_learning: _Optional[_Union[RetryWithLearningSpec, _Mapping]] = ..., fallback_chain: _Optional[_Union[FallbackChainSpec, _Mapping]] = ..., race: _Optional[_Union[RaceSpec, _Mapping]] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ..., task_messages: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., model_params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., conversation: _Optional[_Union[_conversation_pb2.Conversation, _Mapping]] = ..., balance: _Optional[_Union[BalanceSpec, _Mapping]] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ["run_id", "state"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: ControlState
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[ControlState, _Mapping]] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ["after_seq", "max_batch", "run_id"]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    max_batch: int
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., max_batch: _Optional[int] = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ["event", "events"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: RunEvent
    events: _containers.RepeatedCompositeFieldContainer[RunEvent]
    def __init__(self, event: _Optional[_Union[RunEvent, _Mapping]] = ..., events: _Optional[_Iterable[_Union[RunEvent, _Mapping]]] = ...) -> None: ...

class WatchRunsRequest(_message.Message):
    __slots__ = ["control", "delegate", "status"]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    control: str
    delegate: str
    status: RunStatus
    def __init__(self, status: _Optional[_Union[RunStatus, str]] = ..., control: _Optional[str] = ..., delegate: _Optional[str] = ...) -> None: ...

class WatchRunsResponse(_message.Message):
    __slots__ = ["deleted_run_id", "run"]
    DELETED_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    deleted_run_id: str
    run: RunSummary
    def __init__(self, run: _Optional[_Union[RunSummary, _Mapping]] = ..., deleted_run_id: _Optional[str] = ...) -> None: ...

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OnExhausted(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class AttemptOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class AttemptStartReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FailureSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RefusedBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NotRetried(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class StatusReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class BalanceStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RunView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class GuardScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class BreakerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class DelegateHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
