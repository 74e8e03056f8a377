"""The read logic: plain functions of (a `ReadView`, the calling thread's `ThreadReaders`, the
config). No actors and no waiting here: the store takes the view (after the read-your-writes
wait), calls these, and asks an owner only when one returns None, i.e. when the view cannot
decide (the ConsumeQueue actor not live, a file that cannot be mapped, a unit that is not its
queue's own at its offset).

- `get_from_view` / `get_from_units`: RocketMQ's getMessage (§13.1): `status_ladder`, then
  `collect` (isTheBatchFull, tag-hash filtering confirmed by the record's real tag).
- `query_messages`: queryMessage's loop (§13.2) over index hits, each checked against the
  record's real keys.
- `bounds_from_view`, `unit_store_time`: min/max offsets and getMessageStoreTimeStamp.

A read through the thread's maps never blocks, so a thread reading in a loop would keep the GIL
for CPython's whole switch interval (5 ms) at a time and make every put hand-off wait that long
(a consumer catching up cut a producer from 90k to 8k msgs/s). So each get and query that read
through the maps ends with one `yield_gil()` (and the C read loop checks between records): it
gives the GIL to the threads the store's hand-offs woke (a put's writer, its answer) when
there are any, and costs nothing when no one puts.
The catch-up case of bench/bench_read.py measures both.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
import weakref
from operator import attrgetter
from typing import Any, Callable, Final, Mapping, Sequence


from .actors.consume_queue import pickup_store_timestamp as _pickup_store_timestamp
from .config import StoreConfig
from .messages import GetResult, QueryResult, UnitsReply
from .read_view import ReadView, in_ranges
from .storage import codec, mapguard, speedups
from .storage.codec import FILLER_UNIT_SIZE, MessageRecord
from .storage.commitlog import CommitLogReader, SegmentReplacedError
from .storage.memory import memory_room
from .storage.consume_queue import ConsumeQueueReader
from .storage.fs import FileSystem, UnreadPageError
from .storage.index import IndexMaps, IndexReader, build_key, index_file_size, key_hash_and_slot
from .storage.status import GetMessageStatus

__all__ = [
    "READER_REFRESH_INTERVAL_MS",
    "ReaderRegistry",
    "ThreadReaders",
    "CorruptSink",
    "batch_full",
    "corrupt_detail",
    "bounds_from_view",
    "collect",
    "get_from_units",
    "get_from_view",
    "index_unread_detail",
    "max_units",
    "offset_for_time",
    "pickup_store_timestamp",
    "query_direct",
    "query_messages",
    "record_at",
    "status_ladder",
    "subscription",
    "unit_store_time",
    "yield_gil",
]

# accessMessageInMemoryMaxRatio's share of the machine's memory: a container's limit, where
# the process has one, not the host's (review 71 F7).
_TOTAL_RAM_BYTES = memory_room().total or 24 * 1024**3
# A reader thread re-lists the commitlog at least this often, so a segment the cleaner deleted
# reads as deleted (MESSAGE_WAS_REMOVING) and its disk space is not kept alive by our maps.
READER_REFRESH_INTERVAL_MS = 1_000
QUERY_ROUNDS_MAX = 3  # queryMessage asks the index at most 3 times, moving the end time back
# An index entry's time is its file's begin time plus whole seconds: up to 999 ms before the
# record's store time. The walk starts that much earlier, and the records' own store times
# decide (review 125 F3: messages stored just after begin_ms were missed, just after end_ms served).
QUERY_WALK_SLACK_MS = 999


def query_walk_begin(begin_ms: int) -> int:
    """Where the index walk of a query for messages stored from `begin_ms` starts."""
    return max(0, begin_ms - QUERY_WALK_SLACK_MS)


def settle_query(messages: Sequence[MessageRecord], max_count: int, begin_ms: int, end_ms: int) -> list[MessageRecord]:
    """A query's answer: each record once (a message whose KEYS repeat the key is indexed once
    for each: review 125 F2 served it once per entry), stored within [begin_ms, end_ms], the
    newest `max_count` of them (the walk's: it goes from the newest hit back), oldest first.
    Review 127 F3: a walk again with max_msgs_num_batch kept the oldest of its hits instead."""
    seen: set[int] = set()
    kept: list[MessageRecord] = []
    for m in messages:
        if begin_ms <= m.store_timestamp <= end_ms and m.commitlog_offset not in seen:
            seen.add(m.commitlog_offset)
            kept.append(m)
    if len(kept) > 1:
        kept.sort(key=attrgetter("commitlog_offset"))
    return kept[-max_count:]


def _walk_cut(hits: int, budget: int, found: int, max_count: int) -> bool:
    """Whether a walk that used its whole budget of hits held fewer than `max_count` messages
    of the key: other keys' hits (or repeats) may have crowded some out."""
    return hits >= budget and found < max_count


def _walk_again(hits: int, budget: int, found: int, max_count: int, batch: int) -> bool:
    """Whether such a walk should be made again with the most one query reads (`batch`,
    max_msgs_num_batch)."""
    return budget < batch and _walk_cut(hits, budget, found, max_count)


def query_walk_cut_detail(hits: int, budget: int, found: int, max_count: int) -> str:
    """The `detail` of an answer whose index walk stopped at its budget of hits with fewer than
    `max_count` messages of the key among them (review 125 F2: other keys' messages of the same
    hash used the budget, and a stored message with the key was answered as none, unsaid)."""
    if not _walk_cut(hits, budget, found, max_count):
        return ""
    return (f"the index walk stopped at {budget} hits, the most one query reads (max_msgs_num_batch), and "
            f"{found} of them were messages of this key (the rest: other keys of the same "
            "hash, or a message indexing this key more than once): older messages with this key may exist; ask "
            "with an earlier end_ms, or raise max_msgs_num_batch")  # fmt: skip


# Faults the SIGBUS guard caught in the process: a read compares it with its reader's
# `faults_seen` before it trusts what it read (the C counter itself, ~30 ns a get).
_total_faults: Final[Callable[[], int]] = mapguard.total_faults

def yield_gil() -> None:
    """Let the threads the store's hand-offs woke (`_native.Signal`: actor inboxes, answers)
    take the GIL now rather than after the switch interval, if any is waiting for it, and
    give the CPU away for a while after one was (a put is a chain of hand-offs); an atomic
    load and a clock read when no one puts. `time.sleep(0)` here cost a scheduler yield per
    call (~90 us on a busy machine, half a 128 B read loop). Without the C extension it
    stays that: Python cannot tell whether a thread waits."""
    fast = speedups.native
    if fast is not None:
        fast.yield_gil()
    else:
        time.sleep(0)


_Closable = CommitLogReader | ConsumeQueueReader | IndexReader


class ThreadReaders:
    """One thread's read-only maps: of the commitlog, of consumequeue/ and of index/. Not
    thread-safe, except `close` (the store closing, from another thread)."""

    def __init__(
        self, fs: FileSystem, cfg: StoreConfig, now_ms: Callable[[], int], on_reader: Callable[[_Closable], None],
        index_maps: IndexMaps | None = None, segments: Callable[[], Mapping[int, tuple[int, int]]] | None = None,
        replaced_seen: set[int] | None = None,
    ) -> None:  # fmt: skip
        self._fs = fs
        self._cfg = cfg
        self._index_maps = index_maps  # shared by every thread's reader (None: this one's own)
        self._now_ms = now_ms
        self._on_reader = on_reader  # each reader made is registered, to be closed at close()
        self._refreshed_ms = now_ms()
        self.commitlog = CommitLogReader(
            fs, cfg.commitlog_dir, mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
            max_message_size=cfg.max_message_size_bytes, segments=segments, replaced_seen=replaced_seen,
        )  # fmt: skip
        on_reader(self.commitlog)
        self._queues: ConsumeQueueReader | None = None
        self._queue_generation = 0
        self._index: IndexReader | None = None
        self.closed = False

    def commitlog_reader(self) -> CommitLogReader:
        """The commitlog reader, re-listed at least every READER_REFRESH_INTERVAL_MS."""
        now = self._now_ms()
        if now - self._refreshed_ms >= READER_REFRESH_INTERVAL_MS:
            self.commitlog.refresh()
            self._refreshed_ms = now
        return self.commitlog

    def queue_reader(self, view: ReadView) -> ConsumeQueueReader:
        """The consumequeue/ reader, its maps dropped if the view's map generation moved."""
        reader = self._queues
        if reader is None:
            reader = self._queues = ConsumeQueueReader(
                self._fs, self._cfg.consume_queue_dir, mapped_file_size=self._cfg.mapped_file_size_consume_queue_bytes
            )
            self._on_reader(reader)
        elif self._queue_generation != view.map_generation:
            reader.forget()
        self._queue_generation = view.map_generation
        return reader

    def index_reader(self, view: ReadView) -> IndexReader | None:
        """The index/ reader mapping the view's index files; None if they cannot be mapped."""
        if view.index_files is None or self.closed:
            return None
        reader = self._index
        if reader is None:
            cfg = self._cfg
            reader = self._index = IndexReader(
                self._fs, cfg.index_dir, max_hash_slot_num=cfg.max_hash_slot_num,
                max_index_num=cfg.max_index_num, max_msgs_num_batch=cfg.max_msgs_num_batch, maps=self._index_maps,
            )  # fmt: skip
            self._on_reader(reader)
        return reader if reader.sync(view.index_files) else None

    def close(self) -> None:
        self.closed = True
        self.commitlog.close()
        if self._queues is not None:
            self._queues.close()
        if self._index is not None:
            self._index.close()


class ReaderRegistry:
    """Each thread's `ThreadReaders`, made on its first read. Its readers are held weakly, so a
    thread that ends takes its maps with it (a host starting a thread per request would
    otherwise pile up maps until close); `close` closes those still alive."""

    def __init__(
        self, fs: FileSystem, cfg: StoreConfig, now_ms: Callable[[], int],
        segments: Callable[[], Mapping[int, tuple[int, int]]] | None = None,
    ) -> None:  # fmt: skip
        self._fs, self._cfg, self._now_ms = fs, cfg, now_ms
        self._segments = segments  # the writer's files (ReadView.segments), for every thread's reader
        # Segments where a thread's reader last found another file than the writer's (before
        # the writer's check publishes them replaced): every thread's wait sees them.
        self.replaced_seen: set[int] = set()
        self._local = threading.local()
        self._open: weakref.WeakSet[_Closable] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        # index/'s read maps, one per file for every thread (review 84 F3)
        self.index_maps = IndexMaps(fs, cfg.index_dir, index_file_size(cfg.max_hash_slot_num, cfg.max_index_num))

    def get(self) -> ThreadReaders:
        readers: ThreadReaders | None = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = ThreadReaders(self._fs, self._cfg, self._now_ms, self._register,
                                                          self.index_maps, self._segments, self.replaced_seen)  # fmt: skip
        return readers

    def still_another_file(self, start: int, writers: tuple[int, int] | None) -> bool:
        """Whether segment `start`'s path, where a reader found another file than the writer's
        (`writers`, its published identity), still names another (a stat). Forgotten once it
        names the writer's file again (review 152 F1: swapped back, every wait there waited
        its time out until some thread happened to map it again)."""
        try:
            now = self._fs.identity(os.path.join(self._cfg.commitlog_dir, codec.segment_file_name(start)))
        except OSError:
            return True  # (no file there, or none that can be looked at: not the writer's)
        if writers is not None and now == writers:
            self.replaced_seen.discard(start)
            return False
        return True

    def made(self) -> ThreadReaders | None:
        """This thread's readers if a read made them, else None (none made)."""
        readers: ThreadReaders | None = getattr(self._local, "readers", None)
        return readers

    def _register(self, reader: _Closable) -> None:
        with self._lock:
            if self._closed:
                reader.close()
            else:
                self._open.add(reader)

    def release_deleted_files(self) -> int:
        """Every thread's commitlog readers and the shared index maps unmap the files deleted
        since they last looked (`CommitLogReader.release_deleted`, `IndexMaps.release_deleted`),
        from this thread: a host thread that read once and went idle kept a deleted file's blocks from
        the disk for as long as it lived (review 46 M5). Called once a second (a store tick
        hook); how many maps it gave back. (ConsumeQueue maps are a bounded LRU per thread.)"""
        with self._lock:  # (another thread's first read registers its readers meanwhile)
            readers = list(self._open)
        released = 0
        logs = [r for r in readers if isinstance(r, CommitLogReader)]
        if logs and (names := self._listed(self._cfg.commitlog_dir)) is not None:
            present = {int(name) for name in names if len(name) == 20 and name.isdigit()}
            released += sum(reader.release_deleted(present) for reader in logs)
        if self.index_maps.mapped_names and (names := self._listed(self._cfg.index_dir)) is not None:
            released += self.index_maps.release_deleted(names)
        return released

    def _listed(self, directory: str) -> set[str] | None:
        try:
            return set(self._fs.listdir(directory))
        except OSError:
            return None  # the directory unreadable now: nothing is known to be gone

    @property
    def open_readers(self) -> list[_Closable]:
        """The readers not yet closed nor collected (tests count them)."""
        return list(self._open)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for reader in list(self._open):
                reader.close()
            self._open.clear()
            self.index_maps.close()


# --------------------------------------------------------------------------------------
# getMessage (§13.1)


class _Unmapped(Exception):
    """The reader's map was closed between finding it and decoding (the store closing, or
    the segment removed): the record is as unreadable as if `select` had not found it."""


# Told of each record a read skips because it fails its CRC (commitlog offset, reason): the
# store logs and counts it (stats "corrupt_records_on_read").
CorruptSink = Callable[[int, str], None]
Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint commitlog [start, end) ranges


def quarantined_detail(commitlog_offset: int) -> str:
    """A GetResult's `detail` for a record skipped as damage recovery quarantined."""
    return (f"skipped the record at commitlog offset {commitlog_offset}: recovery quarantined it as damaged; "
            "run `mqstore verify`")  # fmt: skip


def is_keyed(record: MessageRecord, topic: str, key: str) -> bool:
    """Whether `record` is one a query for `key` of `topic` asked for: its UNIQ_KEY or a KEYS token."""
    return record.topic == topic and (record.uniq_key == key or key in record.key_list)


def key_lost_reason(record: MessageRecord, topic: str, key: str, max_hash_slot_num: int) -> str | None:
    """Why `record`, where an index entry for `key` of `topic` points, lacks the key, when that
    is damage; None when it is another key's. The entry holds the key's hash: a record with a
    key of that hash is another key's (a collision, which the Java store leaves to the client);
    one with none had its topic or keys changed after it was indexed (the body CRC covers
    neither), as `verify` says of the entry (`index_wrong_key`). Review 97 M1: the record was
    skipped unsaid, "0 messages"."""
    wanted = key_hash_and_slot(build_key(topic, key), max_hash_slot_num)[0]
    keys = ([record.uniq_key] if record.uniq_key is not None else []) + list(record.key_list)
    if any(key_hash_and_slot(build_key(record.topic, k), max_hash_slot_num)[0] == wanted for k in keys):
        return None
    return f"an index entry for this key points at a record of topic {record.topic[:80]!r} with no key of its hash: " \
           "its topic or keys were changed after it was indexed"  # fmt: skip


def unmappable_detail(commitlog_offset: int, error: BaseException, outcome: str = "nothing was skipped") -> str:
    """A read's `detail` where the commitlog segment holding the record exists but could not
    be mapped now, or a page of it could not be read (UnreadPageError)."""
    if isinstance(error, SegmentReplacedError):  # (not the disk's: no device to check)
        return (f"the commitlog segment holding offset {commitlog_offset} was not read ({error}): {outcome}; "
                "reads there stop until the store is closed and its copy of the segment moved back")  # fmt: skip
    how = "read" if isinstance(error, UnreadPageError) else "mapped"
    return (f"the commitlog segment holding offset {commitlog_offset} could not be {how} now ({error}): "
            f"{outcome}; {retry_hint(error)}")


_ERRNO_IN_TEXT: Final = re.compile(r"\[Errno (\d+)\]")


def retry_hint(error: BaseException | str, *, who: str = "the process") -> str:
    """What to do before asking again, by the errno of what refused the map (review 65 F6: a
    file the process may not open was blamed on its descriptors and memory). `error` is the
    exception or its text ("PermissionError: [Errno 13] ...", as a reply carries it); `who`
    is who may not open it (the CLI: the user running the command). The one errno-to-advice
    table for the library's answers and the read tools' (cli.unreadable_file)."""
    code = getattr(error, "errno", None)
    if code is None:
        found = _ERRNO_IN_TEXT.search(str(error))
        code = int(found.group(1)) if found else None
    if code in (errno.EACCES, errno.EPERM):
        return (f"{who} may not open the file, which is not known to be damaged: give it back its owner and mode, or "
                "read access (or clear an immutable attribute), then ask again")  # fmt: skip
    if code == errno.EIO:
        return "the disk answered with an I/O error: check the device (the kernel log) before asking again"
    return "ask again once the process has descriptors and memory to spare"


def index_unread_detail(error: OSError) -> str:
    """A query's `detail` where a page of an index file faulted while it was walked."""
    return f"an index file could not be read now ({error}): messages with this key may exist; {retry_hint(error)}"


def hole_detail(commitlog_offset: int, segment_bytes: int) -> str:
    """A read's `detail` for units skipped into a hole of the log: a segment missing, empty or
    cut short below the newest one, which retention never leaves (it deletes the oldest)."""
    name = "%020d" % (commitlog_offset - commitlog_offset % segment_bytes)
    return (f"skipped messages in a hole of the commitlog at offset {commitlog_offset} (segment {name} is missing or "
            "cut short, not expired): they are served again once the segment is put back whole; `mqstore recover` "
            "gives them up and makes the log whole")  # fmt: skip


def corrupt_detail(commitlog_offset: int, reason: str) -> str:
    """A GetResult's `detail` for a record skipped as corrupt."""
    return f"skipped the corrupt record at commitlog offset {commitlog_offset} ({reason}); run `mqstore verify`"


def replaced_detail(commitlog_offset: int, segment_bytes: int) -> str:
    """A read's `detail` at a segment the writer found replaced under the running store."""
    name = "%020d" % (commitlog_offset - commitlog_offset % segment_bytes)
    return (f"commitlog segment {name}, holding offset {commitlog_offset}, was replaced, renamed away or deleted by "
            "another process while the store ran: the file there now is not the log; nothing was skipped, the next "
            f"read starts here; close the store and move {name}.store-copy over the segment (see the log)")


def not_own_detail(commitlog_offset: int, found: str) -> str:
    """A read's `detail` where a queue's unit points at a whole record that is not its own: the
    log there is not the one the queue was built from (a segment replaced, renamed over or
    restored from elsewhere under the store; or a damaged queue file). Serving it would hand a
    consumer another message under this one's offset (review 144 F2)."""
    return (f"what lies at commitlog offset {commitlog_offset} is not this queue's message ({found}): the commitlog there is "
            "not the one the queue was built from (a segment replaced or restored under the store, see the log, "
            "or a damaged queue file); nothing was skipped, the next read starts at it")


def _not_own(record: MessageRecord, queue: tuple[str, int], queue_offset: int) -> str:
    """"" if `record` is the unit's own, `queue`'s at `queue_offset` (as the direct read checks;
    its physical-offset field alone is not: a flipped bit there is the record's damage, which
    `verify` reports, not another log); else what it says it is."""
    if (record.topic, record.queue_id, record.queue_offset) == (*queue, queue_offset):
        return ""
    return (f"it says topic {record.topic[:80]!r} queue {record.queue_id} offset {record.queue_offset}, "
            f"stored at commitlog offset {record.commitlog_offset}")


def _not_own_raw(data: bytes, queue: tuple[str, int], queue_offset: int) -> str:
    """`_not_own` of a record served raw, by its header (queue id at 12, queue offset at 20,
    physical offset at 28; the topic lies past the body and is not decoded here)."""
    if len(data) < 36:
        return ""  # not a whole header: such bytes are judged as before
    magic = int.from_bytes(data[4:8], "big", signed=True)
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) or int.from_bytes(data[:4], "big") != len(data):
        return f"no whole record of {len(data)} bytes lies there (size {int.from_bytes(data[:4], 'big')}, magic code 0x{magic & 0xFFFFFFFF:08X})"
    queue_id = int.from_bytes(data[12:16], "big", signed=True)
    queue_offset_field = int.from_bytes(data[20:28], "big", signed=True)
    physical = int.from_bytes(data[28:36], "big", signed=True)
    if (queue_id, queue_offset_field) == (queue[1], queue_offset):
        return ""
    return f"its header says queue {queue_id} offset {queue_offset_field}, stored at commitlog offset {physical}"


def _stored_elsewhere_raw(data: bytes, phy: int) -> bool:
    """Whether `data` (at least a record's header) is a message record whose own physical-offset
    field names another place than `phy`."""
    magic = int.from_bytes(data[4:8], "big", signed=True)
    physical = int.from_bytes(data[28:36], "big", signed=True)
    return magic in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) and physical != phy


def _another_logs(reader: CommitLogReader, phy: int, what: str, *, stored_elsewhere: bool) -> str:
    """The stop's detail where what lies at `phy` (not its queue's, said by `what`) is another
    log's: a record that also says it was `stored_elsewhere`, or a segment whose first records
    say the file is another segment's; "" where it is this segment's damage, to skip."""
    elsewhere = reader.not_this_segment(phy)
    if not (elsewhere or stored_elsewhere):
        return ""
    return not_own_detail(phy, f"{what}; {elsewhere}" if elsewhere else what)


def _stop_at_stranger(
    found: list[MessageRecord], found_raw: list[bytes], raw: bool, queue_offset: int, bounds: tuple[int, int], detail: str
) -> GetResult:
    """The answer of a read that met, at `queue_offset`, another log's record or a segment
    replaced under the store (`detail` says which): what was read before it, or
    NO_MATCHED_LOGIC_QUEUE (as for a segment it cannot map); the next read starts at it either
    way, so no consumer moves past the message that belongs there."""
    taken = bool(found_raw if raw else found)
    return GetResult(
        status=GetMessageStatus.FOUND if taken else GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        messages=tuple(found) if not raw else (),
        raw=tuple(found_raw) if raw else (),
        next_begin_offset=queue_offset,
        min_offset=bounds[0],
        max_offset=bounds[1],
        detail=detail,
    )


def _read_in_place(
    buf: Any, pos: int, limit: int | None, max_message_size: int, check_crc: bool = False
) -> MessageRecord | codec.RecordRead:
    """`codec.read_served` on a map of the reader's; _Unmapped if that map is closed."""
    try:
        return codec.read_served(buf, pos, limit, max_message_size=max_message_size, check_crc=check_crc)
    except ValueError as exc:
        if getattr(buf, "closed", False):
            raise _Unmapped from exc
        raise


def subscription(tags: str | None) -> tuple[frozenset[int], frozenset[str]] | None:
    """A subscription expression as (tag hash codes, tag strings); None matches everything.
    As RocketMQ's FilterAPI.buildSubscriptionData: only None, "" and "*" are everything; an
    expression of blanks names no tag and matches nothing, and " * " is the tag "*"."""
    if tags is None or tags in ("", "*"):
        return None
    names = frozenset(t.strip() for t in tags.split("||") if t.strip())
    return frozenset(codec.java_string_hash(t) for t in names), names


def batch_full(
    cfg: StoreConfig, size: int, max_count: int, total_bytes: int, count: int, in_disk: bool, max_total: int | None
) -> bool:
    """isTheBatchFull (§13.1), plus the caller's own byte limit."""
    if total_bytes == 0 or count == 0:
        return False
    if count >= max_count:
        return True
    if max_total is not None and total_bytes + size > max_total:
        return True
    if in_disk:
        return (
            total_bytes + size > cfg.max_transfer_bytes_on_message_in_disk
            or count > cfg.max_transfer_count_on_message_in_disk - 1
        )
    return (
        total_bytes + size > cfg.max_transfer_bytes_on_message_in_memory
        or count > cfg.max_transfer_count_on_message_in_memory - 1
    )


def status_ladder(exists: bool, min_offset: int, max_offset: int, offset: int) -> GetResult | None:
    """getMessage's answer when `offset` is not readable in the queue; None when it is
    (min_offset <= offset < max_offset), and the units decide."""
    if not exists:
        # 4.4.0 creates the queue on demand, so an unknown queue reads as an empty one.
        return GetResult(status=GetMessageStatus.NO_MESSAGE_IN_QUEUE, next_begin_offset=0)
    if max_offset == 0:
        return GetResult(status=GetMessageStatus.NO_MESSAGE_IN_QUEUE, next_begin_offset=0, min_offset=min_offset, max_offset=0)
    if offset < min_offset:
        return GetResult(status=GetMessageStatus.OFFSET_TOO_SMALL, next_begin_offset=min_offset,
                         min_offset=min_offset, max_offset=max_offset)  # fmt: skip
    if offset == max_offset:
        return GetResult(status=GetMessageStatus.OFFSET_OVERFLOW_ONE, next_begin_offset=offset,
                         min_offset=min_offset, max_offset=max_offset)  # fmt: skip
    if offset > max_offset:
        return GetResult(status=GetMessageStatus.OFFSET_OVERFLOW_BADLY, next_begin_offset=0 if min_offset == 0 else max_offset,
                         min_offset=min_offset, max_offset=max_offset)  # fmt: skip
    return None


def collect(
    cfg: StoreConfig,
    reader: CommitLogReader,
    units: bytes,
    head: int,
    offset: int,
    max_count: int,
    max_total_bytes: int | None,
    tags: str | None,
    raw: bool,
    bounds: tuple[int, int],
    *,
    expect: tuple[str, int] | None = None,
    queue: tuple[str, int] | None = None,
    on_corrupt: CorruptSink | None = None,
    quarantined: Ranges = (),
    replaced: Ranges = (),
) -> GetResult | None:
    """The messages the units point at (§13.1's loop); `head` is where "in memory" is measured
    from. With `expect` (units read through the thread's own maps), each record must be that
    (topic, queueId)'s at its queue offset, else None: the caller asks the owner instead.
    With `queue` (the owner's units), a record that is not that queue's at its offset is not
    served: one that also says it was stored elsewhere is another log's, and the read stops
    before it as before a segment it cannot map (`not_own_detail`); else it is a damaged unit,
    skipped and said. A unit into a `replaced` segment (the writer found it replaced under the
    store) stops the read whatever lies there.
    With `cfg.check_crc_on_read`, a record whose body fails its CRC is never returned: it is
    skipped (told to `on_corrupt`, named in the result's `detail`); with `expect`, the owner's
    answer decides, so it is told once. A unit into a `quarantined` range (damage recovery
    found) is skipped whatever the setting, with a detail: recovery already knows it is bad."""
    wanted = None if tags is None else subscription(tags)
    in_memory_bytes = _TOTAL_RAM_BYTES * cfg.access_message_in_memory_max_ratio_percent // 100
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    found_raw: list[bytes] = []
    raw_taken: list[int] = []  # the commitlog offsets of found_raw (raw records carry none we trust)
    found: list[MessageRecord] = []
    count = total_bytes = 0
    next_phy_file_start = -1
    limit = max(16000, max_count * 20)
    unpack = codec.CQ_UNIT.unpack_from
    segment = cfg.mapped_file_size_commitlog_bytes
    max_message_size = cfg.max_stored_record_bytes  # the stored records', not the put limit
    check_crc = cfg.check_crc_on_read
    skipped = ""
    # The C loop takes runs of plain units (no tag filter, no quarantine, units read through
    # the thread's maps); whatever it stops at goes through the loop below, the reference.
    native = speedups.native
    run = None if native is None or expect is None or raw or wanted is not None or quarantined or replaced else native.decode_units
    end = min(len(units), limit)
    i = 0
    while i < end:
        if run is not None and next_phy_file_start < 0:
            assert expect is not None  # (for mypy: `run` is only set with it)
            phy = unpack(units, i)[0]
            segment_place = reader.select(phy, 1)
            if segment_place is not None and not getattr(segment_place[0], "closed", False):
                segment_buf, pos = segment_place
                before = count
                try:
                    i, count, total_bytes = run(
                        units, i, end, segment_buf, phy - pos, reader.readable_until(phy) - (phy - pos), max_message_size,
                        MessageRecord, codec.host_from_bytes, check_crc, expect[0], expect[1], offset, count,
                        total_bytes, max_count, -1 if max_total_bytes is None else max_total_bytes, head,
                        in_memory_bytes, _transfer_limits(cfg), found,
                    )  # fmt: skip
                except ValueError:
                    if not getattr(segment_buf, "closed", False):
                        raise
                    # closed since (the store closing): the loop below reads that as removed
                if count > before:
                    status = GetMessageStatus.FOUND
                if i >= end:
                    break
        phy, size, tags_code = unpack(units, i)
        if size == FILLER_UNIT_SIZE and phy == 0:
            i += 20  # a queue offset whose record was lost or damaged (a filler unit): nothing to serve
            continue
        if replaced and in_ranges(replaced, phy):  # (first: damage found there is the other file's, review 149 F1)
            return _stop_at_stranger(found, found_raw, raw, offset + i // 20, bounds, replaced_detail(phy, segment))
        if quarantined and in_ranges(quarantined, phy):
            skipped = quarantined_detail(phy)
            i += 20
            continue
        if next_phy_file_start >= 0 and phy < next_phy_file_start:
            i += 20
            continue
        in_disk = head - phy > in_memory_bytes
        if batch_full(cfg, size, max_count, total_bytes, count, in_disk, max_total_bytes):
            break
        if wanted is not None and codec.to_int32(tags_code) not in wanted[0]:
            if total_bytes == 0:
                status = GetMessageStatus.NO_MATCHED_MESSAGE
            i += 20
            continue
        # Raw mode hands out copies of the records; decoding reads them in place in the map.
        data = None
        place: tuple[Any, int] | None
        if raw:
            data = reader.read(phy, size, limit=phy + size)
            if data is not None and int.from_bytes(data[:4], "big") != size and reader.drop_if_renewed(phy):
                # A map of the segment's earlier file (deleted and made again): as below.
                if total_bytes:
                    break
                return collect(cfg, reader, units, head, offset, max_count, max_total_bytes, tags, raw, bounds,
                               expect=expect, queue=queue, on_corrupt=on_corrupt, quarantined=quarantined, replaced=replaced)  # fmt: skip
            place = None if data is None else (data, 0)
            if data is not None and check_crc and wanted is None:  # else decoded (and checked) below
                reason = codec.body_crc_mismatch(data, 0)
                if reason in codec.INTEGRITY_FAILURES:
                    if _total_faults() != reader.faults_seen and (
                        stop := _stop_unread(reader, units, i + 20, offset, found, found_raw, raw_taken, raw, bounds, segment)
                    ):
                        return stop
                    if expect is not None:
                        return None
                    skipped = _skip_corrupt(phy, reason, on_corrupt)
                    i += 20
                    continue
        else:
            place = reader.select(phy, size)
        if place is None:
            unmappable = reader.map_error(phy)
            if unmappable is not None:
                # Present but not mappable now (out of descriptors or memory): "removed" would
                # move a consumer past stored messages (review 52 H1). What was read so far is
                # served, and the next get starts at this unit.
                if total_bytes:
                    break
                return GetResult(status=GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=offset,
                                 min_offset=bounds[0], max_offset=bounds[1], detail=unmappable_detail(phy, unmappable))
            if total_bytes == 0:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
            if reader.within_log(phy):
                # Not retention's (it deletes from the oldest): unsaid, a consumer would commit
                # past these messages unwarned (review 116 L2).
                skipped = hole_detail(phy, segment)
            next_phy_file_start = phy + segment - phy % segment
            i += 20
            continue
        if wanted is not None or not raw:
            buf, pos = place
            try:
                served = _read_in_place(buf, pos, pos + size, max_message_size, check_crc)
            except _Unmapped:
                if total_bytes == 0:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                i += 20
                continue
            if isinstance(served, MessageRecord):
                record: MessageRecord | None = served
            else:
                # Zeros the guard put where a page faulted read as no record: stop before it.
                if _total_faults() != reader.faults_seen and (
                    stop := _stop_unread(reader, units, i + 20, offset, found, found_raw, raw_taken, raw, bounds, segment)
                ):
                    return stop
                if reader.drop_if_renewed(phy):
                    # A map of the segment's earlier file (deleted and made again): read again
                    # from this unit through the file named now.
                    if total_bytes:
                        break
                    return collect(cfg, reader, units, head, offset, max_count, max_total_bytes, tags, raw, bounds,
                                   expect=expect, queue=queue, on_corrupt=on_corrupt, quarantined=quarantined, replaced=replaced)  # fmt: skip
                record = None
                if expect is None and codec.failed_integrity(served):
                    skipped = _skip_corrupt(phy, served.reason, on_corrupt)
                elif queue is not None:
                    # No record where the unit points. Damage is skipped, said; another segment's
                    # bytes there (out of step with this one's records) are a log to put back,
                    # not to pass over (review 144 F2: 237 acknowledged messages were skipped
                    # unsaid, as "no matched message").
                    what = f"no whole record of {size} bytes lies there ({served.kind.value}" + \
                        (f", {served.reason})" if served.reason else ")")  # fmt: skip
                    if another := _another_logs(reader, phy, what, stored_elsewhere=False):
                        return _stop_at_stranger(found, found_raw, raw, offset + i // 20, bounds, another)
                    skipped = _skip_corrupt(phy, what, on_corrupt)
            if expect is not None and (
                record is None
                or record.queue_offset != offset + i // 20
                or record.queue_id != expect[1]
                or record.topic != expect[0]
            ):
                return None
            if queue is not None and record is not None and (
                stranger := _not_own(record, queue, offset + i // 20)
            ):
                # Another queue's record that also says it was stored elsewhere is another
                # log's: stop before it. One field alone disagreeing is damage (a flipped bit
                # must not stop a queue for good, review 145 F1): skipped, said.
                if another := _another_logs(reader, phy, stranger, stored_elsewhere=record.commitlog_offset != phy):
                    return _stop_at_stranger(found, found_raw, raw, offset + i // 20, bounds, another)
                skipped = _skip_corrupt(phy, f"the queue's unit points at another queue's message: {stranger}", on_corrupt)
                record = None
            if record is None or (wanted is not None and record.tags not in wanted[1]):
                if total_bytes == 0:
                    status = GetMessageStatus.NO_MATCHED_MESSAGE
                i += 20
                continue
            found.append(record)
        elif data is not None and (own := expect or queue) and (stranger := _not_own_raw(data, own, offset + i // 20)):
            # Served raw, undecoded: judged by its header as a decoded one is (review 144 F2).
            if expect is not None:
                return None
            if another := _another_logs(reader, phy, stranger, stored_elsewhere=_stored_elsewhere_raw(data, phy)):
                return _stop_at_stranger(found, found_raw, raw, offset + i // 20, bounds, another)
            skipped = _skip_corrupt(phy, stranger, on_corrupt)
            if total_bytes == 0:
                status = GetMessageStatus.NO_MATCHED_MESSAGE
            i += 20
            continue
        if data is not None:
            found_raw.append(data)
            raw_taken.append(phy)
        count += 1
        total_bytes += size
        status = GetMessageStatus.FOUND
        next_phy_file_start = -1
        i += 20
    # A page that faulted in a record that still decoded (its properties' tail zeroed).
    if _total_faults() != reader.faults_seen and (
        stop := _stop_unread(reader, units, i, offset, found, found_raw, raw_taken, raw, bounds, segment)
    ):
        return stop
    return GetResult(
        status=status,
        messages=tuple(found) if not raw else (),
        raw=tuple(found_raw) if raw else (),
        next_begin_offset=offset + i // 20,
        min_offset=bounds[0],
        max_offset=bounds[1],
        detail=skipped,
    )


def _stop_unread(
    reader: CommitLogReader, units: bytes, upto: int, offset: int, found: list[MessageRecord], found_raw: list[bytes],
    raw_taken: list[int], raw: bool, bounds: tuple[int, int], segment: int,
) -> GetResult | None:  # fmt: skip
    """After a fault on one of the reader's maps: the answer that stops before the first of
    `units[:upto]` that may have read the guard's zeros, or None if none lies in a segment
    that faulted. Zeros run from the faulted page to the map's end and a queue's records lie
    in log order, so in such a segment the records taken before the last one are whole; that
    last one (whose tail may lie in the page) and everything after it are not served. Nothing
    left: NO_MATCHED_LOGIC_QUEUE with the offset kept, as for a segment it cannot map."""
    faulted = reader.look_for_faults()
    if not faulted:
        return None
    taken = raw_taken if raw else [record.commitlog_offset for record in found]
    first: dict[int, int] = {}  # faulted segment -> its first unit here
    last_taken: dict[int, int] = {}  # faulted segment -> its last unit taken (raw: that decodes)
    taken_at: list[int] = []
    t = 0
    for j in range(0, min(upto, len(units)), 20):
        phy, size, _ = codec.CQ_UNIT.unpack_from(units, j)
        if size == FILLER_UNIT_SIZE and phy == 0:
            continue
        start = phy - phy % segment
        if t < len(taken) and taken[t] == phy:
            taken_at.append(j)
            t += 1
            if start in faulted and (not raw or isinstance(codec.read_served(found_raw[t - 1], 0), MessageRecord)):
                last_taken[start] = j
        if start in faulted:
            first.setdefault(start, j)
    if not first:
        return None
    cut = min(last_taken.get(start, j) for start, j in first.items())
    phy = codec.CQ_UNIT.unpack_from(units, cut)[0]
    error = faulted[phy - phy % segment]
    kept = sum(1 for j in taken_at if j < cut)
    if not kept:
        return GetResult(status=GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=offset,
                         min_offset=bounds[0], max_offset=bounds[1], detail=unmappable_detail(phy, error))  # fmt: skip
    return GetResult(
        status=GetMessageStatus.FOUND,
        messages=tuple(found[:kept]) if not raw else (),
        raw=tuple(found_raw[:kept]) if raw else (),
        next_begin_offset=offset + cut // 20,
        min_offset=bounds[0],
        max_offset=bounds[1],
        detail=unmappable_detail(phy, error, "served what was read before it, the next read starts there"),
    )


def _transfer_limits(cfg: StoreConfig) -> tuple[int, int, int, int]:
    """isTheBatchFull's limits as decode_units takes them: in-memory bytes and count, on-disk ones."""
    return (cfg.max_transfer_bytes_on_message_in_memory, cfg.max_transfer_count_on_message_in_memory,
            cfg.max_transfer_bytes_on_message_in_disk, cfg.max_transfer_count_on_message_in_disk)  # fmt: skip


def _skip_corrupt(commitlog_offset: int, reason: str, on_corrupt: CorruptSink | None) -> str:
    if on_corrupt is not None:
        on_corrupt(commitlog_offset, reason)
    return corrupt_detail(commitlog_offset, reason)


def max_units(max_count: int) -> int:
    # The scan reads at most max(16000, maxMsgNums * 20) bytes of units (§13.1).
    return max(800, max_count)


def get_from_view(
    view: ReadView,
    readers: ThreadReaders,
    cfg: StoreConfig,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    *,
    max_total_bytes: int | None = None,
    tags: str | None = None,
    raw: bool = False,
    on_corrupt: CorruptSink | None = None,
) -> GetResult | None:
    """getMessage decided by the view and read through the thread's maps; None when the view
    cannot decide (not live, a unit file not mappable, a record not the queue's own)."""
    if not view.queues_live:
        return None
    bounds = view.queue_bounds.get((topic, queue_id))
    early = status_ladder(bounds is not None, *(bounds or (0, 0)), offset)
    if early is not None or bounds is None:
        return early
    queue_reader = readers.queue_reader(view)
    units = queue_reader.read_units(topic, queue_id, offset, min(max_units(max_count), bounds[1] - offset))
    if units is None:
        return None  # the owner decides (OFFSET_FOUND_NULL: the file is gone)
    found = collect(cfg, readers.commitlog_reader(), units, view.queues_written, offset, max_count,
                    max_total_bytes, tags, raw, bounds, expect=(topic, queue_id), on_corrupt=on_corrupt,
                    quarantined=view.quarantined, replaced=view.replaced)  # fmt: skip
    yield_gil()
    return found


def get_from_units(
    reply: UnitsReply,
    readers: ThreadReaders,
    cfg: StoreConfig,
    queue: tuple[str, int],
    offset: int,
    max_count: int,
    *,
    max_total_bytes: int | None = None,
    tags: str | None = None,
    raw: bool = False,
    on_corrupt: CorruptSink | None = None,
    quarantined: Ranges = (),
    replaced: Ranges = (),
) -> GetResult:
    """getMessage decided by the ConsumeQueue actor's answer (`GetUnits`) for `queue`, (topic,
    queueId). Unlike 4.4.0, a record not the queue's own is never served (`collect`)."""
    early = status_ladder(reply.exists, reply.min_offset, reply.max_offset, offset)
    if early is not None:
        return early
    bounds = (reply.min_offset, reply.max_offset)
    if reply.unreadable:
        return GetResult(status=GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=offset,
                         min_offset=bounds[0], max_offset=bounds[1],
                         detail=f"the consume queue file holding offset {offset} could not be "
                                f"{'read' if 'UnreadPageError' in reply.unreadable else 'mapped'} now "
                                f"({reply.unreadable}): nothing was skipped; {retry_hint(reply.unreadable)}")  # fmt: skip
    if reply.units is None:
        return GetResult(status=GetMessageStatus.OFFSET_FOUND_NULL, next_begin_offset=reply.next_file_offset,
                         min_offset=bounds[0], max_offset=bounds[1])  # fmt: skip
    found = collect(cfg, readers.commitlog_reader(), reply.units, reply.commitlog_head, offset, max_count,
                    max_total_bytes, tags, raw, bounds, queue=queue, on_corrupt=on_corrupt, quarantined=quarantined,
                    replaced=replaced)  # fmt: skip
    assert found is not None  # without `expect` every unit is decided
    return found


def bounds_from_view(view: ReadView, topic: str, queue_id: int) -> tuple[int, int] | None:
    """The queue's (min, max) offsets by the view: (0, 0) for a queue that does not exist
    (4.4.0's answer for a queue it would create), None when the view is not live."""
    if not view.queues_live:
        return None
    return view.queue_bounds.get((topic, queue_id), (0, 0))


def unit_store_time(view: ReadView, readers: ThreadReaders, topic: str, queue_id: int, queue_offset: int) -> int | None:
    """getMessageStoreTimeStamp (§13.4) through the thread's maps: the store time of that unit's
    message, -1 if the unit is outside the queue or its message is gone; None when the view
    cannot decide."""
    bounds = bounds_from_view(view, topic, queue_id)
    if bounds is None:
        return None
    if not bounds[0] <= queue_offset < bounds[1]:
        return -1
    units = readers.queue_reader(view).read_units(topic, queue_id, queue_offset, 1)
    if units is None:
        return None
    phy, size, _tags = codec.CQ_UNIT.unpack_from(units, 0)
    return pickup_store_timestamp(readers.commitlog_reader(), phy, size, view.replaced)


def pickup_store_timestamp(reader: CommitLogReader, offset: int, size: int, replaced: Ranges = ()) -> int:
    """`actors.consume_queue.pickup_store_timestamp` through this thread's reader: -1 too when
    the record's page faulted (the guard's zeros read as store time 0), or it lies in a segment
    `replaced` under the store (another file's time, review 146 F3)."""
    if replaced and in_ranges(replaced, offset):
        return -1
    found = _pickup_store_timestamp(reader, offset, size)
    if _total_faults() != reader.faults_seen and reader.unread(offset) is not None:
        return -1
    if found <= 0 and reader.drop_if_renewed(offset):  # a map of the segment's earlier file: zeros
        return _pickup_store_timestamp(reader, offset, size)
    return found


def offset_for_time(view: ReadView, readers: ThreadReaders, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
    """getOffsetInQueueByTime (§9.5) through the thread's maps, as the owner would answer it;
    None when the view cannot decide (the queues are not published, a file went underneath);
    -1 when a record's page it read faulted (its search read zeros for a store time), or it
    read a store time in a segment replaced under the store."""
    bounds = bounds_from_view(view, topic, queue_id)
    if bounds is None:
        return None
    commitlog = readers.commitlog_reader()
    map_failures = commitlog.map_failures
    replaced, read_replaced = view.replaced, []

    def store_time(offset: int, size: int) -> int:
        if replaced and in_ranges(replaced, offset):
            read_replaced.append(offset)  # another file's time there: not an answer (review 146 F3)
        return _pickup_store_timestamp(commitlog, offset, size)

    found = readers.queue_reader(view).offset_by_time(topic, queue_id, bounds, timestamp_ms, store_time, commitlog.min_offset())
    if read_replaced:
        return -1
    if _total_faults() != commitlog.faults_seen and commitlog.look_for_faults():
        return -1
    if commitlog.map_failures != map_failures:  # a segment it had to map could not be, now
        return -1
    return found


# --------------------------------------------------------------------------------------
# queryMessage (§13.2)


IndexHits = Callable[[str, str, int, int, int], "tuple[Sequence[int], int, int]"]


def record_at(
    reader: CommitLogReader,
    offset: int,
    max_message_size: int,
    *,
    check_crc: bool = False,
    on_corrupt: CorruptSink | None = None,
    quarantined: Ranges = (),
) -> MessageRecord | None:
    """The message record at `offset`, decoded in place in the reader's map. Its own
    TOTALSIZE bounds it: within max_message_size and the segment, or None. With `check_crc`,
    None for a record whose body fails its CRC too (told to `on_corrupt`), and always for one
    in a `quarantined` range."""
    if quarantined and in_ranges(quarantined, offset):
        return None
    place = reader.select(offset, 4)
    if place is None:
        return None
    try:
        served = codec.read_served(place[0], place[1], None, max_message_size=max_message_size, check_crc=check_crc)
    except ValueError:
        if getattr(place[0], "closed", False):
            return None  # unmapped under the read (the store closing, the segment removed)
        raise
    # A page that faulted read zeros: None, and `reader.map_error(offset)` says why.
    if _total_faults() != reader.faults_seen and reader.unread(offset) is not None:
        return None
    if isinstance(served, MessageRecord):
        return served
    if reader.drop_if_renewed(offset):  # a map of the segment's earlier file: read the one named now
        return record_at(reader, offset, max_message_size, check_crc=check_crc, on_corrupt=on_corrupt,
                         quarantined=quarantined)  # fmt: skip
    if on_corrupt is not None and codec.failed_integrity(served):
        on_corrupt(offset, served.reason)
    return None


def query_messages(
    hits: IndexHits, reader: CommitLogReader, cfg: StoreConfig, topic: str, key: str, max_count: int, begin_ms: int,
    end_ms: int, on_corrupt: CorruptSink | None = None, quarantined: Ranges = (), walk_budget: int | None = None,
    replaced: Ranges = (),
) -> QueryResult:  # fmt: skip
    """queryMessage's loop (§13.2) over `hits(topic, key, max_num, begin_ms, end_ms)` (the
    commitlog offsets of the key's index hits, the newest file's endTimestamp and endPhyOffset):
    up to 3 rounds, each moving the end time back to the oldest hit's store time. Unlike the
    Java store, which leaves hash collisions to the client, each hit is checked against the
    record's real keys; a walk of `max_count` hits cut short by other keys' is made again with
    `max_msgs_num_batch` (`walk_budget`), the most one query reads."""
    last_query_ms = end_ms
    messages: list[MessageRecord] = []
    last_ts = last_phy = 0
    max_message_size, check_crc = cfg.max_stored_record_bytes, cfg.check_crc_on_read
    unread = skipped = ""

    def corrupt(offset: int, reason: str) -> None:
        nonlocal skipped
        if not skipped and not _another_keys(reader, offset, max_message_size, topic, key, cfg.max_hash_slot_num):
            skipped = corrupt_detail(offset, reason)
        if on_corrupt is not None:
            on_corrupt(offset, reason)

    budget = min(walk_budget or max_count, cfg.max_msgs_num_batch)
    walk_begin, walked = query_walk_begin(begin_ms), 0
    for _ in range(QUERY_ROUNDS_MAX):
        asked_ms = last_query_ms
        offsets, ts, phy_end = hits(topic, key, budget, walk_begin, last_query_ms)
        walked = len(offsets)
        if not offsets:
            break
        last_ts, last_phy = ts, phy_end
        first = True
        for phy in sorted(set(offsets)) if len(offsets) > 1 else offsets:
            if replaced and in_ranges(replaced, phy):
                # Not the log there: another file's record with this key would pass the key check.
                unread = unread or replaced_detail(phy, reader.mapped_file_size).replace(
                    "nothing was skipped, the next read starts here", "the hits there are not in this answer")
                first = False
                continue
            kept = len(messages)
            record = _query_hit(reader, phy, max_message_size, check_crc, corrupt, quarantined, topic, key, messages)
            if record is None:
                if not unread and (unmappable := reader.map_error(phy)) is not None:
                    unread = unmappable_detail(phy, unmappable, "the hits there are not in this answer")
                elif not skipped and quarantined and in_ranges(quarantined, phy):
                    skipped = quarantined_detail(phy)
                elif not skipped and reader.select(phy, 1) is None and reader.within_log(phy):
                    skipped = hole_detail(phy, reader.mapped_file_size)
                first = False
                continue
            if len(messages) == kept and not skipped and (lost := key_lost_reason(record, topic, key, cfg.max_hash_slot_num)):
                skipped = corrupt_detail(phy, lost)
            if first:
                last_query_ms = record.store_timestamp
                first = False
        if messages or last_query_ms < begin_ms or last_query_ms == asked_ms:
            break  # (the same question again would read the same records)
    if _total_faults() != reader.faults_seen and (faulted := reader.look_for_faults()):
        # A record that decoded though its page faulted (its tail zeroed) is not served.
        size = reader.mapped_file_size
        dropped = [m.commitlog_offset for m in messages if m.commitlog_offset - m.commitlog_offset % size in faulted]
        if dropped:
            phy = dropped[0]
            unread = unread or unmappable_detail(phy, faulted[phy - phy % size], "the hits there are not in this answer")
            messages = [m for m in messages if m.commitlog_offset - m.commitlog_offset % size not in faulted]
    messages = settle_query(messages, max_count, begin_ms, end_ms)
    if not (unread or skipped) and _walk_again(walked, budget, len(messages), max_count, cfg.max_msgs_num_batch):
        return query_messages(hits, reader, cfg, topic, key, max_count, begin_ms, end_ms, on_corrupt, quarantined,
                              walk_budget=cfg.max_msgs_num_batch, replaced=replaced)  # fmt: skip
    # (what could not be read first: its hits may be anything)
    if detail := unread or skipped or query_walk_cut_detail(walked, budget, len(messages), max_count):
        return QueryResult(messages=tuple(messages), index_last_update_timestamp=last_ts,
                           index_last_update_phy_offset=last_phy, detail=detail)  # fmt: skip
    return QueryResult.of(tuple(messages), last_ts, last_phy)


def _another_keys(reader: CommitLogReader, offset: int, max_message_size: int, topic: str, key: str,
                  max_hash_slot_num: int) -> bool:  # fmt: skip
    """Whether the corrupt record at `offset` (its body fails its CRC; the header and keys it
    covers not) is another key's of the same hash: not this query's damage to name (review
    100 M3: a corrupt "BB" was named in the answer for "Aa")."""
    record = record_at(reader, offset, max_message_size, check_crc=False)
    return (record is not None and not is_keyed(record, topic, key)
            and key_lost_reason(record, topic, key, max_hash_slot_num) is None)  # fmt: skip


def query_direct(
    walk: tuple[tuple[Any, ...], int, int, int, int], reader: CommitLogReader, cfg: StoreConfig, topic: str, key: str,
    max_count: int, begin_ms: int, end_ms: int,
) -> QueryResult | None:  # fmt: skip
    """`query_messages` over the thread's own index maps (`IndexReader.walk_args`), each round
    one C call (`native.query_keyed`: the index walk, the records' decode and key check). None
    where the C path declines (no extension, a record it does not serve, a map closed under
    it): the caller runs query_messages, the reference, from the start. A store with
    quarantined ranges always takes the reference (the caller's choice)."""
    return _query_direct(walk, reader, cfg, topic, key, max_count, begin_ms, end_ms, None)


def _query_direct(
    walk: tuple[tuple[Any, ...], int, int, int, int], reader: CommitLogReader, cfg: StoreConfig, topic: str, key: str,
    max_count: int, begin_ms: int, end_ms: int, walk_budget: int | None,
) -> QueryResult | None:  # fmt: skip
    native = speedups.native
    if native is None or reader.has_hole:
        return None  # (the reference names the hits in a hole; C skips them as retention's)
    messages: list[MessageRecord] = []
    last_query_ms = end_ms
    last_ts = last_phy = 0
    select, max_message_size, check_crc = reader.select, cfg.max_stored_record_bytes, cfg.check_crc_on_read
    budget, batch = min(walk_budget or max_count, walk[4]), walk[4]
    walk_begin, hits = query_walk_begin(begin_ms), 0
    for _ in range(QUERY_ROUNDS_MAX):
        asked_ms = last_query_ms
        try:
            found = native.query_keyed(walk, topic, key, budget, walk_begin, last_query_ms, select, max_message_size,
                                       MessageRecord, codec.host_from_bytes, check_crc, messages)  # fmt: skip
        except ValueError:
            return None  # an index map closed under the read (the store closing): the reference decides
        if found is None:
            return None
        first_ts, hits, ts, phy_end = found
        if not hits:
            break
        last_ts, last_phy = ts, phy_end
        if first_ts is not None:
            last_query_ms = first_ts
        if messages or last_query_ms < begin_ms or last_query_ms == asked_ms:
            break  # (as query_messages: the same question again would read the same records)
    if _total_faults() != reader.faults_seen and reader.look_for_faults() or reader.has_hole:
        return None  # a record's page faulted (or a hole was found): the reference reads again and names what it cannot
    messages = settle_query(messages, max_count, begin_ms, end_ms)
    if _walk_again(hits, budget, len(messages), max_count, batch):
        return _query_direct(walk, reader, cfg, topic, key, max_count, begin_ms, end_ms, batch)
    if detail := query_walk_cut_detail(hits, budget, len(messages), max_count):
        return QueryResult(messages=tuple(messages), index_last_update_timestamp=last_ts,
                           index_last_update_phy_offset=last_phy, detail=detail)  # fmt: skip
    return QueryResult.of(tuple(messages), last_ts, last_phy)


def _query_hit(
    reader: CommitLogReader, phy: int, max_message_size: int, check_crc: bool, on_corrupt: CorruptSink | None,
    quarantined: Ranges, topic: str, key: str, found: list[MessageRecord],
) -> MessageRecord | None:  # fmt: skip
    """`record_at` for an index hit, the record appended to `found` when it is `topic`'s and
    `key` is its UNIQ_KEY or one of its KEYS (a hash collision is not). The C decoder checks
    the keys as it decodes; what it declines goes through record_at, the reference."""
    native = speedups.native
    if native is not None and not (quarantined and in_ranges(quarantined, phy)):
        place = reader.select(phy, 4)
        if place is None:
            return None
        try:
            decoded: MessageRecord | None = native.decode_keyed(
                place[0], place[1], None, max_message_size, MessageRecord, codec.host_from_bytes, check_crc, topic,
                key, found,
            )  # fmt: skip
        except ValueError:
            if getattr(place[0], "closed", False):
                return None  # unmapped under the read (the store closing, the segment removed)
            raise
        if decoded is not None:
            return decoded
    record = record_at(reader, phy, max_message_size, check_crc=check_crc, on_corrupt=on_corrupt, quarantined=quarantined)
    if record is not None and is_keyed(record, topic, key):
        found.append(record)
    return record
