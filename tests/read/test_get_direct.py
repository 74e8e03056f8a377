"""`get` reads ConsumeQueue units through the calling thread's own maps, below the bounds in the
read view the ConsumeQueue actor publishes, instead of asking the actor. The actor stays the
owner and decides every case the view does not cover: these tests hold the view's answers to
the actor's, and check the view is taken, withdrawn and refreshed when it should be."""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
from typing import Any, Callable

import pykka
import pytest

from mqstore import GetMessageStatus as S
from mqstore import Message, MessageStore
from mqstore import reads
from mqstore.messages import DeleteExpiredConsumeQueueFiles, QueueBounds, Reply

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
UNIT, put_n = h.UNIT, h.put_n

Open = Callable[..., MessageStore]
TINY_CQ = {"mapped_file_size_consume_queue_bytes": 8 * UNIT}  # 8 units per ConsumeQueue file


def counting_asks(store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    asked: list[Any] = []
    original = store._units

    def units(*args: Any) -> Any:
        asked.append(args)
        return original(*args)

    monkeypatch.setattr(store, "_units", units)
    return asked


def as_tuple(r: Any) -> tuple[Any, ...]:
    return (r.status, [m.queue_offset for m in r.messages], [m.body for m in r.messages],
            r.next_begin_offset, r.min_offset, r.max_offset)  # fmt: skip


def test_direct_gets_equal_the_actors_answers(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(**TINY_CQ)
    rng = random.Random(7)
    tags = ["A", "B", "C", None]
    for q in range(2):
        put_n(store, 45, queue_id=q, body=b"y" * rng.randrange(1, 300), tags=lambda i: tags[i % 4])
    cases = [
        (q, rng.randrange(0, 48), rng.choice([1, 3, 8, 32]), rng.choice([None, "A", "B||C", "*", "Z"]),
         rng.choice([None, 500, 5000]))
        for q in range(3) for _ in range(60)
    ]  # fmt: skip
    caught_up(store)
    asked = counting_asks(store, monkeypatch)
    direct = [as_tuple(store.get("T", q, off, n, tags=t, max_total_bytes=b)) for q, off, n, t, b in cases]
    assert asked == [], "the view decided every get (queue 2 does not exist: the view says so too)"
    monkeypatch.setattr(reads, "get_from_view", lambda *args, **kwargs: None)
    by_actor = [as_tuple(store.get("T", q, off, n, tags=t, max_total_bytes=b)) for q, off, n, t, b in cases]
    assert len(asked) == len(cases)
    assert direct == by_actor


def test_min_and_max_offsets_from_the_bounds_equal_the_actors(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(**TINY_CQ)
    put_n(store, 13)
    put_n(store, 2, queue_id=1)
    caught_up(store)
    asked = counting_asks(store, monkeypatch)
    direct = [(store.min_offset("T", q), store.max_offset("T", q)) for q in range(3)]
    assert asked == [], "the view decides, the unknown queue too"
    monkeypatch.setattr(reads, "bounds_from_view", lambda *args: None)
    assert direct == [(store.min_offset("T", q), store.max_offset("T", q)) for q in range(3)] == [(0, 13), (0, 2), (0, 0)]
    assert len(asked) == 6


def test_bounds_that_claim_unwritten_units_fall_back_to_the_actor(open_store: Open) -> None:
    """A stale or wrong bound can only cost a round trip: every record read directly must be
    the queue's own at its offset."""
    store = open_store(**TINY_CQ)
    put_n(store, 5)
    caught_up(store)
    written = store.read_view.view.queues_written
    wrong = QueueBounds(bounds={("T", 0): (0, 9)}, dispatched_offset=written, complete=False)  # units 5..8 are zeros
    store.read_view.publish_queues(wrong)
    r = store.get("T", 0, 5, 32)
    assert (r.status, r.max_offset) == (S.OFFSET_OVERFLOW_ONE, 5)
    r = store.get("T", 0, 3, 32)
    assert (r.status, [m.queue_offset for m in r.messages], r.max_offset) == (S.FOUND, [3, 4], 5)


def test_a_thread_reads_its_own_puts_at_once(open_store: Open) -> None:
    store = open_store(**TINY_CQ)
    errors: list[str] = []

    def producer(q: int) -> None:
        for i in range(40):
            r = store.put(Message(topic="T", queue_id=q, body=f"{q}-{i}".encode()))
            got = store.get("T", q, r.queue_offset, 1)
            if got.status is not S.FOUND or got.messages[0].body != f"{q}-{i}".encode():
                errors.append(f"{q}-{i}: {got.status}")

    threads = [threading.Thread(target=producer, args=(q,)) for q in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def caught_up(store: MessageStore) -> None:
    """Until the ConsumeQueue actor has published this thread's puts in the view."""
    wait_for(lambda: store.read_view.view.queues_written >= store._own_put_end(), "units written")


def test_deleted_queue_files_are_unmapped_and_read_as_the_actor_says(open_store: Open) -> None:
    store = open_store(**TINY_CQ)
    results = put_n(store, 40)
    caught_up(store)
    assert [m.queue_offset for m in store.get("T", 0, 2, 4).messages] == [2, 3, 4, 5]
    reader = store._readers.get()._queues
    assert reader is not None and ("T", 0, 0) in reader._maps, "the first ConsumeQueue file is mapped"
    generation = store.read_view.view.map_generation
    # The cleaner's step for the queues, as if the commitlog below message 20 were gone:
    # files 0-7 and 8-15 hold only units below it.
    done: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    request = DeleteExpiredConsumeQueueFiles(min_phy_offset=results[20].commitlog_offset, start_after=None,
                                             reply=Reply(future=done))  # fmt: skip
    store.supervisor.ctx.peers["consume_queue"].tell(request)
    assert done.get(timeout=10).deleted == 2
    assert store.read_view.view.queue_bounds[("T", 0)] == (20, 40)
    assert store.read_view.view.map_generation > generation
    r = store.get("T", 0, 3, 4)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_TOO_SMALL, 20)
    assert [m.queue_offset for m in store.get("T", 0, 20, 2).messages] == [20, 21]
    assert ("T", 0, 0) not in reader._maps, "the deleted file's map was closed"


def test_bounds_are_withdrawn_while_the_consume_queue_actor_is_down(
    open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(**TINY_CQ)
    put_n(store, 10)
    assert store.read_view.view.queues_live
    store.supervisor.ctx.peers["consume_queue"].tell(object())  # a broken invariant: it crashes
    wait_for(lambda: len(store.supervisor.restarts) == 1, "the ConsumeQueue actor was restarted")
    wait_for(lambda: store.read_view.view.queues_live, "the restarted actor published its bounds")
    assert store.read_view.view.queue_bounds[("T", 0)] == (0, 10)
    asked = counting_asks(store, monkeypatch)
    assert [m.queue_offset for m in store.get("T", 0, 6, 8).messages] == [6, 7]  # to its file's end
    assert [m.queue_offset for m in store.get("T", 0, 8, 8).messages] == [8, 9]
    assert asked == []


def test_a_stopping_consume_queue_actor_withdraws_its_bounds(open_store: Open) -> None:
    store = open_store(read_your_writes_timeout_ms=50, **TINY_CQ)
    put_n(store, 3)
    generation = store.read_view.view.map_generation
    store.supervisor.ctx.peers["consume_queue"].stop()
    view = store.read_view.view
    assert (view.queues_live, dict(view.queue_bounds)) == (False, {})
    assert view.map_generation > generation, "readers drop their maps: a successor may truncate"
    r = store.get("T", 0, 0, 4)
    assert r.status is S.NO_MATCHED_LOGIC_QUEUE and r.next_begin_offset == 0, "not decided while the owner is down"
    assert store.max_offset("T", 0) == -1


def test_a_reading_thread_that_ends_takes_its_maps_with_it(open_store: Open) -> None:
    store = open_store(**TINY_CQ)
    put_n(store, 20)

    def read() -> None:
        assert len(store.get("T", 0, 0, 32).messages) == 8

    for _ in range(5):
        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
    gc.collect()
    assert store._readers.open_readers == []
    read()  # this thread's readers stay until close()
    assert sorted(type(r).__name__ for r in store._readers.open_readers) == ["CommitLogReader", "ConsumeQueueReader"]
    readers = store._readers.get()
    store.close()
    assert store._readers.open_readers == [] and readers._queues is not None and readers._queues._maps == {}


def test_a_get_through_the_maps_yields_the_gil_once(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stated replacement of the give-way: a read through the caller's maps never blocks,
    so it ends with one bounded yield (a thread waiting for the GIL, a put's hand-off, runs
    then). bench/bench_read.py's catch-up case measures the effect."""
    store = open_store(**TINY_CQ)
    put_n(store, 10)
    caught_up(store)
    yields: list[None] = []
    monkeypatch.setattr(reads, "yield_gil", lambda: yields.append(None))
    asked = counting_asks(store, monkeypatch)
    for offset in range(0, 8, 2):
        assert [m.queue_offset for m in store.get("T", 0, offset, 2).messages] == [offset, offset + 1]
    assert (len(yields), asked) == (4, [])
    assert store.query("T", "k5").messages[0].queue_offset == 5
    assert len(yields) == 5
