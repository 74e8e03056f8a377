"""put_msg_index_high_water, RocketMQ's dispatch back-pressure (issue 18): while more records than
the high water are appended but not yet in the ConsumeQueues and the index, each put holds the
writer 1 ms (of the store's ticker) before it is answered. Puts are slowed, never dropped: every
acknowledged one is read back, before and after a reopen. Time is a ManualTicker: the test counts
the holds exactly and never sleeps."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from mqstore import Message, MessageStore
from mqstore.actors.commitlog_writer import CommitLogWriter, DispatchLag
from mqstore.faults import HoldAt
from mqstore.ticker import ManualTicker

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py


def _writer(store: MessageStore) -> CommitLogWriter:
    actor: Any = store.supervisor.ctx.peers["writer"].proxy()._actor  # reaching in to read its counter
    assert isinstance(actor, CommitLogWriter)
    return actor


def _put(store: MessageStore, i: int) -> int:
    result = store.put(Message(topic="t", body=b"m%d" % i, keys=[f"k{i}"]))
    assert result.ok, result  # acknowledged: it must be read back
    return result.commitlog_offset + result.wrote_bytes


def test_puts_are_held_back_while_the_index_is_behind_the_high_water(store_dir: Path) -> None:
    # reput.mid_dispatch lies after the ConsumeQueue was told and before the index is: held
    # there, the index falls behind while the queues keep up.
    hold = HoldAt("reput.mid_dispatch")
    ticker = ManualTicker()
    store = h.open_small(store_dir, put_msg_index_high_water=2, faults=hold, ticker=ticker)
    try:
        end = _put(store, 0)
        h.wait_dispatched(store)
        assert store.read_view.await_view(lambda v: v.indexed_end >= end, 10) is not None
        hold.armed.set()
        _put(store, 1)  # dispatched to the queue; reput is held before the index hears of it
        assert hold.entered.wait(10)
        # The queues wrote put 1 (told before the fault point): only the index is behind.
        assert store.read_view.await_view(lambda v: v.queues_written >= v.dispatched_end, 10) is not None
        writer = _writer(store)
        assert writer.held_back_ms == 0
        before = len(ticker.sleeps)  # reput is held: from here on only the writer sleeps
        _put(store, 2)  # 2 records not indexed: at the high water, not above it
        assert writer.held_back_ms == 0
        _put(store, 3)  # 3 > 2: this put is held 1 ms before its answer
        _put(store, 4)
        assert writer.held_back_ms == 2 and ticker.sleeps[before:] == [1, 1]
    finally:
        hold.release.set()
    end = h.wait_dispatched(store)
    assert store.read_view.await_view(lambda v: v.indexed_end >= end and v.queues_written >= end, 10) is not None
    _put(store, 5)  # caught up: not held
    assert writer.held_back_ms == 2
    got = store.get("t", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"m%d" % i for i in range(6)]
    assert all(store.query("t", f"k{i}").messages for i in range(6))
    assert store.close()

    reopened = h.open_small(store_dir)
    try:
        assert [m.body for m in reopened.get("t", 0, 0, 32).messages] == [b"m%d" % i for i in range(6)]
    finally:
        reopened.close()


def test_a_lagging_consume_queue_counts_when_the_index_is_off(store_dir: Path) -> None:
    # With message_index_enable off only the queues count; held at reput.mid_dispatch they
    # have every record, so nothing is held back however many puts wait behind reput.
    hold = HoldAt("reput.mid_dispatch")
    ticker = ManualTicker()
    store = h.open_small(store_dir, put_msg_index_high_water=1, message_index_enable=False, faults=hold, ticker=ticker)
    try:
        end = _put(store, 0)
        h.wait_dispatched(store)
        assert store.read_view.await_view(lambda v: v.queues_written >= end, 10) is not None
        hold.armed.set()
        _put(store, 1)
        assert hold.entered.wait(10)
        writer = _writer(store)
        # Reput holds the batch of put 1: the queues wrote it (told before the fault point).
        assert store.read_view.await_view(lambda v: v.queues_written >= v.dispatched_end, 10) is not None
        _put(store, 2)  # 1 record behind (put 2): at the high water
        assert writer.held_back_ms == 0
        _put(store, 3)  # 2 > 1
        assert writer.held_back_ms == 1
    finally:
        hold.release.set()
    h.wait_dispatched(store)
    store.close()


def test_dispatch_lag_counts_records_by_the_offsets_dispatch_reached() -> None:
    lag = DispatchLag()
    lag.appended(100, 1)
    lag.appended(300, 2)  # a pass of two records ending at 300
    lag.appended(400, 1)
    assert lag.behind(0) == 4
    assert lag.behind(100) == 3
    assert lag.behind(250) == 3  # a pass dispatched in part counts as not dispatched
    assert lag.behind(300) == 1
    assert lag.behind(400) == 0
    assert lag.behind(100) == 0  # an offset that went back (a restarted owner) hides nothing done


def test_dispatch_lag_thinned_marks_only_overstate_the_lag() -> None:
    lag = DispatchLag()
    n = DispatchLag.MARKS_MAX + 1
    for i in range(1, n + 1):
        lag.appended(i * 10, 1)
    for done in (0, 5, 10, 15, 12_340, n * 10 - 10):
        exact = n - done // 10
        assert exact <= lag.behind(done) <= exact + 1
    assert lag.behind(n * 10) == 0


class DispatchCatchesUp(ManualTicker):
    """A ticker whose 1 ms pause in the writer lasts until dispatch reached the log's end, as
    real time would let a dispatcher that knows of the records catch up (bounded)."""

    def __init__(self) -> None:
        super().__init__()
        self.store: MessageStore | None = None
        self.dispatched_before = 0  # the log's end before the held puts
        self.caught_up: list[bool] = []

    def sleep_ms(self, ms: int) -> None:
        super().sleep_ms(ms)
        store, before = self.store, self.dispatched_before
        if store is None or not threading.current_thread().name.startswith("CommitLogWriter"):
            return
        view = store.read_view.await_view(lambda v: v.indexed_end > before and v.queues_written > before, 5)
        self.caught_up.append(view is not None)


def test_the_held_puts_are_dispatched_during_the_hold(store_dir: Path) -> None:
    # A batch of 3 over a high water of 1: the writer tells reput of the batch before it holds,
    # so the hold ends with the batch dispatched (not with a lag only the hold's end can clear).
    ticker = DispatchCatchesUp()
    store = h.open_small(store_dir, put_msg_index_high_water=1, ticker=ticker)
    try:
        ticker.dispatched_before = _put(store, 0)  # 1 record behind at most: not held
        h.wait_dispatched(store)
        assert store.read_view.await_view(lambda v: v.indexed_end >= ticker.dispatched_before, 10) is not None
        ticker.store = store
        result = store.put_batch([Message(topic="t", body=b"b%d" % i, keys=[f"k{i}"]) for i in range(3)])
        assert result.ok and result.msg_num == 3
        assert ticker.caught_up == [True] and _writer(store).held_back_ms == 1
        assert [m.body for m in store.get("t", 0, 0, 32).messages] == [b"m0", b"b0", b"b1", b"b2"]
    finally:
        store.close()
