"""Helpers of the cleaner tests (loaded by conftest.py as `mqstore_cleaner_test_helpers`; tests/
has no packages): a store on the simulated disk whose files age with a manual clock, a settable
disk gauge, and a recorded (never sleeping) pause."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mqstore import Message, MessageStore
from mqstore.messages import CleanRound, GetWriterStatus, Tick, WriterReady
from mqstore.storage.disk import FixedDiskGauge
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.ticker import RealTicker

SEGMENT_BYTES = 64 * 1024
CQ_FILE_BYTES = 20 * 100  # 100 units per consume queue file
BODY = b"x" * 900  # about 70 records per commitlog segment
TOPIC = "clean"
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

SMALL: dict[str, Any] = {
    "mapped_file_size_commitlog_bytes": SEGMENT_BYTES,
    "mapped_file_size_consume_queue_bytes": CQ_FILE_BYTES,
    "max_hash_slot_num": 100,
    "max_index_num": 400,
    # The test drives every round itself: the supervisor's own Tick comes at start, then a
    # year later. (It was a day: the following ticker jumps days with the test's clock, and
    # a supervisor round raced the test's own, deleting what the test's round was to.)
    "clean_resource_interval_ms": 365 * DAY_MS,
    "delete_when": "04",
    "file_reserved_time_hours": 72,
    # Segment rolls currently wait out the allocator (reported to the lead); keep that short.
    "allocate_wait_timeout_ms": 20,
}


def local_ms(day: int, hour: int, minute: int = 30) -> int:
    """Epoch ms of a local wall time (the cleaner reads the local hour of the injected clock)."""
    return int(time.mktime((2025, 3, 10 + day, hour, minute, 0, 0, 0, -1)) * 1000)


@dataclass
class ManualClock:
    now_ms: int = field(default_factory=lambda: local_ms(0, 10))

    def __call__(self) -> int:
        return self.now_ms

    def set(self, now_ms: int) -> None:
        self.now_ms = now_ms


@dataclass
class Harness:
    store: MessageStore
    fs: SimulatedFileSystem
    clock: ManualClock
    gauge: FixedDiskGauge
    sleeps: list[int]

    @property
    def ctx(self) -> Any:
        return self.store.supervisor.ctx

    def tick(self) -> CleanRound:
        """One cleaning round at the clock's time, as the supervisor's ticker would run it."""
        result: CleanRound = self.ctx.peers["cleaner"].ask(Tick(now_ms=self.clock()), timeout=30)
        return result

    def writer(self) -> WriterReady:
        ready: WriterReady = self.ctx.peers["writer"].ask(GetWriterStatus(), timeout=30)
        return ready

    def commitlog_files(self) -> list[str]:
        return [n for n in self.fs.listdir(str(self.store.config.commitlog_dir)) if n.isdigit()]

    def cq_files(self, queue_id: int = 0) -> list[str]:
        return self.fs.listdir(f"{self.store.config.consume_queue_dir}/{TOPIC}/{queue_id}")

    def index_files(self) -> list[str]:
        return self.fs.listdir(str(self.store.config.index_dir))

    def fill_segments(self, segments: int, queue_id: int = 0) -> list[int]:
        """Put until the log has grown by `segments` segments; returns the queue offsets put.
        Then flush (file times are the clock's now) and wait until dispatch caught up."""
        target = self.writer().max_offset + segments * SEGMENT_BYTES
        offsets = []
        while self.writer().max_offset < target:
            for _ in range(20):
                n = len(offsets)
                result = self.store.put(Message(topic=TOPIC, queue_id=queue_id, body=BODY, keys=[f"k{queue_id}-{self.clock()}-{n}"]))
                assert result.ok, result
                offsets.append(result.queue_offset)
        self.settle(queue_id, offsets[-1] + 1)
        return offsets

    def settle(self, queue_id: int, queue_max: int) -> None:
        self.store.flush()
        deadline = time.monotonic() + 15
        while self.store.max_offset(TOPIC, queue_id) < queue_max:
            assert time.monotonic() < deadline, "dispatch did not catch up"
            time.sleep(0.002)
        self.store.flush()


class FollowingTicker(RealTicker):
    """Monotonic time that also moves forward with the test's clock: the tests age files by
    setting the wall clock days ahead, which the cleaner takes for time passing only when
    the monotonic clock moved too (a wall clock alone jumping ahead is not: review 57 F2)."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock
        self._start_ms = clock.now_ms
        self._ahead_ms = 0

    def now_ms(self) -> int:
        self._ahead_ms = max(self._ahead_ms, self._clock.now_ms - self._start_ms)
        return super().now_ms() + self._ahead_ms
