"""The benchmark's workload: one deterministic message set, shared by every system.

Every system is handed the very same tuples (built before any clock starts), so the
figures differ only by what the store does with them.
"""

from __future__ import annotations

import dataclasses
import random
from typing import NamedTuple

TOPIC = "BenchTopic"
TAGS = ("TagA", "TagB", "TagC", "TagD")
BATCH_SIZE_MSGS = 32  # put_batch / pipeline / transaction size, and read batch size
QUEUE_COUNT = 4  # async workload: batch b goes to queue b % QUEUE_COUNT
SYNC_PRODUCER_THREADS = 16  # sync workload: producer t writes queue t
PUT_EACH_THREADS = (4, 16)  # single-message puts, each acknowledged before the next, from N threads
PIPELINE_WINDOW = 1024  # pipelined single-message puts: at most this many unacknowledged


class BenchMessage(NamedTuple):
    topic: str
    queue_id: int
    tag: str
    key: str
    body: bytes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """Sizes of one benchmark run. `quick()` and `full()` are the two documented presets."""

    mode: str
    messages_per_case: int  # async class: appended, then read back, per body size
    sync_messages_per_case: int  # sync class: one acknowledged commit each
    key_lookups: int
    repeats: int
    body_sizes_bytes: tuple[int, ...] = (128, 1024)
    lag_messages: int = 2000
    single_messages_per_case: int = 20_000  # single-message put cases (one call per message)
    disk_seq_write_bytes: int = 64 * 1024 * 1024
    disk_fdatasync_samples: int = 500
    open_store_bytes: int = 2 << 30  # commitlog bytes of the store the open and recovery-scan cases use
    seed: int = 20240501

    @staticmethod
    def full() -> BenchConfig:
        return BenchConfig(
            mode="full",
            messages_per_case=100_000,
            sync_messages_per_case=3_000,
            key_lookups=10_000,
            repeats=3,
        )

    @staticmethod
    def quick() -> BenchConfig:
        return BenchConfig(
            mode="quick",
            messages_per_case=10_000,
            sync_messages_per_case=480,
            key_lookups=1_000,
            repeats=1,
            lag_messages=500,
            single_messages_per_case=4_000,
            disk_seq_write_bytes=16 * 1024 * 1024,
            disk_fdatasync_samples=200,
            open_store_bytes=64 << 20,
        )

    @staticmethod
    def tiny() -> BenchConfig:
        """For the smoke test: exercises every code path, measures nothing worth reading."""
        return BenchConfig(
            mode="tiny",
            messages_per_case=200,
            sync_messages_per_case=32,
            key_lookups=50,
            repeats=1,
            body_sizes_bytes=(128,),
            lag_messages=50,
            single_messages_per_case=64,
            disk_seq_write_bytes=1024 * 1024,
            disk_fdatasync_samples=10,
            open_store_bytes=2 << 20,
        )


def _bodies(count: int, size_bytes: int, rng: random.Random) -> list[bytes]:
    # Incompressible bodies cut from one random buffer: cheap to build, no shared prefix.
    pool = rng.randbytes(size_bytes * 64 + 4096)
    return [pool[(i * 61) % 4096 : (i * 61) % 4096 + size_bytes] for i in range(count)]


def make_async_messages(count: int, body_bytes: int, seed: int) -> list[BenchMessage]:
    """Batches of BATCH_SIZE_MSGS share a queue (put_batch needs one topic and queue)."""
    rng = random.Random(seed)
    bodies = _bodies(count, body_bytes, rng)
    return [
        BenchMessage(
            topic=TOPIC,
            queue_id=(i // BATCH_SIZE_MSGS) % QUEUE_COUNT,
            tag=TAGS[i % len(TAGS)],
            key=f"k{seed:x}-{i:08d}-{rng.getrandbits(32):08x}",
            body=bodies[i],
        )
        for i in range(count)
    ]


def make_sync_messages(count: int, body_bytes: int, seed: int) -> list[list[BenchMessage]]:
    """One list per producer thread; thread t writes queue t, so each queue has one writer."""
    flat = make_async_messages(count, body_bytes, seed + 1)
    per_thread: list[list[BenchMessage]] = [[] for _ in range(SYNC_PRODUCER_THREADS)]
    for i, m in enumerate(flat):
        t = i % SYNC_PRODUCER_THREADS
        per_thread[t].append(m._replace(queue_id=t))
    return per_thread


def split_by_thread(messages: list[BenchMessage], threads: int) -> list[list[BenchMessage]]:
    """One list per producer thread, thread t writing queue t (as the sync workload)."""
    return [[m._replace(queue_id=t) for m in messages[t::threads]] for t in range(threads)]


def lookup_keys(messages: list[BenchMessage], count: int, seed: int) -> list[str]:
    rng = random.Random(seed + 2)
    return [messages[rng.randrange(len(messages))].key for _ in range(count)]


def batches(messages: list[BenchMessage], size: int = BATCH_SIZE_MSGS) -> list[list[BenchMessage]]:
    return [messages[i : i + size] for i in range(0, len(messages), size)]


def expected_per_queue(messages: list[BenchMessage]) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for m in messages:
        counts[(m.topic, m.queue_id)] = counts.get((m.topic, m.queue_id), 0) + 1
    return counts
