"""The recovery scan's record walk, in C over the map (storage/_native.c `scan_records`).

`scan_run` walks the run of consecutive records from a position that the recovery scan
accepts without asking the Python decoder: V1 records with IPv4 hosts whose lengths agree
(codec.read_dispatch's fast path, with a topic as codec.read_record requires), with `check_crc` their body CRC and last property
separator, with `check_offset` their physical-offset field equal to where they lie. It returns
where that run ends and why. What lies at the end (a blank, zeroes, damage, an IPv6 or V2
record) is for the caller's Python decoder: recovery's rules (look past a bad record, quarantine,
never cut intact records) stay in storage/commitlog.py, unchanged.

`scan_run_reference` is the same walk in Python, the reference the C walk is tested against;
without the extension (or with MQSTORE_PURE_PYTHON=1) the callers keep their per-record Python
loop, so `scan_run` is only used where `fast_scan_available()`.

`data_end` sizes a scan's progress bar by the bytes that hold data, not by the segments'
allocated size: a crashed store's last 1 GiB segment holding 98 MB is 98 MB of work.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from . import codec, speedups
from .codec import DispatchFields, RecordKind
from .foreign import FOREIGN_SYSFLAGS, PROPERTY_INNER_MULTI_QUEUE_OFFSET
from .fs import FileSystem

__all__ = [
    "RecordTally",
    "ScanProgress",
    "cq_valid_prefix",
    "find_magic",
    "find_magic_reference",
    "cq_valid_prefix_reference",
    "ScanRun",
    "STOP_REASONS",
    "data_end",
    "dispatch_run",
    "fast_scan_available",
    "scan_run",
    "scan_run_reference",
]

# Why a run ended, by the C kernel's code (the index).
STOP_REASONS: Final = (
    "limit",  # fewer than 8 bytes left before the limit
    "budget",  # max_bytes walked: continue from `end`
    "blank",  # the END_OF_FILE record: the segment's end
    "zeroes",  # a zero header: unwritten space (end of data)
    "bad crc",  # a whole record whose body fails its CRC
    "torn properties",  # properties that do not end with their separator
    "wrong offset",  # a record whose physical-offset field says it lies elsewhere
    "past limit",  # a record size that runs past the limit: a torn tail
    "other",  # bad magic, insane lengths, IPv6, V2 or a foreign feature's record: the Python decoder decides
)
_BLANK_MAGIC: Final = codec.BLANK_MAGIC_CODE
_II = struct.Struct(">ii")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")
_V6_FLAGS: Final = codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG
# An item of the properties that starts with this name (storage.foreign's multi-dispatch).
_MULTI_DISPATCH_ITEM: Final = b"\x02" + PROPERTY_INNER_MULTI_QUEUE_OFFSET.encode() + b"\x01"
_FIXED_V4_LEN: Final = 91
_BODY_POS_V4: Final = 88
_SYSFLAG_POS: Final = 36
_BODY_LEN_POS: Final = 84
_STORE_TS_POS_V4: Final = 56


class ScanRun(NamedTuple):
    end: int  # position after the run's last record (= the start when the run is empty)
    records: int
    last_store_timestamp: int  # of the run's last record; 0 when the run is empty
    stop: str  # one of STOP_REASONS


def fast_scan_available() -> bool:
    """Whether the C walk is there (read at call time, as tests switch paths per case)."""
    native = speedups.native
    return native is not None and hasattr(native, "scan_records")


def scan_run(
    buf: Any,
    pos: int,
    limit: int,
    *,
    file_from_offset: int,
    max_message_size: int,
    check_crc: bool,
    check_offset: bool = True,
    max_bytes: int = 0,
) -> ScanRun:
    """The run of accepted records from `pos` (see the module doc); at most about `max_bytes`
    (0: no bound) so a caller can report progress between calls. The C walk releases the GIL."""
    if pos < 0:
        raise ValueError(f"pos must be >= 0, got {pos}")
    native = speedups.native
    if native is None or not hasattr(native, "scan_records"):
        return scan_run_reference(buf, pos, limit, file_from_offset=file_from_offset,
                                  max_message_size=max_message_size, check_crc=check_crc,
                                  check_offset=check_offset, max_bytes=max_bytes)  # fmt: skip
    end, records, last_ts, stop = native.scan_records(
        buf, pos, limit, file_from_offset, max_message_size, check_crc, check_offset, max_bytes
    )
    return ScanRun(end, records, last_ts, STOP_REASONS[stop])


def scan_run_reference(
    buf: Any,
    pos: int,
    limit: int,
    *,
    file_from_offset: int,
    max_message_size: int,
    check_crc: bool,
    check_offset: bool = True,
    max_bytes: int = 0,
) -> ScanRun:
    """`scan_run` in Python: the rules of codec.read_dispatch's fast path, record by record."""
    limit = min(limit, len(buf))
    budget_end = pos + max_bytes if max_bytes > 0 else None
    records = 0
    last_ts = 0
    while True:
        if pos + 8 > limit:
            stop = "limit"
            break
        if budget_end is not None and pos >= budget_end:
            stop = "budget"
            break
        total, magic = _II.unpack_from(buf, pos)
        if magic != codec.MESSAGE_MAGIC_CODE:
            stop = "blank" if magic == _BLANK_MAGIC else "zeroes" if total == 0 and magic == 0 else "other"
            break
        if total < _FIXED_V4_LEN or total > max_message_size:
            stop = "other"
            break
        if pos + total > limit:
            stop = "past limit"
            break
        sys_flag = _I.unpack_from(buf, pos + _SYSFLAG_POS)[0]
        body_len = _I.unpack_from(buf, pos + _BODY_LEN_POS)[0]
        if sys_flag & _V6_FLAGS or not 0 <= body_len <= total - _FIXED_V4_LEN:
            stop = "other"
            break
        t = pos + _BODY_POS_V4 + body_len
        topic_len = buf[t]
        if not 1 <= topic_len <= 127 or _FIXED_V4_LEN + body_len + topic_len > total:
            stop = "other"
            break
        props_len = _H.unpack_from(buf, t + 1 + topic_len)[0]
        if props_len < 0 or total != _FIXED_V4_LEN + body_len + topic_len + props_len:
            stop = "other"
            break
        if check_crc:
            body = memoryview(buf)[pos + _BODY_POS_V4 : pos + _BODY_POS_V4 + body_len]
            if body_len and codec.body_crc(body) != _I.unpack_from(buf, pos + 8)[0]:
                stop = "bad crc"
                break
            if props_len and buf[pos + total - 1] != 2:
                stop = "torn properties"
                break
        if check_offset and _Q.unpack_from(buf, pos + codec.PHYSICAL_OFFSET_POSITION)[0] != file_from_offset + pos:
            stop = "wrong offset"
            break
        if sys_flag & FOREIGN_SYSFLAGS or _MULTI_DISPATCH_ITEM in b"\x02" + bytes(buf[t + 3 + topic_len : pos + total]):
            stop = "other"  # a foreign feature's record: the Python decoder refuses it (storage.foreign)
            break
        last_ts = _Q.unpack_from(buf, pos + _STORE_TS_POS_V4)[0]
        records += 1
        pos += total
    return ScanRun(pos, records, last_ts, stop)


_MAGICS: Final = tuple(_I.pack(m) for m in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2, _BLANK_MAGIC))


def find_magic(buf: Any, start: int, stop: int, limit: int) -> int:
    """The first position pos in [start, stop) with a record's magic code (message V1 or V2,
    or the blank) at pos + 4, ending by `limit`; -1 if none. In C without the GIL (zeros
    skipped a word at a time) where the extension is built."""
    native = speedups.native
    if native is not None and hasattr(native, "find_magic"):
        found: int = native.find_magic(buf, start, stop, limit)
        return found
    return find_magic_reference(buf, start, stop, limit)


def find_magic_reference(buf: Any, start: int, stop: int, limit: int) -> int:
    """`find_magic` in Python."""
    start = max(start, 0)
    limit = min(limit, len(buf))
    stop = min(stop, limit - 7)
    if start >= stop:
        return -1
    window = bytes(buf[start + 4 : stop + 7])
    hits = [h for h in (window.find(m) for m in _MAGICS) if h >= 0]
    return start + min(hits) if hits else -1


def cq_valid_prefix(data: bytes | bytearray | memoryview, after: int = -1) -> tuple[int, int, int]:
    """(units, last commitlog offset, last real unit's offset) of the valid ConsumeQueue units
    at the start of `data` (offset >= 0, size > 0, past `after`, the last real unit's offset
    before them, unless a filler), up to the first invalid one; (0, -1, after) if none. In C
    without the GIL where the extension is built (a 2 GiB store's queues hold 2M units)."""
    if len(data) % codec.CQ_STORE_UNIT_SIZE:
        raise ValueError(f"data must be a whole number of {codec.CQ_STORE_UNIT_SIZE}-byte units, got {len(data)} bytes")
    native = speedups.native
    if native is not None and hasattr(native, "cq_valid_prefix"):
        units, last, after = native.cq_valid_prefix(data, after)
        return int(units), int(last), int(after)
    return cq_valid_prefix_reference(data, after)


def cq_valid_prefix_reference(data: bytes | bytearray | memoryview, after: int = -1) -> tuple[int, int, int]:
    """`cq_valid_prefix` in Python (ConsumeQueue.recover's loop). A queue's records lie in log
    order: a unit at or below the real one before it is torn (review 122 F3: a power loss left
    (0, 282, 0), which served the log's first message at an acknowledged offset)."""
    units, last = 0, -1
    for offset, size, _tags in codec.CQ_UNIT.iter_unpack(data):
        if offset < 0 or size <= 0:
            break
        if not (offset == 0 and size == codec.FILLER_UNIT_SIZE):
            if offset <= after:
                break
            after = offset
        elif after < 0:
            after = 0  # after a filler no real unit points at 0 (review 123 F1)
        units += 1
        last = offset
    return units, last, after



class RecordTally:
    """What crash recovery keeps of the records its scan walks, gathered without a Python call
    per record where the C walk runs: how many, the first one's commitlog offset, the last one's
    store time, and per queue ("topic-queueId") the queue offset after its last record (PREPARED
    and ROLLBACK transaction records have none). Pass it as `dispatch` to
    CommitLog.recover_abnormally; called with one record's fields, it is the reference."""

    def __init__(self) -> None:
        self.count = 0
        self.first_offset = -1
        self.last_store_timestamp = 0
        self.next_queue_offsets: dict[str, int] = {}

    def __call__(self, fields: DispatchFields) -> None:
        if self.first_offset < 0:
            self.first_offset = fields.commitlog_offset
        self.count += 1
        self.last_store_timestamp = fields.store_timestamp
        tran = fields.sys_flag & codec.TRANSACTION_MASK
        if tran not in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
            key = f"{fields.topic}-{fields.queue_id}"
            if fields.consume_queue_offset >= self.next_queue_offsets.get(key, 0):
                self.next_queue_offsets[key] = fields.consume_queue_offset + 1

    def add_run(self, buf: Any, start: int, file_from_offset: int, run: ScanRun, max_message_size: int) -> None:
        """Every record of `run` (from `start` of a segment at `file_from_offset`) at once."""
        native = speedups.native
        if native is None or not hasattr(native, "tally_records"):
            dispatch_run(buf, start, run, max_message_size, self)
            return
        if not run.records:
            return
        if self.first_offset < 0:
            self.first_offset = file_from_offset + start
        self.count += run.records
        self.last_store_timestamp = run.last_store_timestamp
        for topic, queue_id, max_queue_offset in native.tally_records(buf, start, run.end, run.records):
            # As the record-by-record rule: the queue's next offset only moves forward.
            key = f"{str(topic, 'utf-8', 'replace')}-{queue_id}"
            if max_queue_offset >= self.next_queue_offsets.get(key, 0):
                self.next_queue_offsets[key] = max_queue_offset + 1


def dispatch_run(
    buf: Any, start: int, run: ScanRun, max_message_size: int, dispatch: Callable[[DispatchFields], None]
) -> None:
    """Hand every record of `run` (which starts at `start`) to `dispatch`, as the per-record
    scan would (codec.read_dispatch's fields, delay levels None): the dispatcher's C decoder,
    and codec.read_dispatch for the records it leaves (the schedule topic)."""
    native = speedups.native
    pos, end, left = start, run.end, run.records
    while left > 0:
        if native is not None:
            decoded, pos_after = native.dispatch_scan(buf, pos, end, left, max_message_size, DispatchFields,
                                                      codec.SCHEDULE_TOPIC_UTF8)  # fmt: skip
            for fields in decoded:
                dispatch(fields)
            left -= len(decoded)
            pos = pos_after
            if left == 0:
                break
        kind, size, one = codec.read_dispatch(buf, pos, end, max_message_size, None)
        if kind is not RecordKind.MESSAGE or one is None:  # the walk accepted it: cannot happen
            raise RuntimeError(f"record at {pos} of an accepted run decodes as {kind.value}")
        dispatch(one)
        left -= 1
        pos += size


_TRIM_BUDGET_BYTES: Final = 64 << 20
_TRIM_CHUNK_BYTES: Final = 1 << 20


def data_end(fs: FileSystem, path: str, buf: Any, start: int, size: int) -> int:
    """Where the data of a segment file ends, at or after `start` (`start` if it holds none):
    the end of its last data extent, less the zeros at the end of it (blocks the writer
    reserved ahead read as data), found backwards within a bounded budget so a zero-filled
    segment costs milliseconds, not a read of the whole file (then the extent's end counts).
    Without extents (no SEEK_DATA) the whole file is data."""
    try:
        extents = fs.data_extents(path, start, size)
    except OSError:
        extents = [(start, size)]
    budget = _TRIM_BUDGET_BYTES
    for extent_start, extent_end in reversed(extents):
        end = extent_end
        while end > extent_start:
            if budget <= 0:
                return end
            begin = max(extent_start, end - _TRIM_CHUNK_BYTES)
            chunk = bytes(buf[begin:end]).rstrip(b"\0")
            if chunk:
                return begin + len(chunk)
            budget -= end - begin
            end = begin
    return start


class ScanProgress:
    """A scan's progress as (bytes of data done, bytes of data to do) for a progress callback,
    reported at most every `step_bytes`. `data_sizes[i]` is what file i of the scan holds from
    where the scan starts in it (the first file: `first_start`) to its data end."""

    def __init__(self, callback: Callable[[int, int], None], data_sizes: Sequence[int], first_start: int,
                 step_bytes: int) -> None:  # fmt: skip
        self.callback = callback
        self.sizes = list(data_sizes)
        self.first_start = first_start
        self.before = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.total = sum(self.sizes)
        self.step_bytes = step_bytes
        self.next_report = 0

    @classmethod
    def of_files(cls, callback: Callable[[int, int], None], fs: FileSystem, files: Sequence[tuple[str, Any]],
                 first_start: int, segment_size: int, step_bytes: int) -> ScanProgress:  # fmt: skip
        """For a scan of `files` ((path, mapped buffer), in order) from `first_start` in the first."""
        sizes = []
        for i, (path, buf) in enumerate(files):
            start = first_start if i == 0 else 0
            sizes.append(max(data_end(fs, path, buf, start, segment_size) - start, 0))
        return cls(callback, sizes, first_start, step_bytes)

    def done_at(self, file_index: int, pos: int) -> int:
        """Bytes of data done when the scan is at `pos` of its `file_index`th file."""
        if file_index >= len(self.sizes):
            return self.total
        start = self.first_start if file_index == 0 else 0
        return self.before[file_index] + min(max(pos - start, 0), self.sizes[file_index])

    def at(self, file_index: int, pos: int) -> None:
        done = self.done_at(file_index, pos)
        if done >= self.next_report:
            self.callback(done, self.total)
            self.next_report = done + self.step_bytes

    def finish(self) -> None:
        self.callback(self.total, self.total)
