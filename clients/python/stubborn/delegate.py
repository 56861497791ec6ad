"""A Stubborn delegate in a handful of lines.

A delegate is a gRPC server of stubborn.v1.DelegateService (Execute, and
ExecuteStream for one that streams its output). With this module it is a
function and one call::

    from stubborn.delegate import Transient, serve

    def handle(request, context):
        if upstream_is_busy():
            raise Transient("busy", retry_after=2.5)  # wait 2.5 s, then retry
        return f"done: {request.brief}"

    serve(handle, "127.0.0.1:7500")

``handle(request, context)`` gets the stubborn.v1.ExecuteRequest (brief,
run_id, attempt, idempotency_key, metadata) and the grpc.ServicerContext, and
returns the result: a str (the text), a stubborn.v1.Result (see
:func:`result` for one with structured data), a stubborn.v1.ExecuteResponse,
or None (an empty result). To fail, it raises:

==========================================  =====================  ============================
raise                                       gRPC code              details (google.rpc.Status)
==========================================  =====================  ============================
``Transient(msg, retry_after=None)``        UNAVAILABLE            RetryInfo if retry_after
``Upstream(http_status, msg, retry_after)`` from the HTTP status   UpstreamStatus, RetryInfo
``Permanent(msg)``                          FAILED_PRECONDITION    none
``DoNotRetry(msg)``                         UNAVAILABLE            RetryInfo of -1 s
``DelegateError(code, msg, ...)``           any but OK             as given
``TimeoutError``                            DEADLINE_EXCEEDED      none
``ConnectionError``                         UNAVAILABLE            none
any other exception (logged)                UNKNOWN                none
==========================================  =====================  ============================

What Stubborn's retry control makes of it (delegates/classify.go,
controls/retry.go): an UpstreamStatus of 408, 425, 429 or 5xx is transient and
any other 4xx permanent, whatever the code; without one, UNAVAILABLE,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED and ABORTED are transient and every
other code is permanent. A transient failure is retried (if the delegate is
declared idempotent or read_only) after the RetryInfo delay when there is one,
capped by the run's max_wait (a longer one ends the retries), else after the
computed backoff; a negative delay asks not to retry at all.

A handler that is a generator function streams: each str it yields is the
next piece of the answer's text, sent at once (an ExecuteStream text_delta;
an empty one, or a bare ``yield``, sends nothing), and what it returns is the
final result: nothing, or a Result with no text (``return
result(data=...)``), means the pieces joined; a str or a Result with text is
the answer's whole text instead. Yielding a Result ends the answer there::

    def handle(request, context):
        for token in model.generate(request.brief):
            if token.error:
                raise Transient(token.error)  # mid-answer: same code and details
            yield token.text

An exception raised mid-answer fails the attempt as it would before any
output (the table above), and Stubborn discards the output already sent.
Between pieces the kit checks that the caller is still there
(context.is_active(): not cancelled, not past its deadline); once it is
gone, the kit closes the generator (GeneratorExit at its ``yield``, so its
``finally`` and ``with`` blocks run). A handler that waits long between
pieces may check context.is_active() itself. A generator handler answers
Execute too, with the pieces joined, so a Stubborn that does not stream
still gets the answer; a plain handler's ExecuteStream answers UNIMPLEMENTED
before any message, which tells Stubborn to call Execute instead. Either way
the handler gets an ExecuteRequest. ``stream=True`` (to :func:`serve` or
:class:`DelegateServer`) serves ExecuteStream for a handler that returns an
iterator of pieces without being a generator function itself.

The details travel as a serialized google.rpc.Status in the
``grpc-status-details-bin`` trailer, as grpcio-status and grpc-go write them.
google.rpc comes from googleapis-common-protos when it is installed (so one
process never holds two copies of google/rpc/status.proto), else from the copy
generated with this package (stubborn._vendor). The same goes for
grpc.health.v1 and grpcio-health-checking.

:func:`serve` also answers grpc.health.v1.Health/Check, for "" and
"stubborn.v1.DelegateService": SERVING, then NOT_SERVING once it is stopping
(Watch is not implemented: UNIMPLEMENTED tells a client's health checking to
treat the server as healthy). SIGTERM or SIGINT stops it gracefully: health
turns NOT_SERVING, calls keep being served for ``drain`` seconds, then new
calls are refused and those in flight get up to ``grace`` seconds to finish.
A second signal acts as it would without serve (SIGTERM kills the process,
SIGINT cuts the grace short).
"""

from __future__ import annotations

import collections
import collections.abc
import datetime
import email.utils
import inspect
import logging
import math
import signal
import threading
import time
from concurrent import futures
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import duration_pb2, json_format

from stubborn.v1 import delegate_pb2, delegate_pb2_grpc

try:  # googleapis-common-protos, when installed
    from google.rpc import error_details_pb2, status_pb2
except ImportError:  # else the copy generated with this package
    from stubborn._vendor.google.rpc import error_details_pb2, status_pb2  # type: ignore[no-redef]

try:  # grpcio-health-checking, when installed
    from grpc_health.v1 import health_pb2
except ImportError:
    from stubborn._vendor.grpc.health.v1 import health_pb2  # type: ignore[no-redef]

__all__ = [
    "DETAILS_METADATA_KEY",
    "TRANSIENT_CODES",
    "DelegateError",
    "DelegateServer",
    "DoNotRetry",
    "Handler",
    "Permanent",
    "Piece",
    "StreamHandler",
    "Transient",
    "Upstream",
    "code_for_http_status",
    "parse_retry_after",
    "result",
    "serve",
]

_log = logging.getLogger("stubborn.delegate")

#: The trailer that carries the serialized google.rpc.Status.
DETAILS_METADATA_KEY = "grpc-status-details-bin"

#: The gRPC codes Stubborn's retry control treats as transient (when no
#: UpstreamStatus says otherwise).
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)

# HTTP status → gRPC code: google/rpc/code.proto's mapping read backwards
# (where several codes share a status, the one code.proto lists first), plus
# 408 and 425, which code.proto leaves out, on transient codes as Stubborn
# treats those statuses. 502 is UNAVAILABLE as in gRPC's own HTTP mapping.
_CODE_FOR_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ABORTED,
    425: grpc.StatusCode.UNAVAILABLE,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

Seconds = Union[int, float, datetime.timedelta, str, None]
"""A retry delay: seconds, a timedelta, an HTTP Retry-After value, or None."""

Answer = Union[str, delegate_pb2.Result, delegate_pb2.ExecuteResponse, None]
Handler = Callable[[delegate_pb2.ExecuteRequest, grpc.ServicerContext], Answer]
"""handler(request, context) → str, Result, ExecuteResponse or None."""

Piece = Union[str, delegate_pb2.Result, delegate_pb2.ExecuteResponse, delegate_pb2.ExecuteStreamResponse, None]
"""What a streaming handler yields: a str is the next piece of the text (an
empty one, or None, sends nothing); a Result (or an ExecuteResponse) is the
answer and ends it; an ExecuteStreamResponse goes as it is."""

StreamHandler = Callable[[delegate_pb2.ExecuteRequest, grpc.ServicerContext], Iterator[Piece]]
"""handler(request, context), a generator function: yields Pieces, and may
return an Answer (the final result)."""


def code_for_http_status(http_status: int) -> grpc.StatusCode:
    """The gRPC code an :class:`Upstream` failure with this HTTP status gets.

    400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED,
    404 NOT_FOUND, 408 DEADLINE_EXCEEDED, 409 ABORTED, 425 UNAVAILABLE,
    429 RESOURCE_EXHAUSTED, 499 CANCELLED, 500 INTERNAL, 501 UNIMPLEMENTED,
    502 and 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED; any other 4xx
    FAILED_PRECONDITION, any other 5xx INTERNAL. Raises ValueError outside
    400-599. Stubborn itself goes by the UpstreamStatus detail, not by this
    code (an Upstream(409) is permanent for it, though ABORTED alone would be
    transient); the code is for every other reader of the status.
    """
    if isinstance(http_status, bool) or not isinstance(http_status, int) or not 400 <= http_status <= 599:
        raise ValueError(f"an upstream failure's HTTP status is 400-599, got {http_status!r}")
    code = _CODE_FOR_HTTP.get(http_status)
    if code is not None:
        return code
    return grpc.StatusCode.FAILED_PRECONDITION if http_status < 500 else grpc.StatusCode.INTERNAL


def parse_retry_after(value: Optional[str], now: Optional[datetime.datetime] = None) -> Optional[float]:
    """Seconds to wait, from an HTTP Retry-After header value.

    The value is delay-seconds ("120"; a fraction such as "0.5" is taken too)
    or an HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT", a date already past is
    0). None, an empty value, a negative number or anything unparseable gives
    None: no hint, so Stubborn computes the backoff itself.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": UTC, per RFC 5322
            when = when.replace(tzinfo=datetime.timezone.utc)
        now = now or datetime.datetime.now(datetime.timezone.utc)
        return max(0.0, (when - now).total_seconds())
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def _delay(value: Seconds) -> Optional[datetime.timedelta]:
    """A retry_after argument as a timedelta (None: no hint)."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, str):
        seconds = parse_retry_after(value)
        return None if seconds is None else datetime.timedelta(seconds=seconds)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"retry_after is seconds, a timedelta or a Retry-After value, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"retry_after must be finite, got {value!r}")
    try:
        return datetime.timedelta(seconds=value)
    except OverflowError as e:
        raise ValueError(f"retry_after {value!r} is out of range") from e


class DelegateError(Exception):
    """A failed attempt: a gRPC code, a message, and what Stubborn reads.

    ``retry_after``: how long Stubborn should wait before the next attempt
    (seconds, a timedelta, or an HTTP Retry-After value, which gives no hint
    when unparseable); sent as google.rpc.RetryInfo. Negative asks not to
    retry at all. None sends no RetryInfo: Stubborn computes the backoff.

    ``http_status``: the HTTP status the delegate got from the service behind
    it (100-599); sent as stubborn.v1.UpstreamStatus. It decides transient
    or not for Stubborn whatever the code (see :attr:`transient`).
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        retry_after: Seconds = None,
        http_status: Optional[int] = None,
    ) -> None:
        if not isinstance(code, grpc.StatusCode) or code is grpc.StatusCode.OK:
            raise ValueError(f"a failure's code is a grpc.StatusCode other than OK, got {code!r}")
        if http_status is not None and (
            isinstance(http_status, bool) or not isinstance(http_status, int) or not 100 <= http_status <= 599
        ):
            raise ValueError(f"http_status is 100-599, got {http_status!r}")
        super().__init__(message)
        self.code = code
        self.message = str(message)
        self.retry_after = _delay(retry_after)
        self.http_status = http_status

    @property
    def transient(self) -> bool:
        """Whether Stubborn's retry control counts this failure transient.

        The upstream HTTP status first (408, 425, 429 and 5xx are, other 4xx
        are not), then the code (:data:`TRANSIENT_CODES`). A transient
        failure is still not retried when retry_after is negative or over the
        run's max_wait, or when the delegate is neither idempotent nor
        read_only in Stubborn's config.
        """
        h = self.http_status
        if h in (408, 425, 429) or (h is not None and 500 <= h <= 599):
            return True
        if h is not None and 400 <= h <= 499:
            return False
        return self.code in TRANSIENT_CODES

    def status(self) -> status_pb2.Status:
        """The google.rpc.Status sent in the grpc-status-details-bin trailer."""
        st = status_pb2.Status(code=self.code.value[0], message=self.message)
        if self.retry_after is not None:
            delay = duration_pb2.Duration()
            delay.FromTimedelta(self.retry_after)
            st.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        if self.http_status is not None:
            st.details.add().Pack(delegate_pb2.UpstreamStatus(http_status=self.http_status))
        return st

    def __repr__(self) -> str:
        extra = ""
        if self.http_status is not None:
            extra += f", http_status={self.http_status}"
        if self.retry_after is not None:
            extra += f", retry_after={self.retry_after.total_seconds()}s"
        return f"{type(self).__name__}({self.code.name}, {self.message!r}{extra})"


class Transient(DelegateError):
    """A failure a retry may fix: UNAVAILABLE, or another of
    :data:`TRANSIENT_CODES` given as ``code``; with RetryInfo when
    ``retry_after`` is given."""

    def __init__(
        self,
        message: str,
        retry_after: Seconds = None,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
    ) -> None:
        if code not in TRANSIENT_CODES:
            raise ValueError(f"a transient failure's code is one of {_names(TRANSIENT_CODES)}, got {code!r}")
        super().__init__(code, message, retry_after=retry_after)


class Upstream(DelegateError):
    """The service behind the delegate answered an HTTP error (400-599).

    Sends stubborn.v1.UpstreamStatus{http_status}, which decides for
    Stubborn: 408, 425, 429 and 5xx are transient, any other 4xx permanent.
    The code is :func:`code_for_http_status` unless ``code`` is given.
    ``retry_after`` may be the upstream's Retry-After header as it came::

        raise Upstream(resp.status, resp.reason, retry_after=resp.headers.get("Retry-After"))
    """

    def __init__(
        self,
        http_status: int,
        message: str,
        retry_after: Seconds = None,
        *,
        code: Optional[grpc.StatusCode] = None,
    ) -> None:
        default = code_for_http_status(http_status)
        super().__init__(code or default, message, retry_after=retry_after, http_status=http_status)


class Permanent(DelegateError):
    """A failure no retry will fix: FAILED_PRECONDITION ("this cannot be done
    as asked; do not retry until something changes"), or another code that
    is not in :data:`TRANSIENT_CODES` given as ``code`` (INVALID_ARGUMENT for
    a brief the delegate cannot use, say)."""

    def __init__(self, message: str, *, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> None:
        if code in TRANSIENT_CODES:
            raise ValueError(f"a permanent failure's code is not one of {_names(TRANSIENT_CODES)}, got {code!r}")
        super().__init__(code, message)


class DoNotRetry(DelegateError):
    """A failure of a transient kind that should not be retried now (a quota
    spent for the day, say): ``code`` (UNAVAILABLE by default) with a
    RetryInfo of -1 s, which Stubborn records as "retry hint asks not to
    retry" (NOT_RETRIED_HINT_NO_RETRY) rather than "not transient"."""

    def __init__(self, message: str, *, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        super().__init__(code, message, retry_after=-1)


def _names(codes: Iterable[grpc.StatusCode]) -> str:
    return ", ".join(sorted(c.name for c in codes))


def result(text: str = "", data: Any = None) -> delegate_pb2.Result:
    """A stubborn.v1.Result: text, and optional structured data given as
    JSON-like Python values (dict, list, str, int, float, bool)."""
    r = delegate_pb2.Result(text=text)
    if data is not None:
        json_format.ParseDict(data, r.data)
    return r


def _response(answer: Answer) -> delegate_pb2.ExecuteResponse:
    if isinstance(answer, delegate_pb2.ExecuteResponse):
        return answer
    if isinstance(answer, delegate_pb2.Result):
        return delegate_pb2.ExecuteResponse(result=answer)
    if isinstance(answer, str):
        return delegate_pb2.ExecuteResponse(result=delegate_pb2.Result(text=answer))
    if answer is None:
        return delegate_pb2.ExecuteResponse(result=delegate_pb2.Result())
    raise TypeError(
        f"the handler returned a {type(answer).__name__}; want str, Result, ExecuteResponse or None "
        "(or, to stream, an iterator of str pieces)"
    )


def _final(answer: Answer) -> delegate_pb2.ExecuteStreamResponse:
    return delegate_pb2.ExecuteStreamResponse(result=_response(answer).result)


def _messages(answer: Any, context: grpc.ServicerContext) -> Iterator[delegate_pb2.ExecuteStreamResponse]:
    """The ExecuteStream messages of a handler's answer: for an iterator
    (a generator's pieces), a text_delta per str piece and then one result
    (what it yielded last, or what it returned); for a plain answer, its
    result alone. Stops, without a result, once the call is no longer
    active (the caller went away), and closes the iterator whatever ends
    it."""
    if not isinstance(answer, collections.abc.Iterator):
        yield _final(answer)
        return
    try:
        while True:
            if not context.is_active():
                return
            try:
                piece = next(answer)
            except StopIteration as stop:
                yield _final(stop.value)
                return
            if isinstance(piece, str):
                if piece:
                    yield delegate_pb2.ExecuteStreamResponse(text_delta=piece)
            elif piece is None:
                pass
            elif isinstance(piece, (delegate_pb2.Result, delegate_pb2.ExecuteResponse)):
                yield _final(piece)
                return
            elif isinstance(piece, delegate_pb2.ExecuteStreamResponse):
                kind = piece.WhichOneof("kind")
                if kind == "result":
                    yield piece
                    return
                if kind == "text_delta" and piece.text_delta:
                    yield piece
            else:
                raise TypeError(
                    f"the handler yielded a {type(piece).__name__}; want str pieces, then maybe a Result"
                )
    finally:
        close = getattr(answer, "close", None)
        if close is not None:
            close()


def _joined(answer: Any, context: grpc.ServicerContext) -> delegate_pb2.ExecuteResponse:
    """A streamed answer as Execute's one response: its result, whose
    text, when empty, is the pieces joined."""
    text = []
    final = delegate_pb2.Result()
    for m in _messages(answer, context):
        if m.WhichOneof("kind") == "text_delta":
            text.append(m.text_delta)
        else:
            final.CopyFrom(m.result)
    if not final.text:
        final.text = "".join(text)
    return delegate_pb2.ExecuteResponse(result=final)


def _streams(handler: Any) -> bool:
    """Whether handler is a generator function (or an object whose
    __call__ is one): a streaming handler."""
    return inspect.isgeneratorfunction(handler) or inspect.isgeneratorfunction(
        getattr(type(handler), "__call__", None)
    )


def _check_handler(handler: Any) -> None:
    if not callable(handler):
        raise TypeError(f"the handler is a function of (request, context), got {handler!r}")
    for f in (handler, getattr(type(handler), "__call__", None)):
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            raise TypeError("the handler is async: the kit serves plain and generator functions (grpc's threaded server)")


class _RpcStatus(collections.namedtuple("_RpcStatus", ("code", "details", "trailing_metadata")), grpc.Status):
    """What ServicerContext.abort_with_status takes (as grpcio-status makes it)."""


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _aborted(context: grpc.ServicerContext) -> bool:
    """Whether the handler already set a status (context.abort or set_code)."""
    try:
        code = context.code()
    except (AttributeError, NotImplementedError):  # grpcio before 1.38
        return False
    return code is not None and code is not grpc.StatusCode.OK


def _failure(e: Exception, request: Any, context: grpc.ServicerContext) -> Optional[DelegateError]:
    """The failure to answer for an exception the handler raised, or None
    when it is context.abort's (whose status stands)."""
    if isinstance(e, DelegateError):
        return e
    if isinstance(e, TimeoutError):
        return DelegateError(grpc.StatusCode.DEADLINE_EXCEEDED, _describe(e))
    if isinstance(e, ConnectionError):
        return DelegateError(grpc.StatusCode.UNAVAILABLE, _describe(e))
    if _aborted(context):
        return None
    _log.exception("attempt %d of run %r failed", request.attempt, request.run_id)
    return DelegateError(grpc.StatusCode.UNKNOWN, _describe(e))


def _abort(context: grpc.ServicerContext, err: DelegateError) -> NoReturn:
    """Ends the call with err's code, message and details; raises."""
    context.abort_with_status(
        _RpcStatus(err.code, err.message, ((DETAILS_METADATA_KEY, err.status().SerializeToString()),))
    )
    raise AssertionError("abort_with_status returned")  # it raises


class _Servicer(delegate_pb2_grpc.DelegateServiceServicer):
    def __init__(self, handler: Union[Handler, StreamHandler], stream: Optional[bool]) -> None:
        _check_handler(handler)
        self._handler = handler
        self._stream = _streams(handler) if stream is None else bool(stream)

    def Execute(self, request: delegate_pb2.ExecuteRequest, context: grpc.ServicerContext) -> delegate_pb2.ExecuteResponse:
        try:
            answer = self._handler(request, context)
            if isinstance(answer, collections.abc.Iterator):  # streamed: joined
                return _joined(answer, context)
            return _response(answer)
        except Exception as e:
            err = _failure(e, request, context)
            if err is None:
                raise
        _abort(context, err)

    def ExecuteStream(
        self, request: delegate_pb2.ExecuteStreamRequest, context: grpc.ServicerContext
    ) -> Iterator[delegate_pb2.ExecuteStreamResponse]:
        if not self._stream:
            # Before any message: Stubborn then calls Execute, from now on.
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this delegate does not stream: call Execute")
        # The handler gets an ExecuteRequest either way: the fields, numbers
        # included, are the same.
        return self._stream_answer(delegate_pb2.ExecuteRequest.FromString(request.SerializeToString()), context)

    def _stream_answer(
        self, request: delegate_pb2.ExecuteRequest, context: grpc.ServicerContext
    ) -> Iterator[delegate_pb2.ExecuteStreamResponse]:
        try:
            # Closed with it, when grpc drops it (the call ended early).
            yield from _messages(self._handler(request, context), context)
            return
        except Exception as e:
            err = _failure(e, request, context)
            if err is None:
                raise
        _abort(context, err)


class _Health:
    """grpc.health.v1.Health/Check for the given services."""

    def __init__(self, services: Sequence[str]) -> None:
        self._services = frozenset(services)
        self.serving = True  # a bool: set and read atomically

    def check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.service not in self._services:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=serving if self.serving else not_serving)

    def rpc_handler(self) -> grpc.GenericRpcHandler:
        check = grpc.unary_unary_rpc_method_handler(
            self.check,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": check})


class DelegateServer:
    """A delegate server, for when :func:`serve`'s signal handling does not
    fit (tests, a server started from another thread). The port is bound
    here; :meth:`start` starts serving.

    ``address``: where to listen, as grpc takes it ("127.0.0.1:7500",
    "[::]:7500"; port 0 picks a free one, see :attr:`port`).
    ``credentials``: grpc.ServerCredentials for TLS; None serves plaintext.
    ``max_workers``: calls handled at once (a thread each).
    ``options``: grpc server options, such as ("grpc.max_receive_message_length", n).
    ``stream``: whether to serve ExecuteStream with the handler; None (the
    default) does for a generator function (see the module's doc), True
    for a handler that returns an iterator of pieces, False never.
    """

    def __init__(
        self,
        handler: Union[Handler, StreamHandler],
        address: str,
        *,
        credentials: Optional[grpc.ServerCredentials] = None,
        max_workers: int = 16,
        options: Sequence[Tuple[str, Any]] = (),
        stream: Optional[bool] = None,
    ) -> None:
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="stubborn-delegate"),
            options=options,
        )
        delegate_pb2_grpc.add_DelegateServiceServicer_to_server(_Servicer(handler, stream), self._server)
        self._health = _Health(("", "stubborn.v1.DelegateService"))
        self._server.add_generic_rpc_handlers((self._health.rpc_handler(),))
        try:
            if credentials is None:
                port = self._server.add_insecure_port(address)
            else:
                port = self._server.add_secure_port(address, credentials)
        except RuntimeError as e:  # newer grpcio raises; older returns 0
            raise OSError(f"cannot listen on {address}: {e}") from e
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        #: The port bound (the one picked for port 0).
        self.port: int = port
        #: host:port as bound, or address itself for a unix: socket.
        self.address: str = address if address.startswith("unix") else f"{address.rpartition(':')[0]}:{port}"

    def start(self) -> "DelegateServer":
        """Starts serving; health answers SERVING."""
        self._server.start()
        return self

    def stop(self, grace: Optional[float] = 10.0, drain: float = 0.0) -> None:
        """Stops gracefully and returns once stopped: health turns
        NOT_SERVING, calls are still served for ``drain`` seconds, then new
        calls are refused and those in flight get ``grace`` seconds (None: as
        long as they take) before they are cancelled."""
        self._health.serving = False
        if drain > 0:
            time.sleep(drain)
        self._server.stop(grace).wait()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the server stopped or timeout seconds passed; returns
        whether it stopped."""
        return self._server.wait_for_termination(timeout)

    def __enter__(self) -> "DelegateServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(grace=0)


def serve(
    handler: Union[Handler, StreamHandler],
    address: str,
    *,
    grace: Optional[float] = 10.0,
    drain: float = 0.0,
    credentials: Optional[grpc.ServerCredentials] = None,
    max_workers: int = 16,
    stream: Optional[bool] = None,
) -> None:
    """Serves handler as a Stubborn delegate on address until SIGTERM or
    SIGINT, then stops gracefully (see the module's doc and
    :meth:`DelegateServer.stop` for ``drain`` and ``grace``) and returns.

    Logs "serving on HOST:PORT" at INFO on the "stubborn.delegate" logger,
    after logging.basicConfig(level=INFO) (which does nothing when logging
    is configured already). Call it from the main thread: it installs
    signal handlers, and puts back the ones it found when it returns.
    ``stream`` is :class:`DelegateServer`'s.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = DelegateServer(handler, address, credentials=credentials, max_workers=max_workers, stream=stream)
    stopping = threading.Event()
    received: list = []
    previous: dict = {}

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        stopping.set()
        _restore(previous)  # a second signal acts as it would without serve

    for s in (signal.SIGTERM, signal.SIGINT):
        previous[s] = signal.signal(s, on_signal)
    try:
        server.start()
        _log.info("serving on %s", server.address)
        while not stopping.wait(1.0):
            pass
        _log.info(
            "%s: health NOT_SERVING; serving %gs more, then up to %s for the calls in flight",
            received[0], drain, "their end" if grace is None else f"{grace:g}s",
        )
        try:
            server.stop(grace=grace, drain=drain)
        except KeyboardInterrupt:
            _log.info("SIGINT again: cancelling the calls in flight")
            server.stop(grace=0)
        _log.info("stopped")
    finally:
        _restore(previous)


def _restore(previous: dict) -> None:
    for s, h in previous.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
