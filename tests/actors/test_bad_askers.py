"""Whatever an asker does, the actor API keeps answering: an asker that stops before its
answer comes, a reply target of the wrong type, a message field of the wrong type. Before,
each crashed a gateway actor, and ten of them in a minute stopped the whole store (FAILED,
every later put SERVICE_NOT_AVAILABLE)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pykka
import pytest

import mqstore
from mqstore import GetMessageStatus, Message, Reply
from mqstore import log as store_log
from mqstore.actors.base import StoppedBeforeHandling
from mqstore.actors.gateway import GATEWAY_READERS
from mqstore.messages import Get, Ping, Put, Subscribe, Unsubscribe, Waiter
from mqstore.ticker import ManualTicker

TIMEOUT_S = 10.0


class _Gone(pykka.ThreadingActor):
    pass


def _stopped_actor() -> pykka.ActorRef[Any]:
    ref = _Gone.start()
    ref.stop()
    return ref


def _answered_in_order(store: mqstore.MessageStore) -> None:
    """Gets (one per reader) and a put told after the bad requests are answered (the gateway
    hands gets to its readers in turn, and each takes its requests in order, so the bad ones
    were handled first) and nothing was restarted."""
    gets = [Waiter() for _ in range(GATEWAY_READERS)]
    for got in gets:
        store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(future=got)))
    put = Waiter()
    store.actor_ref.tell(Put(messages=(Message("t", b"after"),), reply=Reply(future=put)))
    for got in gets:
        assert got.get(timeout=TIMEOUT_S).status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MESSAGE_IN_QUEUE)
    assert put.get(timeout=TIMEOUT_S).ok
    assert store.supervisor.restarts == [] and store.running


def test_a_get_whose_asker_stopped_is_dropped_without_a_restart(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        gone = _stopped_actor()
        for _ in range(GATEWAY_READERS):
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(actor=gone)))
        _answered_in_order(store)


def test_a_refused_request_whose_asker_stopped_is_dropped_without_a_restart(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        gone = _stopped_actor()
        store.actor_ref.tell(Get(topic=5, queue_id=0, offset=0, max_count=1, reply=Reply(actor=gone)))  # type: ignore[arg-type]
        store.actor_ref.tell(Put(messages=(Message("t", b"x", born_host=5),), reply=Reply(actor=gone)))  # type: ignore[arg-type]
        _answered_in_order(store)


def test_askers_that_stop_cannot_stop_the_store(tmp_path: Path) -> None:
    """More than the supervisor's restart intensity (10 a minute) of them."""
    fatal: list[BaseException] = []
    with mqstore.open(tmp_path / "s", on_fatal=fatal.append) as store:
        store.put(Message("t", b"x"))
        gone = _stopped_actor()
        for _ in range(15):
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(actor=gone)))
        _answered_in_order(store)
        assert fatal == []


def test_answers_to_an_asker_that_stopped_are_logged_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 58 F4: a host asking again and again for an actor that had stopped logged a
    line per answer (1.8k lines/s). A Reply is no one store's: the process's repeat log
    (real time, here a manual ticker) limits them, the first in full."""
    ticker = ManualTicker()
    monkeypatch.setattr(store_log, "PROCESS_REPEATS", store_log.RepeatedLog(ticker.now_ms))

    def dropped() -> list[dict[str, Any]]:
        return [r.mqstore_event for r in caplog.records if r.getMessage() == "an answer could not be delivered; dropped"]

    with caplog.at_level(logging.WARNING, logger="mqstore"), mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        gone = _stopped_actor()
        for _ in range(50):
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(actor=gone)))
        _answered_in_order(store)
        assert [(line["target"], "suppressed" in line) for line in dropped()] == [("actor", False)]
        ticker.advance(store_log.REPEAT_LOG_INTERVAL_MS)
        store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(actor=gone)))
        _answered_in_order(store)
    assert [line.get("suppressed") for line in dropped()] == [None, 49]


@pytest.mark.parametrize("target", ["future", "actor", "callback"])
def test_a_reply_target_of_the_wrong_type_is_a_type_error_where_it_is_made(target: str) -> None:
    with pytest.raises(TypeError, match=f"Reply.{target}"):
        Reply(**{target: "nope"})


def test_a_put_with_a_born_host_that_is_not_a_str_is_answered_with_a_type_error(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        waiter = Waiter()
        store.actor_ref.tell(Put(messages=(Message("t", b"x", born_host=5),), reply=Reply(future=waiter)))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="born_host"):  # from the encoder's field check
            waiter.get(timeout=TIMEOUT_S)
        _answered_in_order(store)


def test_an_actor_client_put_refused_for_a_stopped_sender_is_dropped_not_raised(tmp_path: Path) -> None:
    """A put refused before the writer (here, too large) is answered to the sender from the
    caller's thread. A sender that had stopped raised pykka's ActorDeadError into the caller;
    the writer's answers to a stopped sender were already dropped with a warning."""
    with mqstore.open(tmp_path / "s", max_message_size_bytes=1024) as store:
        client = store.actor_client(_stopped_actor())
        assert client.put(Message("t", b"x" * 2048), correlation_id=1) is False
        assert client.put_batch([Message("t", b"x" * 2048)], correlation_id=2) is False
        assert client.put_and_forget(Message("t", b"x" * 2048)) is False
        assert store.put(Message("t", b"after")).ok and store.running


class _Quiet(pykka.ThreadingActor):
    use_daemon_thread = True

    def on_receive(self, message: Any) -> Any:
        return self  # asked once: the actor object, for a ref of the host's own class


class _RaisingRef(pykka.ActorRef[Any]):
    """A host's own ref (a wrapper for metrics, say) whose tell raises, not ActorDeadError."""

    def tell(self, message: Any) -> None:
        raise RuntimeError("the host's ref refused the tell")


@pytest.mark.parametrize("request_kind", ["get", "query", "refused", "subscribe"])
def test_a_reply_target_or_subscriber_whose_tell_raises_restarts_nothing(tmp_path: Path, request_kind: str) -> None:
    """Review 27 finding 2: only ActorDeadError was caught where a store actor tells the
    host's ref. Any other error crashed the gateway reader (Get, Query), the gateway itself (a
    refused request's error) or reput (a subscriber, at every dispatch to its topic), and a
    dozen such requests stopped the whole store. A ref of the host's own class is told on the
    blocking-tells listener now (its tell may block too); there its error is logged, the
    answer dropped and a subscriber unsubscribed (review 28: it stayed subscribed, and failed
    at every dispatch)."""
    from mqstore.messages import Query, Subscribe

    target = _Quiet.start()
    ref = _RaisingRef(target.ask("who"))
    try:
        with mqstore.open(tmp_path / "s") as store:
            assert store.put(Message("t", b"x", keys=["k"])).ok
            for _ in range(12):  # more than the supervisor's restart budget
                request: Any = {
                    "get": lambda: Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(actor=ref)),
                    "query": lambda: Query(topic="t", key="k", max_count=1, reply=Reply(actor=ref)),
                    "refused": lambda: Get(topic="t", queue_id=0, offset=-1, max_count=1, reply=Reply(actor=ref)),
                    "subscribe": lambda: Subscribe(subscriber=ref, topic="t"),
                }[request_kind]()
                store.actor_ref.tell(request)
                assert store.put(Message("t", b"y")).ok  # (dispatched: the subscriber is told)
            waiter = Waiter()  # answered once the gateway has taken every request before it
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=32, reply=Reply(future=waiter)))
            waiter.get(timeout=TIMEOUT_S)
            assert len(store.get("t", 0, 0, 32).messages) == 13
            assert store.flush() is None
            assert store.supervisor.restarts == [] and store.running
            if request_kind == "subscribe":
                # The last Subscribe may have been taken after reput dispatched the put after
                # it (the gateway and reput run apart): the waiter proves it registered, and
                # one more put is dispatched to it for certain.
                assert store.put(Message("t", b"z")).ok
                deadline = time.monotonic() + TIMEOUT_S
                while ref in store._subscriptions.subscribers() and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert ref not in store._subscriptions.subscribers()
    finally:
        target.stop()


def test_a_hosts_stop_all_leaves_the_store_running(tmp_path: Path) -> None:
    """Review 27 finding 4: the store's actors were in pykka's global registry, so a host's
    `ActorRegistry.stop_all()` (pykka's own advice at shutdown; pykka also runs it when any
    actor raises SystemExit) stopped them behind the supervisor's back. The store said RUNNING
    with nothing running: puts said "writer is restarting" for good, flush() timed out. The
    store's actors are out of the registry now; the store stops them at close()."""
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(Message("t", b"before")).ok
        pykka.ActorRegistry.stop_all(block=True, timeout=TIMEOUT_S)
        assert store.put(Message("t", b"after")).ok
        store.flush()
        assert [m.body for m in store.get("t", 0, 0, 32).messages] == [b"before", b"after"]
        assert store.supervisor.restarts == []
    with mqstore.open(tmp_path / "s") as again:
        assert [m.body for m in again.get("t", 0, 0, 32).messages] == [b"before", b"after"]


@pytest.mark.parametrize("how", ["tell", "ask"])
@pytest.mark.parametrize(
    "control",
    [
        pykka.messages._ActorStop(),
        pykka.messages.ProxyCall(attr_path=("release",), args=(), kwargs={}),
        pykka.messages.ProxyGetAttr(attr_path=("backend",)),
        pykka.messages.ProxySetAttr(attr_path=("backend",), value=None),
    ],
    ids=["stop", "proxy call", "proxy get", "proxy set"],
)
def test_pykkas_own_control_messages_are_refused_where_they_are_told(tmp_path: Path, how: str, control: Any) -> None:
    """Review 103 M2, L1: pykka's actor loop runs its control messages itself, before the
    gateway's own checks: `_ActorStop` (what `ActorRef.stop()` sends) told to `store.actor_ref`
    stopped the gateway for good while the supervisor said RUNNING, and a `ProxyCall` of
    `release` stopped its readers for good. They are a TypeError where they are told, as
    `store.actor_ref.stop()` is, and the actor API goes on."""
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        send = store.actor_ref.tell if how == "tell" else store.actor_ref.ask
        with pytest.raises(TypeError, match="pykka's own control message"):
            send(control)
        _answered_in_order(store)
        assert store.actor_ref.is_alive()


class _Unhashable(type):
    def __hash__(cls) -> int:
        raise RuntimeError("hash of a caller's class")


class _OddRequest(metaclass=_Unhashable):
    pass


def test_a_request_of_a_type_whose_hash_raises_is_dropped_without_a_restart(tmp_path: Path) -> None:
    """Review 104 F4: the gateway's log throttle keyed its lines by the request's type, whose
    hash (a caller's metaclass) may raise: the gateway crashed and restarted each time, and
    its other callers got ActorDeadError meanwhile."""
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        for _ in range(3):
            store.actor_ref.tell(_OddRequest())
        _answered_in_order(store)


class _BoundedAndBusy(pykka.ThreadingActor):
    """A host actor with a bounded inbox that stops taking messages until `release` is set."""

    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> Any:
        import queue

        return queue.Queue(maxsize=2)

    def __init__(self, release: Any) -> None:
        super().__init__()
        self.release = release
        self.got: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        if message == "count":
            return len(self.got)
        self.release.wait(TIMEOUT_S)
        self.got.append(message)
        return None


@pytest.mark.parametrize("told_by", ["writer", "reput"])
def test_a_host_actor_slow_to_take_its_answers_blocks_nothing_of_the_store(tmp_path: Path, told_by: str) -> None:
    """Review 27 finding 3: the writer told an actor client's answers, and reput a subscriber's
    arrivals, on their own threads. With a bounded inbox its actor was slow to empty, the tell
    blocked: every put of the process waited out its 20 s, or all dispatch stopped, and the
    close was unclean and kept the lock. Such a ref is told on the notifier's thread now."""
    import threading
    import time

    release = threading.Event()
    slow = _BoundedAndBusy.start(release)
    try:
        with mqstore.open(tmp_path / "s") as store:
            if told_by == "writer":
                client = store.actor_client(slow)
                for i in range(8):  # more answers than its inbox holds
                    client.put(Message("slow", b"%d" % i), correlation_id=i)
            else:
                store.subscribe(slow, topic="t")
                for i in range(8):  # one dispatch, one arrival each: more than its inbox holds
                    assert store.put(Message("t", b"%d" % i)).ok
                    assert store.wait_for_messages("t", 0, i, TIMEOUT_S / 4)
            started = time.monotonic()
            for i in range(20):
                assert store.put(Message("t", b"other %d" % i)).ok
            got = store.get("t", 0, 0, 64)
            assert len(got.messages) == 20 + (8 if told_by == "reput" else 0)
            assert time.monotonic() - started < TIMEOUT_S / 2
            # Nor a reply callback, of this store or another (review 28: they shared one listener).
            answered = threading.Event()
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1,
                                     reply=Reply(callback=lambda answer: answered.set())))  # fmt: skip
            assert answered.wait(TIMEOUT_S / 2), "a reply callback waited behind the stuck actor"
            release.set()
            expected = 8 if told_by == "writer" else 1  # (arrivals are told per dispatch batch)
            deadline = time.monotonic() + TIMEOUT_S
            while slow.ask("count") < expected and time.monotonic() < deadline:
                time.sleep(0.01)
            assert slow.ask("count") >= expected  # its answers or arrivals came, once it took them
        assert store.supervisor.lock_released.is_set()
    finally:
        release.set()
        slow.stop()


def test_an_actor_subscriber_stuck_behind_its_bounded_inbox_holds_one_notice_per_queue(tmp_path: Path) -> None:
    """Review 58 F3: the arrivals for a subscribed actor whose bounded inbox is full wait on the
    "blocking-tells" listener: one told call per dispatch batch, without bound. They coalesce
    now, the newest per queue, and the actor hears the newest of each queue once it takes them."""
    import threading

    from mqstore import MessageArrived, runtime

    release = threading.Event()
    slow = _BoundedAndBusy.start(release)
    try:
        with mqstore.open(tmp_path / "s") as store:
            store.subscribe(slow, topic="t")
            for i in range(30):  # one dispatch, one arrival each: far more than its inbox holds
                assert store.put(Message("t", b"%d" % i, queue_id=i % 3)).ok
                assert store.wait_for_messages("t", i % 3, i // 3, TIMEOUT_S / 4)
            shared = runtime._shared["blocking-tells"]
            assert shared.actor_inbox.qsize() <= 1  # was 27 or so: one call per arrival
            release.set()
            newest = {("t", q): 10 for q in range(3)}

            def heard() -> dict[tuple[str, int], int]:
                got: list[Any] = slow.proxy().got.get(timeout=TIMEOUT_S)
                arrived = [a for a in got if isinstance(a, MessageArrived)]
                return {(a.topic, a.queue_id): max(b.max_offset for b in arrived if b.queue_id == a.queue_id) for a in arrived}

            deadline = time.monotonic() + TIMEOUT_S
            while heard() != newest and time.monotonic() < deadline:
                time.sleep(0.01)
            assert heard() == newest
    finally:
        release.set()
        slow.stop()


# Review 44 H1: requests that raised something other than TypeError/ValueError while the
# gateway read them crashed it; eleven in a minute stopped the whole store.


class _RaisingMapping(Mapping[str, str]):
    """A client's properties mapping that fails while it is read."""

    def __getitem__(self, key: str) -> str:
        raise RuntimeError("the client's mapping failed")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("the client's mapping failed")

    def __len__(self) -> int:
        return 1


class _ReprRaises:
    """A callable whose repr raises (and a partial-like object without __qualname__)."""

    def __call__(self, answer: object) -> None:
        self.answers.append(answer)

    def __init__(self) -> None:
        self.answers: list[object] = []

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _EqRaises:
    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value of an array is ambiguous")

    __hash__ = object.__hash__

    def __call__(self, arrived: object) -> None:
        pass


def test_requests_that_raise_while_read_are_answered_and_never_stop_the_store(tmp_path: Path) -> None:
    """More of them than the store's restart budget: each is answered (or logged), nothing is
    restarted, and the store and the actor API go on."""
    fatal: list[BaseException] = []
    with mqstore.open(tmp_path / "s", on_fatal=fatal.append) as store:
        store.put(Message("t", b"x"))
        failed = []
        for _ in range(12):
            waiter = Waiter()
            bad = Message("t", b"x", properties=_RaisingMapping())
            store.actor_ref.tell(Put(messages=(bad,), reply=Reply(future=waiter)))
            failed.append(waiter)
            store.actor_ref.tell(Subscribe(subscriber=lambda arrived: None, topic="t", queue_id=-1))
            store.actor_ref.tell(Unsubscribe(subscriber=_EqRaises()))
        for waiter in failed:
            with pytest.raises(RuntimeError, match="the client's mapping failed"):
                waiter.get(timeout=TIMEOUT_S)
        _answered_in_order(store)
        assert fatal == []


def test_a_get_answered_to_a_callback_whose_repr_raises_reaches_it(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        callback = _ReprRaises()
        for _ in range(GATEWAY_READERS):
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(callback=callback)))
        _answered_in_order(store)
        deadline = time.monotonic() + TIMEOUT_S
        while len(callback.answers) < GATEWAY_READERS and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [type(a).__name__ for a in callback.answers] == ["GetResult"] * GATEWAY_READERS


def test_the_gateway_crashing_more_than_the_restart_budget_does_not_stop_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own bug (an injected fault in every request): restarted each time with back-off,
    never counted against the actors that own the store's files."""
    from mqstore import supervisor
    from mqstore.faults import FaultPlan
    from mqstore.supervisor import MAX_RESTARTS

    monkeypatch.setattr(supervisor, "BACKOFF_MAX_MS", 20)  # (the count matters here, not the pause)

    fatal: list[BaseException] = []
    plan = FaultPlan()
    with mqstore.open(tmp_path / "s", on_fatal=fatal.append, faults=plan) as store:
        plan.arm("gateway.mid_request", times=MAX_RESTARTS + 2)
        # The first crash; each start handshake of a restarted gateway crashes again (a Ping
        # through the same handler) until the plan is spent: MAX_RESTARTS + 2 failures.
        with contextlib.suppress(pykka.ActorDeadError):
            store.actor_ref.tell(Ping())
        deadline = time.monotonic() + 60
        while plan.fired.get("gateway.mid_request", 0) < MAX_RESTARTS + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert plan.fired["gateway.mid_request"] == MAX_RESTARTS + 2
        _answered_in_order_after_restarts(store)
        # The supervisor's thread records a restart once its group has started: the restarted
        # gateway can answer the get and the put above first (under load: restarts was []).
        deadline = time.monotonic() + TIMEOUT_S
        while not store.supervisor.restarts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.running and fatal == [] and store.supervisor.restarts[-1].failed == "gateway"


def _answered_in_order_after_restarts(store: mqstore.MessageStore) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        got = Waiter()
        try:
            store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(future=got)))
            assert got.get(timeout=TIMEOUT_S).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
            break
        except (pykka.ActorDeadError, StoppedBeforeHandling):  # (the tell met the last crash's gateway stopping)
            assert time.monotonic() < deadline, "the gateway was not restarted"
            time.sleep(0.05)
    assert store.put(Message("t", b"after")).ok


def test_a_request_subclass_whose_fields_raise_is_refused_without_a_restart(tmp_path: Path) -> None:
    """Review 47 F3: a Put subclass whose `reply` raised when read crashed the gateway each
    time, and while it was restarted (back-off up to 1 s) every client's tell failed."""

    class EvilPut(Put):
        def __getattribute__(self, name: str) -> Any:
            if name == "reply":
                raise RuntimeError("the client's reply attribute raises")
            return object.__getattribute__(self, name)

    with mqstore.open(tmp_path / "s") as store:
        for _ in range(5):
            store.actor_ref.tell(EvilPut(messages=(Message("t", b"x"),), reply=Reply(future=Waiter())))
        _answered_in_order(store)


@pytest.mark.parametrize("request_kind", ["put", "get"])
@pytest.mark.parametrize("future_kind", ["slow set", "condition held"])
def test_a_hosts_future_is_completed_off_the_answering_actors_thread(
    tmp_path: Path, request_kind: str, future_kind: str
) -> None:
    """Review 115 F2/F3: a host's pykka future in Reply(future=...) was completed on the
    answering actor's thread, under the future's lock: a host thread holding it (a Ctrl-C inside
    its get() leaves it held) or a slow set() of a subclass froze the writer (every put of the
    store hung, close() False after 21 s) or a gateway reader (other clients' gets unanswered).
    It is host code, completed on the notifier, as a callback is."""
    import threading

    from mqstore.messages import Get, Put

    ran_on: list[str] = []
    release = threading.Event()

    class SlowFuture(pykka.ThreadingFuture[Any]):
        def set(self, value: Any = None) -> None:
            ran_on.append(threading.current_thread().name)
            release.wait(30)
            super().set(value)

    store = mqstore.open(tmp_path / "store")
    try:
        assert store.put(Message(topic="T", body=b"first")).ok
        future: pykka.ThreadingFuture[Any] = SlowFuture() if future_kind == "slow set" else pykka.ThreadingFuture()
        if future_kind == "condition held":
            held = threading.Event()

            def hold() -> None:  # as a get() interrupted inside the future's lock leaves it
                with future._condition:  # type: ignore[attr-defined]
                    held.set()
                    release.wait(30)

            threading.Thread(target=hold, daemon=True).start()
            assert held.wait(10)
        for _ in range(GATEWAY_READERS if request_kind == "get" else 1):
            if request_kind == "put":
                store.actor_ref.tell(Put(messages=(Message(topic="T", body=b"told"),), reply=Reply(future=future)))
            else:
                store.actor_ref.tell(Get(topic="T", queue_id=0, offset=0, max_count=1, reply=Reply(future=future)))
        time.sleep(0.3)
        started = time.monotonic()
        assert store.put(Message(topic="T", body=b"another thread's")).ok
        assert store.put_async(Message(topic="T", body=b"async")).result(timeout=TIMEOUT_S).ok
        other = Waiter()
        for _ in range(GATEWAY_READERS):  # through every reader
            store.actor_ref.tell(Get(topic="T", queue_id=0, offset=0, max_count=1, reply=Reply(future=other)))
            assert other.get(timeout=TIMEOUT_S).status is GetMessageStatus.FOUND
            other = Waiter()
        if future_kind == "condition held":  # another host's future is not held behind it either
            hosts: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
            store.actor_ref.tell(Get(topic="T", queue_id=0, offset=0, max_count=1, reply=Reply(future=hosts)))
            assert hosts.get(timeout=TIMEOUT_S).status is GetMessageStatus.FOUND
        assert time.monotonic() - started < 3.0
        assert "CommitLogWriter" not in " ".join(ran_on) and "GatewayReader" not in " ".join(ran_on), ran_on
        if future_kind == "condition held":
            release.set()  # the held future is completed once its lock is free
            assert future.get(timeout=TIMEOUT_S) is not None
    finally:
        release.set()
        assert store.close()
