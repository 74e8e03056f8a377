"""What an odd caller does to the embedded API (review 44): a Message subclass whose fields are
computed, a signal handler's exception in the middle of a put, a topic with a newline, a
batch of the wrong type, a refused fire-and-forget put, a lone surrogate, a blank tag filter."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pykka
import pytest

import mqstore
from mqstore import GetMessageStatus, Message, PutMessageStatus


class _Alternating(Message):
    """A 'load-balancing' message: every read of queue_id (or topic) answers the next value."""

    __slots__ = ()
    _queues = itertools.cycle(range(4))
    _topics = itertools.cycle(["ta", "tb"])

    @property  # type: ignore[override]
    def queue_id(self) -> int:
        return next(self._queues)

    @property  # type: ignore[override]
    def topic(self) -> str:
        return next(self._topics)


def _served(store: mqstore.MessageStore, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    got = store.get(topic, queue_id, 0, 1000)
    return [(m.queue_offset, m.body) for m in got.messages]


@pytest.mark.parametrize("how", ["put", "put_async", "put_batch", "actor_client", "gateway"])
def test_a_message_whose_fields_change_per_read_is_stored_as_one_reading(tmp_path: Path, how: str) -> None:
    """Review 44 H2: the store read topic and queue_id several times; a record landed in one
    queue with an offset of another queue's counter, and the next plain message of that queue
    got the same offset (served with the other's body)."""
    acked: list[tuple[str, int, int, bytes]] = []
    with mqstore.open(tmp_path / "s") as store:
        for i in range(24):
            for topic in ("ta", "tb"):
                plain = Message(topic, b"plain-%d-%s" % (i, topic.encode()), queue_id=i % 4)
                result = store.put(plain)
                assert result.ok
                acked.append((topic, plain.queue_id, result.queue_offset, plain.body))
            odd = _Alternating("ignored", b"odd-%d" % i)
            if how == "put":
                result = store.put(odd)
            elif how == "put_async":
                result = store.put_async(odd).result(timeout=10)
            elif how == "put_batch":
                result = store.put_batch([odd])
            elif how == "actor_client":
                result = _put_through_actor_client(store, odd)
            else:
                waiter = mqstore.messages.Waiter()
                store.actor_ref.tell(mqstore.messages.Put(messages=(odd,), reply=mqstore.Reply(future=waiter)))
                result = waiter.get(timeout=10)
            assert result.ok
    with mqstore.open(tmp_path / "s") as store:
        for topic, queue_id, offset, body in acked:
            served = dict(_served(store, topic, queue_id))
            assert served[offset] == body, (topic, queue_id, offset)
        for topic in ("ta", "tb"):
            for queue_id in range(4):
                offsets = [o for o, _ in _served(store, topic, queue_id)]
                assert offsets == list(range(len(offsets)))  # each queue offset once


class _Collector(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, mqstore.messages.Replied):
            self.replies.append(message.answer)
        return None


def _put_through_actor_client(store: mqstore.MessageStore, message: Message) -> Any:
    import time

    ref = _Collector.start()
    try:
        assert store.actor_client(ref).put(message, correlation_id=1)
        proxy = ref.proxy()
        deadline = time.monotonic() + 10
        while not proxy.replies.get() and time.monotonic() < deadline:
            time.sleep(0.01)
        return proxy.replies.get()[0]
    finally:
        ref.stop()


def test_a_signal_handlers_exception_in_put_async_leaks_no_slot_and_no_pending_future(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 44 H3: an exception raised by a signal handler (KeyboardInterrupt) between the
    in-flight slot's take and the hand-over kept the slot for good, and one between the
    future's registration and its `try` made every later flush() wait its whole timeout.
    Here the exception is raised where the handler would run: as the writer is told."""
    with mqstore.open(tmp_path / "s", max_puts_in_flight=4) as store:
        pipeline = store._puts
        real_tell = store._tell_writer
        interrupts = iter([True, False] * 8)

        def interrupted_tell(*args: Any, **kwargs: Any) -> Any:
            if next(interrupts, False):
                raise KeyboardInterrupt
            return real_tell(*args, **kwargs)

        monkeypatch.setattr(store, "_tell_writer", interrupted_tell)
        batch = [Message("t", b"x")]
        for _ in range(16):
            try:
                assert store.put_batch_async(batch).result(timeout=10).ok
            except KeyboardInterrupt:
                pass
        assert pipeline._free_slots == 4 and not pipeline._pending
        store.flush()  # at once: no future left behind
        assert store.put_async(Message("t", b"after")).result(timeout=10).ok


def test_slots_given_back_twice_never_raise_the_bound(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s", max_puts_in_flight=4) as store:
        store._puts._slots.give(3)  # as a put interrupted just after the writer took it
        assert store._puts._free_slots == 4


@pytest.mark.parametrize("topic", ["orders\n", "a\n", "\norders", "or\nders"])
def test_a_topic_with_a_newline_is_refused(tmp_path: Path, topic: str) -> None:
    """Review 44 M1: `$` matched before a final newline, so "orders\\n" became a directory."""
    with mqstore.open(tmp_path / "s") as store:
        result = store.put(Message(topic, b"x"))
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL and "characters outside" in result.detail
    assert not (tmp_path / "s" / "consumequeue").exists() or list((tmp_path / "s" / "consumequeue").iterdir()) == []


def test_the_actor_clients_put_batch_checks_its_argument_as_put_batch_does(tmp_path: Path) -> None:
    """Review 44 M3: AttributeError for a list of dicts, where store.put_batch says TypeError."""
    ref = _Collector.start()
    try:
        with mqstore.open(tmp_path / "s") as store:
            client = store.actor_client(ref)
            with pytest.raises(TypeError, match="mqstore.Message"):
                client.put_batch([{"topic": "t"}])  # type: ignore[list-item]
            with pytest.raises(TypeError, match="sequence of mqstore.Message"):
                client.put_batch("abc")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="must not be empty"):
                client.put_batch([])
    finally:
        ref.stop()


def test_a_refused_fire_and_forget_put_is_counted_in_the_stats(tmp_path: Path) -> None:
    """Review 44 L1: the README says a refusal nobody hears of goes to the stats and the log."""
    ref = _Collector.start()
    try:
        with mqstore.open(tmp_path / "s") as store:
            client = store.actor_client(ref)
            assert [client.put_and_forget(Message("bad/topic", b"x")) for _ in range(3)] == [False] * 3
            stats = store.stats()
            assert stats["put_message_failed_times"] == 3
            assert stats["put_message_status_times"] == {"MESSAGE_ILLEGAL": 3}
    finally:
        ref.stop()


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("topic", Message("a\ud800", b"x")),
        ("tags", Message("t", b"x", tags="\udc80")),
        ("keys", Message("t", b"x", keys=["k\ud800"])),
        ("properties['p']", Message("t", b"x", properties={"p": "\ud800"})),
    ],
)
def test_a_lone_surrogate_is_refused_naming_its_field(tmp_path: Path, field: str, message: Message) -> None:
    """Review 44 L3: a bare UnicodeEncodeError named no field."""
    with mqstore.open(tmp_path / "s") as store:
        for put in (store.put, lambda m: store.put_async(m).result(timeout=10), lambda m: store.put_batch([m])):
            try:
                result = put(message)
            except ValueError as exc:
                assert field in str(exc)
            else:
                assert result.status is PutMessageStatus.MESSAGE_ILLEGAL and field in result.detail


@pytest.mark.parametrize(("tags", "found"), [(" ", []), ("  ||  ", []), (" * ", [b"star"]), ("*", [b"a", b"star"]), ("", [b"a", b"star"])])
def test_a_tag_filter_of_blanks_matches_nothing_as_in_rocketmq(tmp_path: Path, tags: str, found: list[bytes]) -> None:
    """Review 44 L4: FilterAPI.buildSubscriptionData takes only null, "" and "*" for every
    message; blanks name no tag (nothing matches) and " * " is the tag "*"."""
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(Message("t", b"a", tags="A")).ok
        assert store.put(Message("t", b"star", tags="*")).ok
        got = store.get("t", 0, 0, 32, tags=tags)
        assert [m.body for m in got.messages] == found
        if not found:
            assert got.status is GetMessageStatus.NO_MATCHED_MESSAGE


def test_subscribing_the_same_callable_again_is_one_subscription(tmp_path: Path) -> None:
    """Review 44 L2: each subscribe of one callable started a thread and a call per event
    (1000 subscribes: 1000 threads)."""
    import threading
    import time

    calls: list[object] = []
    with mqstore.open(tmp_path / "s") as store:
        before = threading.active_count()
        for _ in range(50):
            store.subscribe(calls.append, topic="t")
        store.subscribe(calls.append, topic="u")  # another filter: its own subscription
        assert threading.active_count() - before <= 2
        assert store.put(Message("t", b"x")).ok
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(calls) == 1
        store.unsubscribe(calls.append)


OPEN_IN_A_LATE_EXIT_HOOK = """
import atexit, sys
root, report = sys.argv[1], sys.argv[2]

def late_hook():  # registered before mqstore's: runs after it
    import mqstore
    try:
        store = mqstore.open(root)
        outcome = "opened"
    except mqstore.StoreClosedError as exc:
        outcome = "refused: " + str(exc)
    with open(report, "w") as f:
        f.write(outcome)

atexit.register(late_hook)
import mqstore  # its exit hook is registered now, after ours
"""


def test_an_open_after_mqstores_exit_hook_is_refused(tmp_path: Path) -> None:
    """Review 93 L2: a store opened in an exit hook that runs after mqstore's was never
    closed (the next open a crash recovery, its put_async callbacks never run)."""
    import subprocess

    root, report = tmp_path / "s", tmp_path / "report"
    subprocess.run([sys.executable, "-c", OPEN_IN_A_LATE_EXIT_HOOK, str(root), str(report)], check=True, timeout=120)
    assert report.read_text().startswith("refused: the interpreter is exiting")
    assert not root.exists()  # refused before any file was made
