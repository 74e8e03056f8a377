"""`spark.readStream.format("rocketmq")`: a store's ConsumeQueues as a stream (Kafka's model).

The source offset is the next queue offset of every queue, {"topic": {"queueId": n}}: a
micro-batch reads [start, end) of each queue through its ConsumeQueue units (commitlog
offset and size), so each message is delivered once per queue offset, and a query that
restarts from its checkpoint goes on where the last committed batch ended.

Options (any other is refused, the batch-only ones included):
  topics, topicPattern  as for batch reads
  startingOffsets       "latest" (default, as Kafka's streams), "earliest" or per-queue JSON;
                        only for a new query: a restarted one uses its checkpoint
  maxOffsetsPerTrigger  at most this many messages per micro-batch, shared over the queues

Only what a ConsumeQueue holds is streamed: a ConsumeQueue unit is written after its record,
so a unit that is visible names bytes that are complete. A filler unit (a queue offset whose
record was lost or quarantined) delivers nothing, and a record that fails recovery's validity
rule (body CRC, its own physical-offset field) is skipped with a warning, never delivered.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from mqstore.log import get_logger
from mqstore.storage.codec import CQ_STORE_UNIT_SIZE, DEFAULT_MAX_MESSAGE_SIZE, FILLER_UNIT_SIZE, PHYSICAL_OFFSET_POSITION

from .bounds import EARLIEST, LATEST, parse_offsets
from .columnar import arrow_schema, decode_batch
from .datasource import freeze_reused_worker_heap
from .segments import (
    Segment,
    crc_failure,
    discover_segments,
    expired_by_retention,
    open_segment,
    read_regular,
    record_bound,
)

log = get_logger(__name__)

_CQ_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
BATCH_ROWS = 8192
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
Offsets = dict[str, dict[str, int]]  # JSON keys are strings: {"topic": {"queueId": next offset}}


@dataclass(frozen=True)
class QueueSlice(InputPartition):
    """Queue offsets [start, end) of one queue."""

    store: str
    topic: str
    queue_id: int
    start: int
    end: int


def _queue_files(queue_dir: str) -> list[tuple[int, str]]:
    """(first queue offset, path) of a queue's files, in order."""
    try:
        names = sorted(n for n in os.listdir(queue_dir) if len(n) == 20 and n.isdigit())
    except FileNotFoundError:
        return []
    return [(int(n) // CQ_STORE_UNIT_SIZE, os.path.join(queue_dir, n)) for n in names]


def _valid_units(path: str) -> np.ndarray:
    # Opened without blocking: a FIFO named like a ConsumeQueue file is an error naming it
    # (the query fails), never a read that waits for a writer for good.
    data = read_regular(path, "a ConsumeQueue file")
    units = np.frombuffer(data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE], dtype=_CQ_DTYPE)
    valid = (units["offset"] >= 0) & (units["size"] > 0)
    return units if valid.all() else units[: int(np.argmin(valid))]


def queue_bounds(queue_dir: str) -> tuple[int, int]:
    """(min, max) queue offsets the queue's files hold: [min, max)."""
    files = _queue_files(queue_dir)
    if not files:
        return 0, 0
    first, _ = files[0]
    last_start, last_path = files[-1]
    return first, last_start + len(_valid_units(last_path))


def queue_units(queue_dir: str, start: int, end: int) -> np.ndarray:
    """The units of queue offsets [start, end) (fewer if the files hold fewer)."""
    out: list[np.ndarray] = []
    for first, path in _queue_files(queue_dir):
        try:
            units = _valid_units(path)
        except FileNotFoundError:
            if expired_by_retention(path):
                continue  # the store's cleaner deleted it since the listing: its units expired
            raise
        lo, hi = max(start, first), min(end, first + len(units))
        if lo < hi:
            out.append(units[lo - first : hi - first])
    return np.concatenate(out) if out else np.zeros(0, dtype=_CQ_DTYPE)


class RocketMQStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType, stores: Sequence[str]) -> None:
        self.columns = [f.name for f in schema.fields]
        self.stores = [os.path.abspath(s) for s in stores]
        topics = options.get("topics")
        if topics is not None and "topicpattern" in options:
            raise ValueError("rocketmq stream: give topics or topicPattern, not both")
        self.topics = frozenset(t.strip() for t in topics.split(",") if t.strip()) if topics else None
        pattern = options.get("topicpattern")
        self.pattern = re.compile(pattern) if pattern else None
        self.start_default, self.starting = parse_offsets(
            "startingOffsets", options.get("startingoffsets", "latest"), ending=False, streaming=True
        )
        raw_max = options.get("maxoffsetspertrigger")
        self.max_per_trigger = int(raw_max) if raw_max is not None else None
        if self.max_per_trigger is not None and self.max_per_trigger <= 0:
            raise ValueError(f"maxOffsetsPerTrigger must be positive, got {raw_max!r}")

    def _queues(self) -> dict[tuple[str, int], str]:
        """(topic, queueId) -> queue dir, for the topics asked for."""
        found: dict[tuple[str, int], str] = {}
        for store in self.stores:
            root = os.path.join(store, "consumequeue")
            if not os.path.isdir(root):
                continue
            for topic in os.listdir(root):
                if self.topics is not None and topic not in self.topics:
                    continue
                if self.pattern is not None and not self.pattern.fullmatch(topic):
                    continue
                for name in os.listdir(os.path.join(root, topic)):
                    if name.isdigit():
                        found[(topic, int(name))] = os.path.join(root, topic, name)
        return found

    def initialOffset(self) -> Offsets:
        out: Offsets = {}
        for (topic, queue_id), queue_dir in sorted(self._queues().items()):
            lo, hi = queue_bounds(queue_dir)
            want = self.starting.get(topic, {}).get(queue_id, self.start_default)
            at = lo if want == EARLIEST else hi if want == LATEST else min(max(want, lo), hi)
            out.setdefault(topic, {})[str(queue_id)] = at
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        avail: dict[tuple[str, int], tuple[int, int]] = {}
        for (topic, queue_id), queue_dir in sorted(self._queues().items()):
            lo, hi = queue_bounds(queue_dir)
            # A queue that appeared after the query started reads from its beginning.
            at = start.get(topic, {}).get(str(queue_id), lo)
            avail[(topic, queue_id)] = (at, max(at, hi))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = {k: hi for k, (_, hi) in avail.items()}
        if budget is not None:
            # Round-robin shares, so that one busy queue cannot starve the others.
            ends = {k: at for k, (at, _) in avail.items()}
            while budget > 0:
                open_queues = [k for k, (_, hi) in avail.items() if ends[k] < hi]
                if not open_queues:
                    break
                share = max(1, budget // len(open_queues))
                for k in open_queues:
                    take = min(share, avail[k][1] - ends[k], budget)
                    ends[k] += take
                    budget -= take
                    if budget == 0:
                        break
        out: Offsets = {}
        for topic, queues in start.items():  # keep queues that are gone from disk
            for q, off in queues.items():
                out.setdefault(topic, {})[q] = off
        for (topic, queue_id), end in ends.items():
            out.setdefault(topic, {})[str(queue_id)] = end
        return out

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        queues = self._queues()
        parts: list[InputPartition] = []
        for topic, per in sorted(end.items()):
            for q, hi in sorted(per.items()):
                lo = start.get(topic, {}).get(q, 0)
                queue_dir = queues.get((topic, int(q)))
                if hi > lo and queue_dir is not None:
                    store = os.path.dirname(os.path.dirname(os.path.dirname(queue_dir)))
                    parts.append(QueueSlice(store, topic, int(q), lo, hi))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):
            raise TypeError(f"partition: a QueueSlice, got {type(partition).__name__}")
        freeze_reused_worker_heap()  # the daemon collects after each micro-batch task too
        yield from read_queue_slice(partition, self.columns)

    def commit(self, end: Offsets) -> None:
        pass  # nothing to release: the store keeps its data by its own retention


def read_queue_slice(part: QueueSlice, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The records of one queue's [start, end), in queue order, through its ConsumeQueue."""
    queue_dir = os.path.join(part.store, "consumequeue", part.topic, str(part.queue_id))
    units = queue_units(queue_dir, part.start, part.end)
    lo, _ = queue_bounds(queue_dir)
    if part.start < lo:
        log.warning("stream_data_expired", topic=part.topic, queue_id=part.queue_id, wanted=part.start, first=lo)
    if len(units) < part.end - max(part.start, lo):
        raise RuntimeError(
            f"rocketmq stream: {part.topic}/{part.queue_id} holds {len(units)} units of [{part.start}, {part.end}); "
            "the ConsumeQueue went backwards"
        )
    schema = arrow_schema(columns)
    segments = discover_segments([part.store])
    bases = np.array([s.base_offset or 0 for s in segments], dtype=np.int64)
    phys = units["offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    # A filler unit keeps a queue offset whose record was lost or quarantined: no record.
    real = ~((phys == 0) & (sizes == FILLER_UNIT_SIZE))
    phys, sizes = phys[real], sizes[real]
    which = np.searchsorted(bases, phys, side="right") - 1
    i = 0
    while i < len(phys):
        j = i
        while j < len(phys) and which[j] == which[i] and j - i < BATCH_ROWS:
            j += 1
        if which[i] < 0:  # before the first segment left (deleted by retention)
            i = j
            continue
        seg: Segment = segments[int(which[i])]
        try:
            buf = open_segment(seg.path)
        except FileNotFoundError:
            # Deleted since the listing (review 53 M1): by retention, its records expired, as
            # those before the first segment; from anywhere else, they are missing (skipped
            # with a warning each, as records past a segment's file are).
            if expired_by_retention(seg.path):
                log.warning("stream_data_expired", topic=part.topic, queue_id=part.queue_id, segment=seg.path)
            else:
                for p in (phys[i:j] - (seg.base_offset or 0)).tolist():
                    log.warning("stream_record_skipped", topic=part.topic, queue_id=part.queue_id, segment=seg.path,
                                position=p, reason="the segment file was deleted after the listing, and not as "
                                "the log's oldest segment: a segment file is missing")  # fmt: skip
            i = j
            continue
        positions = [p for p, size in zip((phys[i:j] - (seg.base_offset or 0)).tolist(), sizes[i:j].tolist())
                     if _record_ok(buf, seg, p, size, part)]  # fmt: skip
        bound = record_bound(seg, DEFAULT_MAX_MESSAGE_SIZE)  # records past the put limit are whole
        batch = decode_batch(buf, seg, positions, schema, max_message_size=bound) if positions else None
        if batch is not None and batch.num_rows:
            yield batch
        i = j


def _record_ok(buf: Any, seg: Segment, pos: int, size: int, part: QueueSlice) -> bool:
    """Whether the unit's record may be delivered: recovery's validity rule (the body CRC, and
    the record's own physical-offset field saying it lies here) and the unit's size. A record
    the store quarantined fails it; it is skipped with a warning, never delivered damaged."""
    why = "" if 0 <= pos and pos + size <= min(seg.file_size, len(buf)) else "unit points past the segment"
    if not why and _I32.unpack_from(buf, pos)[0] != size:
        why = "record size differs from the unit's"
    if not why:
        why = crc_failure(buf, pos, seg.file_size, record_bound(seg, DEFAULT_MAX_MESSAGE_SIZE))
    if not why and seg.base_offset is not None:
        said = _I64.unpack_from(buf, pos + PHYSICAL_OFFSET_POSITION)[0]
        if said != seg.base_offset + pos:
            why = f"record says it is at commitlog offset {said}"
    if why:
        log.warning("stream_record_skipped", topic=part.topic, queue_id=part.queue_id, segment=seg.path,
                    position=pos, reason=why)  # fmt: skip
    return not why
