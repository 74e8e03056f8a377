"""The CommitLog: the writer side, recovery scans, and read-only views (spec §3.7, §6, §11).

`CommitLog` is owned by one actor, the only writer of commitlog/. Records arrive already
encoded (by `codec.encode_message` in the producer's thread, offsets 0); the writer only
assigns the queue offset, the physical offset and the store timestamp, in place.

`CommitLogReader` is for every other thread: its own read-only maps, reading only below a
watermark it was told. `scan_commitlog_dir` walks a directory for tools.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import mmap
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Collection, Generator, Iterator, Mapping, Sequence
from typing import Any, Callable, Final, NamedTuple

from mqstore.log import get_logger, suppressed_fields
from mqstore.storage.codec import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DispatchFields,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    JAVA_LONG_MAX,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PHYSICAL_OFFSET_POSITION,
    QUEUE_OFFSET_POSITION,
    SYSFLAG_POSITION,
    TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    HostAddress,
    RecordKind,
    RecordRead,
    blank_record_header,
    read_dispatch,
    read_record,
    store_timestamp_position,
)
from mqstore.storage import mapguard, scan, speedups
from mqstore.storage.fs import (
    OUT_OF_RESOURCES_ERRNOS,
    FileSystem,
    MappedRegion,
    RealFileSystem,
    UnreadDuringRecoveryError,
    UnreadPageError,
    close_region_if_free,
    free_name,
    region_closed,
)
from mqstore.storage.mapped_file import RESERVE_LOW_WATER_BYTES, DiskFullError, MappedFile, WriteBufferPool
from mqstore.storage.mapped_file_queue import Allocator, MappedFileQueue
from mqstore.storage.status import (
    AppendMessageResult,
    AppendMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

__all__ = [
    "CommitLog",
    "CommitLogReader",
    "EncodedRecords",
    "ProgressCallback",
    "QUARANTINED_PREFIX",
    "Quarantined",
    "being_created",
    "find_next_valid_record",
    "valid_prefix_end",
    "expired_since_listed",
    "scan_commitlog_dir",
]

log = get_logger(__name__)
# The store's own copy of a segment another process replaced while the store wrote it
# (CommitLog.keep_replaced_segments): an open refuses while one is there.
STORE_COPY_SUFFIX: Final = ".store-copy"
# An empty file saying the copy could not be saved (a full disk): without it nothing on disk
# says the file at the segment's name is not the store's (review 147 F1's rest: the next open
# read the other file as the log). A name `store_copies` lists: every refusal holds for it.
STORE_COPY_LOST_SUFFIX: Final = ".store-copy-lost"
# An empty file (where none can be made, a second name of that file) saying that, when the
# writer was to make this segment, a file it did not make was at its path (another process's):
# it wrote nothing into it, and without the mark the next open read that file as the log's next
# segment (review 152 F2: another store's records served).
STORE_COPY_NONE_SUFFIX: Final = ".store-copy-none"


def store_copies(fs: FileSystem, commitlog_dir: str) -> list[str]:
    """Names of the `.store-copy` files in the commitlog directory, sorted: while one is
    there, an open, `mqstore recover` and a restarted writer refuse, and `inspect` names it."""
    if not fs.isdir(commitlog_dir):
        return []
    return sorted(name for name in fs.listdir(commitlog_dir) if STORE_COPY_SUFFIX in name)


def store_copy_problem(name: str) -> str:
    """What a file `store_copies` lists stands for and the ways out, said alike by the open,
    `mqstore recover`, a restarted writer, `verify` and `inspect`. `name`: its name or path."""
    segment = os.path.basename(name).split(STORE_COPY_SUFFIX)[0]
    if STORE_COPY_NONE_SUFFIX in name:
        return (f"{name} says that when the store was to write segment {segment}, a file it did not make was "
                "already at its path (another process's): the store wrote nothing into it and acknowledged no "
                f"message there; move the file named {segment} out of the commitlog directory and delete the marker "
                "(where no empty file could be made, the marker is a second name of that file)")
    if STORE_COPY_LOST_SUFFIX in name:
        return (f"{name} says another process replaced segment {segment} while the store wrote it, and the store "
                f"could not save its copy of it (see the log): the file named {segment} is not the one the store "
                "wrote, and the messages the store acknowledged in it are lost unless a backup of the segment "
                "holds them; put that backup over the segment (or accept the other file) and delete the marker")
    return (f"{name} is the store's own copy of segment {segment}, which another process replaced while the store "
            "wrote it: move the copy over the segment to keep the store's acknowledged messages, or delete it to "
            "keep the other file")  # fmt: skip


def store_copy_starts(fs: FileSystem, commitlog_dir: str) -> list[int]:
    """The log offsets of the segments a name of `store_copies` stands beside (names it gave:
    NAME.store-copy, NAME.store-copy.N, and the NAME.store-copy-lost and NAME.store-copy-none
    marks, which start alike), sorted; a stray name is the open's to name, not an offset. Each is
    a segment whose file at its path is not the one the store wrote, whichever of the names is
    there: a restarted writer serves none of its records, the cleaner keeps what the queues and
    the index hold for it (`head_offset`), and recovery counts it as a hole where no file of
    the log is loaded."""
    return sorted({int(name[:20]) for name in store_copies(fs, commitlog_dir)
                   if name[:20].isdigit() and name[20:].startswith(STORE_COPY_SUFFIX)})  # fmt: skip

_II = struct.Struct(">ii")
_I = struct.Struct(">i")
_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")  # QUEUEOFFSET and PHYSICALOFFSET sit side by side
_PROGRESS_STEP_BYTES: Final = 4 << 20

# (bytes scanned so far, bytes to scan in total), for a progress bar.
ProgressCallback = Callable[[int, int], None]

# The reason of a CORRUPT read that `scan_commitlog_dir(look_past_damage=True)` walked past.
QUARANTINED_PREFIX: Final = "quarantined: "
DISK_FULL_LOG_INTERVAL_S: Final = 10.0
_MAGIC_PATTERNS: Final = tuple(_I.pack(m) for m in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, BLANK_MAGIC_CODE))
_SEARCH_CHUNK_BYTES: Final = 4 << 20


_SECTOR: Final = 512  # the unit a write-back tears in (a disk sector)


class Quarantined(NamedTuple):
    """Damaged bytes [start, end) of the commitlog with valid records after them: left in place,
    skipped by readers and dispatch, reported; never a reason to cut what follows."""

    start: int
    end: int
    reason: str


def _valid_record_at(buf: Any, pos: int, limit: int, file_from_offset: int, segment_size: int,
                     max_message_size: int, stored_before_ms: int | None) -> bool:  # fmt: skip
    """A record that can be trusted to start at `pos`: a CRC-checked message whose own
    physical-offset field says it lies here (segments are never reused, so a stale record
    cannot pass), stored at or before `stored_before_ms` if given, or (without that bound) the
    blank that ends this segment exactly."""
    if pos + 8 > limit:
        return False
    total, magic = _II.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return stored_before_ms is None and total == segment_size - pos
    read = read_record(buf, pos, limit, check_crc=True, read_body=True, max_message_size=max_message_size)
    record = read.record
    return (
        read.kind is RecordKind.MESSAGE
        and record is not None
        and record.commitlog_offset == file_from_offset + pos
        and (stored_before_ms is None or record.store_timestamp <= stored_before_ms)
    )


def find_next_valid_record(
    buf: Any,
    start: int,
    limit: int,
    *,
    file_from_offset: int,
    segment_size: int,
    max_message_size: int,
    extents: Sequence[tuple[int, int]] | None = None,
    stored_before_ms: int | None = None,
) -> int | None:
    """The position of the first trusted record (see `_valid_record_at`) in [start, limit) of
    one segment's buffer, or None. Candidates are found by their magic code, in bounded chunks,
    only inside `extents` (the parts of the file that hold data; default: all of it)."""
    fast = speedups.native is not None
    for extent_start, extent_end in extents if extents is not None else ((start, limit),):
        lo = max(start, extent_start - 8)  # a header may start just before a data extent
        hi = min(limit, extent_end)
        # No magic is looked for past the extent: a hole after it is zeros (a magic has none),
        # and on a full tmpfs a read of one faults (review 116 F1: a magic checked across the
        # extent's end made a store that filled its disk unopenable). A record found is read
        # whole, to `limit`: one holding a page of zeros may span a hole of a sparse copy.
        reach = hi
        if fast:
            # The candidates of the chunked search below, in the same order, found in C (a
            # zero-filled segment, e.g. one copied without its holes, was seconds of
            # bytes.find per open).
            pos = scan.find_magic(buf, max(start, lo - 4), hi, reach) if lo < hi else -1
            while pos >= 0:
                if _valid_record_at(buf, pos, limit, file_from_offset, segment_size, max_message_size,
                                    stored_before_ms):  # fmt: skip
                    return pos
                pos = scan.find_magic(buf, pos + 1, hi, reach)
            continue
        while lo < hi:
            chunk_end = min(hi, lo + _SEARCH_CHUNK_BYTES)
            window = bytes(buf[lo : min(reach, chunk_end + 8)])  # +8: a magic across the chunk edge
            hits = sorted(
                h for pattern in _MAGIC_PATTERNS for h in _find_all(window, pattern) if lo + h - 4 >= start
                and lo + h - 4 < chunk_end  # fmt: skip
            )
            for hit in hits:
                pos = lo + hit - 4
                if _valid_record_at(buf, pos, limit, file_from_offset, segment_size, max_message_size,
                                    stored_before_ms):  # fmt: skip
                    return pos
            lo = chunk_end
    return None


def max_record_size(segment_size: int, max_message_size: int) -> int:
    """The largest record a read takes as one: whatever fits a segment, not the put limit.
    A store reopened with a smaller max_message_size_bytes (or written by a broker with a
    larger maxMessageSize) holds records past that limit, and they are whole: RocketMQ reads
    them, bounded only by the file. Taken for damage, they were quarantined and, after a
    crash, their queue units cut. A damaged size field is still caught: the record's field
    lengths must add up to it, and its CRC must match."""
    return max(segment_size, max_message_size)


def valid_prefix_end(buf: Any, file_from_offset: int, segment_size: int, max_message_size: int) -> int:
    """The end of the valid records (CRC and offset checked) at the start of a short (damaged)
    segment's bytes `buf`. Room is left for the blank record that ends a segment, so what a
    reader serves before `mqstore recover` is exactly what recover keeps."""
    pos = 0
    while True:
        read = read_record(buf, pos, len(buf), check_crc=True, max_message_size=max_message_size)
        if (read.kind is not RecordKind.MESSAGE or read.record is None
                or read.record.commitlog_offset != file_from_offset + pos):  # fmt: skip
            return pos
        if pos + read.size + END_FILE_MIN_BLANK_LENGTH > segment_size:
            return pos
        pos += read.size


def _find_all(window: bytes, pattern: bytes) -> Iterator[int]:
    at = window.find(pattern)
    while at >= 0:
        yield at
        at = window.find(pattern, at + 1)


class EncodedRecords(NamedTuple):
    """The records of one put (one record, or a batch), encoded outside the writer, with
    what the writer needs to place them: one topic-queue, one sys flag, one store host (as
    RocketMQ's batch encoder requires)."""

    datas: tuple[bytes, ...]
    topic: str
    queue_id: int
    sys_flag: int
    store_host: HostAddress

    @property
    def queue_key(self) -> str:
        return f"{self.topic}-{self.queue_id}"


@functools.lru_cache(maxsize=64)
def _msg_id_prefix(host: HostAddress) -> bytes:
    return host.address_bytes() + _I.pack(host.port)


@functools.lru_cache(maxsize=64)
def _msg_id_prefix_hex(host: HostAddress) -> str:
    return _msg_id_prefix(host).hex().upper()


def _msg_id(host: HostAddress, offset: int) -> str:
    return (_msg_id_prefix(host) + _Q.pack(offset)).hex().upper()


def _ids_before_overflow(host: HostAddress, wrote_offset: int, datas: Sequence[bytes], max_blank: int, batch: bool) -> str:
    """The msgId DefaultAppendMessageCallback.doAppend puts in an END_OF_FILE result: a single
    message's own id at `wrote_offset` (computed before the space check); for a batch
    (MessageExtBatch), the ids of the records built before the one that overflowed, at the
    offsets they would have had in this file. None of them was written there: the put goes
    on in the next file, where the ids are given again."""
    if not batch:
        return _msg_id(host, wrote_offset)
    ids = []
    total = 0
    for data in datas:
        total += len(data)
        if total + END_FILE_MIN_BLANK_LENGTH > max_blank:
            break
        ids.append(_msg_id(host, wrote_offset + total - len(data)))
    return ",".join(ids)


def _absolute(read: RecordRead, base: int) -> RecordRead:
    return read._replace(offset=base + read.offset) if base else read


def _put_status(append: AppendMessageStatus) -> PutMessageStatus:
    if append is AppendMessageStatus.PUT_OK:
        return PutMessageStatus.PUT_OK
    if append in (AppendMessageStatus.MESSAGE_SIZE_EXCEEDED, AppendMessageStatus.PROPERTIES_SIZE_EXCEEDED):
        return PutMessageStatus.MESSAGE_ILLEGAL
    return PutMessageStatus.UNKNOWN_ERROR


class CommitLog:
    """The commitlog directory, written by its owner only. Not thread-safe."""

    def __init__(
        self,
        fs: FileSystem,
        store_path: str,
        *,
        mapped_file_size: int,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        clock_ms: Callable[[], int],
        allocator: Allocator | None = None,
        write_buffer_pool: WriteBufferPool | None = None,
        create_on_allocator_failure: bool = False,
        check_crc_on_recover: bool = True,
        fault_hook: Callable[[str], None] | None = None,
        fast_append: bool = False,
    ) -> None:
        if mapped_file_size <= END_FILE_MIN_BLANK_LENGTH:
            raise ValueError(f"mapped_file_size must exceed {END_FILE_MIN_BLANK_LENGTH} bytes, not {mapped_file_size}")
        self._fault_hook = fault_hook
        self.fs = fs
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.max_message_size = max_message_size  # what a put may store
        self.max_record_size = max_record_size(mapped_file_size, max_message_size)  # what a read takes
        self.clock_ms = clock_ms
        self.check_crc_on_recover = check_crc_on_recover
        self.mapped_file_queue = MappedFileQueue(
            fs, store_path, mapped_file_size, clock_ms=clock_ms, allocator=allocator,
            create_on_allocator_failure=create_on_allocator_failure, write_buffer_pool=write_buffer_pool,
            on_path_taken=self._mark_path_taken,
        )  # fmt: skip
        # How much of a truncated tail recovery zeroes: None = all of it (crash recovery);
        # after a clean stop the tail is already zero and its owner sets 0.
        self.zero_tail_bytes: int | None = None
        # Marks of taken segment paths that could not be written or removed: said once each.
        self._marks_failed: set[str] = set()
        # "topic-queueId" -> the next queue offset (§6.4); recovery's caller fills it (§11.8).
        self.topic_queue_table: dict[str, int] = {}
        # The file a put left full, for the owner to munlock later (§6.5); it clears this.
        self.last_full_file: MappedFile | None = None
        # Damage that recovery found with valid records after it (left in place, skipped).
        self.quarantined: list[Quarantined] = []
        # Segments found replaced whose copies are saved: each is saved once, and one whose
        # copy could not be saved is tried again at the next check (review 146 F1).
        self.copies_kept: set[int] = set()
        self.copies_failed: set[int] = set()  # (said and logged once; tried again silently)
        self._disk_full_logged_at = -DISK_FULL_LOG_INTERVAL_S  # (monotonic s) see _note_disk_full_refusal
        self._past_largest_offset_logged = False
        self._disk_full_refused = 0
        self._scan_ended_on_blank = False
        # After a power loss, bytes past the last flush may be torn while later pages reached
        # the disk: such damage is a torn tail, not corruption. Set (by crash recovery) to the
        # checkpoint's physic timestamp, only records stored up to it (flushed, but for the rest
        # of that millisecond) count as "valid records after the damage"; None trusts any.
        self.trusted_after_damage_before_ms: int | None = None
        # Sharper where the checkpoint says it (mqstore's flushed offset, set with the same
        # timestamp): below it every byte was flushed, so damage there is damage and the valid
        # records after it (up to it) are kept; damage at or past it is a torn tail, cut. The
        # timestamp alone trusts the records appended after the flush in its last millisecond
        # too, which kept unflushed records past a torn hole (test_power_loss, queue offsets
        # not dense). None: the timestamp alone (a checkpoint RocketMQ wrote).
        self.flushed_before_offset: int | None = None
        # After a crash whose checkpoint records no flush (missing, zero-filled, cut short):
        # nothing tells a power loss's tear from damage. Zeros, and a record with an all-zero
        # sector in it (its write-back torn), are a torn tail, cut as RocketMQ's recovery cuts;
        # any other corrupt record is damage (a flipped byte), looked past without a bound, so
        # the flushed records after it are kept (review 54 H2; review 55 F1: looking past zeros
        # too kept unflushed records past a torn hole, the queue offsets not dense).
        self.no_flush_evidence = False
        # At a restart, where readers read up to before it, or the flushed offset if further
        # (see _look_past); None otherwise.
        self.read_before_offset: int | None = None
        # False after a clean stop: every put was finished, so a zeroed header is damage.
        self.unfinished_put_possible = True
        # Short (truncated) segments left out of the queue: start -> end of their valid records,
        # which readers serve (`CommitLogReader`); only the rest of such a segment is a hole.
        self.short_valid_ends: dict[int, int] = {}
        # append_fast (see there): allowed at all (the owner says so: no fault hook armed, no
        # write buffers), and the file a checked put last appended to, with its map.
        self._fast_append = fast_append and speedups.native is not None and write_buffer_pool is None
        self._fast_file: MappedFile | None = None
        self._fast_buf: Any = None
        self._id_host: HostAddress | None = None
        self._id_prefix = ""
        self.fast_appends = 0  # puts append_fast took, for the tests and the bench

    def load(self, *, readonly_if_denied: bool = False) -> bool:
        """Map the segments (MappedFileQueue.load). `readonly_if_denied`: a segment that may
        not be written is mapped read-only (`not_writable`), and no byte is zeroed past the
        end while one is (the owner zeroes the tail once they are writable again)."""
        self._fast_file = None
        ok = self.mapped_file_queue.load(skip_damaged=True, readonly_if_denied=readonly_if_denied)
        if self.mapped_file_queue.not_writable:
            self.zero_tail_bytes = 0
        log.info("commitlog loaded", ok=ok, files=len(self.mapped_file_queue.mapped_files))
        for damaged in self.mapped_file_queue.damaged_files:
            start = int(damaged[:20])
            path = os.path.join(self.store_path, damaged[:20])
            try:
                data = self.fs.read_bytes(path) if self.fs.getsize(path) < self.mapped_file_size else b""
            except OSError:
                data = b""
            end = valid_prefix_end(data, start, self.mapped_file_size, self.max_record_size) if data else 0
            if end:
                self.short_valid_ends[start] = end
        if self.degraded_reason:
            log.error("commitlog opened degraded: puts are refused", reason=self.degraded_reason)
        return ok

    @property
    def degraded_reason(self) -> str:
        """Why puts are refused ("" when they are not): a missing or wrong-sized segment. The
        writer never writes over or beyond one; `mqstore recover` makes the log whole."""
        holes = self.mapped_file_queue.holes()
        damaged = self.mapped_file_queue.damaged_files
        if not holes and not damaged:
            return ""
        # A wrong-sized file below the first loaded one is no hole between files, but damage all the same.
        what = [f"holes at offsets {', '.join(f'{a + self.short_valid_ends.get(a, 0)}..{b}' for a, b in holes)}"] if holes else []
        what += [f"wrong-sized segments: {', '.join(damaged)}"] if damaged else []
        short = self.mapped_file_queue.records_end_below_expected
        if short is not None and any(a == short for a, _ in holes):
            return (f"commitlog has {'; '.join(what)}: its records end at {short}, below "
                    f"{self.mapped_file_queue.expected_end} where it was flushed (a segment replaced by an older copy "
                    "of itself, or a damaged record); put that segment back, or run `mqstore recover` to give up the "
                    "rest")  # fmt: skip
        return f"commitlog has {'; '.join(what)}; run `mqstore recover` to make it whole"

    # put path (§6.4, §6.7) ------------------------------------------------------------------
    def _create_failure(self) -> str:
        """A CREATE_MAPPED_FILE_FAILED refusal's detail: why the next segment could not be made
        (the cause was in the log only, silent inside a host: review 52 L3)."""
        return f"the next commitlog segment could not be created: {self.mapped_file_queue.last_create_error or 'see the log'}"

    def put_message(self, record: EncodedRecords, now_ms: int) -> PutMessageResult:
        """Append one record; `now_ms` becomes its store timestamp."""
        assert len(record.datas) == 1, "put_message takes one record"
        return self._check_and_put(record, now_ms, batch=False)

    def put_messages(self, records: EncodedRecords, now_ms: int) -> PutMessageResult:
        """Append a batch of one topic-queue contiguously in one file (never split)."""
        return self._check_and_put(records, now_ms, batch=True)

    def _check_and_put(self, records: EncodedRecords, now_ms: int, *, batch: bool) -> PutMessageResult:
        """The checks of putMessage(s), on the put as a whole, then the append."""
        datas = records.datas
        assert datas, "empty put"
        if batch and records.sys_flag & TRANSACTION_MASK != TRANSACTION_NOT_TYPE:
            return PutMessageResult(status=PutMessageStatus.MESSAGE_ILLEGAL)
        if speedups.native is None:  # the C append checks these itself
            for data in datas:
                assert len(data) >= 8 and _I.unpack_from(data, 0)[0] == len(data), "record TOTALSIZE disagrees"
        total = sum(map(len, datas))
        # Java's encoder refuses a batch whose records sum past maxMessageSize; it must also
        # fit a fresh file, or END_OF_FILE would repeat forever.
        if total > self.max_message_size or total + END_FILE_MIN_BLANK_LENGTH > self.mapped_file_size:
            log.warning("message too large", size=total, max_message_size=self.max_message_size, batch=batch)
            return self._illegal(AppendMessageStatus.MESSAGE_SIZE_EXCEEDED)
        return self._put(records, now_ms, batch=batch)

    def room_in_last_file(self) -> int:
        """Bytes of records the last segment still takes before the blank record that ends it
        (0: none, or it is full): a run of single puts that fits goes in as one append and
        lands where the puts would have one by one."""
        mapped_file = self.mapped_file_queue.last_mapped_file
        if mapped_file is None:
            return 0
        return max(0, mapped_file.file_size - mapped_file.wrote_position - END_FILE_MIN_BLANK_LENGTH)

    def append_fast(
        self, datas: tuple[bytes, ...], queue_key: str, sys_flag: int, store_host: HostAddress, now_ms: int
    ) -> tuple[int, int, int, str] | None:
        """The common put in one frame: `datas` (one record, or a batch, of the topic-queue
        `queue_key`) appended to the file the last checked put went to, when nothing but the
        copy is left to do: that file is still the last, the records fit it before its blank
        record's room, its blocks are reserved, no transaction type, no size limit near.
        Returns (wrote offset, wrote bytes, first queue offset, msgIds joined by ','), the
        bytes on disk exactly those of `put_message(s)`; None when the put must take that
        path (nothing was written: it decides, refuses or rolls over as ever)."""
        mapped_file = self._fast_file
        if mapped_file is None or not datas or sys_flag & TRANSACTION_MASK != TRANSACTION_NOT_TYPE:
            return None
        files = self.mapped_file_queue.mapped_files
        if not files or files[-1] is not mapped_file:
            return None
        total = len(datas[0]) if len(datas) == 1 else sum(map(len, datas))
        pos = mapped_file.wrote_position
        end = pos + total
        reserved = mapped_file.reserved_until
        # As append_message: no reservation when the low water is reserved, or the whole file;
        # and the blank record's room (END_OF_FILE) is within what is reserved.
        if (
            end + END_FILE_MIN_BLANK_LENGTH > reserved
            or (pos + RESERVE_LOW_WATER_BYTES > reserved and reserved < mapped_file.file_size)
            or total > self.max_message_size
        ):
            return None
        if store_host is not self._id_host:
            self._id_prefix = _msg_id_prefix_hex(store_host)
            self._id_host = store_host
        first = datas[0]
        ts_position = store_timestamp_position(_I.unpack_from(first, SYSFLAG_POSITION)[0])
        table = self.topic_queue_table
        queue_offset = table.get(queue_key, 0)
        buf = self._fast_buf
        file_from_offset = mapped_file.file_from_offset
        msg_ids: str = speedups.native.append_records(  # type: ignore[union-attr]  # fast: native is set
            buf, pos, datas, file_from_offset, queue_offset, True, now_ms, ts_position, self._id_prefix
        )
        buf[pos : pos + 8] = first[:8]  # TOTALSIZE and MAGIC last, as _do_append
        table[queue_key] = queue_offset + len(datas)
        mapped_file.wrote_position = end
        if now_ms:
            mapped_file.store_timestamp = now_ms
        self.fast_appends += 1
        return file_from_offset + pos, total, queue_offset, msg_ids

    @staticmethod
    def _illegal(status: AppendMessageStatus) -> PutMessageResult:
        return PutMessageResult(status=PutMessageStatus.MESSAGE_ILLEGAL, append_result=AppendMessageResult(status=status))

    def _put(self, records: EncodedRecords, now_ms: int, *, batch: bool) -> PutMessageResult:
        queue = self.mapped_file_queue
        if queue.damaged_files or queue.holes():
            return PutMessageResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=self.degraded_reason)
        past = self._past_the_largest_offset(sum(map(len, records.datas)))
        if past:
            return PutMessageResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=past)
        mapped_file = queue.last_mapped_file
        if mapped_file is None or mapped_file.is_full():
            mapped_file = queue.get_last_mapped_file(0)
        if mapped_file is None:
            self._log_create_refusal("no commitlog file for a put")
            return PutMessageResult(status=PutMessageStatus.CREATE_MAPPED_FILE_FAILED, detail=self._create_failure())

        def append(buf: bytearray, file_from_offset: int, position: int, max_blank: int) -> AppendMessageResult:
            return self._do_append(buf, file_from_offset, position, max_blank, records, now_ms, batch)

        # The most an append writes: the records, or a blank record's header (§3.7). Blocks
        # for it are reserved first; on a nearly full disk that is all that gets reserved.
        need = sum(map(len, records.datas)) + END_FILE_MIN_BLANK_LENGTH

        def needed_in(mapped_file: MappedFile) -> int:
            # Where the records do not fit, only the blank record's header is written there.
            room = mapped_file.file_size - mapped_file.wrote_position
            return need if need <= room else END_FILE_MIN_BLANK_LENGTH

        try:
            result = mapped_file.append_message(append, needed_in(mapped_file))
            if result.status is AppendMessageStatus.END_OF_FILE:
                self.last_full_file = mapped_file
                mapped_file = queue.get_last_mapped_file(0)
                if mapped_file is None:
                    self._log_create_refusal("no commitlog file after roll-over")
                    return PutMessageResult(status=PutMessageStatus.CREATE_MAPPED_FILE_FAILED, append_result=result,
                                            detail=self._create_failure())  # fmt: skip
                result = mapped_file.append_message(append, needed_in(mapped_file))
        except DiskFullError as exc:
            # Nothing of this put was written; the next put tries to reserve again. Logged when
            # the refusals start and then at most every DISK_FULL_LOG_INTERVAL_S with a count
            # (review 46 L1: one ERROR line per refused put, 25k of them).
            what = ("out of file descriptors" if exc.out_of_descriptors  # (review 60 L1)
                    else "a commitlog segment is not writable (an immutable or append-only attribute, or permission; "
                         "make it writable and puts resume)" if exc.not_writable  # (review 66 F2)
                    else "a commitlog segment is larger than the process's file size limit" if exc.past_size_limit
                    else "disk full")  # fmt: skip
            self._note_disk_full_refusal(f"{what}: {exc}")
            return PutMessageResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=f"{what}: {exc}")
        if (self._fast_append and result.status is AppendMessageStatus.PUT_OK and mapped_file.write_buffer is None
                and mapped_file.file_from_offset + mapped_file.file_size <= JAVA_LONG_MAX):  # fmt: skip
            # Checked just now: no holes, the last file, and every record it takes ends below
            # the largest offset (_past_the_largest_offset); the next puts may go straight to it.
            self._fast_file, self._fast_buf = mapped_file, mapped_file.mapped_buffer
        return PutMessageResult(status=_put_status(result.status), append_result=result)

    def _log_create_refusal(self, event: str) -> None:
        # At the put rate while the segment cannot be made (review 65 F2): in full once, then
        # once a minute with a count, as the queue's own creation lines.
        suppressed = self.mapped_file_queue.repeats.admit(("commitlog put refused", event))
        if suppressed is not None:
            log.error(event, detail=self._create_failure(), **suppressed_fields(suppressed))

    def _past_the_largest_offset(self, total: int) -> str:
        """Why a put of `total` bytes of records is refused, or "": its records would end past
        JAVA_LONG_MAX, the largest offset a RocketMQ log holds (a long), here or in the next
        segment, which would be named past it; the store could not be opened again (review 52
        L1: the segment named 2^63 was made, the C append failed on the offset, and every open
        after). Nothing is written, not even the blank record that ends a segment: a smaller
        put that still fits is taken."""
        last = self.mapped_file_queue.last_mapped_file
        if last is None:
            return ""  # the first segment, at offset 0
        size = self.mapped_file_size
        position = size if last.is_full() else last.wrote_position
        fits = total + END_FILE_MIN_BLANK_LENGTH <= size - position
        end = last.file_from_offset + (position if fits else size) + total
        if end <= JAVA_LONG_MAX:
            return ""
        if not self._past_largest_offset_logged:  # once: every later put would say it again
            self._past_largest_offset_logged = True
            log.error("the commitlog reached the largest offset a log can have: puts that do not fit are refused",
                      log_end=last.file_from_offset + last.wrote_position, largest=JAVA_LONG_MAX)  # fmt: skip
        return (f"the commitlog is full: this put's records would end at offset {end}, past {JAVA_LONG_MAX} (Java's "
                "Long.MAX_VALUE), the largest offset a RocketMQ log can hold; no more messages fit in this store")

    def _note_disk_full_refusal(self, error: str) -> None:
        now = time.monotonic()
        self._disk_full_refused += 1
        if now - self._disk_full_logged_at >= DISK_FULL_LOG_INTERVAL_S:
            log.error("puts refused: no blocks could be reserved", error=error, refused_since_last_said=self._disk_full_refused)
            self._disk_full_logged_at = now
            self._disk_full_refused = 0

    def _do_append(
        self,
        buf: bytearray,
        file_from_offset: int,
        position: int,
        max_blank: int,
        records: EncodedRecords,
        now_ms: int,
        batch: bool,
    ) -> AppendMessageResult:
        wrote_offset = file_from_offset + position
        datas = records.datas
        key = records.queue_key
        queue_offset = self.topic_queue_table.setdefault(key, 0)
        total = sum(map(len, datas))
        if total + END_FILE_MIN_BLANK_LENGTH > max_blank:
            # §3.7: only the 8-byte header; the rest of the file stays zero.
            buf[position : position + END_FILE_MIN_BLANK_LENGTH] = blank_record_header(max_blank)
            return AppendMessageResult(
                status=AppendMessageStatus.END_OF_FILE, wrote_offset=wrote_offset, wrote_bytes=max_blank,
                msg_id=_ids_before_overflow(records.store_host, wrote_offset, datas, max_blank, batch),
                store_timestamp=now_ms, logics_offset=queue_offset, msg_num=0,
            )  # fmt: skip
        tran_type = records.sys_flag & TRANSACTION_MASK
        advances = batch or tran_type not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
        first_queue_offset = queue_offset if advances else 0
        # Everything but the first record's TOTALSIZE and MAGIC, which go in last (below):
        # until then the log ends at `position` for any reader or recovery, so a crash in the
        # middle of a batch leaves none of it rather than half of it.
        # Records of one put share their hosts, hence the store timestamp's position.
        first = datas[0]
        ts_position = store_timestamp_position(_I.unpack_from(first, SYSFLAG_POSITION)[0])
        id_prefix = _msg_id_prefix_hex(records.store_host)
        # PREPARED/ROLLBACK are stored with queue offset 0 and do not advance the counter (§3.9).
        next_queue_offset = queue_offset + len(datas) if advances else queue_offset
        fast = speedups.native
        if fast is not None:
            msg_id = fast.append_records(
                buf, position, datas, file_from_offset, queue_offset, advances, now_ms, ts_position, id_prefix
            )
        else:
            msg_id = self._copy_and_patch(buf, position, datas, file_from_offset, queue_offset, advances, now_ms,
                                          ts_position, id_prefix)  # fmt: skip
        if self._fault_hook is not None:
            self._fault_hook("writer.mid_batch_append")
        buf[position : position + 8] = first[:8]
        if advances:
            self.topic_queue_table[key] = next_queue_offset
        return AppendMessageResult(
            status=AppendMessageStatus.PUT_OK, wrote_offset=wrote_offset, wrote_bytes=total,
            msg_id=msg_id, store_timestamp=now_ms, logics_offset=first_queue_offset,
            msg_num=len(datas), page_cache_rt_ms=max(self.clock_ms() - now_ms, 0),
        )  # fmt: skip

    @staticmethod
    def _copy_and_patch(
        buf: bytearray,
        position: int,
        datas: Sequence[bytes],
        file_from_offset: int,
        queue_offset: int,
        advances: bool,
        now_ms: int,
        ts_position: int,
        id_prefix: str,
    ) -> str:
        """The reference for `_native.append_records`: copy all but the first 8 bytes, fill
        in each record's offsets and store time; the msgIds joined by ','."""
        blob = datas[0] if len(datas) == 1 else b"".join(datas)
        buf[position + 8 : position + len(blob)] = memoryview(blob)[8:]
        msg_ids = []
        pos = position
        for data in datas:
            offset = file_from_offset + pos
            _QQ.pack_into(buf, pos + QUEUE_OFFSET_POSITION, queue_offset if advances else 0, offset)
            _Q.pack_into(buf, pos + ts_position, now_ms)
            msg_ids.append(f"{id_prefix}{offset:016X}")
            if advances:
                queue_offset += 1
            pos += len(data)
        return ",".join(msg_ids)

    # offsets, flush, commit ---------------------------------------------------------------
    def raise_if_cut(self, *, writing: bool = False) -> None:
        """FileCutUnderMapError if a segment lost pages under its map (another process cut it;
        after a pass's writes, `writing`: or the disk had no room for a page)."""
        self.mapped_file_queue.raise_if_cut(writing=writing)

    def keep_replaced_segments(self, since: MappedFile | None = None) -> tuple[str, bool, tuple[int, ...]] | None:
        """If a segment written since `since` (the last one before a pass; None: every
        mapped segment) is no longer the file at its path (another process renamed a file
        over it, renamed it away, or deleted it; an older segment deleted does not count),
        save what the store wrote there to a new file beside it and say so, whether every
        copy was saved, and the replaced segments' starts; None while all are ours, or while
        nothing is new (each is saved once; a copy that failed is tried again, said once).
        What is written into such a segment reaches no file a directory holds, so the owner
        acknowledges no more puts."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return None
        start = 0
        if since is not None:
            for i in range(len(files) - 1, -1, -1):  # a pass rolls at most a few segments
                if files[i] is since:
                    start = i
                    break
        # Deleted counts for the segments written since `since` and the newest: what was
        # acknowledged there is in no file. An older one deleted by hand (space freed, as
        # operators do) is a hole the next open reports; replaced, it is saved too.
        newest = files[-1]
        replaced = [f for f in files[start:] if f.file_from_offset not in self.copies_kept
                    and f.replaced(deleted_too=since is not None or f is newest)]  # fmt: skip
        if not replaced:
            return None
        said = []
        all_saved = True
        for mapped_file in replaced:
            name = mapped_file.file_name
            kept = free_name(self.fs.exists, name + STORE_COPY_SUFFIX)
            start = mapped_file.file_from_offset
            try:
                mapped_file.save_copy(kept)
            except OSError as exc:
                all_saved = False
                self._mark_copy_lost(name, say=start not in self.copies_failed)
                if start not in self.copies_failed:  # (not once a tick: review 147 F2)
                    self.copies_failed.add(start)
                    log.error("the store's copy of a replaced segment could not be saved; tried again at each check",
                              segment=name, error=repr(exc))  # fmt: skip
                    said.append(f"{os.path.basename(name)} (its copy could not be saved: {exc})")
                continue
            self.copies_kept.add(start)
            if start in self.copies_failed:
                self.copies_failed.discard(start)
                with contextlib.suppress(OSError):  # (left, it refuses the open as the copy does)
                    self.fs.remove(name + STORE_COPY_LOST_SUFFIX)
            log.error("a commitlog segment was replaced by another process while the store wrote it",
                      segment=name, store_copy=kept, bytes=mapped_file.read_position)  # fmt: skip
            said.append(f"{os.path.basename(name)} (the store's own copy saved as {os.path.basename(kept)})")
        if not said:
            return None  # only copies that failed before and failed again
        lost = "" if not self.copies_failed else (
            f"; where a copy could not be saved, a {STORE_COPY_LOST_SUFFIX} file beside the segment says so, and the "
            "open refuses until a backup of the segment is put back or the other file accepted")  # fmt: skip
        return ("commitlog segments replaced, renamed away or deleted by another process while the store wrote "
                f"them: {', '.join(said)}; to keep every acknowledged message, close the store and move each copy "
                f"over its segment before it opens again{lost}"), all_saved, tuple(f.file_from_offset for f in replaced)  # fmt: skip

    def _mark_path_taken(self, segment: str, taken: bool) -> None:
        """MappedFileQueue.on_path_taken: `NAME.store-copy-none` left beside a segment path that
        a file the writer did not make holds (empty, else a hard link to that file), removed once
        the segment is made after all, or at the close once the path is free. An open, `recover`
        and a restarted writer refuse while it is there, as for a copy."""
        marker = segment + STORE_COPY_NONE_SUFFIX
        try:
            if not taken:
                self.fs.remove(marker)
                return
            if self.fs.exists(marker):
                return  # (the queue's "creating a segment failed" says the refusal, once)
            try:
                self.fs.write_atomic(marker, b"")
            except OSError:
                # No inode left (review 153 F1: the next open read that file as the log): a
                # second name of the file itself needs none on most filesystems (tmpfs counts
                # links as inodes). Tried each time (review 154 F2: only the first).
                self.fs.link(segment, marker)
        except FileNotFoundError:
            pass
        except OSError as exc:  # tried again at the next put that needs the segment, and at the close
            if segment not in self._marks_failed:
                self._marks_failed.add(segment)
                log.error("the mark of a segment path another process took could not be written or removed: the "
                          "next open will read the file there as the log", marker=marker, error=repr(exc))  # fmt: skip
            return
        self._marks_failed.discard(segment)

    def _mark_copy_lost(self, segment: str, *, say: bool) -> None:
        """Leave `NAME.store-copy-lost` beside a replaced segment whose copy could not be saved.
        Empty: it needs a directory entry, no data block, which a full disk has as a rule."""
        marker = segment + STORE_COPY_LOST_SUFFIX
        try:
            if not self.fs.exists(marker):
                self.fs.write_atomic(marker, b"")
        except OSError as exc:  # tried again at the next check, as the copy is; said once
            if say:
                log.error("the mark of a replaced segment whose copy could not be saved could not be written either: "
                          "the next open will read the other file as the log", marker=marker, error=repr(exc))  # fmt: skip

    def get_max_offset(self) -> int:
        return self.mapped_file_queue.max_offset()

    def get_max_wrote_offset(self) -> int:
        return self.mapped_file_queue.max_wrote_position()

    @property
    def store_timestamp(self) -> int:
        """The store time of the newest record appended (0 before the first)."""
        last = self.mapped_file_queue.last_mapped_file
        return last.store_timestamp if last is not None else 0

    def recover_tail(
        self, scan_from: int, topic_queue_table: dict[str, int], *, check_crc: bool = True
    ) -> tuple[int, dict[str, int]]:
        """The restarted writer's recovery: from `scan_from` (a point below which the queues
        are known), walk valid records to the end of the log (past quarantined damage, as
        start-up recovery does), continue the queue offsets past them, and truncate (zeroing)
        whatever follows the last valid record, e.g. a record the previous writer died
        writing. Returns (end offset, topic-queue table)."""
        self._fast_file = None
        queue = self.mapped_file_queue
        files = queue.mapped_files
        if not files:
            return 0, topic_queue_table
        offset = max(scan_from, files[0].file_from_offset)
        if offset >= files[-1].file_from_offset + self.mapped_file_size:
            offset = files[-1].file_from_offset
        # The file holding `offset`, or the first one after it (a hole: nothing to scan there).
        index = next(i for i, f in enumerate(files) if offset < f.file_from_offset + self.mapped_file_size)
        pos = max(offset - files[index].file_from_offset, 0)
        store_ts = 0

        def seen(fields: DispatchFields) -> None:
            nonlocal store_ts
            store_ts = fields.store_timestamp
            if fields.sys_flag & TRANSACTION_MASK not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
                key = f"{fields.topic}-{fields.queue_id}"
                topic_queue_table[key] = max(topic_queue_table.get(key, 0), fields.consume_queue_offset + 1)

        saved_crc = self.check_crc_on_recover
        self.check_crc_on_recover = check_crc
        try:
            # Recovery's end below the flushed offset is a hole (truncate_dirty_files): the
            # records after it are not taken back by a scan that trusts more than it did
            # (no CRC, no flushed-offset bound).
            if scan_from < queue.expected_end and not self._blank_record_at(scan_from):
                self._scan_ended_on_blank = False
                end = scan_from
            else:
                end = self._scan_for_recovery(index, seen, None, start_pos=pos)
        finally:
            self.check_crc_on_recover = saved_crc
        if self._scan_ended_on_blank:
            end = self.roll_next_file(end)
        # Only the put the previous writer died in can have left bytes past the end (and with
        # zero_tail_bytes 0, a degraded log, nothing is zeroed).
        zero = 2 * self.max_message_size if self.zero_tail_bytes is None else min(self.zero_tail_bytes, 2 * self.max_message_size)
        queue.truncate_dirty_files(end, zero)
        queue.flushed_where = min(queue.flushed_where, end) if queue.flushed_where else end
        queue.committed_where = end
        last = queue.last_mapped_file
        if last is not None and store_ts:
            last.store_timestamp = store_ts
        return end, topic_queue_table

    def _blank_record_at(self, offset: int) -> bool:
        """Whether the blank record that ends a segment lies at `offset` (in a loaded file)."""
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        pos = offset % self.mapped_file_size
        if mapped_file is None or pos + _II.size > self.mapped_file_size:
            return False
        return bool(_II.unpack_from(mapped_file.mapped_buffer, pos)[1] == BLANK_MAGIC_CODE)

    def close(self) -> None:
        """Unmap every segment (the files stay); a taken segment path's marker is settled first."""
        self._fast_file = None
        self.mapped_file_queue.settle_taken_paths()
        self.mapped_file_queue.shutdown(0)

    def get_min_offset(self) -> int:
        """§11.8: the first file's start, or the next file's if the first is being deleted."""
        first = self.mapped_file_queue.first_mapped_file
        if first is None:
            return -1
        return first.file_from_offset if first.is_available() else self.roll_next_file(first.file_from_offset)

    def head_offset(self) -> int:
        """Where the log's files begin, counting the wrong-sized segments loading left out
        (their records may come back whole from a backup): what the queues and the index may
        keep units for. `get_min_offset` when there are none; -1 with no file at all."""
        starts = [int(name[:20]) for name in self.mapped_file_queue.damaged_files]
        # And a segment the running store saved a copy of (replaced or deleted under it): the
        # owner may move it back, so the cleaner must not delete its queue and index files
        # (review 143 F1: a restarted writer's head past it, and the cleaner's next round
        # deleted them; the copy moved back served none of its 40 messages).
        starts.extend(store_copy_starts(self.fs, self.store_path))
        first = self.get_min_offset()
        if first >= 0:
            starts.append(first)
        return min(starts, default=-1)

    def roll_next_file(self, offset: int) -> int:
        return offset + self.mapped_file_size - offset % self.mapped_file_size

    @property
    def flushed_where(self) -> int:
        return self.mapped_file_queue.flushed_where

    @property
    def committed_where(self) -> int:
        return self.mapped_file_queue.committed_where

    def flush(self, least_pages: int) -> bool:
        """True when nothing moved (one file per call)."""
        return self.mapped_file_queue.flush(least_pages)

    def commit(self, least_pages: int) -> bool:
        return self.mapped_file_queue.commit(least_pages)

    # cleaning (delegated; the cleaner decides, the owner deletes) ----------------------------
    def delete_expired_file(
        self, expired_ms: int, interval_ms: int, forcibly_ms: int, clean_immediately: bool, now_ms: int,
        sleep_ms: Callable[[int], None],
    ) -> int:  # fmt: skip
        self._fast_file = None  # the file list changes: the next put checks it again
        return self.mapped_file_queue.delete_expired_file_by_time(
            expired_ms, interval_ms, forcibly_ms, clean_immediately, now_ms, sleep_ms
        )

    def retry_delete_first_file(self, interval_ms: int, now_ms: int) -> bool:
        self._fast_file = None
        return self.mapped_file_queue.retry_delete_first_file(interval_ms, now_ms)

    def destroy(self) -> None:
        self._fast_file = None
        self.mapped_file_queue.destroy()

    def shutdown(self) -> None:
        self._fast_file = None
        self.mapped_file_queue.shutdown(0)

    # reading (owner side) ------------------------------------------------------------------
    def get_data(self, offset: int, max_bytes: int | None = None) -> tuple[int, bytes] | None:
        """(start offset, bytes) from `offset` to its file's readable end (§13.5); reading offset
        0 after old files were deleted starts at the first existing file."""
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset, offset == 0)
        if mapped_file is None:
            return None
        pos = offset % self.mapped_file_size
        if max_bytes is not None:
            size = min(max_bytes, mapped_file.read_position - pos)
            data = mapped_file.select(pos, size) if size > 0 else None
        else:
            data = mapped_file.select(pos)
        return (mapped_file.file_from_offset + pos, data) if data is not None else None

    def get_message(self, offset: int, size: int) -> bytes | None:
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset, offset == 0)
        if mapped_file is None:
            return None
        return mapped_file.select(offset % self.mapped_file_size, size)

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        """STORETIMESTAMP of the message at [offset, offset+size), or -1 if not readable (§9.5)."""
        if offset < self.get_min_offset():
            return -1
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset, offset == 0)
        if mapped_file is None:
            return -1
        pos = offset % self.mapped_file_size
        header = mapped_file.select(pos, size)
        if header is None or size < SYSFLAG_POSITION + 4:
            return -1
        sys_flag = _I.unpack_from(header, SYSFLAG_POSITION)[0]
        ts_pos = store_timestamp_position(sys_flag)
        if ts_pos + 8 > size:
            return -1
        return int(_Q.unpack_from(header, ts_pos)[0])

    def read_record_at(self, offset: int, check_crc: bool = False, read_body: bool = True) -> RecordRead | None:
        """The record at `offset` (absolute offset in the result); None if no file holds it."""
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mapped_file is None:
            return None
        return self._read_in(mapped_file, offset - mapped_file.file_from_offset, mapped_file.read_position,
                             check_crc, read_body)  # fmt: skip

    def _read_in(self, mapped_file: MappedFile, pos: int, limit: int, check_crc: bool, read_body: bool) -> RecordRead | None:
        if not mapped_file.hold():
            return None
        try:
            read = read_record(
                mapped_file.mapped_buffer, pos, limit, check_crc=check_crc, read_body=read_body,
                max_message_size=self.max_record_size,
            )  # fmt: skip
        finally:
            mapped_file.release()
        return _absolute(read, mapped_file.file_from_offset)

    def iter_records(
        self, from_offset: int, to_offset: int | None = None, *, check_crc: bool = False, read_body: bool = True
    ) -> Iterator[RecordRead]:
        """Records from `from_offset` with absolute offsets: MESSAGE and BLANK (then the next
        file); ends with END_OF_DATA or CORRUPT, or silently at `to_offset` / a missing file."""
        offset = from_offset
        queue = self.mapped_file_queue
        while to_offset is None or offset < to_offset:
            mapped_file = queue.find_mapped_file_by_offset(offset)
            if mapped_file is None:
                after = [f.file_from_offset for f in queue.mapped_files if f.file_from_offset > offset]
                if after and offset >= max(queue.min_offset(), 0):
                    offset = after[0]  # a hole (a missing segment): the next file goes on
                    continue
                if offset == queue.max_offset():
                    yield RecordRead(RecordKind.END_OF_DATA, offset, 0, reason="end of the commitlog")
                return
            limit = mapped_file.read_position
            if to_offset is not None:
                limit = min(limit, to_offset - mapped_file.file_from_offset)
            read = self._read_in(mapped_file, offset - mapped_file.file_from_offset, limit, check_crc, read_body)
            if read is None:
                return
            if read.kind in (RecordKind.CORRUPT, RecordKind.END_OF_DATA):
                skip_to = self._quarantine_end(offset)
                if skip_to is not None:
                    offset = skip_to  # damage recovery left in place: valid records follow it
                    continue
            yield read
            if read.kind is RecordKind.MESSAGE:
                offset += read.size
            elif read.kind is RecordKind.BLANK:
                offset = self.roll_next_file(offset)
            else:
                return

    def store_timestamp_before(self, end: int) -> int:
        """The store time of the last record before `end` in the segment holding it (0 if
        none): where `iter_records` from that segment's start to `end` ends. The runs of plain
        records are walked in C (headers only); each record a run stops at goes through
        `iter_records` itself, so both give the same answer."""
        start = max(end - end % self.mapped_file_size, max(self.get_min_offset(), 0))
        last = 0
        offset = start
        fast = scan.fast_scan_available()
        while offset < end:
            mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset) if fast else None
            if mapped_file is not None:
                run = scan.scan_run(
                    mapped_file.mapped_buffer, offset - mapped_file.file_from_offset,
                    min(mapped_file.read_position, end - mapped_file.file_from_offset),
                    file_from_offset=mapped_file.file_from_offset, max_message_size=self.max_record_size,
                    check_crc=False, check_offset=False,
                )  # fmt: skip
                if run.records:
                    last = run.last_store_timestamp
                    offset = mapped_file.file_from_offset + run.end
                    continue
            read = next(iter(self.iter_records(offset, end, read_body=False)), None)
            if read is None or read.record is None:
                break
            last = read.record.store_timestamp
            offset = read.offset + read.size
        return last

    def next_queue_offsets(self, start: int, end: int) -> dict[str, int]:
        """Per "topic-queueId", the queue offset after the last record of [start, end) (PREPARED
        and ROLLBACK records have none): where `iter_records` from `start` ends, past segment
        ends and quarantined ranges. Runs of plain records are tallied in C; each record a run
        stops at goes through `iter_records` itself (as `store_timestamp_before`), so both give
        the same answer. The C walk checks CRCs so that it accepts no record the per-record
        path would not. A `start` below the first segment (a queue rebuilt from the log's
        start, 0, after retention deleted the first segments) walks from the first segment:
        `iter_records` finds nothing below it, and every record of the log would go uncounted
        (review 62 H1: the writer then gave out queue offsets the log holds)."""
        tally = scan.RecordTally()
        found = tally.next_queue_offsets
        offset = max(start, self.get_min_offset())
        fast = scan.fast_scan_available()
        while offset < end:
            mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset) if fast else None
            if mapped_file is not None:
                base = mapped_file.file_from_offset
                buf = mapped_file.mapped_buffer
                run = scan.scan_run(buf, offset - base, min(mapped_file.read_position, end - base),
                                    file_from_offset=base, max_message_size=self.max_record_size,
                                    check_crc=True)  # fmt: skip
                if run.records:
                    tally.add_run(buf, offset - base, base, run, self.max_record_size)
                    offset = base + run.end
                    continue
            read = next(iter(self.iter_records(offset, end, read_body=False)), None)
            if read is None:
                break
            if read.kind is RecordKind.BLANK:
                offset = self.roll_next_file(read.offset)
                continue
            record = read.record
            if record is None:
                break
            if record.transaction_type not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
                key = f"{record.topic}-{record.queue_id}"
                found[key] = max(found.get(key, 0), record.queue_offset + 1)
            offset = read.offset + read.size
        return found

    def _quarantine_end(self, offset: int) -> int | None:
        for quarantined in self.quarantined:
            if quarantined.start == offset:
                return quarantined.end
        return None

    # recovery (§11.5, §11.6) --------------------------------------------------------------------
    def recover_normally(
        self, max_phy_offset_of_consume_queue: int, progress: ProgressCallback | None = None, *, all_files: bool = False,
        from_offset: int | None = None,
    ) -> int:
        """After a clean shutdown: scan the last three files (every file with `all_files`, as
        `mqstore recover` does to find damage anywhere; from the one holding `from_offset` if
        that is earlier), truncate after the last valid record, and return that offset (the
        caller truncates queues if they reach past it)."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return 0
        index = 0 if all_files else max(0, len(files) - 3)
        if from_offset is not None:
            index = min(index, next((i for i, f in enumerate(files) if from_offset < f.file_from_offset + self.mapped_file_size),
                                    index))  # fmt: skip
        process_offset = self._scan_for_recovery(index, None, progress)
        self._truncate_after_recovery(process_offset, max_phy_offset_of_consume_queue)
        return process_offset

    def recover_abnormally(
        self,
        min_timestamp: int,
        dispatch: Callable[[DispatchFields], None],
        progress: ProgressCallback | None = None,
        max_phy_offset_of_consume_queue: int = -1,
        start_no_later_than: int | None = None,
    ) -> int:
        """After a crash: start at the newest file whose first message is not newer than
        `min_timestamp` (the checkpoint's), and no later than the file holding
        `start_no_later_than` (the checkpoint's forced offsets: store times need not rise
        along a log a stepped clock wrote), dispatch every valid message from there, truncate
        after the last one and return its end. No files: returns 0 (destroy the queues)."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            self.mapped_file_queue.flushed_where = self.mapped_file_queue.committed_where = 0
            return 0
        index = 0
        known: dict[int, list[tuple[int, int]]] = {}
        for i in range(len(files) - 1, -1, -1):
            if self._data_end(files[i], i, 0, known) == 0:
                continue  # its first page a hole: no record, and not read (a full tmpfs faults: review 116 F1)
            if self.is_mapped_file_matched_recover(files[i], min_timestamp):
                index = i
                log.info("abnormal recovery starts at", file=files[i].file_name)
                break
        if start_no_later_than is not None:
            holding = max((i for i, f in enumerate(files) if f.file_from_offset <= start_no_later_than), default=0)
            if holding < index:
                log.warning("abnormal recovery starts earlier than the checkpoint's timestamps say: at the file "
                            "holding its forced offset (store times went back along the log)",
                            file=files[holding].file_name, forced_offset=start_no_later_than)  # fmt: skip
                index = holding
        process_offset = self._scan_for_recovery(index, dispatch, progress)
        self._truncate_after_recovery(process_offset, max_phy_offset_of_consume_queue)
        return process_offset

    @staticmethod
    def is_mapped_file_matched_recover(mapped_file: MappedFile, min_timestamp: int) -> bool:
        buf = mapped_file.mapped_buffer
        magic = _I.unpack_from(buf, 4)[0]
        if magic != MESSAGE_MAGIC_CODE:
            return False
        sys_flag = _I.unpack_from(buf, SYSFLAG_POSITION)[0]
        store_ts = _Q.unpack_from(buf, store_timestamp_position(sys_flag))[0]
        return bool(store_ts != 0 and store_ts <= min_timestamp)

    def _scan_for_recovery(
        self,
        index: int,
        dispatch: Callable[[DispatchFields], None] | None,
        progress: ProgressCallback | None,
        *,
        start_pos: int = 0,
    ) -> int:
        """Walk valid records from file `index` and return the end of the last one. Runs of
        plain records are walked in C over the map (storage/scan.py, no GIL); the record
        that ends a run, and every record without the extension, goes through the
        dispatcher's decoder with the body CRC checked in place.

        Only a torn tail is cut: damage with a trusted record somewhere after it (this file or
        a later one) is quarantined (`self.quarantined`) and the walk continues there."""
        files = self.mapped_file_queue.mapped_files
        # Sized by the bytes that hold data, not by the segments' allocated size.
        bar = None
        if progress is not None:
            scanned = [(f.file_name, f.mapped_buffer) for f in files[index:]]
            bar = scan.ScanProgress.of_files(progress, self.fs, scanned, start_pos, self.mapped_file_size,
                                             _PROGRESS_STEP_BYTES)  # fmt: skip
        first_index = index
        mapped_file = files[index]
        file_offset = start_pos
        self._scan_ended_on_blank = False
        fast = scan.fast_scan_available()
        extents: dict[int, list[tuple[int, int]]] = {}
        while True:
            if file_offset >= self.mapped_file_size:
                # Records filled the file to its last byte, no blank record after them (the
                # writers keep 8 bytes for one; a copied or foreign store need not): the log goes
                # on in the next file (review 120 F1: the walk ended here, and a crash's recovery
                # cut every later file, their records valid).
                if index + 1 >= len(files):
                    break
                index += 1
                mapped_file, file_offset = files[index], 0
                continue
            # Where the file's data ends from here: a hole is zeros never written, not read (on a
            # full tmpfs a read of one needs a page there is no room for, and faults: review
            # 116 F1, a store that filled its disk could not be opened until room was made).
            data_end = self._data_end(mapped_file, index, file_offset, extents)
            hole = data_end <= file_offset < self.mapped_file_size
            if fast and not hole:
                # The run of valid records in C (no GIL); what ends it goes through the
                # reference decoder below, so every rule stays in one place.
                run = scan.scan_run(
                    mapped_file.mapped_buffer, file_offset, data_end,
                    file_from_offset=mapped_file.file_from_offset, max_message_size=self.max_record_size,
                    check_crc=self.check_crc_on_recover, max_bytes=_PROGRESS_STEP_BYTES,
                )  # fmt: skip
                if run.records:
                    if isinstance(dispatch, scan.RecordTally):  # no call per record
                        dispatch.add_run(mapped_file.mapped_buffer, file_offset, mapped_file.file_from_offset, run,
                                         self.max_record_size)  # fmt: skip
                    elif dispatch is not None:
                        scan.dispatch_run(mapped_file.mapped_buffer, file_offset, run, self.max_record_size, dispatch)
                    file_offset = run.end
                    if bar is not None:
                        bar.at(index - first_index, file_offset)
                    if run.stop == "budget" or file_offset >= data_end:
                        continue
            if hole:
                kind, size, fields = RecordKind.END_OF_DATA, 0, None
            else:
                kind, size, fields = read_dispatch(
                    mapped_file.mapped_buffer, file_offset, self.mapped_file_size, self.max_record_size,
                    None, self.check_crc_on_recover,
                )  # fmt: skip
            if kind is RecordKind.MESSAGE and fields is not None and (
                fields.commitlog_offset == mapped_file.file_from_offset + file_offset
            ):
                if dispatch is not None:
                    dispatch(fields)
                file_offset += size
                if bar is not None:
                    bar.at(index - first_index, file_offset)
                continue
            if kind is RecordKind.BLANK:
                index += 1
                if index >= len(files):
                    log.info("recovery reached the last file's end", file=mapped_file.file_name)
                    self._scan_ended_on_blank = True
                    break
                mapped_file = files[index]
                file_offset = 0
                continue
            if mapped_file.cut_short():  # zeros from the guard, not the file's bytes
                raise UnreadDuringRecoveryError(mapped_file.file_name)
            damaged_at = mapped_file.file_from_offset + file_offset
            # Below the offset the checkpoint says was flushed every put was finished (and
            # forced): a zeroed header there is damage, whatever its physical-offset field says
            # (review 97 M2: taken for the put the writer died in, the flushed records after it
            # were cut from the log).
            below_flushed = self.flushed_before_offset is not None and damaged_at < self.flushed_before_offset
            if (self.unfinished_put_possible and not below_flushed and not hole
                    and self._unfinished_put_at(mapped_file, file_offset)
                    and not self._later_put_follows(index, file_offset)):  # fmt: skip
                log.warning("recovery stops at a put the writer did not finish", offset=damaged_at)
                break
            resume = self._look_past(index, file_offset, corrupt=kind is not RecordKind.END_OF_DATA)
            if resume is None:
                if kind is not RecordKind.END_OF_DATA:
                    log.warning("recovery stops at a damaged record: a torn tail", file=mapped_file.file_name,
                                position=file_offset, reason=self._damage_reason(mapped_file, file_offset))  # fmt: skip
                break
            next_index, next_pos = resume
            resume_at = files[next_index].file_from_offset + next_pos
            reason = "zeroed bytes" if hole else self._damage_reason(mapped_file, file_offset)
            self.quarantined.append(Quarantined(damaged_at, resume_at, reason))
            log.error("damaged commitlog bytes quarantined; valid records follow them", start=damaged_at,
                      end=resume_at, reason=reason)  # fmt: skip
            index, mapped_file, file_offset = next_index, files[next_index], next_pos
        # A page that faulted read as zeros (the SIGBUS guard's): what ended or broke the walk
        # there may be records that could not be read, not an end (review 63's note). Checked
        # where the walk stops, and here for the pages looked past damage.
        for walked in files[first_index:]:
            if walked.cut_short():
                raise UnreadDuringRecoveryError(walked.file_name)
        if bar is not None:
            bar.finish()
        return mapped_file.file_from_offset + file_offset

    def _data_end(self, mapped_file: MappedFile, index: int, pos: int, known: dict[int, list[tuple[int, int]]]) -> int:
        """The end of the file's data extent holding `pos` (`pos` itself in a hole; the
        segment's size where the file system cannot tell): each file's extents asked once a
        scan (`known`)."""
        extents = known.get(index)
        if extents is None:
            try:
                extents = self.fs.data_extents(mapped_file.file_name, 0, self.mapped_file_size)
            except OSError:
                extents = [(0, self.mapped_file_size)]
            known[index] = extents
        for start, end in extents:
            if start <= pos < end:
                return end
        return min(pos, self.mapped_file_size)

    def _damage_reason(self, mapped_file: MappedFile, pos: int) -> str:
        read = read_record(mapped_file.mapped_buffer, pos, self.mapped_file_size, check_crc=True,
                           max_message_size=self.max_record_size)  # fmt: skip
        if read.kind is RecordKind.END_OF_DATA:
            return "zeroed bytes"
        if read.kind is RecordKind.MESSAGE and read.record is not None:
            return f"record says it is at {read.record.commitlog_offset}"
        return read.reason or read.kind.value

    def _later_put_follows(self, index: int, pos: int) -> bool:
        """Whether the zeroed header at `pos` of file `index` was written once (damage), not
        the put the writer died in: proven by a later record stored after this record's own
        store time and before the checkpoint's physic timestamp, so appended after it and
        flushed. The writer appends puts one after another, each put's first 8 bytes last, so
        the put it died in is the log's last and was never flushed.

        Not proof: records of its own millisecond (the rest of its batch, or another put of that
        millisecond), or none yet (a batch record whose store time the writer had not written:
        review 101 H1); records stored before it (a broker's stale records past an old end,
        which RocketMQ does not zero: review 101 H2); records of the checkpoint's millisecond or
        later (maybe unflushed: review 101 H3). Without a checkpoint timestamp (none, or
        mqstore's flushed offset decides), nothing is. Review 99 N3: with a broker's checkpoint
        the log was cut there, 80 flushed records with it; review 100 H1: a rule by this
        record's own time kept part of a batch after the clock stepped back."""
        bound = self.trusted_after_damage_before_ms
        if bound is None or self.flushed_before_offset is not None:
            return False
        files = self.mapped_file_queue.mapped_files
        buf, size = files[index].mapped_buffer, self.mapped_file_size
        if pos + SYSFLAG_POSITION + 4 > size:
            return False
        stored_at = pos + store_timestamp_position(_I.unpack_from(buf, pos + SYSFLAG_POSITION)[0])
        stored = _Q.unpack_from(buf, stored_at)[0] if stored_at + 8 <= size else 0
        if not 0 < stored < bound - 1:
            return False  # (no millisecond between it and the last flushed record's)
        found = self._next_valid_record(index, pos + 1)
        while found is not None:
            i, at = found
            read = read_record(files[i].mapped_buffer, at, size, check_crc=True, max_message_size=self.max_record_size)
            if read.kind is RecordKind.BLANK:
                # A segment's end: the proof may be in the next one (review 102 H1: the last
                # record of a segment damaged, the log was cut there and later segments deleted).
                found = self._next_valid_record(i + 1, 0)
                continue
            if read.kind is not RecordKind.MESSAGE or read.record is None:  # (only a race with a file cut under us)
                return False
            if stored < read.record.store_timestamp < bound:
                return True
            found = self._next_valid_record(i, at + read.size)
        return False

    def _next_valid_record(self, index: int, start: int, *, below: int | None = None,
                           stored_before_ms: int | None = None) -> tuple[int, int] | None:
        """(file index, position) of the first trusted record (see `_valid_record_at`) at or
        after `start` of file `index`, in it or a later file, ending below the offset `below`
        if given (with the flushed offset, only records that end below it are trusted); None
        if none."""
        files = self.mapped_file_queue.mapped_files
        for i in range(index, len(files)):
            mapped_file = files[i]
            lo = start if i == index else 0
            limit = self.mapped_file_size if below is None else min(self.mapped_file_size, below - mapped_file.file_from_offset)
            if limit <= lo:
                break
            try:
                extents = self.fs.data_extents(mapped_file.file_name, lo, limit)
            except OSError:
                extents = [(lo, limit)]
            found = find_next_valid_record(
                mapped_file.mapped_buffer, lo, limit, file_from_offset=mapped_file.file_from_offset,
                segment_size=self.mapped_file_size, max_message_size=self.max_record_size, extents=extents,
                stored_before_ms=stored_before_ms,
            )  # fmt: skip
            if found is not None:
                return i, found
        return None

    def _unfinished_put_at(self, mapped_file: MappedFile, pos: int) -> bool:
        """The put the previous writer died in: it writes a record's TOTALSIZE and MAGIC last,
        so its header is still zero while its own physical-offset field already says where it
        lies. What follows it belongs to the same unfinished put (a batch): a torn tail."""
        buf = mapped_file.mapped_buffer
        if pos + PHYSICAL_OFFSET_POSITION + 8 > self.mapped_file_size or any(buf[pos : pos + 8]):
            return False
        return bool(_Q.unpack_from(buf, pos + PHYSICAL_OFFSET_POSITION)[0] == mapped_file.file_from_offset + pos)

    def _look_past(self, index: int, pos: int, *, corrupt: bool = True) -> tuple[int, int] | None:
        """(file index, position) of the first trusted record after damage at `pos` of file
        `index`, in it or a later file; None when nothing valid follows (a torn tail).
        `corrupt`: bytes that are not a record (not zeros, where a segment's data ends)."""
        files = self.mapped_file_queue.mapped_files
        flushed = self.flushed_before_offset
        damaged_at = files[index].file_from_offset + pos
        stored_before_ms: int | None
        resume_at_flushed = False
        if self.no_flush_evidence and (not corrupt or self._looks_torn(files[index], pos)):
            return None
        if flushed is None and not corrupt and self.read_before_offset is not None and damaged_at >= self.read_before_offset:
            # A restart: nothing past where the log was read was acknowledged (every answer
            # waits for its end to be published), so zeros there end it, records after them
            # too. They are a failed pass's: its write buffers' commit failed, and the
            # segments it wrote straight into their maps lay past the hole (review 129 F1:
            # looked past, they stayed in the log; the restart's new records were not served,
            # and a kill -9 then cut the log at the hole, PUT_OKs with it).
            return None
        if flushed is None and not corrupt and self.read_before_offset is not None and damaged_at < self.read_before_offset:
            # A restart: zeros below where the log was read (or flushed) are a hole (a segment
            # rolled back; the previous writer degraded on it), looked past only that far, not
            # to later segments that stay out of the log on disk (review 41 N1).
            flushed, stored_before_ms = self.read_before_offset, None
        elif flushed is not None and corrupt and damaged_at < flushed:
            # A corrupt record below the flushed offset is damage, not a power loss's tear (those
            # bytes were durable): with no valid record after it below that offset, the scan
            # goes on from the offset itself (a record boundary), where what follows is judged
            # as any tail (review 41 N3: `recover` gave up the intact records past it; review 42
            # G1: looking past it without a bound kept unflushed records past a torn hole).
            # Zeros there stay a hole (truncate_dirty_files): a rolled-back segment may come back.
            stored_before_ms = None
            resume_at_flushed = True
        else:
            stored_before_ms = self.trusted_after_damage_before_ms if flushed is None else None
        found = self._next_valid_record(index, pos + 1, below=flushed, stored_before_ms=stored_before_ms)
        if found is not None:
            return found
        if resume_at_flushed and flushed is not None:
            return self._position_of(flushed)
        return None

    def _looks_torn(self, mapped_file: MappedFile, pos: int) -> bool:
        """Whether the corrupt record at `pos` has bytes a write-back left out: zeros in its
        size field, or an all-zero disk sector (512 bytes, aligned) within it, or zeros from a
        sector boundary to its end. A flipped byte leaves neither (a segment's unwritten bytes
        are zeros, so a torn record's missing sectors read as zeros)."""
        buf = mapped_file.mapped_buffer
        head = bytes(buf[pos : pos + 4])
        if not any(head):
            return True
        size = int.from_bytes(head, "big", signed=True)
        if not 0 < size <= min(self.max_record_size, self.mapped_file_size - pos):
            return False  # a size no record has: damage, not a tear (a tear leaves zeros)
        end = pos + size
        boundary = pos - pos % _SECTOR + _SECTOR
        while boundary < end:
            if not any(buf[boundary : min(boundary + _SECTOR, end)]):
                return True
            boundary += _SECTOR
        return False

    def _position_of(self, offset: int) -> tuple[int, int] | None:
        """(file index, position) of `offset` in the loaded files (a file's end: the next
        file's start), or None past them."""
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mapped_file is None:
            return None
        return self.mapped_file_queue.mapped_files.index(mapped_file), offset - mapped_file.file_from_offset

    def _truncate_after_recovery(self, process_offset: int, max_phy_offset_of_consume_queue: int) -> None:
        self._fast_file = None
        queue = self.mapped_file_queue
        queue.flushed_where = queue.committed_where = process_offset
        # A blank record ends the last segment: nothing was written after it (the writer went on
        # in a next segment, or `mqstore recover` ended a rolled-back segment there); it stays,
        # so the writer goes on in the next segment, never over the offsets it gave up.
        ended = self._scan_ended_on_blank
        queue.truncate_dirty_files(process_offset, 0 if ended else self.zero_tail_bytes, segment_ended=ended)
        log.info("commitlog recovered", max_offset=process_offset,
                 consume_queue_past_end=max_phy_offset_of_consume_queue >= process_offset)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Readers for other threads and tools


class SegmentReplacedError(OSError):
    """The file at a commitlog segment's path is not the one the running store's writer maps
    (another process renamed a file over it, restored a backup, or replaced it): read as "not
    now" (EIO), never as the log, whose records the writer's own map still holds."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EIO, "the file at this commitlog segment's path is not the one the store writes (replaced "
                                    "under the running store): nothing read from it; the writer's next check saves "
                                    "the store's copy beside it, or marks it .store-copy-lost where it cannot (see "
                                    "the log)", path)  # fmt: skip


def _map_failed_now(exc: OSError | ValueError) -> bool:
    """Whether a segment's map failed for the process's resources or access (EMFILE, ENFILE,
    ENOMEM, EACCES, EIO, ...), not for what the file is: gone (ENOENT), of another size or
    kind (EINVAL, EISDIR, ValueError), or being created."""
    return isinstance(exc, OSError) and exc.errno not in _FILE_IS_NOT_A_SEGMENT and not isinstance(exc, FileNotFoundError)


_FILE_IS_NOT_A_SEGMENT = frozenset({errno.ENOENT, errno.EINVAL, errno.EISDIR, errno.ENOTDIR, errno.ENODEV, None})


# Segments a CommitLogReader keeps mapped at once. Each map holds a descriptor (CPython's mmap
# keeps one of its own), and every reading thread has a reader: mapping every segment made the
# process's descriptors grow with the retained log, once per thread (review 76 H2: ~300
# segments and three consumer threads used up a 1,024 limit; puts failed
# CREATE_MAPPED_FILE_FAILED, the host's own open() EMFILE). The rest are known by name and
# size, and mapped when read (the oldest mapped given back).
READER_MAPPED_SEGMENTS = 16


class CommitLogReader:
    """A read-only view of a commitlog directory for one reader thread. Not thread-safe,
    except `release_deleted` and `close`.

    Reads only below `limit` (the watermark its owner was told). A segment deleted underneath
    reads as None, never as an exception. At most READER_MAPPED_SEGMENTS segments are mapped
    at once (and a short one, kept): the others are "parked", present and full-sized, and
    mapped when read.
    """

    def __init__(
        self,
        fs: FileSystem,
        store_path: str,
        *,
        mapped_file_size: int,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        limit: int = 0,
        segments: Callable[[], Mapping[int, tuple[int, int]]] | None = None,
        replaced_seen: set[int] | None = None,
    ) -> None:
        self.fs = fs
        self.store_path = store_path
        # The running store's writer's files (ReadView.segments): a file mapped at a segment's
        # path that is not the one it maps is not read as the log. None: no writer runs.
        self._segments = segments
        # Shared by every thread's reader of one store: the segments whose last map, by any of
        # them, found another file at the path (a wait on a thread that never read looks here).
        self._replaced_seen = replaced_seen
        self.mapped_file_size = mapped_file_size
        self.max_message_size = max_message_size
        self.max_record_size = max_record_size(mapped_file_size, max_message_size)
        self.limit = limit
        self._regions: dict[int, MappedRegion] = {}
        # Present full-sized segments not mapped now (READER_MAPPED_SEGMENTS), and the mapped
        # ones' starts oldest-mapped first (may name one since unmapped: skipped).
        self._parked: set[int] = set()
        self._mapped_order: deque[int] = deque()
        # Short (truncated) segments: their valid records' end; the rest is a hole until recover.
        self._valid_ends: dict[int, int] = {}
        # Segments present but with nothing readable (empty, or cut inside their first record),
        # below the newest file (which may be being created): a hole, not a file the cleaner
        # removed, so the log's head is still theirs (review 36 F1).
        self._unreadable: set[int] = set()
        # Segments present whose map failed for want of the process's resources (descriptors,
        # memory, map count) or of access: not a hole nor a removed file, only "not now".
        self._map_errors: dict[int, OSError | ValueError] = {}
        # Maps that failed so far (counted, not kept): a search that read store times through
        # this reader compares it before and after, to know none of its reads was "not now".
        self.map_failures = 0
        self._list_error: OSError | None = None  # the directory could not be listed at the last refresh
        # The listing has a hole: a segment missing between two present, or one present with
        # nothing (or less than its length) readable. Reads into it name it (review 116 L2).
        self.has_hole = False
        # Segments whose map faulted and was dropped, until the refresh that maps them again:
        # still the log's (min_offset, next_segment_after), not removed.
        self._dropped: set[int] = set()
        # mapguard.total_faults() when this reader last asked its maps (`look_for_faults`): a
        # reader compares it before trusting a read that did not decode, one integer.
        self.faults_seen = mapguard.total_faults()
        # Maps are closed from two threads (this reader's own: refresh, and another's:
        # release_deleted or the store's close): one close at a time.
        self._closing = threading.Lock()
        self.refresh()

    def set_limit(self, limit: int) -> None:
        self.limit = limit

    def refresh(self) -> None:
        """Map new segment files and drop the ones that were deleted."""
        try:
            names = self.fs.listdir(self.store_path) if self.fs.isdir(self.store_path) else []
        except FileNotFoundError:
            names = []
        except OSError as exc:
            # Not listable now (out of descriptors, say): nothing is known to be gone, and an
            # unmapped segment is "not now" (map_error), not removed.
            self._list_error = exc
            return
        self._list_error = None
        self._map_errors = {}
        self._dropped = set()
        present: set[int] = set()
        starts = [int(name) for name in names if len(name) == 20 and name.isdigit()]
        newest = max(starts, default=-1)
        unreadable: set[int] = set()
        newly_mapped: list[int] = []
        for start in sorted(starts, reverse=True):  # the newest mapped first: reads are mostly near the end
            present.add(start)
            known = self._regions.get(start)
            if known is not None:
                if not region_closed(known):
                    continue
                with self._closing:  # given back (release_deleted) but named again: map it anew
                    close_region_if_free(self._regions.pop(start))
                self._valid_ends.pop(start, None)
            elif start in self._parked:
                continue
            path = os.path.join(self.store_path, f"{start:020d}")
            if len(self._regions) >= READER_MAPPED_SEGMENTS and self._full_sized(path):
                self._parked.add(start)  # mapped when read
                continue
            region = self._map(path, start)
            if region is None:
                present.discard(start)  # being created (not yet full size), just deleted, or empty
                if start != newest and self.fs.exists(path):
                    unreadable.add(start)
            else:
                self._regions[start] = region
                newly_mapped.append(start)
        self._mapped_order.extend(reversed(newly_mapped))  # oldest segment first: given back first
        self._unreadable = unreadable
        listed = sorted(starts)
        self.has_hole = bool(unreadable) or any(start in present for start in self._valid_ends) or any(
            b - a != self.mapped_file_size for a, b in zip(listed, listed[1:]))  # fmt: skip
        self._parked &= present
        for start in [s for s in self._regions if s not in present]:
            self._valid_ends.pop(start, None)
            with self._closing:
                close_region_if_free(self._regions.pop(start))

    def _full_sized(self, path: str) -> bool:
        """Whether `path` is a regular file of the segment size (a segment to map when read;
        anything else is mapped now, to be judged as `_map` does)."""
        try:
            return self.fs.isfile(path) and self.fs.getsize(path) == self.mapped_file_size
        except OSError:
            return False

    def _map_parked(self, start: int) -> MappedRegion | None:
        """Map the parked segment at `start`, giving back the oldest mapped one beyond
        READER_MAPPED_SEGMENTS (a short segment stays mapped, as does one a view still holds)."""
        path = os.path.join(self.store_path, f"{start:020d}")
        if not self._full_sized(path) and self.fs.exists(path):
            # Full-sized when listed, short now: cut by another process while parked, as a
            # mapped one is cut under its map. "Not now" (as for a faulted map), not a short
            # segment's damage: a short map kept would serve it as a hole after its restore.
            self._map_errors[start] = UnreadPageError(path, "nothing was skipped; read again once the file reads whole")
            self.map_failures += 1
            return None
        self._parked.discard(start)
        region = self._map(path, start)
        if region is not None:
            self._map_errors.pop(start, None)  # mapped now: an earlier "not now" is over (review 77 L2)
        if region is None:
            if start in self._map_errors:
                self._parked.add(start)  # "not now" (map_error names why): still the log's
            return None  # or gone (the next refresh forgets it)
        self._give_back_mapped(READER_MAPPED_SEGMENTS - 1)
        self._regions[start] = region
        self._mapped_order.append(start)
        return region

    def _give_back_mapped(self, keep: int) -> None:
        """Unmap the least recently mapped segments until at most `keep` are mapped (a short
        segment stays mapped, as does one a view still holds); each stays known, parked."""
        order = self._mapped_order
        for _ in range(len(order)):
            if len(self._regions) <= keep:
                break
            oldest = order.popleft()
            mapped = self._regions.get(oldest)
            if mapped is None or oldest in self._valid_ends:
                if mapped is not None:
                    order.append(oldest)  # a short segment is kept mapped
                continue
            with self._closing:
                if not close_region_if_free(mapped):
                    order.append(oldest)  # a view of it is alive: given back later
                    continue
            del self._regions[oldest]
            self._parked.add(oldest)

    def release_deleted(self, present: Collection[int]) -> int:
        """From any thread: unmap this reader's segments whose files are gone (`present`: the
        segment starts listed now); how many it unmapped. A deleted file's blocks go back to
        the disk only with its last map, and a thread that reads no more never refreshed its
        own (review 46 M5: the cleaner freed nothing on a full disk until a reopen). Its owner
        then reads None there, as for any deleted segment, and its next refresh forgets it."""
        released = 0
        for start, region in list(self._regions.items()):  # (a copy: the owner may refresh meanwhile)
            if start in present or region_closed(region) or not isinstance(region.buf, mmap.mmap):
                continue  # (a simulated region has no map to give back)
            if self.fs.exists(os.path.join(self.store_path, f"{start:020d}")):
                continue  # made after `present` was listed (the owner mapped a new segment)
            with self._closing:
                if close_region_if_free(region):
                    released += 1
        return released

    def _map(self, path: str, start: int) -> MappedRegion | None:
        region = self._map_file(path, start)
        if region is None or self._segments is None:
            return region
        expected = self._segments().get(start)
        seen = self._replaced_seen
        if expected is None or region.identity == expected:
            if seen is not None and start in seen:
                seen.discard(start)  # the store's own file there again (a restarted writer's new one)
            return region
        # Replaced under the running store, the writer's check not come yet: "not now", never
        # the log; once the writer has found it, the view's `replaced` stops reads there.
        region.close()
        self._valid_ends.pop(start, None)
        self._map_errors[start] = SegmentReplacedError(path)
        if seen is not None:
            seen.add(start)
        self.map_failures += 1
        return None

    def _map_file(self, path: str, start: int) -> MappedRegion | None:
        try:
            try:
                return self.fs.map_file(path, self.mapped_file_size, create=False, readonly=True)
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES_ERRNOS or not self._regions:
                    raise
                # The process (or the store's share of its maps) is short: this thread's own
                # segments go back first, and the map is tried again (review 91 B1: a busy
                # reader kept the maps other readers needed).
                self._give_back_mapped(0)
                return self.fs.map_file(path, self.mapped_file_size, create=False, readonly=True)
        except (OSError, ValueError) as exc:
            if _map_failed_now(exc):
                # Without its traceback: its frames hold this reader, and the cycle kept the
                # reader's maps and descriptors until a garbage collection (review 76 H2).
                self._map_errors[start] = exc.with_traceback(None)
                self.map_failures += 1
                return None
        # A short segment (truncated by damage; files are created full-size at once): mapped
        # at its own length, its valid records from the start are served until the first
        # record that is not; past that lies the hole (the store is degraded until recover).
        try:
            size = self.fs.getsize(path)
            if not 0 < size < self.mapped_file_size:
                return None
            region = self.fs.map_file(path, size, create=False, readonly=True)
        except (OSError, ValueError) as exc:
            if _map_failed_now(exc):
                self._map_errors[start] = exc.with_traceback(None)
                self.map_failures += 1
            return None
        end = valid_prefix_end(region.buf, start, self.mapped_file_size, self.max_record_size)
        if end == 0:
            region.close()
            return None
        self._valid_ends[start] = end
        return region

    @property
    def map_errors(self) -> bool:
        """Whether a segment present could not be mapped (or the directory listed) at the last refresh."""
        return bool(self._map_errors) or self._list_error is not None

    def map_error(self, offset: int) -> OSError | ValueError | None:
        """Why the segment holding `offset` is present but could not be mapped at the last
        refresh (too many open files, no memory or map count left, no access); None if it
        was not. A read there is "not now", never "removed": a consumer moves on the latter
        (review 52 H1)."""
        if not self._map_errors:
            return self._list_error
        return self._map_errors.get(offset - offset % self.mapped_file_size, self._list_error)

    def look_for_faults(self) -> dict[int, UnreadPageError]:
        """The segments whose map faulted since this reader last looked (an I/O error, or the
        file cut meanwhile: the guard's zeros are not their content), each unmapped so the
        next read maps the file again, and named by `map_error` until the next refresh. Ask
        when `mapguard.total_faults()` moved from `faults_seen`."""
        self.faults_seen = mapguard.total_faults()  # (before asking: a fault after it moves it again)
        found: dict[int, UnreadPageError] = {}
        for start, region in list(self._regions.items()):
            if region.cut_short():
                error = UnreadPageError(os.path.join(self.store_path, f"{start:020d}"),
                                        "nothing was skipped; read again once the file reads whole")  # fmt: skip
                found[start] = self._map_errors[start] = error
                self._dropped.add(start)
                self._valid_ends.pop(start, None)
                with self._closing:
                    close_region_if_free(self._regions.pop(start))
        return found

    def unread(self, offset: int) -> UnreadPageError | None:
        """Why the segment holding `offset` could not be read now, if its map faulted (now or
        since the last refresh); else None. One compare when nothing faulted."""
        if mapguard.total_faults() != self.faults_seen:
            self.look_for_faults()
        if not self._map_errors:
            return None
        error = self._map_errors.get(offset - offset % self.mapped_file_size)
        return error if isinstance(error, UnreadPageError) else None

    def drop_if_renewed(self, offset: int) -> bool:
        """Whether this reader maps the segment holding `offset` from a file its name no longer
        names (deleted and made again: a trailing segment a restarted writer's recovery
        deleted, then made again by a roll-over; before the allocator's files made ahead were
        unnamed, the usual case was one of those): if so that map is given
        back and the next read maps the file named now. A stat; asked by a read that found no
        record where a unit points (the old file reads zeros: a get moved a consumer past an
        acknowledged message there)."""
        start = offset - offset % self.mapped_file_size
        region = self._regions.get(start)
        if region is None or region_closed(region) or not region.renewed():
            return False
        self._valid_ends.pop(start, None)
        with self._closing:
            close_region_if_free(self._regions.pop(start))
        return True

    def not_this_segment(self, offset: int) -> str:
        """Why the file named for the segment holding `offset` is not that segment, or "" if
        its bytes do not say so: its first two records (every segment starts with a record)
        agree they were stored at another segment's start. Asked where a read found no record
        of its queue: another segment's bytes there are not damage to skip past but a log to
        put back (review 144 F2). A segment the writer found replaced is the read view's
        `replaced`, which a read looks at first."""
        start = offset - offset % self.mapped_file_size
        # Its first two records, both saying they were stored the same distance away: one
        # field's damage (a flipped bit) is not another segment (review 145 F1).
        first = self._stored_at(start)
        if first is None or first[1] == start or first[1] % self.mapped_file_size:
            return ""
        second = self._stored_at(start + first[0])
        if second is None or second[1] != first[1] + first[0]:
            return ""
        return f"segment {start:020d} starts with records stored at commitlog offset {first[1]}: it holds another segment's bytes"

    def _stored_at(self, offset: int) -> tuple[int, int] | None:
        """(size, physical-offset field) of the message record header at `offset`, if one is there."""
        head = self.read(offset, 36, limit=offset + 36)
        if head is None:
            return None
        size, magic = _II.unpack_from(head, 0)
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or size < 36:
            return None
        return size, _Q.unpack_from(head, PHYSICAL_OFFSET_POSITION)[0]

    def _readable_end(self, start: int) -> int:
        """Where the segment at `start` stops being readable (its end, or a short one's valid end)."""
        return self._valid_ends.get(start, self.mapped_file_size)

    def close(self) -> None:
        with self._closing:
            for region in list(self._regions.values()):
                close_region_if_free(region)
        self._regions.clear()
        self._parked.clear()
        self._mapped_order.clear()
        self._valid_ends.clear()

    def min_offset(self) -> int:
        """The log's head: the first segment present, or an unreadable one before it."""
        starts = [*self._regions, *self._parked, *self._unreadable, *self._dropped]
        return min(starts) if starts else -1

    def within_log(self, offset: int) -> bool:
        """Whether `offset` is at or past the log's head as listed now: a read that found
        nothing there met a hole, not a segment retention deleted (which goes from the head).
        Listed again first (asked only where a read found nothing): this reader's older
        listing still holds segments retention deleted since, mapped, parked or unmapped by
        another thread (`release_deleted`), and took their starts for the head (review 121 F2)."""
        self.refresh()
        head = self.min_offset()
        return 0 <= head <= offset

    def has_segment(self, offset: int) -> bool:
        """Whether the segment holding `offset` is mapped and readable there (full-sized, or
        `offset` below a short segment's valid end)."""
        found = self._region_for(offset)
        return found is not None and offset - found[0] < self._readable_end(found[0])

    def readable_until(self, offset: int) -> int:
        """The end of what the segment holding `offset` can serve: its end, or a short
        segment's valid end (past which lies a hole, not data still to come)."""
        start = offset - offset % self.mapped_file_size
        return start + (self._readable_end(start) if self._region_for(offset) is not None else self.mapped_file_size)

    def next_segment_after(self, offset: int) -> int | None:
        """The start of the first mapped segment after `offset` (past a hole), or None."""
        later = [start for start in (*self._regions, *self._parked, *self._dropped) if start > offset]
        return min(later) if later else None

    def _region_for(self, offset: int) -> tuple[int, MappedRegion] | None:
        start = offset - offset % self.mapped_file_size
        region = self._regions.get(start)
        if region is None:
            if start not in self._parked:
                self.refresh()
                region = self._regions.get(start)
            if region is None and start in self._parked:
                region = self._map_parked(start)
        return (start, region) if region is not None else None

    def _limit(self, limit: int | None) -> int:
        return self.limit if limit is None else limit

    def read(self, offset: int, size: int, *, limit: int | None = None) -> bytes | None:
        """Bytes [offset, offset+size) if all below the limit and in one existing segment."""
        view = self.view(offset, size, limit=limit)
        if view is None:
            return None
        with view:
            return bytes(view)

    def view(self, offset: int, size: int, *, limit: int | None = None) -> memoryview | None:
        """`read` without the copy: a view into this reader's own mapping. The caller must
        `release()` it before anything of this reader can unmap (refresh, close) - reading
        and releasing in one call on the reader's thread keeps that true."""
        found = self._region_for(offset)
        if found is None or size < 0 or offset + size > self._limit(limit):
            return None
        start, region = found
        pos = offset - start
        if pos + size > self._readable_end(start):
            return None
        try:
            return memoryview(region.buf)[pos : pos + size]
        except ValueError:  # unmapped underneath
            return None

    def select(self, offset: int, size: int) -> tuple[mmap.mmap | bytearray, int] | None:
        """selectMappedBuffer without a buffer object: the map that holds [offset, offset+size)
        and the position there, None where `read(offset, size, limit=offset + size)` gives None.

        For a decoder that reads in place within one call (`codec.read_message`): it holds the
        map only while it runs, so nothing outlives the call and no record is copied. The
        caller must not keep the map: a refresh or close of this reader unmaps it."""
        # _region_for and _readable_end inline: a key lookup calls this from C for each hit,
        # and their two frames were a tenth of the lookup.
        start = offset - offset % self.mapped_file_size
        region = self._regions.get(start)
        if region is None:
            found = self._region_for(offset)  # (refreshes the listing)
            if found is None:
                return None
            region = found[1]
        pos = offset - start
        if size < 0 or pos + size > self._valid_ends.get(start, self.mapped_file_size):
            return None
        if getattr(region.buf, "closed", False):
            return None
        return region.buf, pos

    def read_record(
        self, offset: int, *, limit: int | None = None, check_crc: bool = False, read_body: bool = True
    ) -> RecordRead | None:
        found = self._region_for(offset)
        if found is None:
            return None
        start, region = found
        end = min(self._limit(limit) - start, self._readable_end(start))
        try:
            read = read_record(region.buf, offset - start, max(end, 0), check_crc=check_crc, read_body=read_body,
                               max_message_size=self.max_record_size)  # fmt: skip
        except ValueError:
            return None
        return _absolute(read, start)

    def iter_records(
        self, from_offset: int, to_offset: int | None = None, *, check_crc: bool = False, read_body: bool = True
    ) -> Iterator[RecordRead]:
        """As `CommitLog.iter_records`, bounded by `to_offset` (default: the limit)."""
        end = self._limit(to_offset)
        offset = from_offset
        while offset < end:
            read = self.read_record(offset, limit=end, check_crc=check_crc, read_body=read_body)
            if read is None:
                return
            yield read
            if read.kind is RecordKind.MESSAGE:
                offset += read.size
            elif read.kind is RecordKind.BLANK:
                offset += self.mapped_file_size - offset % self.mapped_file_size
            else:
                return


class SegmentSize(NamedTuple):
    """A segment size that explains a commitlog directory, and at what cost: each file it
    finds damaged (cut, grown, not a regular file) counts 1, a name off its grid 2 (no store
    of that size names a file so), a missing segment between the first and the last 1."""

    size: int
    cost: int


def segment_size_candidates(starts: list[int], lengths: list[int | None], *, min_size: int = 4096) -> list[SegmentSize]:
    """Every segment size that could have written the segments named `starts`, of `lengths`
    (None: not a regular file), cheapest explanation first (ties: one a file has, then the
    longer). A
    candidate is the length of a file that starts on its grid, at least `min_size` (files are
    made at the segment size, so an intact one says it), and the names' step (their gcd),
    which no file may have (every file cut: an interrupted copy); the names then say which
    files are damage and where segments are missing. Neither the commonest length (cut files
    outnumbering intact ones, review 29) nor the names' step alone (one stray name or a hole
    beside a cut file made it a size no file has, review 30) decides, and without the step a
    cut file's length won where every file is cut (review 32). The store adopts no size that
    no file has, nor one of two that tie (storage.geometry): those it refuses."""
    sizes = {n for start, n in zip(starts, lengths) if n is not None and n >= min_size and start % n == 0}
    steps = [b - a for a, b in zip(starts, starts[1:]) if b > a]
    names_step = math.gcd(*steps) if steps else 0
    unproven = names_step if names_step >= min_size and names_step not in sizes else 0
    candidates: list[SegmentSize] = []
    for size in sizes | ({unproven} if unproven else set()):
        on_grid = [start for start in starts if start % size == 0]
        off_grid = len(starts) - len(on_grid)
        damaged = sum(1 for start, n in zip(starts, lengths) if start % size == 0 and n != size)
        distinct = sorted(set(on_grid))
        missing = (distinct[-1] - distinct[0]) // size + 1 - len(distinct)
        candidates.append(SegmentSize(size, 2 * off_grid + damaged + missing))
    # Of equal explanations, one a file has, then the longer.
    candidates.sort(key=lambda c: (c.cost, c.size == unproven, -c.size))
    return candidates


def segment_size_of(starts: list[int], lengths: list[int | None], prefer: int | None = None) -> int:
    """A commitlog directory's segment size for the tools that read one without the store
    (`segment_size_candidates`' cheapest; 0 when no file can say it: nothing to read by). Any
    length counts: a lone segment cut short is read as far as it goes. `prefer`: the size the
    store adopted or the caller set, taken where it explains the files as well as any (the
    store refuses such a tie until the caller settles it; the tools then read as told)."""
    candidates = segment_size_candidates(starts, lengths, min_size=1)
    if not candidates:
        return 0
    if prefer is not None and any(c.size == prefer and c.cost == candidates[0].cost for c in candidates):
        return prefer
    return candidates[0].size


def segment_lengths_in(fs: FileSystem, path: str, names: list[str]) -> list[int | None]:
    """The lengths of the segments `names` in directory `path` (None: not a regular file)."""
    lengths: list[int | None] = []
    for name in names:
        try:
            lengths.append(fs.getsize(os.path.join(path, name)) if fs.isfile(os.path.join(path, name)) else None)
        except FileNotFoundError:  # removed since the listing (a running store's cleaner)
            lengths.append(None)
    return lengths


def segment_size_in(fs: FileSystem, path: str, names: list[str], prefer: int | None = None) -> int:
    """`segment_size_of` for the segments `names` in directory `path`."""
    return segment_size_of([int(n) for n in names], segment_lengths_in(fs, path, names), prefer)


def being_created(name: str, newest: str, size: int, file_size: int) -> bool:
    """Whether a file of a running store (a commitlog segment, a ConsumeQueue or index file)
    of `size` bytes is one its owner is making: the newest of its directory (`newest`: the
    greatest name there), shorter than its kind's `file_size`. Files are created empty and
    then sized (O_CREAT|O_EXCL, then ftruncate): the read-only tools called one met in between
    damage (review 53 L1)."""
    return name == newest and size < file_size


def expired_since_listed(fs: FileSystem, directory: str, start: int) -> bool:
    """Whether the file starting at `start` (a segment, or a ConsumeQueue file: both named by
    their start), found gone, was its directory's head: the directory, listed again, holds
    such files and all of them start after it (a store's retention deletes only the oldest,
    never the last). One gone while older ones remain, or gone with every other, is a hole.
    The tools' scan and the Spark readers (`pipeline.segments.expired_by_retention`) ask it."""
    try:
        left = [int(n) for n in fs.listdir(directory) if len(n) == 20 and n.isdigit()]
    except OSError:
        return False
    return bool(left) and start < min(left)


def scan_commitlog_dir(
    path: str,
    *,
    check_crc: bool = False,
    read_body: bool = True,
    segment_size: int | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    fs: FileSystem | None = None,
    look_past_damage: bool = False,
    live: bool = False,
    on_unreadable: Callable[[str, OSError], None] | None = None,
) -> Generator[RecordRead, None, None]:
    """Every record of every segment in `path`, for tools (absolute offsets).

    Each file is read from its start until a BLANK, END_OF_DATA or CORRUPT record (which is
    yielded too), then the next file follows. A file of the wrong size is reported as CORRUPT
    at its start offset. The segment size defaults to the first file's length.

    `live`: a running store writes the directory. Its newest segment, shorter than the others,
    is one being created (a segment is made empty, then sized: `being_created`), not damage;
    it holds no record yet and is read as nothing.

    With `look_past_damage` (as recovery does), damage or zeroes followed by a trusted record
    in the same file are one CORRUPT read whose `size` spans them, and the walk continues;
    a record whose physical-offset field disagrees with where it lies counts as damage.

    `on_unreadable(path, error)`: told of a segment present that this process cannot open or
    map now (no access, an I/O error, no descriptors or memory: `_map_failed_now`), which is
    then passed over; without it, such a segment is a CORRUPT read as damage is.
    """
    fs = fs or RealFileSystem()
    names = [n for n in fs.listdir(path) if len(n) == 20 and n.isdigit()]
    if not names:
        return
    if segment_size is None:
        segment_size = segment_size_in(fs, path, names)
    max_message_size = max_record_size(segment_size, max_message_size)
    newest = max(names)
    for name in names:
        start = int(name)
        file_path = os.path.join(path, name)
        try:
            size = fs.getsize(file_path)
            if live and being_created(name, newest, size, segment_size):
                continue
            if size != segment_size:
                yield RecordRead(RecordKind.CORRUPT, start, 0, reason=f"file is {size} bytes, expected {segment_size}")
                continue
            region = fs.map_file(file_path, segment_size, create=False, readonly=True)
        except FileNotFoundError as exc:
            if not os.path.lexists(file_path) and expired_since_listed(fs, path, start):
                continue  # a running store's cleaner removed it since the listing (review 53 M3, review 56 M1)
            yield RecordRead(RecordKind.CORRUPT, start, 0, reason=f"cannot read {file_path}: {exc}")
            continue
        except OSError as exc:
            if on_unreadable is not None and _map_failed_now(exc):
                on_unreadable(file_path, exc)  # not damage: the file may be whole (review 65 F1)
                continue
            yield RecordRead(RecordKind.CORRUPT, start, 0, reason=f"cannot read {file_path}: {exc}")
            continue
        try:
            yield from _scan_segment(fs, region, file_path, start, segment_size, check_crc, read_body, max_message_size,
                                     look_past_damage, on_unreadable)  # fmt: skip
        finally:
            region.close()


def _scan_segment(
    fs: FileSystem, region: MappedRegion, file_path: str, start: int, segment_size: int, check_crc: bool,
    read_body: bool, max_message_size: int, look_past_damage: bool,
    on_unreadable: Callable[[str, OSError], None] | None,
) -> Generator[RecordRead, None, None]:  # fmt: skip
    """scan_commitlog_dir's walk of one mapped segment. Before each read is yielded, a fault on
    the map (an I/O error, or the file cut meanwhile) ends the walk: what the guard's zeros read
    as (damage, the end, a record whose tail they are) is not the file's. The segment is then
    unreadable now (`on_unreadable`), or without it CORRUPT at that offset."""
    seen = mapguard.total_faults()
    pos = 0
    while True:
        read = read_record(region.buf, pos, segment_size, check_crc=check_crc, read_body=read_body,
                           max_message_size=max_message_size)  # fmt: skip
        if read.kind is RecordKind.MESSAGE and look_past_damage and read.record is not None and (
            read.record.commitlog_offset != start + pos
        ):
            read = RecordRead(RecordKind.CORRUPT, pos, read.size,
                              reason=f"record says it is at {read.record.commitlog_offset}")  # fmt: skip
        if look_past_damage and read.kind in (RecordKind.CORRUPT, RecordKind.END_OF_DATA):
            following = find_next_valid_record(
                region.buf, pos + 1, segment_size, file_from_offset=start, segment_size=segment_size,
                max_message_size=max_message_size, extents=_extents(fs, file_path, pos + 1, segment_size),
            )  # fmt: skip
            if following is not None:
                if mapguard.total_faults() != seen and region.cut_short():
                    break
                # Quarantined: reported with its extent as `size`, and the walk goes on.
                reason = read.reason if read.kind is RecordKind.CORRUPT else "zeroed bytes"
                yield RecordRead(RecordKind.CORRUPT, start + pos, following - pos,
                                 reason=QUARANTINED_PREFIX + reason)  # fmt: skip
                pos = following
                continue
        if mapguard.total_faults() != seen and region.cut_short():
            break
        yield _absolute(read, start)
        if read.kind is not RecordKind.MESSAGE:
            return
        pos += read.size
        if pos >= segment_size:
            # Records to the last byte, no blank record (the writers keep 8 bytes for one; a
            # copied or foreign store need not): no end of the log, as recovery walks on to the
            # next file (review 121 F1: inspect said "damaged" and dump exited 3 there).
            return
    error = UnreadPageError(file_path, "the records before it were read; read again once the file reads whole")
    if on_unreadable is not None:
        on_unreadable(file_path, error)
    else:
        yield RecordRead(RecordKind.CORRUPT, start + pos, 0, reason=f"cannot read {file_path}: {error}")


def _extents(fs: FileSystem, path: str, start: int, end: int) -> list[tuple[int, int]]:
    try:
        return fs.data_extents(path, start, end)
    except OSError:
        return [(start, end)]

