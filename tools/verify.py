"""`mqstore verify`: check that a stopped store's ConsumeQueues and index agree with its CommitLog.

Read-only: the CommitLog is scanned (CRC-checked) through `scan_commitlog_dir`, queues through
`iter_cq_units`, index files through `IndexFile.open_readonly`; nothing is mapped writable and
nothing is created, so it is safe on a store that is not running (and on a broker's copy).

What it checks (each failure is a `Problem` with a kind, a place and a detail):

* the CommitLog: every segment is whole and readable up to its end of data; a damaged record
  or data after the end is `commitlog_corrupt` / `commitlog_data_after_end`; a segment this
  process cannot open or map (no access, an I/O error) is `commitlog_unreadable`, not damage:
  what points into it is not checked (`VerifyReport.unreadable`);
* every ConsumeQueue unit points at a valid record that matches it (topic, queue id, queue
  offset, size, tags code), `cq_*`; units at or past the log end are `cq_past_end`;
* every index entry points at a valid record whose UNIQ_KEY or a KEYS token, as
  `topic#key`, has the entry's hash (`index_*`); entries past the log end are `index_past_end`;
* nothing is missing: each record that is not PREPARED/ROLLBACK has its unit
  (`cq_missing`), unless its queue file was cleaned, or its queue has no directory and the
  queue ledger does not list it, or it lies below the floor the ledger keeps for a queue
  `clean_unused_topic` removed and the topic was written again since (counted in
  `VerifyReport.not_queued`); each key of each record in the range an
  index file covers has an entry (`index_missing`). Records outside every index file's
  [beginPhyOffset, endPhyOffset] (a file dropped at crash recovery, or expired) are not
  expected, and are counted in `VerifyReport.not_indexed`; but an index file the index
  progress (`index_progress.msgpack`) lists that is gone while messages it indexed are still in
  the log, or is there as an older copy, is `index_file_lost`;
* every record's topic and queue id can name a queue (`commitlog_bad_topic`: damage to the
  header that the body CRC does not cover; dispatch gives such a record no unit);
* no ConsumeQueue starts later than the queue ledger (`queue_ledger.msgpack`) says: its first
  files were deleted, not cleaned (`cq_front_missing`; an unreadable ledger is
  `queue_ledger_unreadable`);
* nothing is indexed twice: a second entry for the same record and key hash, across all
  files, is `index_duplicate` (unless the record carries that key twice);
* the checkpoint, where there is one, is one (`checkpoint_not_a_checkpoint`: longer than 4096
  bytes, or values no broker writes; the open refuses it, see storage.checkpoint).
* the store uses no RocketMQ feature mqstore does not implement, by its directories and its
  records (`unsupported_store`: storage.foreign; the open refuses such a store).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Final, Iterator, NamedTuple

from ..config import StoreConfig
from ..storage import codec
from ..storage.checkpoint import CheckpointError, read_checkpoint
from ..storage.foreign import SUPPORTED, foreign_layout, record_feature
from ..storage.codec import CQ_STORE_UNIT_SIZE, RecordKind, names_a_queue
from ..cli import unreadable_file
from ..storage.commitlog import QUARANTINED_PREFIX, scan_commitlog_dir, segment_size_in, store_copies, store_copy_problem
from ..storage.consume_queue import is_filler, iter_cq_units, list_consume_queues
from ..storage.dry_run import CrashRecoveryVerdict, verdict_of_stopped_store
from ..storage.fs import FileSystem, NotARegularFileError, RealFileSystem
from ..storage.index import IndexFile, build_key, key_hash_and_slot, read_index_header
from ..storage.index_progress import first_lost_index_file, peek_index_progress
from ..storage.queue_ledger import LedgerError, LedgerFile, unpack_ledger_file

__all__ = ["Problem", "VerifyReport", "verify_store"]

_SKIPPED_TRAN: Final = (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE)


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.detail}"


class _Rec(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    size: int
    tags_code: int
    tran_type: int
    key_hashes: frozenset[int]
    repeated_hashes: frozenset[int]  # hashes of keys the record carries more than once (legit twice)


@dataclass
class VerifyReport:
    store_dir: str
    min_offset: int = 0
    max_offset: int = 0  # end of the last valid record
    messages: int = 0
    consume_queues: int = 0
    cq_units: int = 0
    index_files: int = 0
    index_entries: int = 0
    not_indexed: int = 0  # records with keys outside every index file's range
    # Records of a queue with no directory that the queue ledger does not list either:
    # clean_unused_topic removed it (it forgets the ledger's entry before the files go).
    not_queued: int = 0
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    max_problems: int = 1000
    # Damaged commitlog ranges [start, end), reported once: units and index entries that point
    # into one are its consequence, not further problems.
    damaged_ranges: list[tuple[int, int]] = field(default_factory=list)

    # The blank ends of segments [start, end): where `recover` filled a hole, the lost records'
    # index entries point here (the index is append-only; a query checks every record).
    blank_tails: list[tuple[int, int]] = field(default_factory=list)
    stale_index_entries: int = 0
    # Segments [start, end) present but not readable by this process now (review 65 F1): not
    # damage; units and index entries that point into one are not checked.
    unreadable_ranges: list[tuple[int, int]] = field(default_factory=list)
    # The checkpoint, queue ledger or an index file the process could not read (an OSError:
    # access, the disk), not a file that read as damaged (review 119 F2: exit 3, "recover").
    unreadable_files: list[str] = field(default_factory=list)

    def in_blank_tail(self, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.blank_tails)

    def in_damaged_range(self, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.damaged_ranges)

    def in_unreadable_range(self, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.unreadable_ranges)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def unreadable(self) -> bool:
        """Whether a segment or another store file could not be read: the check is incomplete,
        and the fix is access (or the disk), not `mqstore recover`."""
        return bool(self.unreadable_ranges or self.unreadable_files)

    def add_unreadable(self, kind: str, path: str, error: OSError, then: str = "") -> None:
        """A store file this process cannot read now (access, the disk): not damage, and the
        check is incomplete (`unreadable`)."""
        self.add(kind, path, unreadable_file(path, error, named=False) + then)
        self.unreadable_files.append(path)

    def add(self, kind: str, where: str, detail: str) -> None:
        self.problem_count += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(Problem(kind, where, detail))

    def summary(self) -> dict[str, object]:
        return {
            "store_dir": self.store_dir,
            "ok": self.ok,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "messages": self.messages,
            "consume_queues": self.consume_queues,
            "cq_units": self.cq_units,
            "index_files": self.index_files,
            "index_entries": self.index_entries,
            "not_indexed": self.not_indexed,
            "not_queued": self.not_queued,
            "stale_index_entries": self.stale_index_entries,
            "unreadable_segments": len(self.unreadable_ranges),
            "unreadable_files": len(self.unreadable_files),
            "problem_count": self.problem_count,
        }


def verify_store(
    store_dir: str | os.PathLike[str],
    *,
    config: StoreConfig | None = None,
    fs: FileSystem | None = None,
    max_problems: int = 1000,
) -> VerifyReport:
    """Check the store at `store_dir` (not running, or at least not writing) and report."""
    root = os.fspath(store_dir)
    cfg = (config or StoreConfig()).replace(store_path_root_dir=root)
    fs = fs or RealFileSystem()
    report = VerifyReport(store_dir=root, max_problems=max_problems)
    _check_checkpoint(cfg, fs, report)
    for found in foreign_layout(cfg, fs):  # the open refuses these stores (review 64 F4)
        report.add("unsupported_store", root, f"{found}. {SUPPORTED}")
    commitlog_dir = os.fspath(cfg.commitlog_dir)
    for name in store_copies(fs, commitlog_dir):  # and these (review 143: verify said ok)
        report.add("store_copy", os.path.join(commitlog_dir, name),
                   f"{store_copy_problem(name)}; the open and `mqstore recover` refuse until then")
    records = _scan_commitlog(cfg, fs, report)
    _check_consume_queues(cfg, fs, records, report)
    _check_index(cfg, fs, records, report)
    return report


def _check_checkpoint(cfg: StoreConfig, fs: FileSystem, report: VerifyReport) -> None:
    """A checkpoint the open would refuse is a problem here too (a missing one is not: a store
    that never flushed, or a broker's copy without it, opens and recovers from the log)."""
    path = cfg.checkpoint_path
    if not fs.exists(path):
        return
    try:
        read_checkpoint(fs, path)
    except CheckpointError as e:
        report.add("checkpoint_not_a_checkpoint", path, str(e))
    except OSError as e:
        report.add_unreadable("checkpoint_unreadable", path, e)


# ---------------------------------------------------------------------------------------------
# CommitLog


def _key_hashes(record: codec.MessageRecord, slots: int) -> tuple[frozenset[int], frozenset[int]]:
    """(the hashes of the record's index keys, those of them that occur more than once)."""
    keys = []
    if record.uniq_key is not None:
        keys.append(build_key(record.topic, record.uniq_key))
    keys.extend(build_key(record.topic, k) for k in record.key_list)
    hashes = [key_hash_and_slot(k, slots)[0] for k in keys]
    return frozenset(hashes), frozenset(h for h in hashes if hashes.count(h) > 1)


def _scan_commitlog(cfg: StoreConfig, fs: FileSystem, report: VerifyReport) -> dict[int, _Rec]:
    directory = os.fspath(cfg.commitlog_dir)
    records: dict[int, _Rec] = {}
    if not fs.isdir(directory):
        report.add("commitlog_missing", directory, "no commitlog directory")
        return records
    names = sorted(n for n in fs.listdir(directory) if len(n) == 20 and n.isdigit())
    if not names:
        return records
    # From the names, not the first file's length: an emptied or cut first segment would
    # redefine every segment's extent (a FIFO or directory there has no length of use).
    # The size the store adopted or the caller set, where the files allow it as well as any.
    segment = segment_size_in(fs, directory, names, cfg.mapped_file_size_commitlog_bytes) or cfg.mapped_file_size_commitlog_bytes
    starts = [int(n) for n in names]
    for k, start in enumerate(starts):
        if start != starts[0] + k * segment:
            report.add("commitlog_gap", os.path.join(directory, names[k]), f"expected a segment at {starts[0] + k * segment}")
    report.min_offset = report.max_offset = starts[0]
    delay_levels = codec.parse_delay_levels(cfg.message_delay_level)
    # Where a file's data stopped early (offset, what was there): the end of the log, unless a
    # later file holds records; then it was damage with valid records after it.
    stopped: tuple[int, str] | None = None
    foreign_record_seen = False
    cut_from: int | None = None  # after a crash, where recovery cuts the log (records from it are not checked)
    verdict: list[CrashRecoveryVerdict | str] = []

    def damage(at: int, why: str, damaged: str | None) -> None:
        """`why` the bytes at `at` are no record; `damaged`: what follows them (None: no valid
        record). After a crash, whether it is damage or a torn tail is asked of recovery itself
        (a dry run, storage/dry_run.py): review 97 L2, a tear with records after it was
        `commitlog_damaged`, "quarantined, not cut", where recover cut it."""
        nonlocal cut_from
        if not verdict and isinstance(fs, RealFileSystem) and fs.exists(cfg.abort_path):
            verdict.append(verdict_of_stopped_store(cfg.replace(mapped_file_size_commitlog_bytes=segment)))
        said = verdict[0] if verdict and isinstance(verdict[0], CrashRecoveryVerdict) else None
        if said is not None and said.is_torn_tail(at):
            if cut_from is None:  # (what follows it is cut with it)
                cut_from = said.torn_from
                report.add("commitlog_corrupt", f"offset {at}",
                           f"{why} (a torn tail after a crash: recover cuts the log at offset {said.torn_from})")  # fmt: skip
        elif damaged is not None:
            report.add("commitlog_damaged", f"offset {at}", f"{why}; {damaged}")
        elif said is not None:
            report.add("commitlog_damaged", f"offset {at}", f"{why}; no valid record follows, and the next open's "
                       "recovery does not cut it (below the checkpoint's flushed offset, or in a segment it leaves "
                       "out): damage, not a torn tail")  # fmt: skip
        else:
            report.add("commitlog_corrupt", f"offset {at}", f"{why} (a torn tail: recover cuts it)")

    def unreadable(path: str, error: OSError) -> None:
        start = int(os.path.basename(path))
        report.add("commitlog_unreadable", path, f"{unreadable_file(path, error, named=False)}; what points into it was not checked")
        report.unreadable_ranges.append((start, start + segment))
        report.max_offset = max(report.max_offset, start)  # (its records' end is not known)

    scan = scan_commitlog_dir(directory, check_crc=True, segment_size=segment, max_message_size=cfg.max_message_size_bytes,
                              fs=fs, look_past_damage=True, on_unreadable=unreadable)  # fmt: skip
    with contextlib.closing(scan):
        for found in scan:
            if found.kind is RecordKind.END_OF_DATA and found.offset % segment == 0:
                continue  # an empty (pre-allocated) file: fine at the end, a gap's report otherwise
            if found.kind in (RecordKind.MESSAGE, RecordKind.BLANK) and stopped is not None:
                at, why = stopped
                damage(at, why, f"valid records follow from offset {found.offset} (quarantined, not cut)")
                report.damaged_ranges.append((at, found.offset))
                stopped = None
            if cut_from is not None and found.offset >= cut_from:
                continue  # cut by the next open with the torn tail: no unit or index entry is owed
            if found.kind is RecordKind.MESSAGE:
                rec = found.record
                assert rec is not None
                if not foreign_record_seen and (feature := record_feature(rec.sys_flag, rec.properties, rec.topic)):
                    foreign_record_seen = True  # the first is named, as inspect does: the open refuses the store
                    report.add("unsupported_store", f"offset {found.offset}", f"a record of topic {rec.topic[:80]!r} is "
                               f"{feature}. {SUPPORTED}")  # fmt: skip
                records[found.offset] = _Rec(
                    rec.topic, rec.queue_id, rec.queue_offset, rec.total_size, rec.tags_code(delay_levels),
                    rec.transaction_type, *_key_hashes(rec, cfg.max_hash_slot_num),
                )  # fmt: skip
                report.max_offset = found.offset + found.size
            elif found.kind is RecordKind.BLANK:
                report.max_offset = found.offset - found.offset % segment + segment
                report.blank_tails.append((found.offset, report.max_offset))
            elif found.kind is RecordKind.CORRUPT and found.reason.startswith(QUARANTINED_PREFIX):
                # Damage inside a file with a trusted record after it (the scan went on there).
                damage(found.offset, found.reason.removeprefix(QUARANTINED_PREFIX), f"{found.size} bytes up to a valid record")
                report.damaged_ranges.append((found.offset, found.offset + found.size))
            elif found.kind is RecordKind.END_OF_DATA:
                stopped = (found.offset, "the file's data ends without the blank that closes a segment")
            else:
                stopped = (found.offset, found.reason)
    if stopped is not None and cut_from is None:
        at, why = stopped
        if not why.startswith("the file's data ends"):
            damage(at, why, None)
    report.messages = len(records)
    return records


# ---------------------------------------------------------------------------------------------
# ConsumeQueues


def _check_consume_queues(cfg: StoreConfig, fs: FileSystem, records: dict[int, _Rec], report: VerifyReport) -> None:
    root = os.fspath(cfg.consume_queue_dir)
    read_ledger = _queue_ledger(cfg, fs, report)
    ledger = read_ledger.queues if read_ledger is not None else {}
    cleaned = read_ledger.cleaned if read_ledger is not None else {}
    units: dict[tuple[str, int, int], int] = {}  # (topic, queue, queue offset) -> commitlog offset
    first_offset: dict[tuple[str, int], int] = {}  # the first queue offset still on disk
    unchecked: set[tuple[str, int]] = set()  # queues with a file this process cannot read now
    for topic, queue_id in list_consume_queues(root, fs):
        report.consume_queues += 1
        queue_dir = os.path.join(root, topic, str(queue_id))
        where = f"{topic}/{queue_id}"
        names = sorted(n for n in fs.listdir(queue_dir) if len(n) == 20 and n.isdigit())
        first_offset[(topic, queue_id)] = int(names[0]) // CQ_STORE_UNIT_SIZE if names else 0
        entry = ledger.get((topic, queue_id))
        if entry is not None and names and first_offset[(topic, queue_id)] > entry.first:
            # The records before it are not "cleaned" then: the cleaner has the ledger
            # written again right after it deletes a queue's first files.
            report.add("cq_front_missing", where, f"the first file starts at queue offset "
                       f"{first_offset[(topic, queue_id)]}, the queue ledger says {entry.first}")  # fmt: skip
            first_offset[(topic, queue_id)] = entry.first
        try:
            expected_next: int | None = None
            for queue_offset, phy, size, tags in iter_cq_units(queue_dir, fs):
                if expected_next is not None and queue_offset != expected_next:
                    report.add("cq_gap", where, f"units jump from queue offset {expected_next - 1} to {queue_offset}")
                expected_next = queue_offset + 1
                if is_filler(phy, size):
                    continue
                report.cq_units += 1
                units[(topic, queue_id, queue_offset)] = phy
                here = f"{where} queue offset {queue_offset}"
                if phy < report.min_offset:
                    continue  # its segment was cleaned
                if report.in_unreadable_range(phy):
                    continue  # (reported once, as commitlog_unreadable)
                if phy >= report.max_offset:
                    report.add("cq_past_end", here, f"points at {phy}, the commitlog ends at {report.max_offset}")
                    continue
                rec = records.get(phy)
                if rec is None:
                    if not report.in_damaged_range(phy):
                        report.add("cq_bad_offset", here, f"no record starts at commitlog offset {phy}")
                    continue
                mismatch = [
                    f"{name} {unit!r} != record's {actual!r}"
                    for name, unit, actual in (
                        ("topic", topic, rec.topic),
                        ("queue_id", queue_id, rec.queue_id),
                        ("queue_offset", queue_offset, rec.queue_offset),
                        ("size", size, rec.size),
                        ("tags_code", tags, rec.tags_code),
                    )
                    if unit != actual
                ]
                if mismatch:
                    report.add("cq_mismatch", here, f"unit -> {phy}: " + "; ".join(mismatch))
        except OSError as exc:
            if isinstance(exc, (NotARegularFileError, IsADirectoryError)):
                raise  # something else where the file belongs: named by the command (exit 5)
            # Not readable now (access, the disk): not damage; its records are not checked
            # against it (review 122 F6: a bare PermissionError, no report).
            path = os.fspath(exc.filename) if exc.filename is not None else queue_dir
            report.add_unreadable("cq_unreadable", path, exc, "; the queue was not checked")
            unchecked.add((topic, queue_id))
    for phy, rec in records.items():
        if rec.tran_type in _SKIPPED_TRAN:
            continue
        if not names_a_queue(rec.topic, rec.queue_id):
            # Damage the body CRC does not cover: no queue may hold it (dispatch skips it).
            report.add("commitlog_bad_topic", f"commitlog offset {phy}",
                       f"topic {rec.topic!r} queue {rec.queue_id} cannot name a queue")  # fmt: skip
            continue
        key = (rec.topic, rec.queue_id)
        if key in unchecked:
            continue
        if key not in first_offset and read_ledger is not None and key not in ledger:
            report.not_queued += 1  # a removed topic's (review 51: cq_missing after clean_unused_topic)
            continue
        if key in cleaned and phy < cleaned[key]:
            # The removed queue's, below its floor, of a topic written again since (review 117 L1).
            report.not_queued += 1
            continue
        if key not in first_offset:
            report.add("cq_missing", f"{rec.topic}/{rec.queue_id}", f"no queue for the record at {phy}")
            first_offset[key] = 1 << 62  # report a missing queue once
            continue
        if rec.queue_offset < first_offset[key]:
            continue  # the queue's file holding it was cleaned
        if units.get((rec.topic, rec.queue_id, rec.queue_offset)) != phy:
            report.add("cq_missing", f"{rec.topic}/{rec.queue_id} queue offset {rec.queue_offset}",
                       f"no unit for the record at {phy}")  # fmt: skip


def _queue_ledger(cfg: StoreConfig, fs: FileSystem, report: VerifyReport) -> LedgerFile | None:
    """The queue ledger, read only (an open sets a damaged one aside; verify only says so);
    None without one (a broker's store) or when it cannot be read."""
    path = cfg.queue_ledger_path
    if not fs.exists(path):
        return None
    try:
        return unpack_ledger_file(fs.read_bytes(path))
    except OSError as exc:
        report.add_unreadable("queue_ledger_unreadable", path, exc)
        return None
    except LedgerError as exc:
        report.add("queue_ledger_unreadable", path, str(exc))
        return None


# ---------------------------------------------------------------------------------------------
# Index


def _index_files(cfg: StoreConfig, fs: FileSystem) -> list[str]:
    directory = os.fspath(cfg.index_dir)
    if not fs.isdir(directory):
        return []
    return [os.path.join(directory, n) for n in sorted(fs.listdir(directory)) if len(n) == 17 and n.isdigit()]


def _check_index(cfg: StoreConfig, fs: FileSystem, records: dict[int, _Rec], report: VerifyReport) -> None:
    if not cfg.message_index_enable:
        return
    entries: set[tuple[int, int]] = set()
    covered: list[tuple[int, int]] = []
    ends: dict[str, int] = {}
    for path in _index_files(cfg, fs):
        report.index_files += 1
        try:
            header = read_index_header(fs, path)
            ends[os.path.basename(path)] = header.end_phy_offset
            f = IndexFile.open_readonly(fs, path, max_hash_slot_num=cfg.max_hash_slot_num)
        except OSError as exc:
            report.add_unreadable("index_unreadable", path, exc)
            continue
        except ValueError as exc:
            report.add("index_unreadable", path, str(exc))
            continue
        try:
            if not 0 <= header.index_count <= f.max_index_num:
                report.add("index_bad_header", path, f"index_count {header.index_count} not in [0, {f.max_index_num}]")
                continue
            if header.index_count > 1:
                if header.begin_phy_offset > header.end_phy_offset:
                    report.add("index_bad_header", path,
                               f"beginPhyOffset {header.begin_phy_offset} > endPhyOffset {header.end_phy_offset}")  # fmt: skip
                covered.append((header.begin_phy_offset, header.end_phy_offset))
            for entry in f.iter_entries():
                report.index_entries += 1
                phy = entry.phy_offset
                here = f"{os.path.basename(path)} entry {entry.entry_no}"
                if (phy, entry.key_hash) in entries:
                    rec = records.get(phy)
                    if rec is None or entry.key_hash not in rec.repeated_hashes:
                        report.add("index_duplicate", here,
                                   f"a second entry for commitlog offset {phy} with key hash {entry.key_hash}")  # fmt: skip
                entries.add((phy, entry.key_hash))
                if phy < report.min_offset or report.in_unreadable_range(phy):
                    continue  # expired, or in a segment that could not be read (reported once)
                if phy >= report.max_offset:
                    report.add("index_past_end", here, f"points at {phy}, the commitlog ends at {report.max_offset}")
                    continue
                rec = records.get(phy)
                if rec is None:
                    if report.in_blank_tail(phy):
                        report.stale_index_entries += 1  # into bytes a filled hole lost
                    elif not report.in_damaged_range(phy):
                        report.add("index_bad_offset", here, f"no record starts at commitlog offset {phy}")
                elif entry.key_hash not in rec.key_hashes:
                    report.add("index_wrong_key", here, f"hash {entry.key_hash} is not a key of the record at {phy}")
                if not (0 <= entry.prev_index < entry.entry_no):
                    report.add("index_bad_chain", here, f"prevIndex {entry.prev_index}")
        finally:
            f.close()
    # Review 45 F6: with index/ gone, every record counted as "not indexed" and verify passed.
    progress = None
    if report.max_offset > report.min_offset:
        try:
            progress = peek_index_progress(fs, cfg.index_progress_path, strict=True)
        except OSError as exc:  # (without it a lost index file goes unseen: the check is incomplete)
            report.add_unreadable("index_progress_unreadable", cfg.index_progress_path, exc)
    unread = {os.path.basename(p) for p in report.unreadable_files}
    lost = first_lost_index_file(progress, ends, report.min_offset, unread)
    if lost is not None:
        report.add("index_file_lost", os.path.join(os.fspath(cfg.index_dir), lost[0]),
                   f"{lost[1]}: keys of messages still in the log are not found; an open rebuilds them")  # fmt: skip
    for phy, rec in records.items():
        if not rec.key_hashes or rec.tran_type == codec.TRANSACTION_ROLLBACK_TYPE:
            continue
        if not any(begin <= phy <= end for begin, end in covered):
            report.not_indexed += 1
            continue
        for key_hash in rec.key_hashes:
            if (phy, key_hash) not in entries:
                report.add("index_missing", f"commitlog offset {phy}", f"no index entry with key hash {key_hash}")


def iter_problem_lines(report: VerifyReport) -> Iterator[str]:
    for problem in report.problems:
        yield str(problem)
    if report.problem_count > len(report.problems):
        yield f"... and {report.problem_count - len(report.problems)} more"

