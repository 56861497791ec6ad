"""Tests of stubborn.delegate, the delegate kit, over real gRPC on loopback.

Each error helper's failure is decoded back from what a client receives: the
gRPC code and message, and the google.rpc.Status in the
grpc-status-details-bin trailer with its RetryInfo and UpstreamStatus, packed
under the type URLs Stubborn (grpc-go) looks them up by. Also: the answers a
handler may return, a generator handler streamed by ExecuteStream (its pieces
in order and at once, its result, a failure mid-answer, the caller hanging
up) and joined by Execute, a plain handler's ExecuteStream UNIMPLEMENTED,
health, and serve()'s graceful stop on SIGTERM in a child process.

    make testclients   # from the installed package, in a venv
    PYTHONPATH=clients/python /usr/bin/python3 -m unittest discover -s clients/python/tests
"""

import datetime
import itertools
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import unittest

import grpc

import stubborn
from stubborn.delegate import (
    DelegateError,
    DelegateServer,
    DoNotRetry,
    Permanent,
    Transient,
    Upstream,
    code_for_http_status,
    parse_retry_after,
    result,
)
from stubborn.v1 import delegate_pb2, delegate_pb2_grpc

try:
    from google.rpc import error_details_pb2, status_pb2
except ImportError:
    from stubborn._vendor.google.rpc import error_details_pb2, status_pb2
try:
    from grpc_health.v1 import health_pb2
except ImportError:
    from stubborn._vendor.grpc.health.v1 import health_pb2

C = grpc.StatusCode
RETRY_INFO_URL = "type.googleapis.com/google.rpc.RetryInfo"
UPSTREAM_URL = "type.googleapis.com/stubborn.v1.UpstreamStatus"

# The case a call runs, by its brief: a function of (request, context).
CASES = {}


def handle(request, context):
    return CASES[request.brief](request, context)


def raises(exc):
    def case(request, context):
        raise exc

    return case


def decode(err):
    """The google.rpc.Status in err's trailer, and its RetryInfo delay and
    UpstreamStatus (None when absent)."""
    values = [v for k, v in (err.trailing_metadata() or ()) if k == "grpc-status-details-bin"]
    if not values:
        return None, None, None
    if len(values) != 1:
        raise AssertionError(f"{len(values)} grpc-status-details-bin trailers")
    st = status_pb2.Status.FromString(values[0])
    delay = http = None
    for detail in st.details:
        if detail.type_url == RETRY_INFO_URL:
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay = info.retry_delay.ToTimedelta()
        elif detail.type_url == UPSTREAM_URL:
            up = delegate_pb2.UpstreamStatus()
            detail.Unpack(up)
            http = up.http_status
        else:
            raise AssertionError(f"unexpected detail {detail.type_url}")
    return st, delay, http


def seconds(s):
    return datetime.timedelta(seconds=s)


class KitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = DelegateServer(handle, "127.0.0.1:0").start()
        cls.channel = grpc.insecure_channel(cls.server.address)
        cls.stub = delegate_pb2_grpc.DelegateServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop(grace=0)

    def call(self, case, **fields):
        CASES[self.id()] = case
        return self.stub.Execute(delegate_pb2.ExecuteRequest(brief=self.id(), **fields), timeout=10)

    def fail_with(self, case):
        with self.assertRaises(grpc.RpcError) as cm:
            self.call(case)
        return cm.exception

    def test_address(self):
        self.assertRegex(self.server.address, r"^127\.0\.0\.1:[1-9][0-9]*$")
        self.assertEqual(self.server.address, f"127.0.0.1:{self.server.port}")

    def test_errors_decode_back(self):
        # (raised, code, message, RetryInfo delay, UpstreamStatus, transient for Stubborn)
        table = [
            (Transient("busy"), C.UNAVAILABLE, "busy", None, None, True),
            (Transient("busy", 1.5), C.UNAVAILABLE, "busy", seconds(1.5), None, True),
            (Transient("busy", datetime.timedelta(milliseconds=250)), C.UNAVAILABLE, "busy", seconds(0.25), None, True),
            (Transient("quota", 2, code=C.RESOURCE_EXHAUSTED), C.RESOURCE_EXHAUSTED, "quota", seconds(2), None, True),
            (Transient("later", retry_after="3"), C.UNAVAILABLE, "later", seconds(3), None, True),
            (Upstream(429, "slow down", retry_after=0.3), C.RESOURCE_EXHAUSTED, "slow down", seconds(0.3), 429, True),
            (Upstream(503, "down", "7"), C.UNAVAILABLE, "down", seconds(7), 503, True),
            (Upstream(502, "bad gateway"), C.UNAVAILABLE, "bad gateway", None, 502, True),
            (Upstream(500, "oops"), C.INTERNAL, "oops", None, 500, True),
            (Upstream(408, "too slow"), C.DEADLINE_EXCEEDED, "too slow", None, 408, True),
            (Upstream(404, "no such doc"), C.NOT_FOUND, "no such doc", None, 404, False),
            (Upstream(409, "conflict"), C.ABORTED, "conflict", None, 409, False),
            (Upstream(422, "unprocessable"), C.FAILED_PRECONDITION, "unprocessable", None, 422, False),
            (Upstream(400, "bad", code=C.INTERNAL), C.INTERNAL, "bad", None, 400, False),
            (Upstream(503, "garbled hint", retry_after="soon"), C.UNAVAILABLE, "garbled hint", None, 503, True),
            (Permanent("cannot"), C.FAILED_PRECONDITION, "cannot", None, None, False),
            (Permanent("bad brief", code=C.INVALID_ARGUMENT), C.INVALID_ARGUMENT, "bad brief", None, None, False),
            (DoNotRetry("quota spent for today"), C.UNAVAILABLE, "quota spent for today", seconds(-1), None, True),
            (DelegateError(C.INTERNAL, "x", http_status=500, retry_after=4), C.INTERNAL, "x", seconds(4), 500, True),
            (DelegateError(C.ABORTED, "é ✓ \n"), C.ABORTED, "é ✓ \n", None, None, True),
        ]
        for exc, code, message, delay, http, transient in table:
            with self.subTest(exc=repr(exc)):
                err = self.fail_with(raises(exc))
                self.assertEqual(err.code(), code)
                self.assertEqual(err.details(), message)
                st, got_delay, got_http = decode(err)
                self.assertIsNotNone(st, "no grpc-status-details-bin trailer")
                self.assertEqual(st.code, code.value[0], "google.rpc.Status code differs from the gRPC code")
                self.assertEqual(st.message, message)
                self.assertEqual(got_delay, delay)
                self.assertEqual(got_http, http)
                self.assertEqual(exc.transient, transient)

    def test_exceptions_the_kit_maps(self):
        table = [
            (TimeoutError("upstream timed out"), C.DEADLINE_EXCEEDED, "TimeoutError: upstream timed out"),
            (ConnectionRefusedError(111, "Connection refused"), C.UNAVAILABLE, "ConnectionRefusedError: [Errno 111] Connection refused"),
            (ValueError("a bug"), C.UNKNOWN, "ValueError: a bug"),
            (KeyError(), C.UNKNOWN, "KeyError"),
        ]
        for exc, code, message in table:
            with self.subTest(exc=repr(exc)):
                with self.assertLogs("stubborn.delegate", "ERROR") if code is C.UNKNOWN else _nothing():
                    err = self.fail_with(raises(exc))
                self.assertEqual(err.code(), code)
                self.assertEqual(err.details(), message)
                st, delay, http = decode(err)
                self.assertEqual((st.code, st.message, delay, http), (code.value[0], message, None, None))

    def test_context_abort_stands(self):
        def case(request, context):
            context.abort(C.NOT_FOUND, "gone")

        err = self.fail_with(case)
        self.assertEqual((err.code(), err.details()), (C.NOT_FOUND, "gone"))
        self.assertEqual(decode(err), (None, None, None))

    def test_answers(self):
        def echo(request, context):
            return f"{request.brief}|{request.run_id}|{request.attempt}|{request.idempotency_key}|{dict(request.metadata)}"

        got = self.call(echo, run_id="run_1", attempt=3, idempotency_key="k", metadata={"a": "b"})
        self.assertEqual(got.result.text, f"{self.id()}|run_1|3|k|{{'a': 'b'}}")
        self.assertFalse(got.result.HasField("data"))

        got = self.call(lambda r, c: result("table", data={"rows": [1, "two", None, True], "n": 2.5}))
        self.assertEqual(got.result.text, "table")
        self.assertEqual(list(got.result.data.struct_value["rows"]), [1, "two", None, True])
        self.assertEqual(got.result.data.struct_value["n"], 2.5)

        self.assertEqual(self.call(lambda r, c: None), delegate_pb2.ExecuteResponse(result=delegate_pb2.Result()))
        answer = delegate_pb2.Result(text="as is")
        self.assertEqual(self.call(lambda r, c: answer).result, answer)
        self.assertEqual(self.call(lambda r, c: delegate_pb2.ExecuteResponse(result=answer)).result, answer)

    def test_wrong_answer_type(self):
        with self.assertLogs("stubborn.delegate", "ERROR"):
            err = self.fail_with(lambda r, c: 42)
        self.assertEqual(err.code(), C.UNKNOWN)
        self.assertIn("TypeError: the handler returned a int", err.details())

    def test_health(self):
        check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        for service in ("", "stubborn.v1.DelegateService"):
            got = check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            self.assertEqual(got.status, health_pb2.HealthCheckResponse.SERVING, service)
        with self.assertRaises(grpc.RpcError) as cm:
            check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        self.assertEqual(cm.exception.code(), C.NOT_FOUND)


# The case a streaming call runs, by its brief: a generator function of
# (request, context).
STREAM_CASES = {}


def stream_handle(request, context):
    return (yield from STREAM_CASES[request.brief](request, context))


def messages(responses):
    """ExecuteStream responses as ("text", delta) and ("result", Result)."""
    return [(m.WhichOneof("kind"), getattr(m, m.WhichOneof("kind"))) for m in responses]


class StreamTest(unittest.TestCase):
    """A generator handler, over ExecuteStream and Execute."""

    @classmethod
    def setUpClass(cls):
        cls.server = DelegateServer(stream_handle, "127.0.0.1:0").start()
        cls.channel = grpc.insecure_channel(cls.server.address)
        cls.stub = delegate_pb2_grpc.DelegateServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop(grace=0)

    def stream(self, case, timeout=10, **fields):
        STREAM_CASES[self.id()] = case
        return self.stub.ExecuteStream(delegate_pb2.ExecuteStreamRequest(brief=self.id(), **fields), timeout=timeout)

    def execute(self, case, **fields):
        STREAM_CASES[self.id()] = case
        return self.stub.Execute(delegate_pb2.ExecuteRequest(brief=self.id(), **fields), timeout=10)

    def test_pieces_in_order_each_at_once(self):
        # The handler waits for the client to have each piece before it
        # yields the next: a kit that held pieces back would hang here.
        got = queue.Queue()

        def case(request, context):
            for piece in ("Roses ", "", "are ", None, "red ✓", "\n"):
                yield piece
                if piece:
                    self.assertEqual(got.get(timeout=5), piece)

        out = []
        for m in self.stream(case):
            kind = m.WhichOneof("kind")
            out.append((kind, getattr(m, kind)))
            if kind == "text_delta":
                got.put(m.text_delta)
        self.assertEqual(
            out,
            [("text_delta", "Roses "), ("text_delta", "are "), ("text_delta", "red ✓"), ("text_delta", "\n"),
             ("result", delegate_pb2.Result())],
        )

    def test_request(self):
        def case(request, context):
            self.assertIsInstance(request, delegate_pb2.ExecuteRequest)
            yield f"{request.brief}|{request.run_id}|{request.attempt}|{request.idempotency_key}|{dict(request.metadata)}"

        got = messages(self.stream(case, run_id="run_1", attempt=3, idempotency_key="k", metadata={"a": "b"}))
        self.assertEqual(got[0], ("text_delta", f"{self.id()}|run_1|3|k|{{'a': 'b'}}"))

    def test_final_result(self):
        closed = threading.Event()

        def returns_data(request, context):
            yield "two "
            yield "rows"
            return result(data={"rows": 2})

        def returns_text(request, context):
            yield "draft"
            return "the whole answer"

        def yields_result(request, context):
            try:
                yield "a"
                yield result("a, then b", data=[1])
                yield "never sent"
            finally:
                closed.set()

        def yields_response(request, context):
            yield delegate_pb2.ExecuteStreamResponse(text_delta="x")
            yield delegate_pb2.ExecuteStreamResponse()  # unset: nothing
            yield delegate_pb2.ExecuteResponse(result=delegate_pb2.Result(text="y"))

        table = [
            (returns_data, [("text_delta", "two "), ("text_delta", "rows"), ("result", result(data={"rows": 2}))]),
            (returns_text, [("text_delta", "draft"), ("result", result("the whole answer"))]),
            (yields_result, [("text_delta", "a"), ("result", result("a, then b", data=[1]))]),
            (yields_response, [("text_delta", "x"), ("result", result("y"))]),
        ]
        for case, want in table:
            with self.subTest(case=case.__name__):
                self.assertEqual(messages(self.stream(case)), want)
        self.assertTrue(closed.wait(5), "the generator that yielded a Result was not closed")

    def test_error_mid_stream(self):
        # (raised after the first piece, code, message, RetryInfo delay, UpstreamStatus)
        table = [
            (Upstream(503, "upstream went away", retry_after=2), C.UNAVAILABLE, "upstream went away", seconds(2), 503),
            (Transient("stalled upstream", 0.5), C.UNAVAILABLE, "stalled upstream", seconds(0.5), None),
            (Upstream(429, "slow down", "7"), C.RESOURCE_EXHAUSTED, "slow down", seconds(7), 429),
            (Permanent("cannot finish"), C.FAILED_PRECONDITION, "cannot finish", None, None),
            (DoNotRetry("quota spent"), C.UNAVAILABLE, "quota spent", seconds(-1), None),
            (TimeoutError("model timed out"), C.DEADLINE_EXCEEDED, "TimeoutError: model timed out", None, None),
            (ConnectionResetError(104, "reset"), C.UNAVAILABLE, "ConnectionResetError: [Errno 104] reset", None, None),
        ]
        for exc, code, message, delay, http in table:
            with self.subTest(exc=repr(exc)):

                def case(request, context):
                    yield "partial "
                    yield "answer"
                    raise exc

                got = []
                with self.assertRaises(grpc.RpcError) as cm:
                    for m in self.stream(case):
                        got.append(m.text_delta)
                self.assertEqual(got, ["partial ", "answer"])
                err = cm.exception
                self.assertEqual((err.code(), err.details()), (code, message))
                st, got_delay, got_http = decode(err)
                self.assertIsNotNone(st, "no grpc-status-details-bin trailer")
                self.assertEqual((st.code, st.message), (code.value[0], message))
                self.assertEqual((got_delay, got_http), (delay, http))

    def test_bug_and_abort_mid_stream(self):
        def bug(request, context):
            yield "x"
            raise ValueError("a bug")

        def wrong_piece(request, context):
            yield "x"
            yield 42

        def aborts(request, context):
            yield "x"
            context.abort(C.NOT_FOUND, "gone")

        for case, code, message, logged in (
            (bug, C.UNKNOWN, "ValueError: a bug", True),
            (wrong_piece, C.UNKNOWN, "TypeError: the handler yielded a int; want str pieces, then maybe a Result", True),
            (aborts, C.NOT_FOUND, "gone", False),
        ):
            with self.subTest(case=case.__name__):
                got = []
                with self.assertLogs("stubborn.delegate", "ERROR") if logged else _nothing():
                    with self.assertRaises(grpc.RpcError) as cm:
                        for m in self.stream(case):
                            got.append(m.text_delta)
                self.assertEqual(got, ["x"])
                self.assertEqual((cm.exception.code(), cm.exception.details()), (code, message))
                if not logged:
                    self.assertEqual(decode(cm.exception), (None, None, None))

    def test_failure_before_any_output(self):
        def case(request, context):
            raise Upstream(429, "rate limited", retry_after=0.3)
            yield  # a generator all the same

        with self.assertRaises(grpc.RpcError) as cm:
            list(self.stream(case))
        self.assertEqual(cm.exception.code(), C.RESOURCE_EXHAUSTED)
        self.assertEqual(decode(cm.exception)[1:], (seconds(0.3), 429))

    def test_caller_hangs_up(self):
        # Cancelled after two pieces, or past its deadline, over ExecuteStream
        # or Execute: the kit stops asking for pieces and closes the
        # generator. After its two pieces the handler only waits (a bare
        # yield sends nothing), so only the kit's own check stops it.
        for how in ("cancel", "deadline", "execute deadline"):
            with self.subTest(how=how):
                asked, closed = [], threading.Event()

                def case(request, context):
                    try:
                        yield "0 "
                        yield "1 "
                        for i in itertools.count():
                            asked.append(i)
                            time.sleep(0.02)
                            yield
                    finally:
                        closed.set()

                if how == "execute deadline":
                    STREAM_CASES[self.id()] = case
                    with self.assertRaises(grpc.RpcError) as cm:
                        self.stub.Execute(delegate_pb2.ExecuteRequest(brief=self.id()), timeout=0.5)
                else:
                    call = self.stream(case, timeout=0.5 if how == "deadline" else 10)
                    self.assertEqual([next(call).text_delta, next(call).text_delta], ["0 ", "1 "])
                    if how == "cancel":
                        call.cancel()
                    with self.assertRaises(grpc.RpcError) as cm:
                        next(call)
                self.assertEqual(cm.exception.code(), C.CANCELLED if how == "cancel" else C.DEADLINE_EXCEEDED)
                self.assertTrue(closed.wait(5), "the generator was not closed")
                n = len(asked)
                time.sleep(0.2)
                self.assertEqual(len(asked), n, "the generator went on after it was closed")

    def test_execute_joins_the_pieces(self):
        def plain(request, context):
            yield "Roses "
            yield "are red"

        def with_data(request, context):
            yield "two rows"
            return result(data={"rows": 2})

        def with_text(request, context):
            yield "draft"
            return "final"

        for case, want in (
            (plain, result("Roses are red")),
            (with_data, result("two rows", data={"rows": 2})),
            (with_text, result("final")),
        ):
            with self.subTest(case=case.__name__):
                self.assertEqual(self.execute(case).result, want)

        def fails(request, context):
            yield "partial"
            raise Upstream(503, "down", retry_after=1)

        with self.assertRaises(grpc.RpcError) as cm:
            self.execute(fails)
        self.assertEqual((cm.exception.code(), cm.exception.details()), (C.UNAVAILABLE, "down"))
        self.assertEqual(decode(cm.exception)[1:], (seconds(1), 503))


class StreamOptionTest(unittest.TestCase):
    """Which handlers ExecuteStream serves: a plain handler's is
    UNIMPLEMENTED before any message (and the handler is not called), a
    generator function's is served, and stream= says otherwise."""

    def serve(self, handler, **kw):
        server = DelegateServer(handler, "127.0.0.1:0", **kw).start()
        self.addCleanup(server.stop, grace=0)
        channel = grpc.insecure_channel(server.address)
        self.addCleanup(channel.close)
        return delegate_pb2_grpc.DelegateServiceStub(channel)

    def test_plain_handler_does_not_stream(self):
        calls = []

        def plain(request, context):
            calls.append(request.brief)
            return "answer"

        stub = self.serve(plain)
        got = []
        with self.assertRaises(grpc.RpcError) as cm:
            for m in stub.ExecuteStream(delegate_pb2.ExecuteStreamRequest(brief="b"), timeout=10):
                got.append(m)
        self.assertEqual(cm.exception.code(), C.UNIMPLEMENTED)
        self.assertEqual((got, calls), ([], []))
        self.assertEqual(stub.Execute(delegate_pb2.ExecuteRequest(brief="b"), timeout=10).result.text, "answer")

    def test_stream_option(self):
        def returns_iterator(request, context):
            return iter(["a", "b"])

        def generator(request, context):
            yield "a"
            yield "b"

        def plain(request, context):
            return "ab"

        def stream_call(stub):
            return messages(stub.ExecuteStream(delegate_pb2.ExecuteStreamRequest(brief="b"), timeout=10))

        streamed = [("text_delta", "a"), ("text_delta", "b"), ("result", delegate_pb2.Result())]
        # stream=True: an iterator returned is streamed; a plain answer is the result alone.
        self.assertEqual(stream_call(self.serve(returns_iterator, stream=True)), streamed)
        self.assertEqual(stream_call(self.serve(plain, stream=True)), [("result", result("ab"))])
        # Auto: a plain function returning an iterator does not stream, but Execute joins it.
        for handler, kw in ((returns_iterator, {}), (generator, {"stream": False})):
            with self.subTest(handler=handler.__name__, **kw):
                stub = self.serve(handler, **kw)
                with self.assertRaises(grpc.RpcError) as cm:
                    stream_call(stub)
                self.assertEqual(cm.exception.code(), C.UNIMPLEMENTED)
                self.assertEqual(stub.Execute(delegate_pb2.ExecuteRequest(brief="b"), timeout=10).result.text, "ab")

        class Model:
            def __call__(self, request, context):
                yield "from a callable object"

        self.assertEqual(stream_call(self.serve(Model()))[0], ("text_delta", "from a callable object"))

    def test_async_handlers_refused(self):
        async def coroutine(request, context):
            return "x"

        async def async_generator(request, context):
            yield "x"

        for handler in (coroutine, async_generator, "not a function"):
            with self.subTest(handler=handler):
                with self.assertRaises(TypeError):
                    DelegateServer(handler, "127.0.0.1:0")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class HelpersTest(unittest.TestCase):
    def test_code_for_http_status(self):
        want = {
            400: C.INVALID_ARGUMENT, 401: C.UNAUTHENTICATED, 403: C.PERMISSION_DENIED, 404: C.NOT_FOUND,
            408: C.DEADLINE_EXCEEDED, 409: C.ABORTED, 410: C.FAILED_PRECONDITION, 418: C.FAILED_PRECONDITION,
            425: C.UNAVAILABLE, 429: C.RESOURCE_EXHAUSTED, 499: C.CANCELLED, 500: C.INTERNAL,
            501: C.UNIMPLEMENTED, 502: C.UNAVAILABLE, 503: C.UNAVAILABLE, 504: C.DEADLINE_EXCEEDED,
            505: C.INTERNAL, 599: C.INTERNAL,
        }
        for status, code in want.items():
            self.assertEqual(code_for_http_status(status), code, status)
        for bad in (200, 399, 600, 0, True, "429"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                code_for_http_status(bad)

    def test_parse_retry_after(self):
        now = datetime.datetime(2015, 10, 21, 7, 28, 0, tzinfo=datetime.timezone.utc)
        self.assertEqual(parse_retry_after("120"), 120)
        self.assertEqual(parse_retry_after(" 0.5 "), 0.5)
        self.assertEqual(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now), 30)
        self.assertEqual(parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), 0)
        for bad in (None, "", "soon", "-3", "nan", "inf"):
            self.assertIsNone(parse_retry_after(bad), repr(bad))

    def test_invalid_arguments(self):
        for make in (
            lambda: Upstream(200, "ok?"),
            lambda: Upstream(600, "?"),
            lambda: Transient("x", code=C.INVALID_ARGUMENT),
            lambda: Permanent("x", code=C.UNAVAILABLE),
            lambda: Transient("x", float("nan")),
            lambda: DelegateError(C.OK, "fine"),
            lambda: DelegateError(C.INTERNAL, "x", http_status=600),
        ):
            self.assertRaises(ValueError, make)
        self.assertRaises(TypeError, lambda: Transient("x", True))
        self.assertRaises(TypeError, lambda: Transient("x", [1]))

    def test_version(self):
        self.assertRegex(stubborn.__version__, r"^\d+\.\d+\.\d+$")


PREFERS = """
import sys
import stubborn.delegate as d
print(d.status_pb2.__name__, d.error_details_pb2.__name__, d.health_pb2.__name__)
print(sorted(m for m in sys.modules if m.startswith("stubborn._vendor.") and m.endswith("_pb2")))
print([a.type_url for a in d.Upstream(429, "x", retry_after=1).status().details])
"""


class ModulePathTest(unittest.TestCase):
    """google.rpc and grpc_health.v1 come from googleapis-common-protos and
    grpcio-health-checking when installed: stand-ins made of the vendored
    modules, on the path of a child process, are taken, and the vendored
    copies are not loaded at all."""

    def test_prefers_installed_google_rpc_and_grpc_health(self):
        import importlib.util
        import shutil
        import tempfile

        site = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, site)
        for module, to in (
            ("stubborn._vendor.google.rpc.status_pb2", "google/rpc"),
            ("stubborn._vendor.google.rpc.error_details_pb2", "google/rpc"),
            ("stubborn._vendor.grpc.health.v1.health_pb2", "grpc_health/v1"),
        ):
            os.makedirs(os.path.join(site, to), exist_ok=True)
            shutil.copy(importlib.util.find_spec(module).origin, os.path.join(site, to))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([site] + sys.path))
        out = subprocess.run(
            [sys.executable, "-c", PREFERS], env=env, capture_output=True, text=True, timeout=30, check=True
        ).stdout.splitlines()
        self.assertEqual(out[0], "google.rpc.status_pb2 google.rpc.error_details_pb2 grpc_health.v1.health_pb2")
        self.assertEqual(out[1], "[]")
        self.assertEqual(out[2], str([RETRY_INFO_URL, UPSTREAM_URL]))


CHILD = """
import sys, time
from stubborn.delegate import serve

def handle(request, context):
    print("handling", request.brief, file=sys.stderr, flush=True)
    time.sleep(float(request.brief))
    return "slept " + request.brief

serve(handle, "127.0.0.1:0", drain=float(sys.argv[1]), grace=5)
"""


class ServeTest(unittest.TestCase):
    """serve() in a child process, stopped by signals."""

    def start(self, drain):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(drain)], stderr=subprocess.PIPE, text=True, env=os.environ
        )
        self.addCleanup(lambda: child.poll() is None and child.kill())
        self.addCleanup(child.stderr.close)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in child.stderr], daemon=True).start()
        self.log = []

        def expect(pattern, timeout=20):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=0.1)
                except queue.Empty:
                    continue
                self.log.append(line)
                m = re.search(pattern, line)
                if m:
                    return m
            self.fail(f"no {pattern!r} in the child's output:\n{''.join(self.log)}")

        m = expect(r"serving on (127\.0\.0\.1:\d+)")
        channel = grpc.insecure_channel(m.group(1))
        self.addCleanup(channel.close)
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        return child, expect, delegate_pb2_grpc.DelegateServiceStub(channel), check

    def test_sigterm_drains_then_finishes_calls_in_flight(self):
        child, expect, stub, check = self.start(drain=1.5)
        self.assertEqual(check(health_pb2.HealthCheckRequest(), timeout=5).status, health_pb2.HealthCheckResponse.SERVING)
        call = stub.Execute.future(delegate_pb2.ExecuteRequest(brief="2.5"), timeout=20)
        expect(r"handling 2\.5")
        child.send_signal(signal.SIGTERM)
        # While it drains, health says NOT_SERVING and calls are still served.
        deadline, status = time.monotonic() + 1.2, None
        while time.monotonic() < deadline:
            status = check(health_pb2.HealthCheckRequest(), timeout=5).status
            if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            time.sleep(0.05)
        self.assertEqual(status, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.assertEqual(stub.Execute(delegate_pb2.ExecuteRequest(brief="0"), timeout=5).result.text, "slept 0")
        # The call in flight outlives the drain and finishes within the grace.
        self.assertEqual(call.result().result.text, "slept 2.5")
        self.assertEqual(child.wait(timeout=15), 0, "".join(self.log))
        expect(r"stopped")

    def test_second_sigterm_kills(self):
        child, expect, stub, check = self.start(drain=30)
        child.send_signal(signal.SIGTERM)
        expect(r"SIGTERM: health NOT_SERVING")
        child.send_signal(signal.SIGTERM)
        self.assertEqual(child.wait(timeout=10), -signal.SIGTERM)


if __name__ == "__main__":
    unittest.main()
