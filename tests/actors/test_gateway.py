"""The actor API is supervised (issue 15): a malformed request gets an error reply and the
gateway carries on; the gateway is restarted like any actor and `store.actor_ref` follows it;
actor clients' reads never wait behind puts; host code (subscribers, reply callbacks) runs on
the notifier's threads, never on a store actor's."""

from __future__ import annotations

import enum
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

from mqstore import FaultPlan, GetResult, Message, MessageArrived, PutResult, Reply
from mqstore import supervisor as supervisor_module
from mqstore.actors.base import ServiceUnavailable
from mqstore.actors.gateway import request_error
from mqstore.errors import StoreClosedError
from mqstore.log import REPEAT_LOG_INTERVAL_MS
from mqstore.messages import Get, Put, Query, Replied, Subscribe, Waiter
from mqstore.runtime import call_listener
from mqstore.ticker import ManualTicker

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py
TIMEOUT_S = 10.0

GOOD = Message(topic="t", body=b"good")


def _ask(store: Any, make: Any) -> Any:
    """Tell the gateway `make(reply)` and wait for the answer (raises what it failed with)."""
    waiter = Waiter()
    store.actor_ref.tell(make(Reply(future=waiter)))
    return waiter.get(timeout=TIMEOUT_S)


MALFORMED: list[tuple[str, Any, type[Exception], str]] = [
    ("str body", lambda r: Put(messages=(Message(topic="t", body="text"),), reply=r), TypeError, r"messages\[0\]\.body"),  # type: ignore[arg-type]
    ("no messages", lambda r: Put(messages=(), reply=r), ValueError, "Put.messages is empty"),
    ("messages not a tuple", lambda r: Put(messages="abc", reply=r), TypeError, "Put.messages"),  # type: ignore[arg-type]
    ("a dict for a message", lambda r: Put(messages=({"topic": "t"},), reply=r), TypeError, r"messages\[0\]"),  # type: ignore[arg-type]
    ("str queue id", lambda r: Put(messages=(Message(topic="t", body=b"x", queue_id="0"),), reply=r), TypeError,  # type: ignore[arg-type]
     r"messages\[0\]\.queue_id"),  # fmt: skip
    ("two messages, not a batch", lambda r: Put(messages=(GOOD, GOOD), reply=r), ValueError, "batch=True"),
    ("get max_count 0", lambda r: Get(topic="t", queue_id=0, offset=0, max_count=0, reply=r), ValueError, "max_count"),
    ("get str queue id", lambda r: Get(topic="t", queue_id="0", offset=0, max_count=1, reply=r), TypeError,  # type: ignore[arg-type]
     "Get.queue_id"),  # fmt: skip
    ("query str max_count", lambda r: Query(topic="t", key="k", max_count="1", reply=r), TypeError, "Query.max_count"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("case", "make", "error", "names"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_request_gets_an_error_reply_and_the_next_good_put_succeeds(
    store_dir: Path, case: str, make: Any, error: type[Exception], names: str
) -> None:
    with h.open_small(store_dir) as store:
        with pytest.raises(error, match=names):
            _ask(store, make)
        result = _ask(store, lambda r: Put(messages=(GOOD,), reply=r))
        assert isinstance(result, PutResult) and result.ok
        assert store.supervisor.restarts == [] and store.running


class _Topic(str, enum.Enum):
    ORDERS = "orders"


_R: Any = Reply(future=Waiter())
ERROR_TEXTS: list[tuple[str, Any, str]] = [
    # Review 103 L7: a plain str was given the hint of a str subclass (an Enum member).
    ("a str for the messages", Put(messages="abc", reply=_R),  # type: ignore[arg-type]
     "Put.messages must be a tuple or list of Message, not str"),  # fmt: skip
    ("a str for a message", Put(messages=("abc",), reply=_R), "Put.messages[0] must be a Message, not str"),  # type: ignore[arg-type]
    ("a str for the batch flag", Put(messages=(GOOD,), batch="yes", reply=_R), "Put.batch must be a bool, not str"),  # type: ignore[arg-type]
    # A Message is a NamedTuple: it was taken as the sequence, and its topic named as messages[0].
    ("one Message, not in a list", Put(messages=GOOD, reply=_R),  # type: ignore[arg-type]
     "Put.messages takes a tuple or list of Message, not a single Message: wrap it in one"),  # fmt: skip
    # The hint where it is right: a str subclass, whose text a member's name would replace.
    ("an Enum member for the topic", Get(topic=_Topic.ORDERS, queue_id=0, offset=0, max_count=1, reply=_R),
     "Get.topic must be a str, not _Topic (a str subclass such as an Enum member: pass its .value)"),  # fmt: skip
    ("an Enum member's message", Put(messages=(GOOD._replace(topic=_Topic.ORDERS),), reply=_R),
     "Put.messages[0].topic must be a str, not _Topic (a str subclass such as an Enum member: pass its .value)"),  # fmt: skip
]


@pytest.mark.parametrize(("case", "request_", "text"), ERROR_TEXTS, ids=[e[0] for e in ERROR_TEXTS])
def test_a_malformed_requests_error_says_what_is_wrong(case: str, request_: Any, text: str) -> None:
    error = request_error(request_)
    assert isinstance(error, TypeError) and str(error) == text


def test_a_put_of_one_message_not_in_a_list_is_answered_so_and_stores_nothing(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        with pytest.raises(TypeError, match="not a single Message: wrap it"):
            _ask(store, lambda r: Put(messages=GOOD, reply=r))  # type: ignore[arg-type]
        assert _ask(store, lambda r: Put(messages=[GOOD], reply=r)).queue_offset == 0


class _LyingLength(list):  # type: ignore[type-arg]
    """A host's list that says it holds one message (or one changed after the gateway's check)."""

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("how", ["list lying in __len__", "submit_put"])
def test_a_put_of_several_messages_not_a_batch_is_refused_whatever_the_list_says(store_dir: Path, how: str) -> None:
    """Review 131 F1: the gateway's one-message check ran on the host's list, and what was put
    was a copy of it: three messages of three queues were appended as one single put, at the
    first queue's offsets (an honest put to another queue was then served another message, or
    none). `submit_put` took them with no lie at all. The encoder refuses them now."""
    three = [Message(topic="A", body=b"A-lie"), Message(topic="B", queue_id=1, body=b"B-lie"),
             Message(topic="C", queue_id=2, body=b"C-lie")]  # fmt: skip
    with h.open_small(store_dir) as store:
        assert store.put(Message(topic="B", queue_id=1, body=b"B-0")).queue_offset == 0
        with pytest.raises(ValueError, match="not a batch"):
            if how == "submit_put":
                store.submit_put(three, batch=False)
            else:
                _ask(store, lambda r: Put(messages=_LyingLength(three), reply=r))
        honest = store.put(Message(topic="B", queue_id=1, body=b"B-1"))
        assert honest.ok and honest.queue_offset == 1
        for topic, queue_id in (("A", 0), ("C", 2)):
            assert store.max_offset(topic, queue_id) == 0
        got = store.get("B", 1, 0, 32)
        assert [bytes(m.body) for m in got.messages] == [b"B-0", b"B-1"]


class _HostsReply(Reply[Any]):
    """A host's Reply subclass: its methods are host code (they could block for good)."""

    __slots__ = ()
    ran_on: list[str] = []

    def send(self, answer: Any, **kwargs: Any) -> None:
        self.ran_on.append(threading.current_thread().name)
        super().send(answer, **kwargs)

    def fail(self, exc: Exception) -> None:
        self.ran_on.append(threading.current_thread().name)
        super().fail(exc)


class _HostsWaiter(Waiter):
    """A host's Waiter subclass: its set() is host code."""

    def set(self, *args: Any, **kwargs: Any) -> None:
        _HostsReply.ran_on.append(threading.current_thread().name)
        super().set(*args, **kwargs)

    def set_later(self, *args: Any, **kwargs: Any) -> None:
        _HostsReply.ran_on.append(threading.current_thread().name)
        super().set_later(*args, **kwargs)

    def hand_over(self, *args: Any, **kwargs: Any) -> None:
        _HostsReply.ran_on.append(threading.current_thread().name)
        super().hand_over(*args, **kwargs)


@pytest.mark.parametrize("how", ["subclass", "store_internal_callback", "a Waiter subclass"])
@pytest.mark.parametrize("request_kind", ["put", "get"])
def test_a_hosts_reply_that_would_run_on_a_store_thread_is_refused(store_dir: Path, how: str, request_kind: str) -> None:
    """Review 131 F2: a Reply subclass, or a host's Reply with store_internal_callback=True,
    ran the host's code on the writer's thread (a put) or a gateway reader's (a get): one that
    blocked held up every put and the close. The gateway drops such a request (logged), and
    submit_put refuses it, so no store thread runs it."""
    called: list[str] = []
    _HostsReply.ran_on = called

    def reply() -> Reply[Any]:
        if how == "subclass":
            return _HostsReply(callback=lambda _answer: None)
        if how == "a Waiter subclass":  # (review 132 F2)
            return Reply(future=_HostsWaiter())
        return Reply(callback=lambda _answer: called.append(threading.current_thread().name), store_internal_callback=True)

    with h.open_small(store_dir) as store:
        if request_kind == "put":
            store.actor_ref.tell(Put(messages=(GOOD,), reply=reply()))
            with pytest.raises(TypeError, match="store thread"):
                store.submit_put([GOOD], batch=False, reply=reply())
        else:
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=reply()))
        # Answered in order behind it: the request was handled (dropped) by now.
        assert _ask(store, lambda r: Put(messages=(Message(topic="t", body=b"next"),), reply=r)).ok
        assert _ask(store, lambda r: Get(topic="t", queue_id=0, offset=0, max_count=8, reply=r)).found
        assert called == []
        assert [bytes(m.body) for m in store.get("t", 0, 0, 8).messages] == [b"next"]


def test_requests_that_cannot_be_answered_are_dropped_and_the_gateway_carries_on(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        store.actor_ref.tell("hello")
        store.actor_ref.tell(Put(messages=(GOOD,), reply=None))  # type: ignore[arg-type]
        store.actor_ref.tell(Subscribe(subscriber=42))  # type: ignore[arg-type]
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        assert store.supervisor.restarts == [] and store.running
        h.wait_dispatched(store)
        assert store.max_offset("t", 0) == 1  # the reply-less put was not stored either


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == event]


UNANSWERABLE: list[tuple[str, Any]] = [
    ("tell(None)", lambda: None),
    ("a Get whose reply is None", lambda: Get(topic="t", queue_id=0, offset=0, max_count=1, reply=None)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("case", "make"), UNANSWERABLE, ids=[u[0] for u in UNANSWERABLE])
def test_an_unanswerable_request_in_a_loop_is_logged_once_then_once_a_minute_with_a_count(
    store_dir: Path, caplog: pytest.LogCaptureFixture, case: str, make: Any
) -> None:
    """Review 103 M4: a line per request, ~100k lines/s from one looping caller. The first is
    logged in full, then a line a minute of the store's ticker, carrying the count."""
    ticker = ManualTicker(sleeps_move_time=False)
    n = 500
    with caplog.at_level(logging.INFO, logger="mqstore"), h.open_small(store_dir, ticker=ticker) as store:
        for _ in range(n):
            store.actor_ref.tell(make())
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok  # the inbox is FIFO: all were handled
        assert len(_lines(caplog, "unanswerable request dropped")) == 1
        ticker.advance(REPEAT_LOG_INTERVAL_MS)
        for _ in range(n):
            store.actor_ref.tell(make())
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        assert store.supervisor.restarts == [] and store.running
        dropped = _lines(caplog, "unanswerable request dropped")
        assert [r.mqstore_event.get("suppressed") for r in dropped] == [None, n - 1]
        assert dropped[0].levelno == logging.WARNING and dropped[0].mqstore_event["request"] == type(make()).__name__
    # The close counts the repeats that came after the minute's line.
    left = [r for r in _lines(caplog, "repeats not logged") if "unanswerable" in r.mqstore_event["kind"]]
    assert [r.mqstore_event["suppressed"] for r in left] == [n - 1]


def test_each_kind_of_unanswerable_request_has_its_own_first_line(store_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    ticker = ManualTicker(sleeps_move_time=False)
    with caplog.at_level(logging.INFO, logger="mqstore"), h.open_small(store_dir, ticker=ticker) as store:
        for _ in range(50):
            store.actor_ref.tell(None)
            store.actor_ref.tell("hello")
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=None))  # type: ignore[arg-type]
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        dropped = _lines(caplog, "unanswerable request dropped")
        assert sorted(r.mqstore_event["request"] for r in dropped) == ["Get", "NoneType", "str"]


def test_answers_sent_to_the_gateway_itself_are_logged_once(store_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review 103 M4 (e4_self_subscribe.py): Gets whose Reply goes to `store.actor_ref`: each
    answer is a `Replied` the gateway cannot handle, a line each."""
    ticker = ManualTicker(sleeps_move_time=False)
    with caplog.at_level(logging.INFO, logger="mqstore"), h.open_small(store_dir, ticker=ticker) as store:
        assert store.put(GOOD).ok
        h.wait_dispatched(store)
        for i in range(100):
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1,
                                     reply=Reply(actor=store.actor_ref, correlation_id=i)))  # fmt: skip
        # Each reader told the gateway its Replied answers before it answers these gets (the
        # readers take gets in turn), and the put after them reaches the gateway after those.
        for _ in range(2):
            assert isinstance(_ask(store, lambda r: Get(topic="t", queue_id=0, offset=0, max_count=1, reply=r)), GetResult)
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        dropped = _lines(caplog, "unanswerable request dropped")
        assert [r.mqstore_event["request"] for r in dropped] == ["Replied"]
        assert store.supervisor.restarts == [] and store.running


def test_malformed_requests_in_a_loop_are_each_answered_but_logged_once_then_once_a_minute(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 103 M4: the INFO line of a malformed request was one per request too."""
    ticker = ManualTicker(sleeps_move_time=False)
    n = 200
    bad = Message(topic="t", body="text")  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="mqstore"), h.open_small(store_dir, ticker=ticker) as store:
        for _ in range(n):
            with pytest.raises(TypeError, match=r"messages\[0\]\.body"):
                _ask(store, lambda r: Put(messages=(bad,), reply=r))
        assert len(_lines(caplog, "malformed request answered with an error")) == 1
        ticker.advance(REPEAT_LOG_INTERVAL_MS)
        with pytest.raises(TypeError, match=r"messages\[0\]\.body"):
            _ask(store, lambda r: Put(messages=(bad,), reply=r))
        with pytest.raises(ValueError, match="max_count"):  # another kind: a line of its own
            _ask(store, lambda r: Get(topic="t", queue_id=0, offset=0, max_count=0, reply=r))
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        malformed = _lines(caplog, "malformed request answered with an error")
        assert [(r.mqstore_event["request"], r.mqstore_event.get("suppressed")) for r in malformed] == [
            ("Put", None), ("Put", n - 1), ("Get", None)]  # fmt: skip
        assert "messages[0].body" in malformed[0].mqstore_event["error"]


def test_the_gateway_is_supervised_and_actor_ref_follows_its_restart(store_dir: Path) -> None:
    plan = FaultPlan()
    with h.open_small(store_dir, faults=plan) as store:
        ref = store.actor_ref
        first = store.supervisor.peers["gateway"]
        plan.arm("gateway.mid_request")
        with pytest.raises(ServiceUnavailable, match="gateway failed"):
            _ask(store, lambda r: Put(messages=(GOOD,), reply=r))
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the gateway's restart")
        record = store.supervisor.restarts[0]
        assert (record.failed, record.restarted) == ("gateway", ("gateway",))
        assert store.supervisor.peers["gateway"] != first and not first.is_alive()
        assert store.actor_ref is ref  # the host's address did not change
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        assert store.running
        with pytest.raises(TypeError, match="close the store"):
            ref.stop()  # its life is the supervisor's: a stopped gateway would never come back
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok


def test_an_actor_clients_get_does_not_hold_up_puts(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with h.open_small(store_dir) as store:
        assert store.put(GOOD).ok
        h.wait_dispatched(store)
        real_get = type(store).get
        entered, release = threading.Event(), threading.Event()

        def slow_get(self: Any, *args: Any, **kwargs: Any) -> GetResult:
            entered.set()
            release.wait(TIMEOUT_S)
            return real_get(self, *args, **kwargs)

        monkeypatch.setattr(type(store), "get", slow_get)
        get_answer = Waiter()
        store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(future=get_answer)))
        assert entered.wait(TIMEOUT_S)
        try:
            # The get is stuck in a reader; a put through the same gateway is answered anyway.
            assert _ask(store, lambda r: Put(messages=(Message(topic="t", body=b"later"),), reply=r)).ok
            assert not release.is_set()
        finally:
            release.set()
        assert [m.body for m in get_answer.get(timeout=TIMEOUT_S).messages] == [b"good"]


def _listener_idle(store: Any) -> None:
    """Once this returns, the (one) subscription's listener has finished every call told before."""
    done = threading.Event()
    assert call_listener(store._subscriptions._entries[0].listener, lambda _: done.set(), None, "sync")
    assert done.wait(TIMEOUT_S)


def test_a_raising_subscriber_causes_no_restart_and_is_logged_with_its_name_once_a_minute(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 58 F4: a line per call (500 lines/s from a subscriber raising at every arrival).
    The first is logged in full, then a line a minute of the store's ticker with the count."""
    ticker = ManualTicker()
    calls: list[MessageArrived] = []

    def broken_subscriber(event: MessageArrived) -> None:
        calls.append(event)
        raise RuntimeError("host bug")

    def raised() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "listener raised"]

    with caplog.at_level(logging.ERROR, logger="mqstore"), h.open_small(store_dir, ticker=ticker) as store:
        store.subscribe(broken_subscriber, topic="t")
        for i in range(20):
            assert store.put(Message(topic="t", body=b"%d" % i)).ok
            h.wait_until(lambda: len(calls) == i + 1, what="the call")  # one dispatch batch per put: 20 arrivals
        assert store.supervisor.restarts == [] and store.running
        assert [e.max_offset for e in calls] == list(range(1, 21))
        _listener_idle(store)
        assert len(raised()) == 1
        ticker.advance(REPEAT_LOG_INTERVAL_MS)
        assert store.put(Message(topic="t", body=b"later")).ok
        h.wait_until(lambda: len(raised()) == 2, what="the minute's line")
    assert [r.mqstore_event.get("suppressed") for r in raised()] == [None, 19]
    assert all("broken_subscriber" in r.mqstore_event["listener"] for r in raised())


def test_a_stuck_subscriber_holds_one_notice_per_queue_and_hears_of_each_queue_once_free(store_dir: Path) -> None:
    """Review 58 F3: a subscriber callback that hangs (a network call) made its listener's
    inbox take one notice per dispatch batch, without bound (4,161 after 120k puts). Notices it
    has not taken coalesce, the newest per queue (`max_offset` is absolute): what waits is
    bounded by the queues, and once free it hears of every queue, at its newest offset."""
    release, entered = threading.Event(), threading.Event()
    calls: list[tuple[str, int, int]] = []

    def stuck(event: MessageArrived) -> None:
        entered.set()
        assert release.wait(TIMEOUT_S)
        calls.append((event.topic, event.queue_id, event.max_offset))

    with h.open_small(store_dir) as store:
        store.subscribe(stuck)
        assert store.put(Message(topic="t", body=b"first")).ok
        assert entered.wait(TIMEOUT_S)  # stuck in its first call
        for _ in range(20):
            for queue_id in range(3):
                assert store.put(Message(topic="t", body=b"x", queue_id=queue_id)).ok
                h.wait_dispatched(store)  # a batch each: 60 notices
        listener = store._subscriptions._entries[0].listener
        assert listener is not None and listener.actor_inbox.qsize() <= 1  # was 60
        release.set()
        h.wait_until(lambda: len(calls) == 4, what="the notices")
        _listener_idle(store)
    assert calls == [("t", 0, 1), ("t", 0, 21), ("t", 1, 20), ("t", 2, 20)]


def test_a_slow_reply_callback_does_not_stall_puts(store_dir: Path) -> None:
    release = threading.Event()
    callback_saw_release: list[bool] = []
    answered: list[Any] = []

    def slow_callback(answer: Any) -> None:
        answered.append(answer)
        callback_saw_release.append(release.wait(TIMEOUT_S))

    with h.open_small(store_dir) as store:
        store.actor_ref.tell(Put(messages=(GOOD,), reply=Reply(callback=slow_callback)))
        h.wait_until(lambda: bool(answered), what="the callback to be called")
        # The callback is blocked; the writer is not: puts from this thread and through the
        # gateway are answered while it waits.
        assert store.put(Message(topic="t", body=b"next")).ok
        assert _ask(store, lambda r: Put(messages=(Message(topic="t", body=b"via actor"),), reply=r)).ok
        release.set()
        h.wait_until(lambda: bool(callback_saw_release), what="the callback to return")
        assert callback_saw_release == [True] and answered[0].ok


def test_a_subscriber_actor_that_died_is_dropped(store_dir: Path) -> None:
    class Sink(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> None:
            return None

    with h.open_small(store_dir) as store:
        sink = Sink.start()
        store.subscribe(sink, topic="t")
        sink.stop()
        assert store.put(GOOD).ok
        h.wait_dispatched(store)
        h.wait_until(lambda: not store._subscriptions.subscribers(), what="the dead subscriber dropped")
        assert store.supervisor.restarts == []


def test_dropping_or_unsubscribing_a_subscriber_runs_no_subscribers_eq(store_dir: Path) -> None:
    """Review 131 F3: a dead actor's subscription was dropped on reput's thread by comparing
    every other subscriber with `==`, the host's code, under the subscriptions' lock: one that
    blocked stopped dispatch, and the close waited on the lock for good. One whose `==` is
    always True, unsubscribed, took every other subscriber with it. Who a subscriber is is its
    identity now."""
    compared: list[str] = []

    class Sink(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> None:
            return None

    class EqualToAll:
        def __call__(self, arrived: Any) -> None:
            return None

        def __eq__(self, other: object) -> bool:
            compared.append(threading.current_thread().name)
            return True

        __hash__ = object.__hash__

    heard: list[Any] = []
    with h.open_small(store_dir) as store:
        subscribed = EqualToAll()
        store.subscribe(subscribed, topic="t")
        store.subscribe(heard.append, topic="t")
        sink = Sink.start()
        store.subscribe(sink, topic="t")
        sink.stop()
        assert store.put(GOOD).ok
        h.wait_dispatched(store)
        h.wait_until(lambda: len(store._subscriptions.subscribers()) == 2, what="the dead subscriber dropped")
        store.unsubscribe(EqualToAll())  # equal to everything, the same as nothing subscribed
        assert len(store._subscriptions.subscribers()) == 2
        store.unsubscribe(subscribed)
        assert store._subscriptions.subscribers() == [heard.append]
        assert compared == []


def test_a_subscriber_actor_that_stopped_is_dropped_though_its_queues_stay_quiet(store_dir: Path) -> None:
    """Review 84 F1: one that stopped without unsubscribing was dropped only at its next notice:
    per-session actors subscribed to their own topics piled up for good (5.6 KB each; 20k
    slowed every dispatch to ~1 ms). Gone at the next tick (the supervisor's, once a second),
    with no put at all."""

    class Sink(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> None:
            return None

    with h.open_small(store_dir) as store:
        ticked = [hook for hook in store.supervisor.ctx.on_tick_ms if getattr(hook, "__name__", "") == "_drop_stopped_subscribers"]
        assert len(ticked) == 1
        sessions = [Sink.start() for _ in range(20)]
        for i, sink in enumerate(sessions):
            store.subscribe(sink, topic=f"session{i}")
        kept = Sink.start()
        try:
            store.subscribe(kept, topic="kept")
            for sink in sessions[:10]:
                sink.stop()
            ticked[0](0)  # the tick hook
            assert len(store._subscriptions.subscribers()) == 11
            for sink in sessions[10:]:
                sink.stop()
            h.wait_until(lambda: len(store._subscriptions.subscribers()) == 1, what="the supervisor's tick")
            assert store._subscriptions.subscribers() == [kept]
        finally:
            kept.stop()


def test_a_callable_subscribed_to_many_queues_has_one_listener_thread(store_dir: Path) -> None:
    """Review 84 F2: a thread per (callable, filter): one callback per queue of 500 queues ran
    512 threads. One listener per callable now, which also never calls the host's callable
    from two threads at once; it hears each filter's events, and goes with its unsubscribe."""
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def on_arrival(event: MessageArrived) -> None:
        with lock:
            seen.append((event.topic, event.queue_id))

    def listeners_since(before: set[threading.Thread]) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before and t.name.startswith("Listener-")]

    with h.open_small(store_dir) as store:
        before = set(threading.enumerate())
        for queue_id in range(40):
            store.subscribe(on_arrival, topic="t", queue_id=queue_id)
        store.subscribe(on_arrival, queue_id=41)  # a queue of any topic
        assert len(listeners_since(before)) == 1
        for queue_id in (0, 17, 39, 41):
            assert store.put(Message(topic="t", body=b"x", queue_id=queue_id)).ok
        assert store.put(Message(topic="u", body=b"x", queue_id=41)).ok
        assert store.put(Message(topic="t", body=b"x", queue_id=40)).ok  # no subscription
        h.wait_until(lambda: len(seen) >= 5, what="the five notices")
        h.wait_dispatched(store)
        assert sorted(seen) == [("t", 0), ("t", 17), ("t", 39), ("t", 41), ("u", 41)]
        store.unsubscribe(on_arrival)
        h.wait_until(lambda: not listeners_since(before), what="the listener's end")


def test_subscriptions_hear_what_their_filters_match_in_subscription_order(store_dir: Path) -> None:
    """Publish looks a notice's subscriptions up by filter (review 84: it visited every one):
    each kind of filter matches as before, and subscribers hear in the order they subscribed."""
    heard: list[str] = []
    lock = threading.Lock()

    class Recorder(pykka.ThreadingActor):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def on_receive(self, message: Any) -> None:
            if isinstance(message, MessageArrived):
                with lock:
                    heard.append(f"{self.name}:{message.topic}/{message.queue_id}")

    filters: dict[str, tuple[str | None, int | None]] = {
        "all": (None, None), "topic": ("t", None), "queue": (None, 2), "both": ("t", 2), "other": ("u", None)}  # fmt: skip
    with h.open_small(store_dir) as store:
        refs = {name: Recorder.start(name) for name in filters}
        try:
            for name, (topic, queue_id) in filters.items():
                store.subscribe(refs[name], topic, queue_id)
            assert store.put(Message(topic="t", body=b"x", queue_id=2)).ok
            h.wait_until(lambda: len(heard) >= 4, what="four notices")
            h.wait_dispatched(store)
            assert sorted(heard) == ["all:t/2", "both:t/2", "queue:t/2", "topic:t/2"]
            heard.clear()
            assert store.put(Message(topic="v", body=b"x", queue_id=0)).ok
            h.wait_until(lambda: len(heard) >= 1, what="one notice")
            h.wait_dispatched(store)
            assert heard == ["all:v/0"]
        finally:
            for ref in refs.values():
                ref.stop()
    # In subscription order, whichever filters they subscribed with.
    from mqstore.runtime import Subscriptions

    order: list[str] = []
    subs = Subscriptions()
    subs._deliver = lambda entry, _event: order.append(entry.name) or True  # type: ignore[method-assign]
    for name, (topic, queue_id) in (("b", ("t", 2)), ("a", (None, None)), ("c", ("t", None)), ("d", (None, 2))):
        subs.add(_named(name), topic, queue_id)
    subs.publish([MessageArrived(topic="t", queue_id=2, max_offset=1, store_timestamp=0)])
    assert order == ["b", "a", "c", "d"]
    subs.close()


def _named(name: str) -> Any:
    def callback(_event: Any) -> None:
        pass

    callback.__qualname__ = name
    return callback


def test_a_raising_reply_callback_is_logged_and_restarts_nothing(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    called = threading.Event()

    def raising_callback(_answer: Any) -> None:
        called.set()
        raise RuntimeError("host bug in a callback")

    with caplog.at_level(logging.ERROR, logger="mqstore"), h.open_small(store_dir) as store:
        store.actor_ref.tell(Put(messages=(GOOD,), reply=Reply(callback=raising_callback)))
        assert called.wait(TIMEOUT_S)
        assert store.put(Message(topic="t", body=b"next")).ok
        assert store.supervisor.restarts == [] and store.running
    h.wait_until(lambda: any(r.getMessage() == "listener raised" for r in caplog.records), what="the log line")
    raised = [r for r in caplog.records if r.getMessage() == "listener raised"]
    assert "raising_callback" in raised[0].mqstore_event["listener"]


def test_a_put_the_gateway_meets_after_close_began_fails_with_store_closed(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with h.open_small(store_dir) as store:

        def closed(*_args: Any, **_kwargs: Any) -> Any:  # what submit_put raises once close() began
            raise StoreClosedError("the store is closed")

        monkeypatch.setattr(store, "submit_put", closed)
        monkeypatch.setattr(store, "subscribe", closed)
        with pytest.raises(StoreClosedError):
            _ask(store, lambda r: Put(messages=(GOOD,), reply=r))
        store.actor_ref.tell(Subscribe(subscriber=lambda _e: None, topic="t"))
        monkeypatch.undo()
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
        assert store.supervisor.restarts == []


class _PutThenRead(pykka.ThreadingActor):
    """Puts one message through its actor client; when the answer arrives, reads the queue at
    that message's offset through the actor API (the gateway's readers); then the next."""

    def __init__(self, store: Any, total: int, put_through_gateway: bool, done: threading.Event) -> None:
        super().__init__()
        self.store, self.total, self.via_gateway, self.done = store, total, put_through_gateway, done
        self.sent = 0
        self.misses: list[int] = []
        self.failures: list[str] = []

    def on_start(self) -> None:
        self.client = self.store.actor_client(self.actor_ref)
        self._put()

    def _put(self) -> None:
        if self.sent == self.total:
            self.done.set()
            return
        message = Message(topic="ryw", body=b"m%d" % self.sent)
        if self.via_gateway:
            self.store.actor_ref.tell(Put(messages=(message,), reply=Reply(actor=self.actor_ref, correlation_id="put")))
        else:
            self.client.put(message, correlation_id="put")
        self.sent += 1

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Replied):
            return None
        answer = message.answer
        if message.correlation_id == "put":
            if not isinstance(answer, PutResult) or not answer.ok:
                self.failures.append(repr(answer))
                self.done.set()
                return None
            get = Get(topic="ryw", queue_id=0, offset=answer.queue_offset, max_count=1,
                      reply=Reply(actor=self.actor_ref, correlation_id=answer.queue_offset))  # fmt: skip
            self.store.actor_ref.tell(get)
        else:
            if not isinstance(answer, GetResult) or [m.body for m in answer.messages] != [b"m%d" % message.correlation_id]:
                self.misses.append(message.correlation_id)
            self._put()
        return None


@pytest.mark.parametrize("via_gateway", [False, True], ids=["actor client", "gateway Put"])
def test_an_actors_read_after_its_put_answered_reflects_the_put(store_dir: Path, via_gateway: bool) -> None:
    """Read-your-writes holds for actors as for threads: once an actor has its put's answer,
    its next Get through the actor API finds the message (dispatch to the queues is
    asynchronous; without the rule most such reads came back empty)."""
    with h.open_small(store_dir) as store:
        done = threading.Event()
        actor = _PutThenRead.start(store, 1000, via_gateway, done)
        try:
            assert done.wait(60)
            state = actor.proxy()
            assert state.failures.get() == []
            assert state.misses.get() == [], "reads that left out the actor's own acknowledged put"
        finally:
            actor.stop()


class _HostActor(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return message


def test_a_callback_that_raises_system_exit_is_logged_and_stops_no_actor_of_the_host(store_dir: Path) -> None:
    """Review 93 M2: a subscriber's or a reply callback's SystemExit (sys.exit() in host code)
    left the listener for pykka's loop, which answered it with ActorRegistry.stop_all(): every
    actor of the host stopped, unsaid. (Review 59 M2 had made the dead listener's subscriber
    dropped.) Logged now, as a put's done-callback's is; the subscription goes on."""
    calls: list[tuple[int, int]] = []
    replies: list[object] = []

    def exits_once(event: MessageArrived) -> None:
        calls.append((event.queue_id, event.max_offset))
        if len(calls) == 1:
            raise SystemExit(3)

    def reply_exits(result: object) -> None:
        replies.append(result)
        raise SystemExit(4)

    host = _HostActor.start()
    try:
        with h.open_small(store_dir) as store:
            store.subscribe(exits_once, topic="t")
            assert store.put(Message(topic="t", body=b"x")).ok
            h.wait_until(lambda: len(calls) == 1, what="the first call")
            assert store.put(Message(topic="t", body=b"x")).ok
            h.wait_until(lambda: len(calls) == 2, what="the call after the SystemExit")
            assert calls[1] == (0, 2) and store._subscriptions.subscribers()
            store.actor_ref.tell(Put(messages=(GOOD,), reply=Reply(callback=reply_exits)))
            store.actor_ref.tell(Put(messages=(GOOD,), reply=Reply(callback=reply_exits)))
            h.wait_until(lambda: len(replies) == 2, what="both reply callbacks, the first having exited")
            assert host.is_alive() and host.ask("still here", timeout=5) == "still here"
            assert store.supervisor.restarts == []
    finally:
        host.stop()


def test_the_supervisor_keeps_the_newest_restart_records_and_counts_them_all(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway may crash and be restarted for as long as the store runs (so may a writer on a
    full btrfs, every second): each restart's record (~340 B) was kept for good (review 76 L2)."""
    monkeypatch.setattr(supervisor_module, "KEPT_RESTART_RECORDS", 3)
    monkeypatch.setattr(supervisor_module, "BACKOFF_MAX_MS", 10)
    plan = FaultPlan()
    with h.open_small(store_dir, faults=plan) as store:
        for n in range(1, 7):
            plan.arm("gateway.mid_request")
            with pytest.raises(ServiceUnavailable, match="gateway failed"):
                _ask(store, lambda r: Put(messages=(GOOD,), reply=r))
            h.wait_until(lambda n=n: store.supervisor.restart_count == n, what=f"restart {n}")
            h.wait_until(lambda: "gateway" in store.supervisor.peers and store.supervisor.peers["gateway"].is_alive())
        assert len(store.supervisor.restarts) == 3 and store.supervisor.restart_count == 6
        assert all(r.failed == "gateway" for r in store.supervisor.restarts)
        assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok


def test_a_callback_exception_whose_repr_exits_stops_no_actor_of_the_host(store_dir: Path) -> None:
    """Review 95 L2: the listener caught the callback's exception, then its log line's repr()
    raised SystemExit, which reached pykka's loop: ActorRegistry.stop_all() again."""

    class Odd(Exception):
        def __repr__(self) -> str:
            raise SystemExit("from a repr")

    calls: list[int] = []

    def raises_odd(_event: MessageArrived) -> None:
        calls.append(1)
        raise Odd

    host = _HostActor.start()
    try:
        with h.open_small(store_dir) as store:
            store.subscribe(raises_odd, topic="t")
            for n in (1, 2):
                assert store.put(Message(topic="t", body=b"x")).ok
                h.wait_until(lambda n=n: len(calls) == n, what=f"call {n}")
            assert host.is_alive() and host.ask("still here", timeout=5) == "still here"
    finally:
        host.stop()


class _ExitsWhenRead(dict[str, str]):
    """A host's properties mapping that runs sys.exit() when the store reads it."""

    def __iter__(self) -> Any:
        raise SystemExit("read")

    def items(self) -> Any:
        raise SystemExit("read")

    def __len__(self) -> int:
        raise SystemExit("read")


def test_a_put_whose_mapping_exits_when_read_is_answered_and_stops_no_actor(store_dir: Path) -> None:
    """Review 136 F1: a Put whose properties mapping raised SystemExit as the gateway read it
    reached pykka's loop: the put was never answered, the gateway stopped for good (the actor
    API dead while the store said RUNNING), and ActorRegistry.stop_all() stopped the host's
    actors. That put is answered with the error; the rest go on."""
    host = _HostActor.start()
    try:
        with h.open_small(store_dir) as store:
            with pytest.raises(RuntimeError, match="SystemExit"):
                _ask(store, lambda r: Put(messages=(Message(topic="t", body=b"x", properties=_ExitsWhenRead(a="b")),), reply=r))
            assert _ask(store, lambda r: Put(messages=(GOOD,), reply=r)).ok
            assert store.supervisor.restarts == [] and host.is_alive()
    finally:
        host.stop()
