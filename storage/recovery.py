"""Recovery (spec §11.3-§11.8), one part per owner, run by each owner's actor in `on_start`,
in the supervisor's tree order, on the first start and on every restart alike:

1. the writer, `recover_commitlog`: the last three files are scanned after a clean stop or an
   actor's restart, every file from the checkpoint's on (CRC-checked) after a crash; the
   dirty tail is truncated and zeroed, damage with valid records after it is quarantined;
2. the index actor, `recover_index`: files that are not safe to keep, or that begin past the
   log's new end, are dropped;
3. the ConsumeQueue actor, `recover_consume_queues`: queue files of the wrong length set
   aside, units past the end (after a crash, past the re-dispatch start) truncated, and the
   re-dispatch start decided, counting what the index needs;
4. the writer again, `resume_queue_offsets` (its ResumeQueues step): the topic-queue table
   from the queues' units and the log after them. Puts wait for this step.

`RecoveryMode` says how far the files are trusted: CLEAN after a clean stop, CRASH after the
process died (a power loss may have torn unflushed pages), RESTART when one actor restarts in
a live process. `recover_store` runs the same parts in one thread, for `mqstore recover`,
tools and benchmarks.

One deliberate difference from 4.4.0: abnormal recovery does not dispatch while it scans.
The re-dispatch start goes to the reput actor, which re-dispatches from there through the
idempotent ConsumeQueue and index writers. The log on disk is the same; recovery just does
not hold the store closed while indexes are rebuilt.
"""
from __future__ import annotations

import bisect
import enum
import errno
import os
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

from ..config import StoreConfig
from ..log import get_logger
from . import codec, speedups
from .checkpoint import CheckpointValues, read_checkpoint
from .commitlog import CommitLog, CommitLogReader, ProgressCallback, Quarantined, store_copy_starts, valid_prefix_end
from .consume_queue import FILLER_UNIT_SIZE, ConsumeQueue, cq_file_size, list_consume_queues
from .foreign import refuse_foreign_layout
from .fs import FileSystem, MappedRegion, RealFileSystem, UnreadDuringRecoveryError, free_name
from .mapped_file import DiskFullError
from .lockfiles import StoreDirectoryError
from .index_progress import IndexProgress, first_lost_index_file, load_index_progress, peek_index_progress, write_index_progress
from .queue_ledger import LedgerEntry, load_ledger_file, peek_queue_ledger, write_queue_ledger
from .scan import RecordTally
from .index import (
    DAMAGED_SUFFIX, HASH_SLOT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, IndexFile, IndexHeader, IndexService,
    build_key, index_file_size, key_hash_and_slot, read_index_header,
)  # fmt: skip

__all__ = [
    "CommitLogRecovery", "ConsumeQueueRecovery", "IndexRecovery", "LogFacts", "RecoveryMode", "RecoveryReport",
    "assemble_report", "check_geometry", "continue_queues_past_quarantine", "mode_at_open", "recover_commitlog",
    "recover_consume_queues", "recover_index", "recover_store", "refuse_files_of_a_newer_mqstore", "resume_queue_offsets", "lost_queue_offsets",
]

log = get_logger(__name__)


@dataclass
class RecoveryReport:
    last_exit_ok: bool
    min_offset: int
    max_offset: int  # end of the last valid record: where the next append goes
    dispatch_from: int  # where the reput actor starts
    store_timestamp: int  # of the last valid record (0 if none)
    topic_queue_table: dict[str, int] = field(default_factory=dict)
    checkpoint: CheckpointValues | None = None
    commitlog_files: int = 0
    consume_queues: int = 0
    consume_queue_max_physic_offset: int = -1
    truncated_consume_queues: int = 0
    dropped_index_files: int = 0
    messages_scanned: int = 0
    # What the scan stopped at and what truncation removed (for people: the CLI and the log).
    stop_reason: str = ""  # "end of data", "end of the last file", or the damaged record's reason
    damaged_at: int = -1  # commitlog offset of a damaged record (-1: the log ended cleanly)
    truncated_commitlog_bytes: int = 0  # non-zero bytes zeroed after the new end in its file
    removed_commitlog_files: list[str] = field(default_factory=list)  # later files deleted
    checkpoint_ahead_of_data: bool = False  # its physic timestamp is newer than the last record
    # Index files removed as unsafe (torn or damaged header, not full after a crash), with why.
    dropped_index_reasons: list[str] = field(default_factory=list)
    # Where re-dispatch starts for the index's sake (-1: the index needs none); dispatch_from
    # is lowered to it, so no key of a message before the crash-recovery start file is lost.
    index_dispatch_from: int = -1
    # ConsumeQueue files of the wrong length (cut short), deleted with the files after them;
    # their queues are rebuilt by re-dispatch.
    damaged_consume_queue_files: list[str] = field(default_factory=list)
    # Damaged commitlog bytes with valid records after them: left in place, skipped (not cut).
    quarantined: list[Quarantined] = field(default_factory=list)
    # Commitlog ranges [start, end) lost to a hole that `recover` filled (their records are gone).
    lost_ranges: list[tuple[int, int]] = field(default_factory=list)
    filled_commitlog_files: list[str] = field(default_factory=list)
    # "topic-queueId" -> the next queue offset, for queues whose last records were lost after
    # their queue offsets were handed out: new puts continue there (filler units in between).
    reserved_queue_offsets: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        return {
            "last_exit_ok": self.last_exit_ok,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "dispatch_from": self.dispatch_from,
            "commitlog_files": self.commitlog_files,
            "consume_queues": self.consume_queues,
            "truncated_consume_queues": self.truncated_consume_queues,
            "dropped_index_files": self.dropped_index_files,
            "messages_scanned": self.messages_scanned,
            "stop_reason": self.stop_reason,
            "damaged_at": self.damaged_at,
            "truncated_commitlog_bytes": self.truncated_commitlog_bytes,
            "removed_commitlog_files": list(self.removed_commitlog_files),
            "checkpoint_ahead_of_data": self.checkpoint_ahead_of_data,
            "dropped_index_reasons": list(self.dropped_index_reasons),
            "index_dispatch_from": self.index_dispatch_from,
            "damaged_consume_queue_files": list(self.damaged_consume_queue_files),
            "quarantined": [q._asdict() for q in self.quarantined],
            "lost_ranges": [list(r) for r in self.lost_ranges],
            "filled_commitlog_files": list(self.filled_commitlog_files),
            "reserved_queue_offsets": dict(self.reserved_queue_offsets),
        }


class RecoveryMode(enum.Enum):
    """What the files may hold, which decides how far each owner trusts them."""

    CLEAN = "clean"  # the store was stopped cleanly (no abort marker): every truncation zeroed its tail
    CRASH = "crash"  # the process died: a power loss may have torn pages past the last flush
    RESTART = "restart"  # one actor restarts in a live process: its files are as it left them


def mode_at_open(last_exit_ok: bool) -> RecoveryMode:
    return RecoveryMode.CLEAN if last_exit_ok else RecoveryMode.CRASH


@dataclass(frozen=True, slots=True)
class LogFacts:
    """What the commitlog's owner tells the other owners' recovery."""

    min_offset: int  # the first file's start (0: no files)
    max_offset: int  # end of the last valid record
    has_files: bool
    # Where the crash scan started (`max_offset` when none ran): nothing before it was seen
    # after the crash, so a crash's re-dispatch starts no later.
    scan_start: int
    # Ranges `recover` filled over lost bytes: no unit may point into them.
    lost_ranges: tuple[tuple[int, int], ...] = ()
    # Holes the store opens degraded on (segments missing between files or past the last one
    # below the flushed offset): their records may come back from a backup, so nothing is
    # given up for them yet (no filler holds their queue offsets until `recover`).
    holes: tuple[tuple[int, int], ...] = ()
    # Damaged bytes recovery left in place with valid records after them: no unit for them.
    quarantined: tuple[tuple[int, int], ...] = ()

    @property
    def reach(self) -> int:
        """How far queue units and index entries may point: the log's end, or past it the end
        of the holes a degraded log has (their records may come back whole from a backup, so
        no unit into them is cut)."""
        return max([self.max_offset, *(stop for _, stop in self.holes)])


def log_facts_of(commitlog: CommitLog, end: int, *, scan_start: int, lost_ranges: tuple[tuple[int, int], ...],
                 quarantined: Sequence[tuple[int, int]]) -> LogFacts:
    """The facts of `commitlog` loaded with its wrong-sized segments left out: those count as
    the log's files (a log whose every segment is cut short is damaged, not gone) and as holes."""
    head = commitlog.head_offset()
    there = head >= 0
    holes = commitlog.mapped_file_queue.holes() if there else []
    # A segment the running store found replaced or deleted has its records in its
    # `.store-copy` (only a restarted writer loads a log beside one: an open refuses): they come
    # back when the owner moves the copy over, so nothing is given up for them. Review 142 F2's
    # residue: the restart after such a deleted head wrote filler units over their queue
    # offsets, and the copy moved back served none of the 59.
    loaded = {f.file_from_offset for f in commitlog.mapped_file_queue.mapped_files}
    size = commitlog.mapped_file_queue.mapped_file_size
    for start in store_copy_starts(commitlog.fs, commitlog.store_path):
        if start not in loaded and not any(a <= start < b for a, b in holes):
            holes.append((start, start + size))
    return LogFacts(min_offset=max(head, 0), max_offset=end, has_files=there,
                    scan_start=min(scan_start, end), lost_ranges=lost_ranges,
                    holes=tuple(sorted(holes)),
                    quarantined=tuple(quarantined))  # fmt: skip


@dataclass
class CommitLogRecovery:
    """The writer's recovery of commitlog/ (§11.5, §11.6), for the report and the other owners."""

    facts: LogFacts
    store_timestamp: int
    # Per "topic-queueId", the queue offset after the last record the crash scan saw.
    scanned_next_queue_offsets: dict[str, int]
    messages_scanned: int
    commitlog_files: int
    stop_reason: str
    damaged_at: int
    truncated_commitlog_bytes: int
    removed_commitlog_files: list[str]
    quarantined: list[Quarantined]
    lost_ranges: list[tuple[int, int]]
    filled_commitlog_files: list[str]


@dataclass(frozen=True)
class IndexRecovery:
    """The index actor's recovery of index/ (§10.8)."""

    dropped: int = 0
    reasons: tuple[str, ...] = ()
    dispatch_from: int | None = None  # where re-dispatch must start for the index's sake


@dataclass(frozen=True)
class ConsumeQueueRecovery:
    """The ConsumeQueue actor's recovery of consumequeue/ (§11.3, §11.6, §11.8)."""

    queues: int
    max_physic_offset: int
    truncated: int
    damaged_files: tuple[str, ...]
    dispatch_from: int  # where re-dispatch starts (every owner's needs counted)
    topic_queue_table: dict[str, int]  # from the units: next queue offset per "topic-queueId"
    # The queue ledger as read at this open (empty: none), and the queues it showed missing
    # or cut short, which re-dispatch rebuilds (storage.queue_ledger).
    ledger: dict[tuple[str, int], LedgerEntry] = field(default_factory=dict)
    rebuilt_from_ledger: tuple[tuple[str, int], ...] = ()
    # The next queue offset of each queue whose units, before recovery cut them, or ledger
    # count went further than `topic_queue_table`: no put may be given an offset below it.
    # Re-dispatch gives most of them back (records still in the log); the rest are lost
    # records' offsets, which the queue fills with filler units at its next put.
    reserved: dict[tuple[str, int], int] = field(default_factory=dict)
    # The floors of queues clean_unused_topic removed (storage.queue_ledger.LedgerFile.cleaned):
    # their records below it are not dispatched again.
    cleaned: dict[tuple[str, int], int] = field(default_factory=dict)


def refuse_files_of_a_newer_mqstore(cfg: StoreConfig, fs: FileSystem) -> None:
    """UnknownVersionError (a StoreDirectoryError) naming the queue ledger or index progress
    if a newer mqstore wrote it, before any owner changes a byte (review 62 H2): taken for
    damage, it was set aside and the open went on without it, handing out again the queue
    offsets the ledger reserves. The files stay in place; damaged ones are still set aside by
    the owners' recovery. (The read-only commands ask the same through `store_config`.)"""
    peek_queue_ledger(fs, cfg.queue_ledger_path)
    peek_index_progress(fs, cfg.index_progress_path)


def check_geometry(cfg: StoreConfig, fs: FileSystem, *, repairing: bool = False) -> None:
    """Refuse (OSError) a store whose files were written with other sizes, before any owner
    changes a byte: that is not damage, and nothing may be "repaired" into the new size.
    Refuse (StoreDirectoryError) a commitlog directory without a single segment beside files
    that say the store held messages: see `commitlog_gone`. `repairing` (`mqstore recover`)
    goes on when the only segments are ones a recover without room set aside: it fills them.
    First, ForeignStoreError for a store written with a RocketMQ feature mqstore does not
    implement (storage.foreign): its queues are not damage to cut or rebuild; and
    UnknownVersionError for a store whose own files a newer mqstore wrote: see
    `refuse_files_of_a_newer_mqstore`."""
    refuse_foreign_layout(cfg, fs)
    refuse_files_of_a_newer_mqstore(cfg, fs)
    gone = commitlog_gone(cfg, fs)
    set_aside = _set_aside_segment_starts(cfg, fs) if gone is not None else []
    if gone is not None and set_aside and not repairing:
        raise StoreDirectoryError(
            f"the commitlog directory {cfg.commitlog_dir} holds no segment, only {len(set_aside)} set aside as "
            f"NAME{DAMAGED_SUFFIX} by a `mqstore recover` that found no room to fill them: run `mqstore recover` "
            "again once the disk has room (it fills them from those files)"
        )
    if gone is not None and not set_aside:
        raise StoreDirectoryError(
            f"the commitlog directory {cfg.commitlog_dir} holds no segment, but {gone}: the store held messages, "
            "and opening it would cut every queue to an empty log. Put the commitlog back (a mount not up yet? "
            "store_path_commitlog set as when it was written?), or remove the whole store directory to start over"
        )
    if gone is None:
        foreign = commitlog_not_this_stores(cfg, fs)
        if foreign is not None:
            raise StoreDirectoryError(
                f"the commitlog directory {cfg.commitlog_dir} is not this store's: {foreign}. Opening (or recovering) "
                "it would cut this store's queues and index to another log. Is store_path_commitlog set as when the "
                "store was written?"
            )
    if not fs.exists(cfg.consume_queue_dir):
        return
    other_geometry = _cq_other_geometry(cfg, fs, list_consume_queues(cfg.consume_queue_dir, fs))
    if other_geometry is not None:
        raise OSError(f"cannot load the consume queues in {cfg.consume_queue_dir}: {other_geometry}")


def commitlog_gone(cfg: StoreConfig, fs: FileSystem) -> str | None:
    """What says the store held messages, when its commitlog has no segment at all; else None.
    The cleaner never deletes the newest segment, so a store with none and ConsumeQueue files,
    index files or a flushed message in its checkpoint has lost its whole log, or is looking
    in the wrong place for it (a mount not up, another store_path_commitlog). Opened, every
    queue would be cut back to the empty log and its units given to new puts."""
    if fs.isdir(cfg.commitlog_dir) and any(_is_segment_name(n) for n in fs.listdir(cfg.commitlog_dir)):
        return None
    for topic, queue_id in list_consume_queues(cfg.consume_queue_dir, fs):
        if _cq_segment_names(fs, os.path.join(cfg.consume_queue_dir, topic, str(queue_id))):
            return f"the ConsumeQueue {topic}-{queue_id} has files"
    if fs.isdir(cfg.index_dir) and any(n.isdigit() for n in fs.listdir(cfg.index_dir)):
        return "the index has files"
    if fs.exists(cfg.checkpoint_path):
        try:
            checkpoint = read_checkpoint(fs, cfg.checkpoint_path)
        except (OSError, ValueError, struct.error):
            return None  # recovery reports an unreadable checkpoint
        if checkpoint.physic_msg_timestamp > 0:
            return "the checkpoint says messages were flushed"
    return None


_FOREIGN_SAMPLE_QUEUES = 16
_FOREIGN_SAMPLES_PER_QUEUE = 8
_LOOKS_LIKE_A_LOG_BYTES = 1 << 20
_RECORD_HEAD = struct.Struct(">iiiiiqq")  # TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET
_RECORD_MAGICS = (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2)


def commitlog_not_this_stores(cfg: StoreConfig, fs: FileSystem) -> str | None:
    """Why the commitlog directory holds another log than the one this store's queues were
    written from, or None. Review 45 F2/F3: store_path_commitlog set to another store's log,
    or to one of this store's queue directories, was taken for a damaged log: the open cut
    every queue and dropped index files, and `recover` filled "holes" in the other store.

    Read only, a few small reads. Damage must never pass for another log (review 47 F1: a
    store whose sampled records were damaged was refused for good), so only these count:
    files named as segments none of which holds a record header anywhere in its first MiB (not
    a commitlog at all: a queue directory), or records that are there, whole, exactly where
    this store's files point, and are other records. Garbage, zeros and bytes inside a record
    say nothing.

    First the index (`_index_evidence`, review 48 H2): its entries hold what only this store's
    messages have, each one's key hash and store time (to the second; the headers' first and
    last messages' to the millisecond). One record there that is the message an entry indexed
    vouches for the log; two or more that are other messages, with none that is, refuse it.
    The ConsumeQueue units cannot tell two logs of one shape apart (two brokers fed by one
    producer: same topic, queues and message size put the same queue offsets at the same
    commitlog offsets), so the index decides when it has evidence.

    Without it (no index files, the index disabled, messages without keys, or every sampled
    entry pointing at no whole record: cleaned, zeroed, damaged) the check is as before: up to
    eight units a queue, spread from its oldest to its newest (so one queue's units into a
    smaller log still meet records, review 47 F2); a record there of its own topic, queue,
    queue offset and size vouches for the log, other records with none of its own refuse it.
    That leaves another log of this store's shape accepted when its messages carry no keys."""
    if not fs.isdir(cfg.commitlog_dir):
        return None
    segments: dict[int, str] = {}
    for name in fs.listdir(cfg.commitlog_dir):
        path = os.path.join(cfg.commitlog_dir, name)
        if _is_segment_name(name) and fs.isfile(path):
            segments[int(name)] = path
    if not segments:
        return None
    # Before the queues are looked at: a new store has none, and took another store's queue
    # directory for its log (review 130 F2).
    if not any(_holds_a_record(fs, path, start) for start, path in sorted(segments.items())):
        return (f"none of its {len(segments)} files named as segments holds a commitlog record (is it a directory of "
                "another kind, such as a queue's?)")  # fmt: skip
    queues = list_consume_queues(cfg.consume_queue_dir, fs)
    if not queues:
        return None
    indexed, others = _index_evidence(cfg, fs, segments)
    if indexed:
        return None  # a message this store indexed, where its index says: this store's log
    if others >= _FOREIGN_MIN_INDEX_EVIDENCE:
        return (f"where this store's index files point, {others} other records are, and none of the messages it "
                "indexed (key hash and store time compared)")  # fmt: skip
    starts = sorted(segments)
    foreign = 0
    for topic, queue_id in queues[:_FOREIGN_SAMPLE_QUEUES]:
        for queue_offset, commitlog_offset, size in _sampled_units(
            fs, os.path.join(cfg.consume_queue_dir, topic, str(queue_id)), starts[0]
        ):
            start = max(s for s in starts if s <= commitlog_offset)
            found = _record_at(fs, segments[start], commitlog_offset - start, commitlog_offset, cfg.max_stored_record_bytes)
            if found is None:
                continue  # zeros, damage, or the middle of a record: no evidence either way
            if (found.topic in (None, topic)) and (found.queue_id, found.queue_offset, found.total_size) == (
                queue_id, queue_offset, size
            ):
                return None  # one of its own records: this store's log (damaged elsewhere or not)
            foreign += 1
    if foreign:
        return (f"where this store's queues point, {foreign} other records are, and none of theirs (topic, queue, "
                "queue offset and size compared)")  # fmt: skip
    return None


_INDEX_SAMPLE_FILES = 4
_INDEX_SAMPLES_SPREAD = 8
# Two records, not one: a single record whose key or store time was damaged (a whole header
# around it) is not enough to refuse a store whose other sampled records are all unreadable.
_FOREIGN_MIN_INDEX_EVIDENCE = 2
_INDEX_ENTRY = struct.Struct(">iqii")  # keyHash, phyOffset, timeDiff (s), prevIndex
_JAVA_INT_MAX = 0x7FFFFFFF


def _index_evidence(
    cfg: StoreConfig, fs: FileSystem, segments: Mapping[int, str], *, exhaustive: bool = False
) -> tuple[int, int]:
    """(How many distinct records where index entries point are the messages they indexed,
    how many are other messages), from up to four index files (oldest to newest) and in each
    the entries 1, 2, 4, 8, ... (the log's first messages: a smaller log overlaps those) and
    eight spread to its newest: at most ~35 entries and records a file. Unless `exhaustive`,
    it stops at the first record that agrees (the open of this store's own log reads one).

    An entry's message agrees when one of its keys (`topic#UNIQ_KEY`, `topic#<KEYS token>`)
    hashes to the entry's keyHash and its store time does to the entry's time: the header's
    beginTimestamp to the millisecond for entry 1 (§10.6: set from that message), its
    endTimestamp to the millisecond for the newest entry (unless recovery cut the file back:
    then it is beginTimestamp + timeDiff * 1000, whole seconds after the begin), and for the
    others timeDiff, the whole seconds since beginTimestamp (entry 1's timeDiff counts from
    the previous file's end, so it is not compared). Header and entries are written in one
    store, from these very records, so this store's own intact records always agree; damage,
    zeros, cleaned segments and entries the log never reached (a crash) give no whole record.
    A file whose entry 1 and newest entry are not at its header's begin and end offsets (torn
    by a power loss, damaged, or read with another geometry) is not read further, nor, after
    a crash (the abort file), one that is not full: recovery drops it too (review 50 H1). A
    record counts only if written whole (`_dispatch_fields_at`: body CRC, no NUL where a
    power loss left zeros, a store time): one whose keys a torn sector cut says nothing.

    What still passes: a record at that offset of the same topic with a key of the same hash,
    stored within the same whole second after the file's first message (and, for the header's
    two, in the same millisecond): in practice only a copy of this store's own log (a slave's),
    or two stores fed the same keyed messages in the same order at the same moments."""
    if not fs.isdir(cfg.index_dir):
        return 0, 0
    starts = sorted(segments)
    indexed: set[int] = set()
    others: set[int] = set()
    try:
        crashed = fs.exists(cfg.abort_path)
        names = sorted(n for n in fs.listdir(cfg.index_dir) if n.isdigit())
        if len(names) > _INDEX_SAMPLE_FILES:
            spread = _INDEX_SAMPLE_FILES - 1
            names = [names[(len(names) - 1) * i // spread] for i in range(spread + 1)]
        for name in names:
            path = os.path.join(cfg.index_dir, name)
            geometry = _index_geometry(cfg, fs.getsize(path)) if fs.isfile(path) else None
            if geometry is None:
                continue  # a size no geometry here fits: the open refuses or adopts it by its own check
            max_hash_slot_num, max_index_num = geometry
            entries_pos = INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE
            raw = fs.read_at(path, 0, INDEX_HEADER_SIZE)
            if len(raw) < INDEX_HEADER_SIZE:
                continue
            header = IndexHeader.unpack(raw)
            newest = header.index_count - 1
            if not 1 <= newest < max_index_num:
                continue  # no entry (a fresh file holds 0 or 1), or a damaged count
            if crashed and header.index_count != max_index_num:
                # As recovery drops it (_index_file_unsafe): not full after a crash, its entries'
                # unflushed pages may be torn, and a torn phyOffset points at another of this
                # store's records (review 50 H1).
                continue
            first, last = _index_entry(fs, path, entries_pos, 1), _index_entry(fs, path, entries_pos, newest)
            if first is None or last is None or (first[1], last[1]) != (header.begin_phy_offset, header.end_phy_offset):
                continue  # header and entries disagree (torn by a power loss, damaged, another geometry)
            spread = _INDEX_SAMPLES_SPREAD - 1
            wanted = {1 << i for i in range(newest.bit_length()) if 1 << i <= newest}
            wanted |= {1 + (newest - 1) * i // spread for i in range(spread + 1)}
            for entry_no in sorted(wanted):
                read = _index_entry(fs, path, entries_pos, entry_no)
                if read is None:
                    break
                key_hash, phy_offset, time_diff, prev_index = read
                if not (phy_offset >= starts[0] and time_diff >= 0 and 0 <= prev_index < entry_no) or (
                    key_hash == phy_offset == time_diff == 0
                ):
                    continue  # below the log (cleaned), unwritten or not an entry: no evidence
                start = starts[bisect.bisect_right(starts, phy_offset) - 1]
                fields = _dispatch_fields_at(fs, segments[start], phy_offset - start, phy_offset, cfg.max_stored_record_bytes)
                if fields is None:
                    continue  # zeros, damage, the middle of a record, past the log's end
                if _is_the_indexed_message(fields, key_hash, time_diff, entry_no, newest, header, max_hash_slot_num):
                    indexed.add(phy_offset)
                    if not exhaustive:
                        return len(indexed), len(others - indexed)
                else:
                    others.add(phy_offset)
    except (OSError, ValueError, struct.error):
        pass  # unreadable: the open reports it; what was read counts
    return len(indexed), len(others - indexed)


def _index_entry(fs: FileSystem, path: str, entries_pos: int, entry_no: int) -> tuple[int, int, int, int] | None:
    """(keyHash, phyOffset, timeDiff, prevIndex) of an index file's entry, None past its end."""
    data = fs.read_at(path, entries_pos + entry_no * INDEX_ENTRY_SIZE, INDEX_ENTRY_SIZE)
    if len(data) < INDEX_ENTRY_SIZE:
        return None
    key_hash, phy_offset, time_diff, prev_index = _INDEX_ENTRY.unpack(data)
    return key_hash, phy_offset, time_diff, prev_index


def _index_geometry(cfg: StoreConfig, size: int) -> tuple[int, int] | None:
    """(max_hash_slot_num, max_index_num) of an index file of `size` bytes: the settings', or,
    where they do not fit it, RocketMQ's four entries a slot (a read-only command checks this
    before it adopts the files' geometry); None if neither fits."""
    if size == index_file_size(cfg.max_hash_slot_num, cfg.max_index_num):
        return cfg.max_hash_slot_num, cfg.max_index_num
    per_slot = HASH_SLOT_SIZE + 4 * INDEX_ENTRY_SIZE
    if size > INDEX_HEADER_SIZE and (size - INDEX_HEADER_SIZE) % per_slot == 0:
        slots = (size - INDEX_HEADER_SIZE) // per_slot
        return slots, 4 * slots
    return None


def _is_the_indexed_message(
    fields: codec.DispatchFields, key_hash: int, time_diff: int, entry_no: int, newest: int, header: IndexHeader,
    max_hash_slot_num: int,
) -> bool:  # fmt: skip
    """Whether the record is the message index entry `entry_no` was written for (see
    `_index_evidence`): a key of the hash, and the store time."""
    keys = [fields.uniq_key] if fields.uniq_key is not None else []
    keys += [k for k in (fields.keys or "").split(codec.KEY_SEPARATOR) if k]
    if all(key_hash_and_slot(build_key(fields.topic, k), max_hash_slot_num)[0] != key_hash for k in keys):
        return False
    stored = fields.store_timestamp
    if entry_no == 1:  # the header's beginPhyOffset (checked by the caller)
        return stored == header.begin_timestamp
    if entry_no == newest and (header.end_timestamp - header.begin_timestamp) % 1000:  # its endPhyOffset
        return stored == header.end_timestamp
    begin = header.begin_timestamp
    # §10.6: Java's long division, then clamped to [0, Integer.MAX_VALUE]; 0 without a begin.
    expected = 0 if begin <= 0 or stored < begin else min((stored - begin) // 1000, _JAVA_INT_MAX)
    return time_diff == expected


def _dispatch_fields_at(fs: FileSystem, path: str, pos: int, offset: int, max_record: int) -> codec.DispatchFields | None:
    """What the dispatcher read from the well-formed record at `pos` of the file, whose own
    physical offset is `offset` (topic, keys, store time: what the index was built from), else
    None; records larger than _TOPIC_READ_LIMIT are not read for this (None)."""
    found = _record_bytes_at(fs, path, pos, offset, max_record)
    if found is None or found[1] is None:
        return None  # (too large: not read for this, no evidence)
    data = found[1]
    try:
        kind, _size, fields = codec.read_dispatch(data, 0, len(data), max_message_size=max_record, check_crc=True)
        record = codec.read_record(data, 0, len(data), check_crc=True, read_body=False, max_message_size=max_record).record
    except (ValueError, IndexError, struct.error):
        return None  # bytes no record has: damage
    if kind is not codec.RecordKind.MESSAGE or fields is None or record is None:
        return None
    # Written whole, or no evidence (review 50 H1): a power loss can keep a record's header
    # sectors and lose the ones after it, which read back as zeros in a file the store made:
    # its keys cut or gone would count one of this store's own records as another's. The
    # body CRC covers the body only; no NUL in the topic or the properties, and a store time.
    if "\x00" in record.topic or "\x00" in record.properties_raw or fields.store_timestamp <= 0:
        return None
    return fields


def _holds_a_record(fs: FileSystem, path: str, file_start: int) -> bool:
    """Whether a record header (a message magic code where the record's own physical offset
    says it lies) is in the file's first MiB; an empty (zeroed) file counts as a segment."""
    try:
        data = fs.read_at(path, 0, 64 << 10)
        if _RECORD_HEAD.size <= len(data):
            head = _RECORD_HEAD.unpack_from(data)
            if head[1] in _RECORD_MAGICS and head[6] == file_start:
                return True  # the usual case: a record at the file's start
        data = fs.read_at(path, 0, _LOOKS_LIKE_A_LOG_BYTES)
    except OSError:
        return True  # unreadable: the open reports it; not evidence of another kind of file
    if not any(data):
        return True
    for magic in _RECORD_MAGICS:
        needle = struct.pack(">i", magic)
        at = data.find(needle, 4)
        while at != -1:
            pos = at - 4
            if pos + _RECORD_HEAD.size <= len(data) and _RECORD_HEAD.unpack_from(data, pos)[6] == file_start + pos:
                return True
            at = data.find(needle, at + 1)
    return struct.pack(">i", codec.BLANK_MAGIC_CODE) == data[4:8]


class _SampledRecord(NamedTuple):
    topic: str | None  # None: a record too large to read for this (its header fields compared)
    queue_id: int
    queue_offset: int
    total_size: int


_TOPIC_READ_LIMIT = 256 << 10


def _record_bytes_at(
    fs: FileSystem, path: str, pos: int, offset: int, max_record: int
) -> tuple[tuple[int, ...], bytes | None] | None:
    """(The header fields, the whole record's bytes) of the record at `pos` of the file whose
    header is well formed and names `offset` as its own physical offset, else None; bytes None
    for a record larger than _TOPIC_READ_LIMIT (not read)."""
    try:
        head = fs.read_at(path, pos, _RECORD_HEAD.size)
        if len(head) < _RECORD_HEAD.size:
            return None
        fields = _RECORD_HEAD.unpack(head)
        total, magic, physical = fields[0], fields[1], fields[6]
        if magic not in _RECORD_MAGICS or physical != offset or not _RECORD_HEAD.size < total <= max_record:
            return None
        return fields, (fs.read_at(path, pos, total) if total <= _TOPIC_READ_LIMIT else None)
    except OSError:
        return None


def _record_at(fs: FileSystem, path: str, pos: int, offset: int, max_record: int) -> _SampledRecord | None:
    """The well-formed record at `pos` of the file whose own physical offset is `offset`,
    else None (no CRC check: a damaged body is still its record)."""
    found = _record_bytes_at(fs, path, pos, offset, max_record)
    if found is None:
        return None
    (total, _magic, _crc, queue_id, _flag, queue_offset, _physical), data = found
    if data is None:
        return _SampledRecord(None, queue_id, queue_offset, total)
    read = codec.read_record(data, 0, len(data), check_crc=False, read_body=False, max_message_size=max_record)
    if read.kind is not codec.RecordKind.MESSAGE or read.record is None:
        return None
    return _SampledRecord(read.record.topic, queue_id, queue_offset, total)


def _sampled_units(fs: FileSystem, queue_dir: str, log_start: int) -> list[tuple[int, int, int]]:
    """(queue offset, commitlog offset, size) of up to _FOREIGN_SAMPLES_PER_QUEUE of a queue's
    units, spread from its first file's first unit at or past `log_start` to its newest (filler
    and unwritten units skipped)."""
    try:
        names = _cq_segment_names(fs, queue_dir)
    except OSError:
        return []
    if not names:
        return []
    unit_size = codec.CQ_STORE_UNIT_SIZE

    def unit_at(queue_offset: int) -> tuple[int, int] | None:
        byte = queue_offset * unit_size
        holder = max((int(n) for n in names if int(n) <= byte), default=None)
        if holder is None:
            return None
        data = fs.read_at(os.path.join(queue_dir, "%020d" % holder), byte - holder, unit_size)
        if len(data) < unit_size:
            return None
        commitlog_offset, size, _tags = codec.CQ_UNIT.unpack_from(data)
        return commitlog_offset, size

    def usable(unit: tuple[int, int] | None) -> bool:
        return unit is not None and 0 < unit[1] != FILLER_UNIT_SIZE and unit[0] >= log_start

    try:
        last = names[-1]
        path = os.path.join(queue_dir, last)
        low, high = 0, fs.getsize(path) // unit_size  # its first unwritten unit is in [low, high]
        while low < high:
            middle = (low + high) // 2
            written = unit_at(int(last) // unit_size + middle)
            if written is not None and written != (0, 0):
                low = middle + 1
            else:
                high = middle
        newest = int(last) // unit_size + low - 1
        oldest = int(names[0]) // unit_size
        if newest < oldest:
            return []
        spread = _FOREIGN_SAMPLES_PER_QUEUE - 1
        wanted = sorted({oldest + (newest - oldest) * i // spread for i in range(spread + 1)})
        found = []
        for queue_offset in wanted:
            unit = unit_at(queue_offset)
            if usable(unit):
                assert unit is not None
                found.append((queue_offset, *unit))
        return found
    except OSError:
        return []


def _is_segment_name(name: str) -> bool:
    return len(name) == 20 and name.isdigit()


def _set_aside_segment_starts(cfg: StoreConfig, fs: FileSystem) -> list[int]:
    """Starts of the segments a `mqstore recover` set aside as NAME.damaged to fill them."""
    if not fs.isdir(cfg.commitlog_dir):
        return []
    cut = len(DAMAGED_SUFFIX)
    return sorted(int(n[:-cut]) for n in fs.listdir(cfg.commitlog_dir)
                  if n.endswith(DAMAGED_SUFFIX) and _is_segment_name(n[:-cut]))  # fmt: skip


def recover_commitlog(
    cfg: StoreConfig,
    fs: FileSystem,
    *,
    mode: RecoveryMode,
    checkpoint: CheckpointValues | None,
    clock_ms: Callable[[], int],
    progress: ProgressCallback | None = None,
    repair_holes: bool = False,
    known_end: int = 0,
    readonly_if_denied: bool = False,
    zero_tail: bool = True,
) -> CommitLogRecovery:
    """The commitlog's owner's recovery: after a clean stop or an actor restart, the last
    three files are scanned; after a crash, every file from the checkpoint's on, CRC-checked.
    `known_end`: at an actor's restart, where the log was readable before it (the read view):
    segments below it held data, so one missing or cut short there is a hole, as below the
    checkpoint's flushed offset. `readonly_if_denied` (a restarted writer): segments that may
    not be written (EPERM, EACCES) are read through read-only maps and nothing is zeroed.
    The dirty tail is truncated (zeroed); damage with valid records after it is quarantined.
    With `repair_holes` (only `mqstore recover`: an open never changes damaged data), a
    missing or wrong-sized segment is made whole (see `_fill_commitlog_holes`), and a clean
    store's whole log is scanned for damage, not only its last three files."""
    fs.makedirs(cfg.commitlog_dir)
    commitlog = _InspectingCommitLog(
        fs,
        cfg.commitlog_dir,
        mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
        max_message_size=cfg.max_message_size_bytes,
        clock_ms=clock_ms,
        check_crc_on_recover=cfg.check_crc_on_recover,
    )
    crashed = mode is RecoveryMode.CRASH
    # After a clean stop every truncation had already zeroed what followed the end; after an
    # actor's death only the put it died in can have left bytes there.
    commitlog.zero_tail_bytes = {RecoveryMode.CLEAN: 0, RecoveryMode.CRASH: None,
                                 RecoveryMode.RESTART: 2 * cfg.max_message_size_bytes}[mode]  # fmt: skip
    commitlog.unfinished_put_possible = mode is not RecoveryMode.CLEAN
    if not zero_tail:  # (a dry run: where the log ends does not depend on it)
        commitlog.zero_tail_bytes = 0
    if crashed and (checkpoint is None or checkpoint.physic_msg_timestamp <= 0):
        # A checkpoint that records no flush (missing, zero-filled, short) is no evidence of
        # what was unflushed: trusting nothing after damage cut and zeroed every flushed,
        # acknowledged record after one flipped byte (review 54 H2). Tears and damage are told
        # apart by the bytes instead (see the attribute).
        commitlog.no_flush_evidence = True
    elif crashed and checkpoint is not None:  # damage past the last flush is a torn tail (see the attributes)
        commitlog.trusted_after_damage_before_ms = checkpoint.physic_msg_timestamp
        commitlog.flushed_before_offset = checkpoint.physic_flushed_offset
    try:
        flushed = checkpoint.physic_flushed_offset if checkpoint is not None else None
        if known_end > (flushed or 0):
            flushed = known_end
        if mode is RecoveryMode.RESTART:
            # Zeros below where the log was read, or flushed (the previous writer degraded on a
            # hole there), are a hole; at or past it they end the log (CommitLog._look_past).
            commitlog.read_before_offset = flushed or 0
        partial = _remove_partial_last_segments(cfg, fs, flushed or 0)
        lost, filled = _fill_commitlog_holes(cfg, fs, flushed or 0) if repair_holes else ([], [])
        if not commitlog.load(readonly_if_denied=readonly_if_denied):
            why = f"cannot load the commitlog in {cfg.commitlog_dir}: {commitlog.mapped_file_queue.load_error}"
            cause = commitlog.mapped_file_queue.load_os_error
            # Its errno kept: a shortage (EMFILE, ENOMEM) is retried by the supervisor, not
            # counted as a broken writer (review 90 M3: with none, the store was given up).
            raise OSError(why) if cause is None or cause.errno is None else OSError(cause.errno, why)
        files = commitlog.mapped_file_queue.mapped_files
        commitlog.mapped_file_queue.expected_end = flushed or 0
        missing = commitlog.mapped_file_queue.missing_tail() if files else None
        if commitlog.mapped_file_queue.damaged_files and not repair_holes:
            # Wrong-sized segments: the store opens degraded until `mqstore recover`, and the
            # geometry it read them by may be the damage's guess. A "torn tail" under a wrong
            # size is an intact record: nothing here zeroes a byte (review 32).
            commitlog.zero_tail_bytes = 0
        if missing is not None:
            # Segments below what was flushed are gone (deleted by hand): a hole the writer
            # stays degraded on until `mqstore recover`. Nothing here may change a byte for
            # it, not even zero the last segment's tail after a crash (its END_FILE blank
            # says the data goes on in the missing segment).
            commitlog.zero_tail_bytes = 0
            log.error("commitlog segments missing below the checkpoint's flushed offset; the store opens degraded",
                      missing_from=missing[0], missing_to=missing[1], flushed_offset=flushed)  # fmt: skip
        # What the crash scan keeps of each record (count, first offset, last store time, next
        # queue offset per queue), gathered per run of records in C (storage/scan.py).
        seen = RecordTally()
        if not crashed:
            # A restart scans from where the log was read up to (the last three files on disk
            # may all lie past a hole, out of the log).
            end = commitlog.recover_normally(-1, progress, all_files=repair_holes,
                                             from_offset=known_end if mode is RecoveryMode.RESTART else None)  # fmt: skip
        else:
            min_ts = 0
            bound = None
            if checkpoint is not None:
                index_safe = cfg.message_index_enable and cfg.message_index_safe
                min_ts = checkpoint.min_timestamp_index() if index_safe else checkpoint.min_timestamp()
                bound = checkpoint.recovery_start_bound()
            end = commitlog.recover_abnormally(min_ts, seen, progress, start_no_later_than=bound)
        if not files:
            end = 0
        recovered = CommitLogRecovery(
            facts=log_facts_of(commitlog, end, scan_start=seen.first_offset if seen.count else end,
                               lost_ranges=tuple(lost), quarantined=[(q.start, q.end) for q in commitlog.quarantined]),  # fmt: skip
            store_timestamp=seen.last_store_timestamp or _store_timestamp_before(commitlog, end),
            scanned_next_queue_offsets=dict(seen.next_queue_offsets),
            messages_scanned=seen.count,
            commitlog_files=len(files),
            stop_reason=commitlog.stop_reason,
            damaged_at=commitlog.damaged_at,
            truncated_commitlog_bytes=commitlog.dirty_bytes,
            removed_commitlog_files=commitlog.removed_files + partial,
            quarantined=list(commitlog.quarantined),
            lost_ranges=lost,
            filled_commitlog_files=filled,
        )
        if recovered.damaged_at >= 0 or recovered.truncated_commitlog_bytes or commitlog.removed_files_with_data or partial:
            log.warning("recovery truncated the commitlog", max_offset=end, stop_reason=recovered.stop_reason,
                        damaged_at=recovered.damaged_at, truncated_bytes=recovered.truncated_commitlog_bytes,
                        removed_files=recovered.removed_commitlog_files,
                        removed_files_with_data=commitlog.removed_files_with_data)  # fmt: skip
        elif recovered.removed_commitlog_files:
            # The allocator's next segment, created ahead and never written: nothing was lost,
            # and a warning on every open after a crash would teach operators to ignore it.
            log.info("recovery removed unwritten commitlog segments past the end", max_offset=end,
                     removed_files=recovered.removed_commitlog_files)  # fmt: skip
        commitlog.flush(0)
        short_end = commitlog.mapped_file_queue.records_end_below_expected
    finally:
        commitlog.shutdown()
    if repair_holes and short_end is not None:
        # The records end below what was flushed, inside a whole segment (an older copy of it
        # put in its place): `recover` accepts the loss. The segment is ended there with the
        # blank record that ends a segment, so the log goes on in the next one (or past it)
        # and no lost record's offset is ever given to a new one; then recovery runs again.
        # After a clean stop every put had finished and was flushed: a record there that does
        # not read (a flipped byte: CRC, magic, size) is damage, not a torn tail, and is
        # reported as damage (quarantined: exit 3), not as the "end of data" the blank makes
        # of it for the second pass (review 63 F3). A crash's tail is judged as before.
        damage = recovered.stop_reason if mode is RecoveryMode.CLEAN and recovered.damaged_at == short_end else None
        lost_range, done, kept = _end_segment_at(cfg, fs, short_end)
        again = recover_commitlog(cfg, fs, mode=mode, checkpoint=checkpoint, clock_ms=clock_ms, progress=progress,
                                  repair_holes=True, known_end=known_end)  # fmt: skip
        again.lost_ranges[:0] = [lost_range]
        again.filled_commitlog_files[:0] = [done]
        again.facts = replace(again.facts, lost_ranges=tuple(again.lost_ranges))
        if damage is not None:
            log.error("a damaged record after a clean stop: the segment was ended before it; its bytes are kept",
                      offset=short_end, reason=damage, kept=kept)  # fmt: skip
            again.stop_reason, again.damaged_at = damage, short_end
            again.quarantined.append(Quarantined(short_end, lost_range[1], f"{damage} (after a clean stop: damage, "
                                                 f"not a torn tail; the segment as it was is kept as {kept})"))  # fmt: skip
        return again
    return recovered


def _end_segment_at(cfg: StoreConfig, fs: FileSystem, offset: int) -> tuple[tuple[int, int], str, str]:
    """Write the blank record that ends a segment at `offset` (for `mqstore recover`): the
    segment's bytes from there are given up. What the blank writes over is kept first, as
    every repair keeps what it replaces: the segment as it is goes to a new NAME.damaged
    beside it, written and synced before the overwrite (review 63 F3: one flipped byte in a
    clean store's last record had its header overwritten in place, with no copy). Returns the
    lost range, what was done, and the copy's name."""
    size = cfg.mapped_file_size_commitlog_bytes
    start = offset - offset % size
    keep = offset - start
    name = codec.segment_file_name(start)
    path = os.path.join(cfg.commitlog_dir, name)
    region = fs.map_file(path, size, create=False)
    try:
        kept = _save_segment_copy(fs, region, path, size)
        # (`unwritten_from`: the segment's records below `keep` are left as they are.)
        if not region.reserve(keep + codec.END_FILE_MIN_BLANK_LENGTH, unwritten_from=keep):
            raise DiskFullError(f"no disk space to end the commitlog segment {name} at {offset}")
        region.buf[keep : keep + codec.END_FILE_MIN_BLANK_LENGTH] = codec.blank_record_header(size - keep)
        region.flush()
    finally:
        region.close()
    log.error("commitlog segment ended where its records end below the flushed offset; the rest is lost",
              file=name, lost_from=offset, lost_to=start + size, kept=kept)  # fmt: skip
    return (offset, start + size), (f"{name}: its records end at {offset}, below where the log was flushed: "
                                    f"ended there, {offset}..{start + size} lost; the segment as it was is kept "
                                    f"as {os.path.basename(kept)}"), os.path.basename(kept)  # fmt: skip


def _save_segment_copy(fs: FileSystem, region: MappedRegion, path: str, size: int) -> str:
    """A copy of the mapped segment at `path` in a new file NAME.damaged (NAME.damaged.N if
    taken; never over another file), durable before it returns: its bytes up to the end of
    its data (the untouched rest of a sparse segment is a hole, as in the copy). A copy that
    could not be finished is removed and the error raised: nothing is overwritten then."""
    try:
        extents = fs.data_extents(path, 0, size)
    except OSError:
        extents = [(0, size)]
    length = extents[-1][1] if extents else 0
    kept = free_name(fs.exists, path + DAMAGED_SUFFIX)
    try:
        region.save_copy(kept, length)
        if region.cut_short():  # the copy holds the guard's zeros where the segment's bytes are
            raise UnreadDuringRecoveryError(path)
    except FileExistsError:
        raise  # (O_EXCL) a file that took the name meanwhile is not ours to remove
    except BaseException as exc:
        if fs.exists(kept):
            fs.remove(kept)
        if isinstance(exc, OSError) and exc.errno == errno.EFAULT:
            # write(2) from the map met a page that could not be read: not damage (review 67 F6)
            raise UnreadDuringRecoveryError(path) from exc
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no disk space to keep a copy of the commitlog segment {path} before ending it: "
                                "nothing was changed; free space and run `mqstore recover` again") from exc  # fmt: skip
        raise
    return kept


def recover_index(
    cfg: StoreConfig,
    fs: FileSystem,
    *,
    mode: RecoveryMode,
    checkpoint: CheckpointValues | None,
    log_facts: LogFacts,
    clock_ms: Callable[[], int],
) -> IndexRecovery:
    """The index's owner's recovery (see `_recover_index`): after a crash it may need an
    earlier re-dispatch than the crash scan's start (the messageIndexSafe rule, always on)."""
    fs.makedirs(cfg.index_dir)
    if not cfg.message_index_enable and mode is RecoveryMode.RESTART:
        return IndexRecovery(dropped=0, reasons=(), dispatch_from=None)
    # A restart in a live process leaves the progress alone (it is older than the files).
    dropped, reasons, index_from = _recover_index(cfg, fs, clock_ms, mode is not RecoveryMode.CRASH, checkpoint,
                                                  log_facts.max_offset, log_facts.min_offset, log_facts.reach,
                                                  use_progress=mode is not RecoveryMode.RESTART)  # fmt: skip
    if not log_facts.has_files or not cfg.message_index_enable:
        index_from = None  # disabled: what the files lack is in the progress, for later
    return IndexRecovery(dropped=dropped, reasons=tuple(reasons), dispatch_from=index_from)


def recover_consume_queues(
    cfg: StoreConfig,
    fs: FileSystem,
    *,
    mode: RecoveryMode,
    log_facts: LogFacts,
    index_dispatch_from: int | None,
    clock_ms: Callable[[], int],
    written_before: int | None = None,
    progress: Callable[[], None] = lambda: None,
) -> ConsumeQueueRecovery:
    """The ConsumeQueues' owner's recovery: queue files of the wrong length set aside, each
    queue's valid units found, units past the log's end (after a crash: past the re-dispatch
    start) truncated, min offsets corrected, and where re-dispatch starts decided.
    `written_before` (a restart in a live process): the offset below which the owner before
    wrote every unit into maps that did not fault; re-dispatch starts no later. `progress` is
    called once a queue (the owner's start is waited for while it moves)."""
    fs.makedirs(cfg.consume_queue_dir)
    end = log_facts.max_offset
    min_offset = log_facts.min_offset
    queues: list[ConsumeQueue] = []
    try:
        max_cq = -1
        damaged_cq_files: list[str] = []
        damaged_queues: list[ConsumeQueue] = []
        for topic, queue_id in list_consume_queues(cfg.consume_queue_dir, fs):
            progress()
            cut_short = _cut_cq_files_at_damage(cfg, fs, topic, queue_id)
            damaged_cq_files.extend(cut_short)
            cq = _loaded_queue(cfg, fs, topic, queue_id, clock_ms)
            cq.recover()
            cq.unmap_files()  # mapped again where a later step reads it: one queue's at a time
            queues.append(cq)
            if cut_short:
                damaged_queues.append(cq)
            elif cq.torn_at is not None:
                # Its last unit half written (or damaged): the unit went with the cut, and with
                # the queues' highest unit another queue's, its record was never dispatched
                # again; the next put took its queue offset (review 120 F2, a broker's store,
                # which has no ledger to tell).
                damaged_queues.append(cq)
                log.warning("a consume queue ended in a torn unit; re-dispatch rebuilds it from its last whole unit",
                            topic=topic, queue_id=queue_id, cut_at=cq.torn_at)  # fmt: skip
            elif not cq.mapped_file_queue.mapped_files:
                # Its directory is there, its files are gone (deleted by hand, or never
                # written): rebuilt from the log like a queue that lost files. Left empty, its
                # queue offsets would start again at 0 and the next put would claim one that a
                # record in the log holds.
                damaged_queues.append(cq)
                log.warning("a consume queue has no files; re-dispatch rebuilds it", topic=topic, queue_id=queue_id)
            max_cq = max(max_cq, cq.max_physic_offset)
        ledger_file = load_ledger_file(fs, cfg.queue_ledger_path)
        ledger = ledger_file.queues if ledger_file is not None else {}
        # A floor is where dispatch had reached at the clean, which may be past what reached the
        # disk: after a power loss the log ends below it, and the records put there since are
        # new ones, none the removed queue's (review 117 F1: dropped as below the floor, six
        # acknowledged puts were never served).
        # Not below the log's reach, though: a hole (segments away, the store degraded) is no
        # end, and a floor lowered to it stayed lowered once they were back (review 118 F3: the
        # removed queue's old records served where puts after the clean were acknowledged).
        cleaned = {key: min(below, log_facts.reach)
                   for key, below in (ledger_file.cleaned if ledger_file is not None else {}).items()}  # fmt: skip
        rebuilt = _queues_behind_ledger(cfg, fs, ledger, queues, damaged_queues, clock_ms)
        for cq in rebuilt:
            max_cq = max(max_cq, cq.max_physic_offset)
        # Before any unit is cut: the queue offsets of records past the log's end (or in lost
        # ranges) go into the ledger, so no later open or `recover` gives them again.
        handed_out = _offsets_of_lost_records(queues, log_facts.reach, log_facts.lost_ranges)
        ledger = _ledger_with_high_water(cfg, fs, ledger, handed_out, queues, cleaned)

        if mode is RecoveryMode.CRASH:
            dispatch_from = log_facts.scan_start
        else:
            dispatch_from = end
            if 0 <= max_cq < end:
                # The queues stop short of the log (dispatch was behind when an actor died, or
                # `recover` cut them at a filled hole): re-dispatch from their last unit (the
                # writers skip what they hold).
                dispatch_from = max_cq
            if written_before is not None and max_cq >= 0:
                # Units that went into a faulted map are not in a file that kept its length,
                # and max_cq may be another queue's (review 70 H3: filler units were written
                # over them, and a restarted writer gave their queue offsets out again, H2).
                dispatch_from = min(dispatch_from, max(written_before, min_offset))
        if max_cq < 0 and log_facts.has_files:
            # No queue at all beside a log (a broker's commitlog copied alone, or the
            # consumequeue dir deleted, after a crash too): rebuild them from the start.
            dispatch_from = min_offset
        if not log_facts.has_files:
            dispatch_from = 0
        dispatch_from = min(dispatch_from, end)
        if log_facts.lost_ranges:
            # Units that point into lost bytes go; re-dispatch from the first loss rebuilds the
            # queues for every readable record after it (the queue offsets of lost records
            # become filler units). Index entries into lost bytes stay: a query checks the
            # record an entry points at, and the index is append-only.
            first_lost = min(start for start, _ in log_facts.lost_ranges)
            dispatch_from = min(dispatch_from, first_lost)
            for cq in _one_mapped_at_a_time(queues):
                cq.truncate_dirty_logic_files(first_lost)
        # A queue that lost files is rebuilt from the record after its last unit left.
        for cq in _one_mapped_at_a_time(damaged_queues):
            last = cq.last_real_unit()
            resume = last[0] + last[1] if last is not None else min_offset
            dispatch_from = min(dispatch_from, max(resume, min_offset))
            log.warning("re-dispatch rebuilds a consume queue that lost units", topic=cq.topic, queue_id=cq.queue_id,
                        files_cut_short=damaged_cq_files, dispatch_from=dispatch_from)  # fmt: skip
        # §11.6 step 1: no log at all means no queue can be right.
        if not log_facts.has_files:
            for cq in queues:
                cq.destroy()
            queues = []
        elif index_dispatch_from is not None and index_dispatch_from < dispatch_from:
            dispatch_from = index_dispatch_from
            log.warning("re-dispatching from the index's last safe point", index_dispatch_from=index_dispatch_from)
        # ConsumeQueues are derived data: after a crash no unit at or past the re-dispatch
        # start is trusted. A power loss writes pages back in any order, so a queue can hold
        # later units while earlier ones (a whole file, or a torn sector of one) never reached
        # the disk, and the duplicate guard would then skip the missing ones forever. Removing
        # them lets re-dispatch write every one again, in order. Units below the start were
        # flushed before the checkpoint that chose it was written.
        # A degraded log's holes keep their units (review 32 P1: a copy with every segment cut
        # short lost every unit, and the segments put back whole were then unreachable). Not
        # after a crash: the units a power loss may have torn are cut whatever lies after them
        # (review 34 F1), and re-dispatch, which stops at a hole (reput), rebuilds them up to
        # it; the close is then unclean, so the open after the segments are back goes on.
        # Units past the start that are exactly what dispatch writes for the record they point
        # at stay (the queue is cut at its first that is not): that is what re-dispatch would
        # write, and on a full disk it could write nothing (review 46 M4).
        crashed = mode is RecoveryMode.CRASH
        cut = dispatch_from if crashed else log_facts.reach
        truncated = kept = 0
        with _UnitChecker(cfg, fs, end, log_facts.quarantined) as checker:
            for cq in _one_mapped_at_a_time(queues):
                if not crashed and cq.max_physic_offset < cut:
                    continue  # (after a crash units may lie past a torn one `recover()` stopped at)
                before = cq.get_max_offset_in_queue()
                if crashed:
                    kept += cq.keep_units_matching(cut, checker.for_queue(cq.topic, cq.queue_id))
                else:
                    cq.truncate_dirty_logic_files(cut)
                if cq.get_max_offset_in_queue() != before:
                    truncated += 1
        if truncated or kept:
            log.info("consume queues truncated for re-dispatch", truncated=truncated, before_commitlog_offset=cut,
                     units_kept_that_match_the_log=kept)  # fmt: skip
        table: dict[str, int] = {}
        for cq in _one_mapped_at_a_time(queues):
            table[f"{cq.topic}-{cq.queue_id}"] = cq.get_max_offset_in_queue()
            if log_facts.has_files:
                cq.correct_min_offset(min_offset)
        # Queue offsets handed out before stay taken (see `reserved`); re-dispatch gives most
        # of them back their units, and the others' records were lost.
        reserved = {
            (topic, queue_id): entry.next_offset
            for (topic, queue_id), entry in sorted(ledger.items())
            if entry.next_offset > table.get(f"{topic}-{queue_id}", 0)
        }
        for cq in queues:
            cq.flush(0)
        return ConsumeQueueRecovery(queues=len(queues), max_physic_offset=max_cq, truncated=truncated,
                                    damaged_files=tuple(damaged_cq_files), dispatch_from=dispatch_from,
                                    topic_queue_table=table, ledger=ledger, reserved=reserved, cleaned=cleaned,
                                    rebuilt_from_ledger=tuple((cq.topic, cq.queue_id) for cq in rebuilt))  # fmt: skip
    finally:
        for cq in queues:
            cq.mapped_file_queue.shutdown(0)


class _UnitChecker:
    """Whether a ConsumeQueue unit is the one dispatch writes for the record it points at:
    the record below the log's `end` and clear of `quarantined` bytes, read as the reput
    actor reads it (its topic, queue id, queue offset, own physical offset, size and tags
    code), and of a kind that gets a unit. A unit pointing at a record of a feature mqstore does
    not implement (multi-dispatch, batch) raises ForeignStoreError where the record is decoded:
    it is not a torn unit, and cutting it would delete another broker's queue (review 61 H1). A
    unit whose tags code reads as a ConsumeQueueExt address is not evidence of one (one flipped
    bit makes it so, review 64 F2): a store written with the ext files is refused at the open by
    its consumequeue_ext/ directory, and without them the unit is cut and rebuilt from the log."""

    def __init__(self, cfg: StoreConfig, fs: FileSystem, end: int, quarantined: Sequence[tuple[int, int]]) -> None:
        self._cfg = cfg
        self._fs = fs
        self._end = end
        self._quarantined = sorted(quarantined)
        self._max_size = cfg.max_stored_record_bytes
        self._delay_levels = codec.parse_delay_levels(cfg.message_delay_level)
        self._reader: CommitLogReader | None = None

    def __enter__(self) -> _UnitChecker:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._reader is not None:
            self._reader.close()

    def for_queue(self, topic: str, queue_id: int) -> Callable[[int, int, int, int], bool]:
        def matches(offset: int, size: int, tags: int, queue_offset: int) -> bool:
            if offset + size > self._end or (self._quarantined and self._in_quarantine(offset, offset + size)):
                return False
            if self._reader is None:
                cfg = self._cfg
                self._reader = CommitLogReader(self._fs, cfg.commitlog_dir, mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
                                               max_message_size=cfg.max_message_size_bytes, limit=self._end)  # fmt: skip
            found = self._reader.select(offset, size)
            fields = self._decode(*found, size) if found is not None else None
            tran = fields.sys_flag & codec.TRANSACTION_MASK if fields is not None else 0
            if fields is not None and (
                fields.msg_size == size and fields.commitlog_offset == offset and fields.topic == topic
                and fields.queue_id == queue_id and fields.consume_queue_offset == queue_offset
                and fields.tags_code == tags
                and tran != codec.TRANSACTION_PREPARED_TYPE and tran != codec.TRANSACTION_ROLLBACK_TYPE
            ):  # fmt: skip
                return True
            # A record that read as the guard's zeros is not one the unit does not match: the
            # queue is not cut there (review 67 F3).
            unread = self._reader.unread(offset)  # (one compare while no map faulted)
            if unread is not None:
                raise UnreadDuringRecoveryError(str(unread.filename))
            if found is None and (cannot := self._reader.map_error(offset)) is not None:
                # Nor is a segment this process cannot map now (short of descriptors, memory or
                # maps): refused with its errno (a restart retries it as a shortage), the queue
                # not cut on no evidence (review 92: its units were cut, to be re-dispatched).
                raise OSError(getattr(cannot, "errno", None) or errno.EIO,
                              f"recovery could not map the commitlog segment holding offset {offset} to check a "
                              f"consume queue unit of {topic}/{queue_id}: {cannot}; nothing was cut")  # fmt: skip
            return False

        return matches

    def _decode(self, buf: Any, pos: int, size: int) -> codec.DispatchFields | None:
        max_size = self._max_size
        if speedups.native is not None:  # the reput actor's own C decoder (a crash's checks were half its open)
            decoded, _pos = speedups.native.dispatch_scan(buf, pos, pos + size, 1, max_size, codec.DispatchFields,
                                                          codec.SCHEDULE_TOPIC_UTF8)  # fmt: skip
            if decoded:
                fields: codec.DispatchFields = decoded[0]
                return fields
        try:
            kind, _total, found = codec.read_dispatch(buf, pos, pos + size, max_size, self._delay_levels)
        except (ValueError, IndexError, struct.error):
            return None
        return found if kind is codec.RecordKind.MESSAGE else None

    def _in_quarantine(self, start: int, stop: int) -> bool:
        ranges = self._quarantined
        i = bisect.bisect_right(ranges, (start, start))  # the first range starting after `start`...
        if i and ranges[i - 1][1] > start:  # ...and the one before it, which may reach past it
            return True
        return i < len(ranges) and ranges[i][0] < stop


def resume_queue_offsets(
    commitlog: CommitLog,
    recovered: CommitLogRecovery,
    queue_table: dict[str, int],
    dispatch_from: int,
    quarantined: Sequence[Quarantined],
    *,
    cleaned: Mapping[tuple[str, int], int] | None = None,
) -> dict[str, int]:
    """The writer's topic-queue table (§11.8): the queues' own offsets (`queue_table`, from
    the ConsumeQueue owner), raised past every record the queues have not caught up with yet
    (re-dispatch brings their units; the writer must continue after them, not reuse them) and
    past the readable headers of `quarantined` records. The crash scan's tally covers what it
    saw; only a start below it is walked again (in C runs). The ledger's count in `queue_table`
    is a floor only (offsets handed out), never where the log's records of the queue end: a
    writer that keeps no ledger (an older mqstore, a broker) may have put past it, so a queue
    rebuilt from the log relies on this walk (from the first segment left: review 62 H1).
    A queue `clean_unused_topic` removed (`cleaned`: its floor) counts only its records at or
    past the floor: its older ones are the removed queue's, and a put after the clean was
    given its offsets anew from 0 (review 114 F1: the next put took offset 10 after NEW-A-0 at 0)."""
    table = dict(queue_table)
    facts = recovered.facts
    end = facts.max_offset
    for key, next_offset in recovered.scanned_next_queue_offsets.items():
        table[key] = max(table.get(key, 0), next_offset)
    scanned_from = facts.scan_start if recovered.messages_scanned else end
    stop = min(scanned_from, end)
    if dispatch_from < stop:
        for key, next_offset in commitlog.next_queue_offsets(dispatch_from, stop).items():
            table[key] = max(table.get(key, 0), next_offset)
    if cleaned:
        for key, next_offset in _next_offsets_past_floors(commitlog, cleaned, end).items():
            table[key] = max(queue_table.get(key, 0), next_offset)
    lost_bytes = sum(stop_ - start for start, stop_ in facts.lost_ranges)
    continue_queues_past_quarantine(commitlog, quarantined, table, slack_bytes=lost_bytes)
    return table


def _next_offsets_past_floors(commitlog: CommitLog, cleaned: Mapping[tuple[str, int], int], end: int) -> dict[str, int]:
    """Per cleaned queue ("topic-queueId"), the queue offset after its last record at or past
    its floor (0: none): one walk of the log from the lowest floor, in stretches between floors."""
    floors = sorted(set(cleaned.values()))
    found = {f"{topic}-{queue_id}": 0 for topic, queue_id in cleaned}
    for i, start in enumerate(floors):
        stop = floors[i + 1] if i + 1 < len(floors) else end
        if start >= stop:
            continue
        stretch = commitlog.next_queue_offsets(start, stop)
        for (topic, queue_id), below in cleaned.items():
            key = f"{topic}-{queue_id}"
            if below <= start and key in stretch:
                found[key] = max(found[key], stretch[key])
    return found


def warn_if_made_for_another_owner(cfg: StoreConfig, fs: FileSystem) -> None:
    """Warn when this process is not the store directory's owner (root running `mqstore recover`
    on a store a service user runs): the files it makes (a rebuilt index file, CQ files, the
    ledger) are this process's, and the service's open then refuses them (EACCES; review 65
    F4). Said, not chowned: a warning cannot leave a file half-owned, and the operator knows
    which user the service runs as better than the directory's owner does."""
    if not isinstance(fs, RealFileSystem):
        return
    try:
        owner = os.stat(cfg.root_dir).st_uid
    except OSError:
        return
    if owner != os.geteuid():
        log.warning("files made now will be owned by this user, not the store directory's owner, who may then be "
                    "unable to open them", uid=os.geteuid(), store_owner_uid=owner, store=cfg.root_dir,
                    fix=f"chown -R {owner} {cfg.root_dir} before the store opens again")  # fmt: skip


def recover_store(
    cfg: StoreConfig,
    fs: FileSystem,
    *,
    last_exit_ok: bool,
    clock_ms: Callable[[], int],
    progress: ProgressCallback | None = None,
    repair_holes: bool = False,
) -> RecoveryReport:
    """Every owner's recovery in the order a start runs them (the store's actors each run
    their own part in `on_start`; this runs them all in one thread, for `mqstore recover`,
    tools and benchmarks), then the closed store's report."""
    warn_if_made_for_another_owner(cfg, fs)
    for path in (cfg.commitlog_dir, cfg.consume_queue_dir, cfg.index_dir):
        fs.makedirs(path)
    check_geometry(cfg, fs, repairing=repair_holes)
    mode = mode_at_open(last_exit_ok)
    checkpoint = read_checkpoint(fs, cfg.checkpoint_path) if fs.exists(cfg.checkpoint_path) else None
    recovered = recover_commitlog(cfg, fs, mode=mode, checkpoint=checkpoint, clock_ms=clock_ms, progress=progress,
                                  repair_holes=repair_holes)  # fmt: skip
    index = recover_index(cfg, fs, mode=mode, checkpoint=checkpoint, log_facts=recovered.facts, clock_ms=clock_ms)
    queues = recover_consume_queues(cfg, fs, mode=mode, log_facts=recovered.facts,
                                    index_dispatch_from=index.dispatch_from, clock_ms=clock_ms)  # fmt: skip
    commitlog = CommitLog(fs, cfg.commitlog_dir, mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
                          max_message_size=cfg.max_message_size_bytes, clock_ms=clock_ms)  # fmt: skip
    # The guards the writer's own commitlog gets (actors/commitlog_writer): an end below the
    # checkpoint's flushed offset is a hole, never a tail to cut, and nothing is zeroed on a
    # degraded log or after a clean stop. Without them this pass zeroed a clean store's
    # damaged last record that the first pass had kept (review 63 F3).
    flushed = checkpoint.physic_flushed_offset if checkpoint is not None else None
    commitlog.mapped_file_queue.expected_end = flushed or 0
    try:
        if not commitlog.load():
            raise OSError(f"cannot load the commitlog in {cfg.commitlog_dir}: {commitlog.mapped_file_queue.load_error}")
        if commitlog.mapped_file_queue.damaged_files or mode is RecoveryMode.CLEAN:
            commitlog.zero_tail_bytes = 0
        commitlog.recover_tail(recovered.facts.max_offset, {}, check_crc=False)  # positions at the end
        table = resume_queue_offsets(commitlog, recovered, queues.topic_queue_table, queues.dispatch_from,
                                     recovered.quarantined)  # fmt: skip
    finally:
        commitlog.shutdown()
    lost = lost_queue_offsets(queues.reserved, table)
    table.update(lost)
    report = assemble_report(mode, checkpoint, recovered, index, queues, table, lost)
    log.info("recovery done", **report.summary())
    return report


def lost_queue_offsets(reserved: Mapping[tuple[str, int], int], next_offsets: Mapping[str, int]) -> dict[str, int]:
    """Of `reserved`, the queues whose offsets go past `next_offsets` (what their units and
    the records still in the log give them): records lost after their queue offsets were
    handed out. "topic-queueId" -> the next queue offset."""
    return {
        name: offset
        for (topic, queue_id), offset in sorted(reserved.items())
        if offset > next_offsets.get(name := f"{topic}-{queue_id}", 0)
    }


def assemble_report(
    mode: RecoveryMode,
    checkpoint: CheckpointValues | None,
    recovered: CommitLogRecovery,
    index: IndexRecovery,
    queues: ConsumeQueueRecovery,
    topic_queue_table: dict[str, int],
    lost_offsets: dict[str, int],
) -> RecoveryReport:
    """The owners' parts of one open's recovery, as one report (the log, the CLI, tests)."""
    facts = recovered.facts
    report = RecoveryReport(
        last_exit_ok=mode is not RecoveryMode.CRASH,
        min_offset=facts.min_offset,
        max_offset=facts.max_offset,
        dispatch_from=queues.dispatch_from,
        store_timestamp=recovered.store_timestamp,
        topic_queue_table=dict(topic_queue_table),
        checkpoint=checkpoint,
        commitlog_files=recovered.commitlog_files,
        consume_queues=queues.queues,
        consume_queue_max_physic_offset=queues.max_physic_offset,
        truncated_consume_queues=queues.truncated,
        dropped_index_files=index.dropped,
        messages_scanned=recovered.messages_scanned,
        stop_reason=recovered.stop_reason,
        damaged_at=recovered.damaged_at,
        truncated_commitlog_bytes=recovered.truncated_commitlog_bytes,
        removed_commitlog_files=list(recovered.removed_commitlog_files),
        dropped_index_reasons=list(index.reasons),
        damaged_consume_queue_files=list(queues.damaged_files),
        quarantined=list(recovered.quarantined),
        lost_ranges=list(recovered.lost_ranges),
        filled_commitlog_files=list(recovered.filled_commitlog_files),
        reserved_queue_offsets=dict(lost_offsets),
    )
    if index.dispatch_from is not None and index.dispatch_from == queues.dispatch_from and facts.has_files:
        report.index_dispatch_from = index.dispatch_from
    if checkpoint is not None and report.store_timestamp:
        report.checkpoint_ahead_of_data = checkpoint.physic_msg_timestamp > report.store_timestamp
    return report


_TAIL_CHUNK_BYTES = 1 << 20
# A crashed store's last segment is mostly its zeroed, preallocated rest: 0.8 GiB of it behind
# 237 MB of data took 1.5 s of a 2.3 s open before this comparison.
_ZERO_CHUNK = bytes(_TAIL_CHUNK_BYTES)
_MIN_RECORD_BYTES = codec.cal_msg_length(0, 1, 0)
_MESSAGE_MAGICS = tuple(struct.pack(">i", m) for m in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2))
_HEADER_SEARCH_CHUNK_BYTES = 4 << 20


def _offsets_of_lost_records(
    queues: Sequence[ConsumeQueue], end: int, lost_ranges: Sequence[tuple[int, int]]
) -> dict[tuple[str, int], int]:
    """The next queue offset of each queue whose last unit points at or past the log's `end`
    or past the start of a lost range: its units count queue offsets handed out to records
    that are gone (a power loss that wrote the units back and not the records, a lost tail or
    hole `recover` accepted), and recovery is about to cut those units. Believed only as far
    as the bytes from the first loss to that unit could hold records, so a damaged unit
    cannot throw a queue far ahead. Read only: nothing is cut here."""
    first_loss = min([end, *(start for start, _ in lost_ranges)])
    found: dict[tuple[str, int], int] = {}
    for cq in _one_mapped_at_a_time(queues):
        units = cq.get_max_offset_in_queue()
        last = cq.last_real_unit() if units > 0 else None  # filler units may follow it
        if last is None or last[0] < first_loss:
            continue
        plausible = cq.units_below(first_loss) + (last[0] + last[1] - first_loss) // _MIN_RECORD_BYTES + 1
        found[(cq.topic, cq.queue_id)] = min(units, plausible)
    return found


def _ledger_with_high_water(
    cfg: StoreConfig,
    fs: FileSystem,
    ledger: dict[tuple[str, int], LedgerEntry],
    handed_out: Mapping[tuple[str, int], int],
    queues: Sequence[ConsumeQueue],
    cleaned: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], LedgerEntry]:
    """`ledger` with each queue's high water raised to `handed_out`, written before recovery
    cuts the units that show it (a failed write is logged; this open still keeps the offsets,
    and the ConsumeQueue actor writes the ledger again at its first tick)."""
    raised = dict(ledger)
    first_files = {(cq.topic, cq.queue_id): cq for cq in queues}
    for (topic, queue_id), next_offset in handed_out.items():
        entry = raised.get((topic, queue_id))
        if not codec.names_a_queue(topic, queue_id) or (entry is not None and entry.next_offset >= next_offset):
            continue
        if entry is None:  # units 0: a floor that says nothing; the first file as it is now
            files = first_files[(topic, queue_id)].mapped_file_queue.mapped_files
            entry = LedgerEntry(0, files[0].file_from_offset // codec.CQ_STORE_UNIT_SIZE if files else 0)
        raised[(topic, queue_id)] = entry._replace(high_water=next_offset)
    if raised == ledger:
        return ledger
    try:
        write_queue_ledger(fs, cfg.queue_ledger_path, raised, cleaned=cleaned)
    except OSError as exc:
        log.error("queue ledger not written before cutting units of lost records; their queue offsets are kept "
                  "at this open only", error=str(exc))  # fmt: skip
    log.warning("queue offsets of records past the log's end are kept; re-dispatch gives back those still in the log",
                queues={f"{t}-{q}": n for (t, q), n in sorted(handed_out.items())})  # fmt: skip
    return raised


def continue_queues_past_quarantine(
    commitlog: CommitLog, ranges: Sequence[Quarantined], table: dict[str, int], *, slack_bytes: int = 0
) -> list[tuple[str, int]]:
    """Raise `table` (the next queue offset per "topic-queueId") past every record in the
    quarantined `ranges` whose header is still readable, so that no new record is given the
    queue offset a quarantined one holds (two records in the log claiming one queue offset).
    The queue's next unit then brings a filler unit for the quarantined offset. Returns the
    (key, queue offset) pairs that counted.

    A header is readable when a message magic code sits where the record's own physical-offset
    field says it lies and the record parses without its CRC (a damaged body, the usual case).
    A queue offset is believed only if it is plausible: below the queue's next offset plus
    the records the quarantined (and `slack_bytes` of lost) bytes could hold, so a flipped
    bit in a queue-offset or queue-id field cannot throw a queue far ahead.

    A record whose header is unreadable (zeroed, or its offset field damaged) names no queue,
    so its queue offset cannot be kept, and if it was its queue's last one the next put takes
    it. That is safe: no readable record claims the offset any more (readers, dispatch and the
    crash scan skip quarantined bytes, and nothing can attribute the damaged bytes to a queue),
    and a ConsumeQueue unit for it survives only where the queue was not rebuilt, in which case
    the table starts from that queue's units and is already past it."""
    if not ranges:
        return []
    size = commitlog.mapped_file_size
    slack = (slack_bytes + sum(q.end - q.start for q in ranges)) // _MIN_RECORD_BYTES + 1
    counted: list[tuple[str, int]] = []
    for damaged in ranges:
        seg_start = damaged.start - damaged.start % size
        while seg_start < damaged.end:
            mapped_file = commitlog.mapped_file_queue.find_mapped_file_by_offset(seg_start)
            if mapped_file is not None and mapped_file.file_from_offset == seg_start:
                lo = max(damaged.start, seg_start) - seg_start
                hi = min(damaged.end, seg_start + size) - seg_start
                for pos in _header_candidates(mapped_file.mapped_buffer, lo, hi, size):
                    read = codec.read_record(mapped_file.mapped_buffer, pos, size, check_crc=False, read_body=False,
                                             max_message_size=commitlog.max_record_size)  # fmt: skip
                    record = read.record
                    if read.kind is not codec.RecordKind.MESSAGE or record is None:
                        continue
                    if record.commitlog_offset != seg_start + pos:
                        continue
                    if record.transaction_type in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
                        continue
                    key = f"{record.topic}-{record.queue_id}"
                    known = table.get(key, 0)
                    if not 0 <= record.queue_offset < known + slack:
                        log.warning("a quarantined record's queue offset is implausible; not continued after",
                                    offset=seg_start + pos, queue=key, queue_offset=record.queue_offset,
                                    next_offset=known)  # fmt: skip
                        continue
                    if record.queue_offset >= known:
                        table[key] = record.queue_offset + 1
                        counted.append((key, record.queue_offset))
            seg_start += size
    if counted:
        log.warning("queue offsets of quarantined records are not reused", offsets=counted)
    return counted


def _header_candidates(buf: codec.ReadBuffer, lo: int, hi: int, limit: int) -> Iterator[int]:
    """Positions in [lo, hi) of a segment's buffer where a message magic code says a record
    may start, in order, found in bounded chunks."""
    at = lo
    while at < hi:
        chunk_end = min(hi, at + _HEADER_SEARCH_CHUNK_BYTES)
        window = bytes(buf[at + 4 : min(limit, chunk_end + 4 + 4)])
        hits: set[int] = set()
        for magic in _MESSAGE_MAGICS:
            found = window.find(magic)
            while found >= 0:
                if at + found < chunk_end:
                    hits.add(at + found)
                found = window.find(magic, found + 1)
        yield from sorted(hits)
        at = chunk_end


class _InspectingCommitLog(CommitLog):
    """A CommitLog that notes, just before recovery truncates, why its scan stopped and what
    the truncation is about to remove (the bytes are zeroed, so afterwards nobody can tell)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_reason = "no commitlog files"
        self.damaged_at = -1
        self.dirty_bytes = 0
        self.removed_files: list[str] = []
        # Of removed_files, those holding a non-zero byte (not only the allocator's zeros).
        self.removed_files_with_data: list[str] = []

    def _truncate_after_recovery(self, process_offset: int, max_phy_offset_of_consume_queue: int) -> None:
        self.removed_files = []
        self.removed_files_with_data = []
        self.stop_reason = "end of the last file"
        # Below the flushed offset the truncation is a hole: it zeroes and removes nothing.
        hole = self.mapped_file_queue.ends_below_expected(process_offset, segment_ended=self._scan_ended_on_blank)
        for mapped_file in self.mapped_file_queue.mapped_files:
            start = mapped_file.file_from_offset
            if start > process_offset and hole:
                continue
            if start > process_offset:
                name = os.path.basename(mapped_file.file_name)
                self.removed_files.append(name)
                # After a clean stop everything past the end is zeros (see _inspect_tail).
                if self.zero_tail_bytes != 0 and self._nonzero_end(mapped_file.mapped_buffer, 0, mapped_file.file_name):
                    self.removed_files_with_data.append(name)
            elif process_offset < start + self.mapped_file_size:
                self._inspect_tail(mapped_file.mapped_buffer, start, process_offset - start, mapped_file.file_name,
                                   zeroed=not hole)  # fmt: skip
        super()._truncate_after_recovery(process_offset, max_phy_offset_of_consume_queue)

    def _inspect_tail(self, buf: codec.ReadBuffer, start: int, pos: int, path: str, *, zeroed: bool) -> None:
        read = codec.read_record(buf, pos, self.mapped_file_size, check_crc=self.check_crc_on_recover,
                                 read_body=True, max_message_size=self.max_record_size)  # fmt: skip
        if read.kind is codec.RecordKind.CORRUPT:
            self.stop_reason = read.reason
            self.damaged_at = start + pos
        elif read.kind is codec.RecordKind.MESSAGE:
            self.stop_reason = "a valid record after the scan's end (left by an earlier crash?)"
        else:
            self.stop_reason = "end of data"
        if self.zero_tail_bytes == 0 or not zeroed:
            # A clean stop leaves a zero tail (reading a 1 GiB remainder costs seconds); a hole
            # below the flushed offset zeroes nothing.
            return
        end = self._nonzero_end(buf, pos, path)
        if end:
            self.dirty_bytes = end - pos

    def _nonzero_end(self, buf: codec.ReadBuffer, pos: int, path: str) -> int:
        """Just past the last non-zero byte of the file at or after `pos` (0: none), found
        backwards in bounded chunks within the parts of the file that hold data (the
        untouched rest of a sparse segment is a hole)."""
        for extent_start, extent_end in reversed(self.fs.data_extents(path, pos, self.mapped_file_size)):
            end = extent_end
            while end > extent_start:
                begin = max(extent_start, end - _TAIL_CHUNK_BYTES)
                chunk = bytes(buf[begin:end])
                if chunk == _ZERO_CHUNK:  # memcmp: rstrip walked a zero chunk at 0.4 GB/s
                    end = begin
                    continue
                chunk = chunk.rstrip(b"\0")
                if chunk:
                    return begin + len(chunk)
                end = begin
        return 0


def _one_mapped_at_a_time(queues: Sequence[ConsumeQueue]) -> Iterator[ConsumeQueue]:
    """Each queue, its files' maps given back once the loop is done with it (they are mapped
    again where read): recovery of a store with thousands of queues never holds more than
    one queue's descriptors and maps (review 58 F2: it held all, EMFILE at ~500 queues under
    `ulimit -n 1024`, and the store could not be opened)."""
    for cq in queues:
        try:
            yield cq
        finally:
            cq.unmap_files()


def _loaded_queue(cfg: StoreConfig, fs: FileSystem, topic: str, queue_id: int, clock_ms: Callable[[], int]) -> ConsumeQueue:
    cq = ConsumeQueue(
        fs, topic, queue_id, cfg.consume_queue_dir,
        mapped_file_size=cfg.mapped_file_size_consume_queue_bytes, clock_ms=clock_ms,
    )  # fmt: skip
    if not cq.load():
        queue = cq.mapped_file_queue
        exc = queue.load_os_error
        if exc is not None:  # EACCES of a root-owned file, EIO...: errno and file kept (review 65 F4)
            raise OSError(exc.errno, f"cannot load consume queue {topic}/{queue_id}: {exc.strerror}",
                          exc.filename) from exc  # fmt: skip
        raise OSError(f"cannot load consume queue {topic}/{queue_id}: {queue.load_error}")
    return cq


# Who may have deleted a queue's files the ledger knew (review 62 L1: not only a person).
_BY_WHOM = ("by hand, or by a writer that keeps no queue ledger, an older mqstore or a RocketMQ broker, "
             "run on this store since")


def _queues_behind_ledger(
    cfg: StoreConfig,
    fs: FileSystem,
    ledger: dict[tuple[str, int], LedgerEntry],
    queues: list[ConsumeQueue],
    damaged: list[ConsumeQueue],
    clock_ms: Callable[[], int],
) -> list[ConsumeQueue]:
    """The queues the ledger (storage.queue_ledger) knew that are gone, hold fewer units than it
    counted, or start later than it says: their directory, last files or first files were
    deleted since. Added to `queues` and `damaged`, so re-dispatch rebuilds them from the log
    before a put can take one of their queue offsets again or a reader skips their units.
    Returns the ones it added to `damaged`."""
    present = {(cq.topic, cq.queue_id): cq for cq in queues}
    rebuilt: list[ConsumeQueue] = []
    for (topic, queue_id), (counted, first, _) in sorted(ledger.items()):
        cq = present.get((topic, queue_id))
        if cq is None:
            cq = _loaded_queue(cfg, fs, topic, queue_id, clock_ms)  # no files: nothing to load
            queues.append(cq)
            log.warning(f"a consume queue in the queue ledger has no directory (deleted {_BY_WHOM}); re-dispatch "
                        "rebuilds it", topic=topic, queue_id=queue_id, ledger_units=counted)  # fmt: skip
        elif cq in damaged:
            continue
        elif (files := cq.mapped_file_queue.mapped_files) and files[0].file_from_offset // codec.CQ_STORE_UNIT_SIZE > first:
            # Not this mqstore's cleaner: it has the ledger written again right after it
            # deletes (an older mqstore's or a broker's, which keep none, may have: review 62
            # L1). Units can only be written in order, so the whole queue is rebuilt from the log.
            log.warning(f"a consume queue's first files were deleted since the queue ledger was written ({_BY_WHOM}, "
                        "e.g. by its retention); its files are removed and re-dispatch rebuilds the whole queue", topic=topic,
                        queue_id=queue_id, first_file_offset=files[0].file_from_offset // codec.CQ_STORE_UNIT_SIZE,
                        ledger_first=first)  # fmt: skip
            cq.destroy()
        elif cq.get_max_offset_in_queue() >= counted:
            continue
        else:
            log.warning(f"a consume queue holds fewer units than the queue ledger counted (files deleted {_BY_WHOM}); "
                        "re-dispatch rebuilds it", topic=topic, queue_id=queue_id,
                        units=cq.get_max_offset_in_queue(), ledger_units=counted)  # fmt: skip
        damaged.append(cq)
        rebuilt.append(cq)
    return rebuilt


def _cq_segment_names(fs: FileSystem, directory: str) -> list[str]:
    """A queue directory's segment files (20 digits); anything else is ignored with a warning."""
    names = []
    for name in fs.listdir(directory):
        path = os.path.join(directory, name)
        if len(name) != 20 or not name.isdigit() or fs.isdir(path):
            if not name.endswith(DAMAGED_SUFFIX) and ".damaged." not in name:
                log.warning("ignoring a file that is not a consume queue segment", path=path)
            continue
        names.append(name)
    return sorted(names)


def _cq_other_geometry(cfg: StoreConfig, fs: FileSystem, queues: list[tuple[str, int]]) -> str | None:
    """Why the ConsumeQueue files look written with another mapped_file_size_consume_queue_bytes,
    or None. That is not damage, and it is refused rather than rebuilt: every file of every
    queue has one size that is a whole number of units, and where a queue has several files
    their names are that size apart. A file its siblings disagree with is damage."""
    expected = cq_file_size(cfg.mapped_file_size_consume_queue_bytes)
    sizes: set[int] = set()
    for topic, queue_id in queues:
        directory = os.path.join(cfg.consume_queue_dir, topic, str(queue_id))
        names = _cq_segment_names(fs, directory)
        sizes.update(fs.getsize(os.path.join(directory, name)) for name in names)
        if len(sizes) > 1:
            return None
        if sizes and any(int(b) - int(a) != next(iter(sizes)) for a, b in zip(names, names[1:])):
            return None
    if len(sizes) != 1:
        return None
    size = next(iter(sizes))
    if size == expected or size <= 0 or size % codec.CQ_STORE_UNIT_SIZE:
        return None
    return (f"every consume queue file is {size} bytes, the settings make {expected} "
            f"(mapped_file_size_consume_queue_bytes={cfg.mapped_file_size_consume_queue_bytes})")


def _cut_cq_files_at_damage(cfg: StoreConfig, fs: FileSystem, topic: str, queue_id: int) -> list[str]:
    """Cut a queue's files at its first damage, for re-dispatch to rebuild from there (derived
    data). A file of the wrong length is set aside (renamed `<name>.damaged`, never deleted)
    and every file after it deleted: loading stops at it and would leave it in the way of the
    queue's next file. A missing file between two others (deleted by hand: the cleaner only
    ever deletes a queue's first files) leaves the files after the gap unreachable by a
    rebuild, which writes units in order; they are deleted, and the units they held written
    again from the log."""
    directory = os.path.join(cfg.consume_queue_dir, topic, str(queue_id))
    size = cq_file_size(cfg.mapped_file_size_consume_queue_bytes)
    removed: list[str] = []
    expected: int | None = None
    gap = False
    for name in _cq_segment_names(fs, directory):
        path = os.path.join(directory, name)
        if removed:
            fs.remove(path)
            removed.append(f"{topic}/{queue_id}/{name} (after {'a gap' if gap else 'a file of the wrong length'})")
        elif expected is not None and int(name) != expected:
            gap = True
            fs.remove(path)
            missing = codec.segment_file_name(expected)
            removed.append(f"{topic}/{queue_id}/{name} (after a gap: {missing} is missing)")
            log.error("consume_queue_file_missing", topic=topic, queue_id=queue_id, missing=missing, removed_after_it=name)
        elif (actual := fs.getsize(path)) != size:
            kept = fs.set_aside(path, DAMAGED_SUFFIX)
            removed.append(f"{topic}/{queue_id}/{name} ({actual} bytes, not {size}; kept as {os.path.basename(kept)})")
            log.error("consume_queue_file_set_aside", path=path, size=actual, expected=size, kept_as=kept)
        expected = int(name) + size
    return removed


def _remove_partial_last_segments(cfg: StoreConfig, fs: FileSystem, held_data_below: int) -> list[str]:
    """Delete commitlog files at the end of the directory that are shorter or longer than a
    segment and hold only zeros: a segment the allocator was creating when the process died
    (created, not yet sized). Loading stops at a wrong-sized file, so left in place it would
    hide nothing but block the writer's next roll and fail `verify`. One with data is left for
    a person to look at (loading ignores it and everything after it, and says so), and so is
    one that starts below `held_data_below` (the flushed offset, or where the log was read
    before an actor's restart): it was emptied, not being created, and is a hole."""
    directory = cfg.commitlog_dir
    names = sorted(n for n in fs.listdir(directory) if len(n) == 20 and n.isdigit()
                   and not fs.isdir(os.path.join(directory, n)))  # fmt: skip
    removed: list[str] = []
    for name in reversed(names):
        path = os.path.join(directory, name)
        if fs.getsize(path) == cfg.mapped_file_size_commitlog_bytes:
            break
        if fs.getsize(path) > cfg.mapped_file_size_commitlog_bytes or _holds_data(fs, path, fs.getsize(path)):
            log.error("a commitlog file of the wrong length holds data; it and later files are ignored", path=path)
            break
        if int(name) < held_data_below:
            log.error("a commitlog segment that held data is empty or cut short; left for `mqstore recover`", path=path)
            break
        fs.remove(path)
        removed.append(f"{name} (empty, wrong length: a segment being created at the crash)")
        log.warning("removed a partly created commitlog segment", path=path)
    return removed


def _holds_data(fs: FileSystem, path: str, size: int) -> bool:
    """Whether the file holds a non-zero byte: read a MiB at a time, its holes skipped. A partly
    created segment of up to a GiB was read whole into memory, and byte by byte (review 100
    H2: 1.08 GB and 6-8 s for a read-only `get` asking recovery's dry run, and for an open)."""
    try:
        extents = fs.data_extents(path, 0, size)
    except OSError:
        extents = [(0, size)]
    for start, end in extents:
        for at in range(start, end, _TAIL_CHUNK_BYTES):
            chunk = fs.read_at(path, at, min(_TAIL_CHUNK_BYTES, end - at))
            if chunk != _ZERO_CHUNK[: len(chunk)]:
                return True
    return False


_FILL_COPY_CHUNK_BYTES = 1 << 20
_FILLING_SUFFIX = ".filling"  # a filled segment before it is known whole (not a segment's name)


def _fill_commitlog_holes(cfg: StoreConfig, fs: FileSystem, expected_end: int) -> tuple[list[tuple[int, int]], list[str]]:
    """Make a commitlog with holes whole, for `mqstore recover`: every missing segment between
    the first and the last file, or after the last one below `expected_end` (the checkpoint's
    flushed offset: segments deleted from the end), and every wrong-sized one, becomes a full segment holding the
    damaged file's valid records (CRC and offset checked, from its start) and then the blank
    record that ends a segment, so readers, dispatch and the writer go on past it. A damaged
    file is renamed NAME.damaged beside it (never deleted) and read through a map, its valid
    records copied in bounded chunks: a segment is never read into memory whole. Returns the
    lost [start, end) ranges and what was done, per file."""
    directory = cfg.commitlog_dir
    size = cfg.mapped_file_size_commitlog_bytes
    names = sorted(n for n in fs.listdir(directory) if _is_segment_name(n))
    set_aside = _set_aside_segment_starts(cfg, fs)
    if not names and not set_aside:
        return [], []
    present = {int(n): fs.getsize(os.path.join(directory, n)) for n in names}
    # A run that found no room left set-aside copies, perhaps of the last segments or of all of
    # them: filled from those at or after the first segment left (older copies stay as they are).
    first = min(present) if present else min(set_aside)
    last = max([*present, *(start for start in set_aside if start >= first)])
    if expected_end > last + size:
        last = (expected_end - 1) - (expected_end - 1) % size
    lost: list[tuple[int, int]] = []
    done: list[str] = []
    for start in range(first - first % size, last + 1, size):
        if present.get(start) == size:
            continue
        name = codec.segment_file_name(start)
        path = os.path.join(directory, name)
        kept = ""
        if start in present:
            kept = fs.set_aside(path, DAMAGED_SUFFIX)
        elif fs.exists(path + DAMAGED_SUFFIX) and not fs.isdir(path + DAMAGED_SUFFIX):
            kept = path + DAMAGED_SUFFIX  # set aside by a run that found no room to fill it
        kept_size = fs.getsize(kept) if kept else 0
        old = fs.map_file(kept, kept_size, create=False, readonly=True) if kept_size else None
        try:
            keep = valid_prefix_end(old.buf, start, size, cfg.max_stored_record_bytes) if old is not None else 0
            _write_filled_segment(fs, path, size, old, keep)
        except UnreadDuringRecoveryError:
            if start in present:  # the wrong-sized segment back in its place: nothing changed
                fs.rename(kept, path)
            raise
        finally:
            if old is not None:
                old.close()
        lost.append((start + keep, start + size))
        what = (f"{present[start]} bytes, kept as {os.path.basename(kept)}" if start in present
                else f"missing, refilled from {os.path.basename(kept)}" if kept else "missing")  # fmt: skip
        done.append(f"{name} ({what}): {keep} bytes of valid records kept, {start + keep}..{start + size} lost")
        log.error("commitlog hole filled; its records are lost", file=name, lost_from=start + keep, lost_to=start + size)
    return lost, done


def _write_filled_segment(fs: FileSystem, path: str, size: int, old: MappedRegion | None, keep: int) -> None:
    """A new full segment at `path`: the first `keep` bytes of `old` (copied in bounded chunks),
    then the blank record that ends a segment. On a full disk nothing is written through the
    map (a page without blocks is a SIGBUS): the new file is removed and DiskFullError raised;
    the damaged file stays set aside, and the next `recover` fills the hole from it.

    Written under a temporary name and renamed into place once `old` is known to have read
    whole: a page of it that faulted while it was measured or copied (the SIGBUS guard's zeros,
    read as the end of its records or copied as them) is UnreadDuringRecoveryError, and no
    segment appears (review 67 F6: 52 acknowledged messages were declared lost, exit 0)."""
    if old is not None and old.cut_short():
        raise UnreadDuringRecoveryError(old.path)
    filling = path + _FILLING_SUFFIX
    if fs.exists(filling):
        fs.remove(filling)  # left by a run that died filling: its source is still set aside
    region = fs.map_file(filling, size, create=True)
    try:
        reserved = region.reserve(keep + codec.END_FILE_MIN_BLANK_LENGTH)
        if reserved:
            if old is not None:
                for at in range(0, keep, _FILL_COPY_CHUNK_BYTES):
                    end = min(keep, at + _FILL_COPY_CHUNK_BYTES)
                    region.buf[at:end] = old.buf[at:end]
            region.buf[keep : keep + codec.END_FILE_MIN_BLANK_LENGTH] = codec.blank_record_header(size - keep)
            region.flush()
    finally:
        region.close()
    if not reserved:
        fs.remove(filling)
        raise DiskFullError(f"no disk space to fill the commitlog hole {path}")
    if old is not None and old.cut_short():
        fs.remove(filling)
        raise UnreadDuringRecoveryError(old.path)
    fs.rename(filling, path)


def _store_timestamp_before(commitlog: CommitLog, end: int) -> int:
    """The store time of the last record before `end` (for the checkpoint), or 0 (walked in C)."""
    return commitlog.store_timestamp_before(end)


def _recover_index(
    cfg: StoreConfig,
    fs: FileSystem,
    clock_ms: Callable[[], int],
    last_exit_ok: bool,
    checkpoint: CheckpointValues | None,
    end: int,
    min_offset: int,
    reach: int,
    *,
    use_progress: bool,
) -> tuple[int, list[str], int | None]:
    """§10.8 load, made safe. Returns (files deleted, why, where re-dispatch must start for
    the index or None if it needs none).

    After a crash, files newer than the checkpoint's indexMsgTimestamp go (load does that),
    and so does any file that is not full: only a full file is flushed before the checkpoint
    moves past it, so a power loss may have torn a non-full one (a stale or zero header over
    newer entries chains one message twice or loses keys). A file whose header does not hold
    together goes too, after any exit, with every later file. What is dropped is rebuilt by
    re-dispatching from the last kept file's endPhyOffset (the start of its last indexed
    message, which the index actor does not index twice), or from the log's start: 4.4.0
    re-dispatches only from the checkpoint's start file, losing the keys of messages before
    it unless messageIndexSafe. Files that begin past the new log end go as well.

    With `use_progress` (an open or `mqstore recover`; not a restart in a live process) the
    index progress (storage.index_progress) adds what the files cannot show: after a clean
    stop, messages past where the index stopped (put while it was disabled) are indexed, and
    a file it lists that is gone (deleted by hand; not one the cleaner expired) is rebuilt with
    every file after it. It is written again whenever this changed the files or needs a
    re-dispatch, so an open interrupted before the re-dispatch ends still makes the next do it."""
    if not fs.exists(cfg.index_dir):
        return 0, [], None
    # With the index disabled (`message_index_enable` off) nothing re-dispatches for it now,
    # but its files are made safe as always and the progress records how far they index, so
    # that the next open with it on indexes the rest (review 35 F1: the keys the index had not
    # reached at a crash were never indexed after an open with it off).
    disabled = not cfg.message_index_enable
    progress = load_index_progress(fs, cfg.index_progress_path) if use_progress else None
    names_before = set(fs.listdir(cfg.index_dir))
    faults_seen = fs.map_faults()
    service = IndexService(
        fs, cfg.index_dir, clock_ms=clock_ms, max_hash_slot_num=cfg.max_hash_slot_num,
        max_index_num=cfg.max_index_num, max_msgs_num_batch=cfg.max_msgs_num_batch,
    )  # fmt: skip
    try:
        if not service.load(last_exit_ok, checkpoint.index_msg_timestamp if checkpoint else 0):
            exc = service.load_error
            if exc is not None:  # EACCES of a root-owned file, EIO...: said as it is (review 65 F4)
                raise OSError(exc.errno, f"cannot load the index in {cfg.index_dir}: {exc.strerror}",
                              exc.filename) from exc  # fmt: skip
            raise OSError(f"cannot load the index in {cfg.index_dir}: its files hold together at "
                          f"another size than max_hash_slot_num={cfg.max_hash_slot_num}, "
                          f"max_index_num={cfg.max_index_num} give (see the log)")  # fmt: skip
        if fs.map_faults() != faults_seen:
            # A header read as the guard's zeros ends at offset 0, "went back": nothing is dropped
            # or set aside on it (review 67).
            for f in service.files:
                if f.cut_short():
                    raise UnreadDuringRecoveryError(f.path)
        gone = names_before - set(fs.listdir(cfg.index_dir))
        reasons = list(service.set_aside)
        reasons += [f"{name}: newer than the checkpoint's index timestamp"
                    for name in sorted(gone) if not any(r.startswith(name) for r in service.set_aside)]  # fmt: skip
        dropped = len(reasons)
        files = service.files
        lost = first_lost_index_file(progress, {f.name: f.end_phy_offset for f in files}, min_offset)
        if lost is not None:
            lost_name, why_lost = lost
            # Its keys are rebuilt in order: files written after it go too (an older message's
            # entry after newer ones would move a file's endPhyOffset back), and it too if it
            # is an older copy (the rebuild writes every key it had).
            later = [f for f in files if f.name >= lost_name]
            for f in later:
                reasons.append(f"{f.name}: {why_lost}" if f.name == lost_name else
                               f"{f.name}: after {lost_name}, which {why_lost}")  # fmt: skip
                f.destroy()
            del files[len(files) - len(later):]
            dropped += len(later)
            log.warning("an index file is gone or went back; re-dispatch rebuilds it", file=lost_name, why=why_lost,
                        dropped=len(later))  # fmt: skip
        for i, f in enumerate(files):
            why = _index_file_unsafe(fs, f, last_exit_ok=last_exit_ok, last=i == len(files) - 1)
            if why is None:
                continue
            for bad in files[i:]:
                if bad is f and why.startswith("corrupt header"):
                    # Damage, not a routine drop: kept for a person to look at, never deleted.
                    bad.close()
                    kept = fs.set_aside(bad.path, DAMAGED_SUFFIX)
                    reasons.append(f"{bad.name}: {why}; kept as {os.path.basename(kept)}")
                    log.error("index_file_set_aside", path=bad.path, reason=why, kept_as=kept)
                else:
                    reasons.append(f"{bad.name}: {why if bad is f else 'after a dropped file'}")
                    bad.destroy()
                dropped += 1
            del files[i:]
            log.warning("unsafe index files dropped; re-dispatch rebuilds them", reasons=reasons)
            break
        # The one file that holds keys of kept messages and of lost ones (a lost tail): its
        # entries past the end are undone, or, when its chains cannot be cut short, it goes
        # with those keys, which are then rebuilt. Files that begin past the end held none.
        # `reach`: entries into a degraded log's holes stay (see LogFacts.reach).
        straddling = next((f.name for f in files if f.begin_phy_offset < reach <= f.end_phy_offset), None)
        cut = service.drop_files_after(reach)
        if cut:
            reasons.append(f"{cut} index file(s) past the commitlog's end or holes ({reach}) dropped")
        files = service.files
        straddling_torn = straddling is not None and all(f.name != straddling for f in files)
        index_from: int | None = None
        if dropped or lost is not None or straddling_torn or not last_exit_ok:
            # From the last kept file's endPhyOffset (its last message is indexed again, and
            # build_index adds no key twice), or the log's start.
            index_from = max(files[-1].end_phy_offset, min_offset) if files else min_offset
        if last_exit_ok and progress is not None and progress.indexed_below < end:
            # Keys put while the index was disabled, or by a broker after mqstore's last close.
            # (After a crash the progress is older than the files: they rebuild from above.)
            behind = max(progress.indexed_below, min_offset)
            index_from = behind if index_from is None else min(index_from, behind)
        if index_from is None and progress is None and not files and end > min_offset:
            # Records and no index at all (its directory emptied by hand, or the index just
            # enabled on a store without progress): built from the log's start.
            index_from = min_offset
        if index_from is not None and index_from >= end:
            index_from = None
        if use_progress and (index_from is not None or dropped or cut or disabled):
            # Written after the files changed: an open interrupted before this finds the files
            # the progress lists gone (or, after a crash, rebuilds from the kept files).
            known = progress.indexed_below if progress is not None else end
            # (`reach`: a degraded log's end short of the progress lowers nothing, review 36 F3.)
            now = IndexProgress(min(known, reach if index_from is None else index_from),
                                tuple((f.name, f.end_phy_offset) for f in files))  # fmt: skip
            if now != progress:
                write_index_progress(fs, cfg.index_progress_path, now)
        return dropped + cut, reasons, index_from
    finally:
        service.close()


def _read_index_header(fs: FileSystem, path: str) -> IndexHeader:
    """`read_index_header`, refusing a header whose page faulted: its zeros are no count."""
    size = fs.getsize(path)
    if size < INDEX_HEADER_SIZE:
        return read_index_header(fs, path)  # (its error)
    region = fs.map_file(path, size, create=False, readonly=True)
    try:
        header = IndexHeader.unpack(region.buf)
        if region.cut_short():
            raise UnreadDuringRecoveryError(path)
        return header
    finally:
        region.close()


def _index_file_unsafe(fs: FileSystem, f: IndexFile, *, last_exit_ok: bool, last: bool) -> str | None:
    """Why an index file cannot be kept, or None."""
    h = _read_index_header(fs, f.path)
    if not 0 <= h.index_count <= f.max_index_num:
        return f"corrupt header: indexCount {h.index_count} not in [0, {f.max_index_num}]"
    # Not begin_timestamp > end_timestamp: a broker's clock stepped back within a file writes
    # that whole (review 57 F6: set aside at every open, rebuilt the same, 420 MB each time).
    if h.index_count > 1 and (h.begin_phy_offset > h.end_phy_offset or h.begin_phy_offset < 0
                              or h.begin_timestamp <= 0):  # fmt: skip
        return (f"corrupt header: phy offsets {h.begin_phy_offset}..{h.end_phy_offset}, "
                f"timestamps {h.begin_timestamp}..{h.end_timestamp}")  # fmt: skip
    if not last and h.index_count != f.max_index_num:
        return f"corrupt header: indexCount {h.index_count} in a file that is not the newest (should be full)"
    if not last_exit_ok and h.index_count != f.max_index_num:
        return "not full after a crash: its unflushed pages may be torn"
    return None
