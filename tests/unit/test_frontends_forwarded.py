"""service/frontends/forwarded.py: a forwarded call run by a servicer's own handler behind a ForwardedContext,
without processes or sockets (the link is a recorder)."""

from __future__ import annotations

import threading

import grpc
import pytest

from engine.interface import CancelToken
from service.core.errors import ModelNotFound
from service.frontends.forwarded import ForwardedContext, HandlerTable, StreamCancelled, run_call
from service.frontends.link import LinkClosed
from service.frontends.messages import CallEnd, CallStart, Credit, Reply
from service.transport import status_codes
from service.transport.auth import Access
from service.transport.servicers.common import AccessGate, CallTracker, rpc

METHOD = "/test.Service/Echo"


class RecordingLink:
    def __init__(self) -> None:
        self.sent: list[object] = []
        self.broken = False
        self.sent_one = threading.Event()

    def send(self, record: object) -> None:
        if self.broken:
            raise LinkClosed("broken")
        self.sent.append(record)
        self.sent_one.set()

    def ends(self) -> list[CallEnd]:
        return [record for record in self.sent if isinstance(record, CallEnd)]


def _context(link: RecordingLink, request: bytes | None = b"hello", time_remaining: float | None = None):
    ended: list[int] = []
    start = CallStart(7, METHOD, (("authorization", "Bearer secret"),), time_remaining, "ipv4:127.0.0.1:5", request)
    return ForwardedContext(link, start, ended.append), ended  # type: ignore[arg-type]


class Echo:
    """A servicer in the house style: `rpc` gives it the access check, the call tracker and the error table."""

    def __init__(self) -> None:
        self.access = AccessGate(False)
        self.calls = CallTracker(4)
        self.tokens: list[CancelToken] = []

    @rpc(inference=True)
    def Echo(self, request: bytes, context: grpc.ServicerContext, token: CancelToken) -> bytes:
        self.tokens.append(token)
        if request == b"missing":
            raise ModelNotFound("nothing by that name")
        return request.upper()


def _table(servicer: Echo) -> HandlerTable:
    table = HandlerTable()
    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(servicer.Echo)
    table.add_registered_method_handlers("test.Service", {"Echo": handler})
    return table


def test_a_unary_call_answers_in_one_call_end_and_its_token_fires_when_it_ends():
    link, servicer = RecordingLink(), Echo()
    context, ended = _context(link)
    run_call(context, _table(servicer).find(METHOD))
    assert link.sent == [CallEnd(7, grpc.StatusCode.OK.value[0], "", (), reply=b"HELLO")]
    assert ended == [7] and not context.is_active()
    assert servicer.tokens[0].cancelled  # fired when the RPC ended, as gRPC's add_callback does
    assert servicer.calls.active == 0


def test_an_error_goes_back_with_its_code_message_and_rich_details():
    link = RecordingLink()
    context, _ = _context(link, b"missing")
    run_call(context, _table(Echo()).find(METHOD))
    [end] = link.ends()
    expected = status_codes.rich_status(*status_codes.describe(ModelNotFound("nothing by that name")))
    assert end.code == expected.code.value[0] and end.details == expected.details
    assert end.trailing_metadata == tuple(expected.trailing_metadata)  # grpc-status-details-bin: the ErrorInfo


def test_an_unknown_method_is_unimplemented():
    link = RecordingLink()
    context, _ = _context(link)
    run_call(context, HandlerTable().find("/test.Service/Nothing"))
    assert link.ends()[0].code == grpc.StatusCode.UNIMPLEMENTED.value[0]


def test_the_client_going_away_fires_the_token_and_sends_nothing():
    link = RecordingLink()
    context, ended = _context(link)
    fired = threading.Event()
    assert context.add_callback(fired.set)
    context.client_gone()
    assert fired.is_set() and ended == [7] and link.sent == []
    assert not context.add_callback(fired.set)  # ended: refused, as gRPC refuses it
    context.finish(b"late")  # a handler that finishes afterwards sends nothing more
    assert link.sent == []


def test_cancel_ends_the_call_with_cancelled_and_asks_the_front_end_to_cancel_it_at_once():
    link = RecordingLink()
    context, _ = _context(link)
    context.cancel()
    [end] = link.ends()
    assert end.code == grpc.StatusCode.CANCELLED.value[0] and end.cancel


def test_time_remaining_counts_down_from_the_clients_deadline_and_none_without_one():
    link = RecordingLink()
    with_deadline, _ = _context(link, time_remaining=5.0)
    remaining = with_deadline.time_remaining()
    assert remaining is not None and 0.0 < remaining <= 5.0
    without, _ = _context(link)
    assert without.time_remaining() is None
    assert without.invocation_metadata() == (("authorization", "Bearer secret"),)
    assert without.peer() == "ipv4:127.0.0.1:5"


def test_a_client_stream_is_read_as_it_comes_each_message_giving_a_credit_back():
    link = RecordingLink()
    context, _ = _context(link, request=None)
    messages = context.requests()
    context.feed(b"one")
    assert next(messages) == b"one"
    assert link.sent == [Credit(7, 1)]
    context.feed(b"two")
    context.half_close()
    assert list(messages) == [b"two"]


def test_a_client_stream_read_after_the_call_ended_raises_as_grpcs_iterator_does():
    link = RecordingLink()
    context, _ = _context(link, request=None)
    messages = context.requests()
    context.client_gone()
    with pytest.raises(StreamCancelled):
        next(messages)


def test_a_stream_reply_waits_until_the_front_end_wrote_it():
    link = RecordingLink()
    context, _ = _context(link, request=None)
    outcome: list[bool] = []
    replying = threading.Thread(target=lambda: outcome.append(context.reply(b"answer")))
    replying.start()
    assert link.sent_one.wait(10)
    assert link.sent == [Reply(7, b"answer")] and outcome == []  # waits for ReplyWritten
    context.written()
    replying.join(10)
    assert outcome == [True]


def test_a_stream_reply_waiting_to_be_written_returns_when_the_call_is_cancelled():
    link = RecordingLink()
    context, _ = _context(link, request=None)
    outcome: list[bool] = []
    replying = threading.Thread(target=lambda: outcome.append(context.reply(b"answer")))
    replying.start()
    assert link.sent_one.wait(10)
    context.cancel()  # the servicer's write timeout
    replying.join(10)
    assert outcome == [False]


def test_a_broken_link_ends_the_call_as_a_client_that_went_away():
    link = RecordingLink()
    context, ended = _context(link)
    fired = threading.Event()
    context.add_callback(fired.set)
    link.broken = True
    context.finish(b"answer")
    assert fired.is_set() and ended == [7]


def test_the_access_check_reads_the_forwarded_metadata():
    servicer = Echo()

    class Refusing(AccessGate):
        def require(self, access: Access, operation: str, context: grpc.ServicerContext) -> None:
            assert ("authorization", "Bearer secret") in context.invocation_metadata()
            super().require(access, operation, context)

    servicer.access = Refusing(False)
    link = RecordingLink()
    context, _ = _context(link)
    run_call(context, _table(servicer).find(METHOD))
    assert link.ends()[0].reply == b"HELLO"
