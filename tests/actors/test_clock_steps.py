"""A wall clock that steps (NTP, a VM restored, an RTC that was wrong at boot) stops no periodic
flush and loses no acknowledged message (review 57).

The periodic flushes are paced by the monotonic ticker, not by the wall time a Tick carries;
crash recovery starts no later than the checkpoint's forced offsets, whatever the store times
say; and store times are held at the newest record's while the clock reads a little earlier."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import mqstore
from mqstore.actors import commitlog_writer
from mqstore.storage.checkpoint import read_checkpoint
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem
from mqstore.ticker import ManualTicker

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py
STORE_TIME_HOLD_MAX_MS = commitlog_writer.STORE_TIME_HOLD_MAX_MS

T0 = 1_800_000_000_000
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


class Wall:
    """The store's wall clock, stepped by the test."""

    def __init__(self, now_ms: int = T0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_the_thorough_flush_and_checkpoint_go_on_after_the_clock_ran_ahead_and_was_put_right(tmp_path: Path) -> None:
    """Before: after the clock ran a day ahead and was put right, no thorough flush and no
    checkpoint write came for a day (a trickle below 4 pages was never forced under
    ASYNC_FLUSH, review 57 F4; and damage past the frozen flushed offset was cut as a torn
    tail, F3)."""
    wall, ticker = Wall(), ManualTicker()
    store_dir = tmp_path / "s"
    store = h.open_small(store_dir, clock_ms=wall, ticker=ticker, flush_disk_type="ASYNC_FLUSH")
    fs = RealFileSystem()

    def put_and_wait_for_the_checkpoint() -> None:
        result = store.put(mqstore.Message(topic="T", body=b"x" * 100))
        assert result.ok
        end = result.commitlog_offset + result.wrote_bytes
        for _ in range(3):  # thorough intervals of the ticker (the flush actor's ticks are 1 s apart)
            for _ in range(10):
                ticker.advance(1_000)
                time.sleep(0.02)
            if (read_checkpoint(fs, str(store_dir / "checkpoint")).physic_flushed_offset or 0) >= end:
                return
        raise AssertionError(f"no checkpoint recorded the flush up to {end} in 3 thorough intervals")

    try:
        put_and_wait_for_the_checkpoint()
        wall.now_ms += DAY_MS
        put_and_wait_for_the_checkpoint()
        wall.now_ms -= DAY_MS
        put_and_wait_for_the_checkpoint()
        put_and_wait_for_the_checkpoint()
    finally:
        store.close()


def test_store_times_are_held_while_the_clock_reads_a_little_earlier_than_the_newest_record(tmp_path: Path) -> None:
    wall = Wall()
    store_dir = tmp_path / "s"
    step = STORE_TIME_HOLD_MAX_MS // 2

    def put(store: mqstore.MessageStore) -> int:
        result = store.put(mqstore.Message(topic="T", body=b"x"))
        assert result.ok
        return result.store_timestamp

    with h.open_small(store_dir, clock_ms=wall) as store:
        assert put(store) == T0
        wall.now_ms = T0 - step
        assert put(store) == T0  # held
        wall.now_ms = T0 + 5
        assert put(store) == T0 + 5  # the clock again
        wall.now_ms = T0 - step
        assert [m.store_timestamp for m in store.get("T", 0, 0, 10).messages] == [T0, T0, T0 + 5]
    with h.open_small(store_dir, clock_ms=wall) as store:  # the newest record's time is on disk
        assert put(store) == T0 + 5


def test_one_reading_far_ahead_does_not_pin_later_store_times(tmp_path: Path) -> None:
    """Review 59 M1: a clock read 10 years ahead once, and every later record, after reopens
    too, got that time until the clock caught up: time queries and offset_for_time answered
    for a store that seemed to have stopped."""
    wall = Wall()
    with h.open_small(tmp_path / "s", clock_ms=wall) as store:
        assert store.put(mqstore.Message(topic="T", body=b"x")).ok
        wall.now_ms = T0 + 10 * 365 * DAY_MS
        assert store.put(mqstore.Message(topic="T", body=b"x")).store_timestamp == wall.now_ms
        wall.now_ms = T0 + 1_000
        assert store.put(mqstore.Message(topic="T", body=b"x")).store_timestamp == T0 + 1_000


def test_a_power_loss_after_the_clock_stepped_back_loses_no_acknowledged_message() -> None:
    """Review 57 F1: store times an hour below the checkpoint's made every later segment look
    older than it, so crash recovery started at the newest segment; a quiet queue's units in
    the segments before it (not forced yet: a queue's units are forced once 2 pages are dirty,
    or by the thorough flush) were never written again, and filler units took their place:
    45 of 1,245 SYNC_FLUSH-acknowledged messages unreadable by get, for good."""
    wall, ticker = Wall(), ManualTicker()
    fs = SimulatedFileSystem(clock_ms=wall)
    settings = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 4000,
                    flush_disk_type="SYNC_FLUSH", message_index_enable=False)  # fmt: skip
    store = mqstore.open("/sim/store", fs=fs, clock_ms=wall, ticker=ticker, **settings)
    acked: dict[str, tuple[int, int]] = {}

    def put(queue_id: int) -> None:
        key = f"k{len(acked)}"
        wall.now_ms += 10
        result = store.put(mqstore.Message(topic="T", queue_id=queue_id, keys=[key], body=b"x" * 200))
        assert result.ok, result
        acked[key] = (queue_id, result.queue_offset)

    try:
        for i in range(40):
            put(i % 2)
        store.flush()  # the checkpoint: physic = logics = T0
        wall.now_ms -= HOUR_MS
        for i in range(1200):  # ~5 segments; queue 1 gets every 20th message
            put(1 if i % 20 == 0 else 0)
            if i % 100 == 99:
                ticker.advance(1_000)  # ConsumeQueue ticks: the busy queue 0's units are forced
        crashed = fs.crash(1, tear=False)  # only forced bytes survive
    finally:
        store.close()
    with mqstore.open("/sim/store", fs=crashed, clock_ms=wall, **settings) as reopened:
        for queue_id in (0, 1):
            expected = [key for key, (q, _offset) in acked.items() if q == queue_id]
            messages = [m for offset in range(0, len(expected), 32)
                        for m in reopened.get("T", queue_id, offset, 32).messages]  # fmt: skip
            assert [m.key_list[0] for m in messages] == expected


def test_an_index_file_written_across_a_clock_step_back_is_kept_at_every_open(tmp_path: Path) -> None:
    """Review 57 F6: a file whose first entry is newer than its last (a broker's, written across
    a step back) was taken for corrupt at every open, clean ones too: set aside as .damaged
    (never deleted), rebuilt the same, and set aside again at the next open."""
    import struct

    store_dir = tmp_path / "s"
    settings = dict(max_hash_slot_num=4, max_index_num=8)
    with h.open_small(store_dir, **settings) as store:
        for i in range(20):
            assert store.put(mqstore.Message(topic="T", body=b"x", keys=[f"k{i}"])).ok
        h.wait_until(lambda: store.query("T", "k19", 1).messages, what="k19 indexed")
    index_dir = store_dir / "index"
    first = index_dir / sorted(p.name for p in index_dir.iterdir())[0]
    with open(first, "r+b") as f:
        begin, end = struct.unpack(">qq", f.read(16))
        f.seek(0)
        f.write(struct.pack(">q", end + HOUR_MS))  # begins an hour after it ends
    before = sorted(p.name for p in index_dir.iterdir())
    for _ in range(2):
        with h.open_small(store_dir, **settings) as store:
            assert [m.key_list for m in store.query("T", "k0", 1).messages] == [["k0"]]
        assert sorted(p.name for p in index_dir.iterdir()) == before
