"""`get` reads ConsumeQueue units through the calling thread's own maps, below the bounds the
ConsumeQueue actor publishes (QueueBounds), instead of asking the actor. The actor stays the
owner and decides every case the bounds do not cover: these tests hold the direct path to the
actor's answers, and check it is taken, withdrawn and refreshed when it should be."""

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
from mqstore.messages import DeleteExpiredConsumeQueueFiles, Reply
from mqstore import store as store_module

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
UNIT, put_n = h.UNIT, h.put_n

Open = Callable[..., MessageStore]
TINY_CQ = {"mapped_file_size_consume_queue_bytes": 8 * UNIT}  # 8 units per ConsumeQueue file



@pytest.fixture(autouse=True)
def reads_never_give_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests put and read at once; the reads must take the direct path all the same
    (giving way to flowing puts has its own test in test_get_direct.py)."""
    monkeypatch.setattr(store_module, "PUTS_FLOWING_NS", 0)

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
        (q, rng.randrange(-2, 48), rng.choice([1, 3, 8, 32]), rng.choice([None, "A", "B||C", "*", "Z"]),
         rng.choice([None, 500, 5000]))
        for q in range(2) for _ in range(60)
    ]  # fmt: skip
    caught_up(store)
    asked = counting_asks(store, monkeypatch)
    direct = [as_tuple(store.get("T", q, off, n, tags=t, max_total_bytes=b)) for q, off, n, t, b in cases]
    in_bounds = sum(1 for _, off, *_ in cases if 0 <= off < 45)
    assert len(asked) == len(cases) - in_bounds, "every get inside the bounds read the units itself"
    monkeypatch.setattr(store, "_units_direct", lambda *args: None)
    by_actor = [as_tuple(store.get("T", q, off, n, tags=t, max_total_bytes=b)) for q, off, n, t, b in cases]
    assert direct == by_actor


def test_min_and_max_offsets_from_the_bounds_equal_the_actors(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(**TINY_CQ)
    put_n(store, 13)
    put_n(store, 2, queue_id=1)
    caught_up(store)
    asked = counting_asks(store, monkeypatch)
    direct = [(store.min_offset("T", q), store.max_offset("T", q)) for q in range(3)]
    assert len(asked) == 2, "only the unknown queue asks (twice)"
    monkeypatch.setattr(store, "_published_bounds", lambda *args, **kwargs: None)
    assert direct == [(store.min_offset("T", q), store.max_offset("T", q)) for q in range(3)] == [(0, 13), (0, 2), (0, 0)]


def test_bounds_that_claim_unwritten_units_fall_back_to_the_actor(open_store: Open) -> None:
    """A stale or wrong bound can only cost a round trip: every record read directly must be
    the queue's own at its offset."""
    store = open_store(**TINY_CQ)
    put_n(store, 5)
    store._queue_bounds[("T", 0)] = (0, 9)  # units 5..8 are zeros
    r = store.get("T", 0, 5, 32)
    assert (r.status, r.max_offset) == (S.OFFSET_OVERFLOW_ONE, 5)
    store._queue_bounds[("T", 0)] = (0, 9)
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
    """Until the ConsumeQueue actor has written this thread's puts (before, its gets ask)."""
    wait_for(lambda: store._queue_units_written >= store._local.last_put_end, "units written")


def test_deleted_queue_files_are_unmapped_and_read_as_the_actor_says(open_store: Open) -> None:
    store = open_store(**TINY_CQ)
    results = put_n(store, 40)
    caught_up(store)
    assert [m.queue_offset for m in store.get("T", 0, 2, 4).messages] == [2, 3, 4, 5]
    reader = store._local.queue_reader
    assert (("T", 0, 0) in reader._maps), "the first ConsumeQueue file is mapped"
    generation = store._queue_maps_generation
    # The cleaner's step for the queues, as if the commitlog below message 20 were gone:
    # files 0-7 and 8-15 hold only units below it.
    done: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    request = DeleteExpiredConsumeQueueFiles(min_phy_offset=results[20].commitlog_offset, start_after=None,
                                             reply=Reply(future=done))  # fmt: skip
    store.supervisor.ctx.peers["consume_queue"].tell(request)
    assert done.get(timeout=10).deleted == 2
    assert store._queue_bounds[("T", 0)] == (20, 40)
    assert store._queue_maps_generation > generation
    r = store.get("T", 0, 3, 4)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_TOO_SMALL, 20)
    assert [m.queue_offset for m in store.get("T", 0, 20, 2).messages] == [20, 21]
    assert ("T", 0, 0) not in reader._maps, "the deleted file's map was closed"


def test_bounds_are_withdrawn_while_the_consume_queue_actor_is_down(
    open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(**TINY_CQ)
    put_n(store, 10)
    assert store._queue_bounds_live
    store.supervisor.ctx.peers["consume_queue"].tell(object())  # a broken invariant: it crashes
    wait_for(lambda: len(store.supervisor.restarts) == 1, "the ConsumeQueue actor was restarted")
    wait_for(lambda: store._queue_bounds_live, "the restarted actor published its bounds")
    assert store._queue_bounds[("T", 0)] == (0, 10)
    asked = counting_asks(store, monkeypatch)
    assert [m.queue_offset for m in store.get("T", 0, 6, 8).messages] == [6, 7]  # to its file's end
    assert [m.queue_offset for m in store.get("T", 0, 8, 8).messages] == [8, 9]
    assert asked == []


def test_a_stopping_consume_queue_actor_withdraws_its_bounds(open_store: Open) -> None:
    store = open_store(**TINY_CQ)
    put_n(store, 3)
    published: list[Any] = []
    original = store.supervisor.ctx.on_queue_bounds
    store.supervisor.ctx.on_queue_bounds = lambda bounds: (published.append(bounds), original(bounds))
    store.supervisor.ctx.peers["consume_queue"].stop()
    assert published[-1] is None
    assert not store._queue_bounds_live and store._queue_bounds == {}
    assert store.get("T", 0, 0, 4).status is S.NO_MATCHED_LOGIC_QUEUE, "the owner decides while it is down"


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
    assert list(store._readers) == []
    read()  # this thread's readers stay until close()
    assert sorted(type(r).__name__ for r in store._readers) == ["CommitLogReader", "ConsumeQueueReader"]
    store.close()
    assert list(store._readers) == []


def test_reads_give_way_to_flowing_puts(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read through the caller's maps never blocks; while puts flow, gets, max_offset and
    queries ask the owners instead (blocking, so a reading loop cannot starve the puts)."""
    monkeypatch.setattr(store_module, "PUTS_FLOWING_NS", 60_000_000_000)
    store = open_store(**TINY_CQ)
    put_n(store, 10)
    caught_up(store)
    asked = counting_asks(store, monkeypatch)
    assert [m.queue_offset for m in store.get("T", 0, 0, 4).messages] == [0, 1, 2, 3]
    assert len(asked) == 1, "the get asked the ConsumeQueue actor"
    queried: list[Any] = []
    original = store._index_offsets
    monkeypatch.setattr(store, "_index_offsets", lambda reader, *a: (queried.append(reader), original(reader, *a))[1])
    assert store.query("T", "k3").messages[0].queue_offset == 3
    assert queried == [None], "the query asked the index actor"
    store._last_put_ns = 0  # no put for a while: the direct paths again
    assert [m.queue_offset for m in store.get("T", 0, 4, 4).messages] == [4, 5, 6, 7]
    assert store.query("T", "k5").messages[0].queue_offset == 5
    assert len(asked) == 1 and queried[-1] is not None
