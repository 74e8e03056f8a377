"""What a read asks for, beyond columns: topics, queues, queue-offset, time and commitlog ranges.

No Spark here. Built from the Kafka-style options (`topics`, `topicPattern`,
`startingOffsets`/`endingOffsets`, `startingTimestamp`/`endingTimestamp`) and from the
filters Spark pushes down; applied twice, both times conservatively:

* planning: `commitlog_range` narrows the byte ranges worth reading (ConsumeQueue entries
  where present; pushed commitlog_offset ranges always);
* decoding: `row_mask` keeps exactly the rows asked for, vectorised over a record batch.

Offsets follow Kafka: start inclusive, end exclusive, -2 earliest, -1 latest; a queue a
JSON does not name reads from earliest to latest. A bounded queue (one a JSON names) holds
what its ConsumeQueue would: prepared and rolled-back transaction records are not in it.
Time bounds are on store_timestamp: start inclusive, end exclusive.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Final, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.log import get_logger
from mqstore.storage.codec import (
    CQ_STORE_UNIT_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    RecordKind,
    cal_msg_length,
    read_record,
)
from mqstore.storage.consume_queue import FILLER_UNIT_SIZE, is_filler

from .segments import Segment, SegmentError, expired_by_retention, open_segment, read_regular, record_bound

log = get_logger(__name__)

EARLIEST: Final = -2
LATEST: Final = -1
_NO_END: Final = np.iinfo(np.int64).max
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US: Final = timedelta(microseconds=1)
_CQ_DTYPE: Final = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
_MIN_RECORD: Final = cal_msg_length(0, 0, 0)


@dataclass(frozen=True)
class ReadBounds:
    """All fields None/empty: everything. Ranges are half-open [from, until)."""

    topics: frozenset[str] | None = None
    topic_pattern: str | None = None
    queue_ids: frozenset[int] | None = None
    starting: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    ending: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    default_start: int = EARLIEST
    default_end: int = LATEST
    timestamp_from_us: int | None = None
    timestamp_until_us: int | None = None
    commitlog_from: int | None = None
    commitlog_until: int | None = None
    # Rows from pushed filters follow SQL: a null (corrupt) row never matches. Rows chosen
    # by options alone keep corrupt ranges, so they are still reported.
    drop_corrupt: bool = False

    @property
    def queue_bounded(self) -> bool:
        return bool(self.starting or self.ending) or self.default_start != EARLIEST or self.default_end != LATEST

    @property
    def needs_rows(self) -> bool:
        """Whether any row-level condition applies (else every decoded row is kept)."""
        return (
            self.drop_corrupt
            or self.topics is not None
            or self.topic_pattern is not None
            or self.queue_ids is not None
            or self.queue_bounded
            or self.timestamp_from_us is not None
            or self.timestamp_until_us is not None
            or self.commitlog_from is not None
            or self.commitlog_until is not None
        )

    @property
    def empty(self) -> bool:
        """Nothing can match: an empty topic set, or a range that is empty."""
        if self.topics is not None and not self.topics or self.queue_ids is not None and not self.queue_ids:
            return True
        for lo, hi in ((self.timestamp_from_us, self.timestamp_until_us), (self.commitlog_from, self.commitlog_until)):
            if lo is not None and hi is not None and lo >= hi:
                return True
        return False

    def filter_columns(self) -> list[str]:
        cols = ["commitlog_offset"]
        if self.topics is not None or self.topic_pattern is not None or self.queue_bounded or self.drop_corrupt:
            cols.append("topic")  # also the mark of a corrupt row: only those lack a topic
        if self.queue_ids is not None or self.queue_bounded:
            cols.append("queue_id")
        if self.queue_bounded:
            cols += ["queue_offset", "sys_flag"]
        if self.timestamp_from_us is not None or self.timestamp_until_us is not None:
            cols.append("store_timestamp")
        return cols

    def and_topics(self, topics: Sequence[str]) -> ReadBounds:
        got = frozenset(topics) if self.topics is None else self.topics & frozenset(topics)
        return replace(self, topics=got)

    def and_queue_ids(self, queue_ids: Sequence[int]) -> ReadBounds:
        got = frozenset(queue_ids) if self.queue_ids is None else self.queue_ids & frozenset(queue_ids)
        return replace(self, queue_ids=got)

    def and_timestamps(self, from_us: int | None, until_us: int | None) -> ReadBounds:
        return replace(
            self,
            timestamp_from_us=_max(self.timestamp_from_us, from_us),
            timestamp_until_us=_min(self.timestamp_until_us, until_us),
        )

    def and_commitlog(self, from_offset: int | None, until_offset: int | None) -> ReadBounds:
        return replace(
            self,
            commitlog_from=_max(self.commitlog_from, from_offset),
            commitlog_until=_min(self.commitlog_until, until_offset),
        )

    def row_mask(self, batch: pa.RecordBatch) -> np.ndarray:
        """Which rows of `batch` (holding `filter_columns()`) are asked for."""
        n = batch.num_rows
        keep = np.ones(n, dtype=bool)
        names = batch.schema.names
        clog = batch.column(names.index("commitlog_offset"))
        corrupt = np.asarray(clog.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        topic = batch.column(names.index("topic")) if "topic" in names else None
        if topic is not None:
            corrupt |= np.asarray(topic.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        clog_np = clog.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if self.commitlog_from is not None:
            keep &= clog_np >= self.commitlog_from
        if self.commitlog_until is not None:
            keep &= clog_np < self.commitlog_until
        if self.topics is not None and topic is not None:
            keep &= _np(pc.is_in(topic, value_set=pa.array(sorted(self.topics), pa.string())))
        if self.topic_pattern is not None and topic is not None:
            keep &= _np(pc.match_substring_regex(topic, f"^(?:{self.topic_pattern})$"))
        if self.queue_ids is not None or self.queue_bounded:
            queue = batch.column(names.index("queue_id")).fill_null(-1).to_numpy(zero_copy_only=False)
            if self.queue_ids is not None:
                keep &= np.isin(queue, np.fromiter(self.queue_ids, dtype=np.int64, count=len(self.queue_ids)))
        if self.queue_bounded and topic is not None:
            keep &= self._queue_offset_mask(batch, topic, queue)
        if self.timestamp_from_us is not None or self.timestamp_until_us is not None:
            ts = batch.column(names.index("store_timestamp")).cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            if self.timestamp_from_us is not None:
                keep &= ts >= self.timestamp_from_us
            if self.timestamp_until_us is not None:
                keep &= ts < self.timestamp_until_us
        wanted: np.ndarray = (keep & ~corrupt) | (corrupt & (not self.drop_corrupt))
        return wanted

    def _queue_offset_mask(self, batch: pa.RecordBatch, topic: pa.Array, queue: np.ndarray) -> np.ndarray:
        names = batch.schema.names
        qoff = batch.column(names.index("queue_offset")).fill_null(-1).to_numpy(zero_copy_only=False)
        sys_flag = batch.column(names.index("sys_flag")).fill_null(0).to_numpy(zero_copy_only=False)
        n = batch.num_rows
        start = np.full(n, _offset_floor(self.default_start), dtype=np.int64)
        end = np.full(n, _offset_ceiling(self.default_end), dtype=np.int64)
        encoded = pc.dictionary_encode(topic)
        indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        for k, name in enumerate(encoded.dictionary.to_pylist()):
            rows = indices == k
            for q, off in self.starting.get(name, {}).items():
                start[rows & (queue == q)] = _offset_floor(off)
            for q, off in self.ending.get(name, {}).items():
                end[rows & (queue == q)] = _offset_ceiling(off)
        tx = sys_flag & TRANSACTION_MASK
        in_queue = (tx != TRANSACTION_PREPARED_TYPE) & (tx != TRANSACTION_ROLLBACK_TYPE)
        return np.asarray(in_queue & (qoff >= start) & (qoff < end), dtype=bool)

    def pushed_range(self) -> tuple[int, int]:
        """[lo, hi) of commitlog offsets the pushed commitlog_offset filters allow."""
        return self.commitlog_from or 0, self.commitlog_until if self.commitlog_until is not None else _NO_END

    def commitlog_range(
        self, store_dir: str, segments: Sequence[Segment], max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    ) -> tuple[int, int]:
        """[lo, hi) of one store's commitlog offsets that can hold a wanted record: the pushed
        range, narrowed by that store's own ConsumeQueue units (`segments`: the store's
        segments, to check them against) when the wanted queues are known and their units
        can be trusted. Offsets of different stores are unrelated: one range per store.

        Conservative, since a record pruned here is lost without a trace: the range stays
        open when a wanted queue has no ConsumeQueue directory (deleted, not copied, a bare
        commitlog), when a queue no JSON names may be wanted (its directory may be missing
        too, so only a pushed queue_id filter bounds the queues), and when a unit is
        implausible or does not point at its own record. Records not yet dispatched to a
        ConsumeQueue lie after every dispatched one, so a lower bound never cuts them off."""
        lo, hi = self.pushed_range()
        if self.topics is None or not self.queue_bounded:
            return lo, hi
        try:
            got = self._consume_queue_range(store_dir, segments, max_message_size)
        except OSError as exc:  # a file that went away or cannot be read: scan
            log.warning("consume_queue_unreadable", store=store_dir, error=str(exc))
            return lo, hi
        if got is None:
            return lo, hi
        cq_lo, cq_hi = got
        if cq_lo == _NO_END:  # no queue selected
            return lo, lo
        return max(lo, cq_lo), min(hi, max(cq_hi, cq_lo))

    def _consume_queue_range(
        self, store_dir: str, segments: Sequence[Segment], max_message_size: int
    ) -> tuple[int, int] | None:
        """(lo, hi) over the wanted queues' units; None: do not prune this store."""
        assert self.topics is not None
        if self.queue_ids is None and _offset_floor(self.default_start) < _offset_ceiling(self.default_end):
            return None  # every queue id no JSON names is wanted, known or not
        # A unit's size is a record's when the record fits a segment (`record_bound`): a broker
        # may allow messages past the default maxMessageSize.
        largest = max([max_message_size] + [record_bound(g, max_message_size) for g in segments])
        cq_lo, cq_hi = _NO_END, 0
        for topic in sorted(self.topics):
            starting, ending = self.starting.get(topic, {}), self.ending.get(topic, {})
            queue_ids = self.queue_ids if self.queue_ids is not None else frozenset(starting) | frozenset(ending)
            for queue_id in sorted(queue_ids):
                s = _offset_floor(starting.get(queue_id, self.default_start))
                e = _offset_ceiling(ending.get(queue_id, self.default_end))
                if s >= e:
                    continue  # nothing wanted from this queue
                queue_dir = os.path.join(store_dir, "consumequeue", topic, str(queue_id))
                units = _cq_units(queue_dir) if os.path.isdir(queue_dir) else None
                if units is None:
                    return None  # nothing says where this queue's records lie
                first, entries = units
                why = _implausible(entries, largest)
                if why:
                    log.warning("consume_queue_implausible", queue=queue_dir, reason=why)
                    return None
                check = _UnitCheck(segments, topic, queue_id, first, entries, max_message_size)
                # Lower end: the wanted record with the lowest queue offset (or, past the last
                # unit, the end of the last one) starts no earlier than the unit of s.
                if s <= first or not len(entries):
                    q_lo: int | None = 0
                elif s - first < len(entries):
                    q_lo = check.start_of(s)
                else:
                    q_lo = check.end_of(first + len(entries) - 1, filler=0)
                # Upper end: the record of e - 1 ends the wanted ones.
                if e == _NO_END or not len(entries) or e - 1 < first or e - 1 - first >= len(entries):
                    q_hi: int | None = _NO_END
                else:
                    q_hi = check.end_of(e - 1, filler=_NO_END)
                if q_lo is None or q_hi is None:
                    log.warning("consume_queue_unit_mismatch", queue=queue_dir, reason=check.failed)
                    return None
                cq_lo, cq_hi = min(cq_lo, q_lo), max(cq_hi, q_hi)
        return cq_lo, cq_hi


def _np(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _offset_floor(off: int) -> int:
    return 0 if off == EARLIEST else _NO_END if off == LATEST else off


def _offset_ceiling(off: int) -> int:
    return _NO_END if off == LATEST else 0 if off == EARLIEST else off


def _implausible(entries: np.ndarray, max_message_size: int) -> str:
    """Why the real (non-filler) units of a queue cannot be those of a ConsumeQueue, or ""."""
    offsets = entries["offset"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    real = ~((offsets == 0) & (sizes == FILLER_UNIT_SIZE))
    offsets, sizes = offsets[real], sizes[real]
    bad = np.nonzero((sizes < _MIN_RECORD) | (sizes > max_message_size))[0]
    if len(bad):
        return f"unit size {int(sizes[bad[0]])} is not a record's"
    # A queue's records lie in commitlog order and never overlap.
    bad = np.nonzero(offsets[:-1] + sizes[:-1] > offsets[1:])[0]
    if len(bad):
        return f"unit at commitlog offset {int(offsets[bad[0] + 1])} does not follow {int(offsets[bad[0]])}"
    return ""


class _UnitCheck:
    """Commitlog offsets from one queue's units, each checked against the record it points
    at (one read): inside a segment of the store, and that record's own topic, queue id,
    queue offset, physical offset and size are the unit's."""

    def __init__(
        self, segments: Sequence[Segment], topic: str, queue_id: int, first: int, entries: np.ndarray, max_message_size: int
    ) -> None:
        self.segments = segments
        self.topic = topic
        self.queue_id = queue_id
        self.first = first
        self.entries = entries
        self.max_message_size = max_message_size
        self.failed = ""

    def start_of(self, queue_offset: int) -> int | None:
        """Where the record of queue_offset starts (0 for a filler unit: it says nothing);
        None when the unit does not hold."""
        offset, size = self._unit(queue_offset)
        if is_filler(offset, size):
            return 0
        held = self._holds(queue_offset, offset, size)
        return 0 if held is None else offset if held else None

    def end_of(self, queue_offset: int, filler: int) -> int | None:
        """Where the record of queue_offset ends (`filler` for a filler unit, the side's
        open end); None as `start_of`."""
        offset, size = self._unit(queue_offset)
        if is_filler(offset, size):
            return filler
        held = self._holds(queue_offset, offset, size)
        return filler if held is None else offset + size if held else None

    def _unit(self, queue_offset: int) -> tuple[int, int]:
        unit = self.entries[queue_offset - self.first]
        return int(unit["offset"]), int(unit["size"])

    def _holds(self, queue_offset: int, offset: int, size: int) -> bool | None:
        """Whether the unit points at its own record; None when the record's segment was
        deleted by the store's retention since the listing: the unit then says nothing, as a
        filler unit (review 53 M1)."""
        seg = next((g for g in self.segments if g.base_offset is not None
                    and g.base_offset <= offset and offset + size <= g.base_offset + g.file_size), None)  # fmt: skip
        if seg is None or seg.base_offset is None:
            self.failed = f"unit {queue_offset}: commitlog offset {offset} (size {size}) is in no segment"
            return False
        try:  # mapped: only the header's pages are read, however large the unit says it is
            buf = open_segment(seg.path)
        except FileNotFoundError:
            if expired_by_retention(seg.path):
                return None
            raise  # damage: `commitlog_range` reads the store whole
        except SegmentError as exc:  # no longer a regular file: nothing to check the unit by
            self.failed = f"unit {queue_offset}: {exc}"
            return False
        pos = offset - seg.base_offset
        got = read_record(buf, pos, min(len(buf), pos + size), read_body=False,
                          max_message_size=record_bound(seg, self.max_message_size))  # fmt: skip
        rec = got.record
        if got.kind is not RecordKind.MESSAGE or rec is None:
            self.failed = f"unit {queue_offset}: no record at commitlog offset {offset}: {got.reason}"
            return False
        seen = (rec.topic, rec.queue_id, rec.queue_offset, rec.commitlog_offset, rec.total_size)
        if seen != (self.topic, self.queue_id, queue_offset, offset, size):
            self.failed = (f"unit {queue_offset} ({offset}, size {size}) points at a record of {rec.topic} queue "
                           f"{rec.queue_id} offset {rec.queue_offset} saying it is at {rec.commitlog_offset}, "
                           f"size {rec.total_size}")  # fmt: skip
            return False
        return True


def _cq_units(queue_dir: str) -> tuple[int, np.ndarray] | None:
    """(first queue offset, valid entries) of one queue's files; None when they are not one
    contiguous run (a gap: do not guess)."""
    names = sorted(n for n in os.listdir(queue_dir) if len(n) == 20 and n.isdigit())
    if not names or int(names[0]) % CQ_STORE_UNIT_SIZE:
        return None
    parts: list[np.ndarray] = []
    first = int(names[0]) // CQ_STORE_UNIT_SIZE
    expect = int(names[0])
    for name in names:
        if int(name) != expect:
            return None
        try:  # a FIFO named like a ConsumeQueue file would block a plain open() for good
            data = read_regular(os.path.join(queue_dir, name), "a ConsumeQueue file")
        except SegmentError as exc:  # not a regular file: nothing to trust, scan
            log.warning("consume_queue_not_a_file", queue=queue_dir, reason=str(exc))
            return None
        units = np.frombuffer(data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE], dtype=_CQ_DTYPE)
        valid = (units["offset"] >= 0) & (units["size"] > 0)
        n_valid = int(np.argmin(valid)) if not valid.all() else len(units)
        parts.append(units[:n_valid])
        if n_valid < len(units):
            break
        expect += len(data)
    entries = np.concatenate(parts) if parts else np.zeros(0, dtype=_CQ_DTYPE)
    # A store that expired its head keeps filler units (offset 0): those tell nothing
    # (`_UnitCheck` leaves the range open at one).
    return first, entries


KNOWN_OFFSET_WORDS: Final = {"earliest": EARLIEST, "latest": LATEST}


def parse_offsets(option: str, text: str, *, ending: bool, streaming: bool) -> tuple[int, dict[str, dict[int, int]]]:
    """(default, {topic: {queue: offset}}) from "earliest", "latest" or a JSON object."""
    word = text.strip().lower()
    if word in KNOWN_OFFSET_WORDS:
        default = KNOWN_OFFSET_WORDS[word]
        _check_offset(option, default, ending=ending, streaming=streaming)
        return default, {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: not 'earliest', 'latest' or JSON ({exc}): {text!r}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"{option}: want {{\"topic\": {{\"queueId\": offset}}}}, got {text!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, queues in raw.items():
        per: dict[int, int] = {}
        for q, off in queues.items():
            if not str(q).lstrip("-").isdigit() or isinstance(off, bool) or not isinstance(off, int):
                raise ValueError(f"{option}: queue ids and offsets are integers, got {q!r}: {off!r} for {topic!r}")
            _check_offset(option, off, ending=ending, streaming=streaming)
            per[int(q)] = off
        out[str(topic)] = per
    return (LATEST if ending else EARLIEST), out


def _check_offset(option: str, off: int, *, ending: bool, streaming: bool) -> None:
    if off < EARLIEST:
        raise ValueError(f"{option}: offset {off} is neither >= 0, -2 (earliest) nor -1 (latest)")
    if ending and off == EARLIEST:
        raise ValueError(f"{option}: -2 (earliest) cannot end a read")
    if not ending and off == LATEST and not streaming:
        raise ValueError(f"{option}: -1 (latest) cannot start a batch read: it would read nothing")


def parse_timestamp_ms(option: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{option}: epoch milliseconds, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{option}: epoch milliseconds, got {text!r}")
    return value


def parse_topic_pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"topicPattern: not a regular expression ({exc}): {text!r}") from None
    return text


def to_epoch_us(value: object) -> int | None:
    """A pushed timestamp literal as epoch microseconds (None: not a timestamp we know)."""
    if isinstance(value, datetime):
        dt = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return (dt - _EPOCH) // _US
    return None

