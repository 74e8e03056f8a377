"""Helpers for the crash tests (imported by them; conftest.py puts this directory on sys.path)."""

from __future__ import annotations

import collections
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mqstore
from mqstore.storage.checkpoint import StoreCheckpoint
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.status import GetMessageStatus
from mqstore.tools.verify import verify_store

TOPIC = "crash"
QUEUES = 4
PRODUCER = os.path.join(os.path.dirname(__file__), "producer.py")


def flushed_only_to(store_dir: str | os.PathLike[str], offset: int) -> None:
    """The checkpoint as a power loss leaves it when the records from `offset` on were not
    flushed yet: its flushed offset there. Records lost below a flushed offset are not a torn
    tail but durable data gone: the store opens degraded on them (until `mqstore recover`)."""
    checkpoint = StoreCheckpoint(RealFileSystem(), os.path.join(os.fspath(store_dir), "checkpoint"))
    try:
        checkpoint.physic_flushed_offset = offset
        checkpoint.flush()
    finally:
        checkpoint.close()


@dataclass(frozen=True)
class Ack:
    key: str
    queue_id: int
    queue_offset: int


def read_all(store: mqstore.MessageStore, topic: str, queue_id: int) -> list[mqstore.MessageRecord]:
    """Every message of a queue, from offset 0, bounded by the queue's max offset. Queue offsets
    the recovery report reserved (their records were lost, unacknowledged, and are never handed
    out again) may be held by filler units at the queue's end: a get there finds nothing and
    moves on, as a consumer does."""
    out: list[mqstore.MessageRecord] = []
    offset = 0
    report = store.supervisor.recovery
    reserved = report.reserved_queue_offsets.get(f"{topic}-{queue_id}", 0) if report is not None else 0
    max_offset = store.max_offset(topic, queue_id)
    while offset < max_offset:
        result = store.get(topic, queue_id, offset, 64)
        if result.status is GetMessageStatus.NO_MATCHED_MESSAGE and offset < result.next_begin_offset <= reserved:
            assert not result.messages
            offset = result.next_begin_offset
            continue
        assert result.status is GetMessageStatus.FOUND, (topic, queue_id, offset, result.status, reserved)
        out.extend(result.messages)
        assert result.next_begin_offset > offset
        offset = result.next_begin_offset
    return out


def check_store(store: mqstore.MessageStore, acks: dict[str, Ack], context: str, *, query_sample: int = 200,
                unacked_batches_whole: bool = True) -> int:  # fmt: skip
    """Acknowledged messages present exactly once at their acknowledged queue offsets; queue
    offsets dense; batches all or nothing (unacknowledged ones too, unless
    `unacked_batches_whole` is False: see test_power_loss's known limitation); keys queryable.
    Returns the number of messages."""
    seen: collections.Counter[str] = collections.Counter()
    batches: dict[str, list[int]] = collections.defaultdict(list)
    batch_keys: dict[str, list[str]] = collections.defaultdict(list)
    where: dict[str, tuple[int, int]] = {}
    total = 0
    for queue_id in range(QUEUES):
        records = read_all(store, TOPIC, queue_id)
        for n, rec in enumerate(records):
            assert rec.queue_offset == n, f"{context}: queue {queue_id} offsets not dense at {n}: {rec.queue_offset}"
            key = rec.key_list[0]
            seen[key] += 1
            where[key] = (queue_id, rec.queue_offset)
            if "batch" in rec.properties:
                batches[rec.properties["batch"]].append(rec.queue_offset)
                batch_keys[rec.properties["batch"]].append(key)
            elif not rec.body.startswith(key.encode()):
                raise AssertionError(f"{context}: body of {key} is wrong: {rec.body[:40]!r}")
        total += len(records)
    dup = [k for k, c in seen.items() if c > 1]
    assert not dup, f"{context}: duplicated messages {dup[:5]}"
    missing = [k for k in acks if k not in seen]
    assert not missing, f"{context}: {len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    moved = [k for k, a in acks.items() if where[k] != (a.queue_id, a.queue_offset)]
    assert not moved, f"{context}: acknowledged at other queue offsets: {[(k, acks[k], where[k]) for k in moved[:5]]}"
    acked_batches = {b for b, offsets in batches.items() if any(k in acks for k in batch_keys[b])}
    for batch, offsets in batches.items():
        if not unacked_batches_whole and batch not in acked_batches:
            continue
        count = int(batch.rsplit("/", 1)[1])
        offsets.sort()
        assert len(offsets) == count, f"{context}: batch {batch} half present: {len(offsets)} of {count}"
        assert offsets == list(range(offsets[0], offsets[0] + count)), f"{context}: batch {batch} not contiguous"
    for key in sorted(acks)[:: max(1, len(acks) // query_sample)]:
        found = store.query(TOPIC, key, 4)
        # Exactly one hit: an index holding the message twice fails here, and in verify.
        hits = [(m.commitlog_offset, m.key_list[0]) for m in found.messages]
        assert [k for _, k in hits] == [key], f"{context}: query by key {key}: {hits}"
    return total


def assert_verified(store_dir: str, context: str, **kwargs: Any) -> None:
    report = verify_store(store_dir, **kwargs)
    assert report.ok, f"{context}: verify found {report.problem_count} problems: {[str(p) for p in report.problems[:10]]}"


def log_alone(root: Path) -> Path:
    """A copy of the commitlog directory of the store at `root` outside any store's root, as a
    log on a disk of its own is (pointed at inside the other store's root, an open is refused
    for where it lies, before its content is read: test_linked_files)."""
    copy = root.parent / f"{root.name}-log"
    if not copy.exists():
        shutil.copytree(root / "commitlog", copy)
    return copy
