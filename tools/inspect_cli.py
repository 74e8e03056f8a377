"""`mqstore inspect STORE_DIR` and `mqstore stats STORE_DIR`: what a store's files say.

Both only read (never take the lock, never map anything writable), so they are safe on a
running store and on a broker's directory. `inspect` scans the whole CommitLog (with CRCs)
and every ConsumeQueue, checks that they agree, and ends in a verdict:

* healthy: clean shutdown, every record and unit valid;
* running: a live process holds the lock (the files are in flux; problems are still listed,
  the queues and index checked as they were before the log was read);
* needs recovery: the abort file is there (the last run crashed), or the queues disagree with
  the log in a way the next start's recovery repairs (units past the log's end, a torn tail);
* damaged: a segment of the wrong size or missing, a corrupt record with valid data after it,
  a consume queue unit that points at something else than its message;
* unreadable: a segment is there but this process cannot open or map it (no access, an I/O
  error): not damage, and not for `mqstore recover`; what points into it is not checked, so
  the verdict waits for it to be readable (exit 1).

`stats` is the cheap view: segments and bytes, message counts per topic and queue from the
ConsumeQueue offsets, the end of the log from the last segment only, checkpoint times. A
running store also writes its StoreStatsService figures to `stats.msgpack` every
`stats_snapshot_interval_ms` (and at close): on a running store `stats` shows them as live
figures with their age; on a closed one, as the figures of the last run.

Exit codes: 0, 1 when a segment cannot be read, 3 when `inspect` finds the store damaged, 5
when STORE_DIR is missing or holds no store files.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import struct
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Iterable, Sequence

import psutil

from ..cli import CliError, ExitCode, segment_layout, store_config, store_path, unreadable_file
from ..config import StoreConfig
from ..storage.checkpoint import CHECKPOINT_FILE_SIZE, read_checkpoint
from ..storage.codec import CQ_STORE_UNIT_SIZE, CQ_UNIT, RecordKind
from ..storage.commitlog import CommitLogReader, being_created, scan_commitlog_dir
from ..storage.consume_queue import is_filler, iter_cq_units, list_consume_queues
from ..storage.foreign import SUPPORTED, foreign_layout, other_layout_directories, record_feature
from ..storage.fs import RealFileSystem
from ..storage.commitlog import store_copies, store_copy_problem
from ..storage.dry_run import CrashRecoveryVerdict, verdict_of_stopped_store
from ..storage.recovery import commitlog_gone
from ..storage.index_progress import first_lost_index_file, peek_index_progress
from ..storage.index import index_file_size, read_index_header
from ..storage.lockfiles import ABORT_FILE_NAME, LOCK_FILE_NAME
from ..stats import BUCKET_NAMES, SNAPSHOT_FILE_NAME, TPS_WINDOWS_S, disk_allocated_bytes, read_snapshot

__all__ = ["add_subcommands", "inspect_store", "store_file_stats", "lock_state", "snapshot_view"]

HEALTHY: Final = "healthy"
RUNNING: Final = "running"
NEEDS_RECOVERY: Final = "needs recovery"
DAMAGED: Final = "damaged"
# Written with a RocketMQ feature mqstore does not implement (storage.foreign): refused, not damaged.
UNSUPPORTED: Final = "unsupported"
# A segment this process may not read now (review 65 F1: it was called damaged, pointing at
# `mqstore recover` for a permission problem).
UNREADABLE: Final = "unreadable"

# Above this many messages, inspect stops remembering each record to check the queues' units
# against (the counts and ranges are still exact).
MAX_CROSS_CHECKED_MESSAGES: Final = 2_000_000
MAX_PROBLEMS_LISTED: Final = 100
# A live snapshot older than this many intervals is called stale (a stuck ticker, a full disk).
SNAPSHOT_STALE_INTERVALS: Final = 3

_FLOCK: Final = struct.Struct("@hhqqi4x")  # struct flock on 64-bit Linux (as storage.lockfiles)


def _iso(ms: int | None) -> str | None:
    if not ms or ms <= 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


def _digits(name: str, width: int) -> bool:
    return len(name) == width and name.isdigit()


# ---------------------------------------------------------------------------------------------
# lock and abort


def lock_state(root: Path, commitlog_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Is the store held by a live process (ours too: the store takes an OFD lock, which
    conflicts with this process's test)? Its `lock` file's record lock says so; failing that,
    the flock a running store holds on its commitlog directory (`commitlog_dir`, default
    root/commitlog; StoreLock.claim_directories): after someone deleted or replaced `lock` (a
    "stale lock" clean-up), the tools advised `mqstore recover` for a live store (review 53
    L3). Both only ask: F_GETLK takes nothing, and a shared flock is let go at once."""
    lock_path = root / LOCK_FILE_NAME
    state: dict[str, Any] = {
        "lock_file": lock_path.is_file(),
        "held": False,
        "holder_pid": None,
        "abort_file": (root / ABORT_FILE_NAME).exists(),
    }
    if state["lock_file"]:
        _test_lock_file(lock_path, state)
    if state["held"]:
        if state["holder_pid"] is None:
            state["holder_pid"] = _ofd_lock_holder(lock_path) or _process_with_open(lock_path)
        return state
    directory = Path(commitlog_dir) if commitlog_dir is not None else root / "commitlog"
    if _directory_held(directory):
        state["held"] = True
        state["held_through"] = str(directory)
        state["holder_pid"] = _ofd_lock_holder(directory)
    return state


def _test_lock_file(lock_path: Path, state: dict[str, Any]) -> None:
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError as exc:
        state["error"] = f"cannot open {lock_path}: {exc.strerror}"
        return
    try:
        query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        l_type, _whence, _start, _len, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
        if l_type != fcntl.F_UNLCK:
            state["held"] = True
            state["holder_pid"] = pid if pid > 0 else None
    except OSError as exc:
        state["error"] = f"cannot test the lock on {lock_path}: {exc.strerror}"
    finally:
        os.close(fd)


def _directory_held(directory: Path) -> bool:
    """Whether another open file holds an exclusive flock on `directory` (a running store's,
    this process's too): a shared one cannot be had. One had is let go at once."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False  # none there (or not a directory): nothing holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)  # (no flock here: nothing to say)
    finally:
        os.close(fd)  # drops the shared lock if it was had
    return False


def _process_with_open(path: Path) -> int | None:
    """The process that has the lock file open (an OFD lock has no owner pid to report)."""
    real = os.path.realpath(path)
    for proc in psutil.process_iter(["pid"]):
        try:
            if any(f.path == real for f in proc.open_files()):
                return int(proc.info["pid"])
        except (psutil.Error, OSError):
            continue
    return None


def _ofd_lock_holder(path: Path) -> int | None:
    """An OFD lock reports pid -1 to F_GETLK; /proc/locks names the process that took it."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        if "->" in parts:
            continue  # a blocked waiter, not the holder
        if len(parts) >= 8 and parts[5].lower() == wanted.lower():
            try:
                pid = int(parts[4])
            except ValueError:
                continue
            if pid > 0:
                return pid
    return None


# ---------------------------------------------------------------------------------------------
# the commitlog


def _segment_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _digits(p.name, 20) and p.is_file())


def _problem(kind: str, severity: str, message: str, **where: Any) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "message": message, **where}


def _inspect_commitlog(
    directory: Path, *, max_message_size: int, check_crc: bool, abort: bool, segment_size: int | None = None,
    live: bool = False, torn_from: int | None = None,
) -> tuple[dict[str, Any], dict[int, tuple[str, int, int, int]] | None, list[dict[str, Any]]]:
    """Segments with their records; a map offset -> (topic, queue, queue offset, size) of
    every message (None when there are too many to remember); the problems found. `live`: a
    running store writes the directory; its newest segment may be one being made.
    `torn_from`: after a crash, where the next open's recovery cuts the log (its dry run,
    storage/dry_run.py); a corrupt record from there is the torn tail, one before it damage."""
    problems: list[dict[str, Any]] = []
    out: dict[str, Any] = {"dir": str(directory), "segment_size": None, "segments": [], "min_offset": -1,
                           "max_offset": -1, "records_reach": -1, "messages": 0, "bytes": 0,
                           "topics": {}}  # fmt: skip
    if not directory.is_dir():
        return out, {}, problems
    files, segment_size = segment_layout(directory, segment_size)
    if not files:
        return out, {}, problems
    if segment_size == 0 and live and len(files) == 1:
        return out, {}, problems  # a new store's first segment, being made
    if segment_size == 0:  # a lone segment, emptied (or not a file): no RocketMQ store has one
        problems.append(_problem("segment_size", DAMAGED, f"{files[0]} holds no bytes: a commitlog segment is never "
                                 "empty", file=str(files[0]), commitlog_offset=int(files[0].name)))  # fmt: skip
        return out, {}, problems
    out["segment_size"] = segment_size
    out["min_offset"] = int(files[0].name)
    segments: dict[int, dict[str, Any]] = {}
    for k, path in enumerate(files):
        start = int(path.name)
        regular = path.is_file()
        if not regular:  # (the scan reports it as a segment it cannot read, below)
            problems.append(_problem("segment_not_a_file", DAMAGED, f"{path} is in the way: a commitlog segment file "
                                     "belongs there", file=str(path), commitlog_offset=start))  # fmt: skip
        size = path.stat().st_size if regular else 0
        allocated, _ = disk_allocated_bytes_of(path) if regular else (0, 0)
        seg: dict[str, Any] = {"file": path.name, "path": str(path), "start_offset": start, "size": size, "allocated_bytes": allocated,
               "messages": 0, "used_bytes": 0, "end": None}  # fmt: skip
        segments[start] = seg
        out["segments"].append(seg)
        expected = out["min_offset"] + k * segment_size
        if start != expected:
            problems.append(_problem("segment_gap", DAMAGED, f"{path}: expected a segment starting at {expected}",
                                     file=str(path), commitlog_offset=expected))  # fmt: skip
    starts = sorted(segments)
    remembered: dict[int, tuple[str, int, int, int]] | None = {}
    topics: dict[str, dict[str, int]] = defaultdict(lambda: {"messages": 0, "bytes": 0})
    corrupt: list[tuple[int, int, str]] = []  # (segment start, offset, reason)
    last_data_end = out["min_offset"]
    reach = last_data_end  # the records' end, or past a blank record that ends their segment
    first_zeros: int | None = None  # where zeros first stand for a record (a segment's data ends)
    out["foreign_record"] = None  # (offset, topic, feature) of the first record mqstore does not implement
    message_after_zeros: int | None = None  # the first record read after them
    data_after_end: list[int] = []
    ended_in: int | None = None
    unreadable: list[tuple[int, int]] = []  # [start, end) of segments that could not be read

    def cannot_read(path: str, error: OSError) -> None:
        start = int(os.path.basename(path))
        if start in segments:
            segments[start]["end"] = "unreadable"
        unreadable.append((start, start + segment_size))
        problems.append(_problem("segment_unreadable", UNREADABLE, f"{unreadable_file(path, error)}; what points "
                                 "into it was not checked", file=path, commitlog_offset=start,
                                 errno=errno.errorcode.get(error.errno or 0)))  # fmt: skip

    for read in scan_commitlog_dir(str(directory), check_crc=check_crc, read_body=check_crc, segment_size=segment_size,
                                   max_message_size=max_message_size, live=live, on_unreadable=cannot_read):  # fmt: skip
        seg_start = read.offset - read.offset % segment_size if segment_size else 0
        seg = segments.get(seg_start) or segments[max(s for s in starts if s <= read.offset)]
        if read.kind is RecordKind.MESSAGE and read.record is not None and read.record.commitlog_offset != read.offset:
            # Recovery's validity rule whole, as get and verify apply it: the record's own
            # physical-offset field (outside the body CRC) says where it lies (review 99 N2).
            corrupt.append((seg_start, read.offset, f"record says it is at {read.record.commitlog_offset}"))
            continue
        if read.kind is RecordKind.MESSAGE:
            assert read.record is not None
            rec = read.record
            if ended_in is not None:
                data_after_end.append(read.offset)
            seg["messages"] += 1
            seg["used_bytes"] += read.size
            topics[rec.topic]["messages"] += 1
            topics[rec.topic]["bytes"] += read.size
            out["messages"] += 1
            out["bytes"] += read.size
            last_data_end = read.offset + read.size
            reach = max(reach, last_data_end)
            if first_zeros is not None and message_after_zeros is None:
                message_after_zeros = read.offset
            if out["foreign_record"] is None and (feature := record_feature(rec.sys_flag, rec.properties, rec.topic)) is not None:
                out["foreign_record"] = (read.offset, rec.topic, feature)  # the first is named (see inspect_store)
            if remembered is not None:
                if len(remembered) >= MAX_CROSS_CHECKED_MESSAGES:
                    remembered = None
                else:
                    remembered[read.offset] = (rec.topic, rec.queue_id, rec.queue_offset, read.size)
        elif read.kind is RecordKind.BLANK:
            seg["end"] = "blank"
            seg["used_bytes"] = read.offset - seg["start_offset"]
            if read.offset >= reach:
                reach = seg["start_offset"] + segment_size
        elif read.kind is RecordKind.END_OF_DATA:
            if first_zeros is None:
                first_zeros = read.offset
            seg["end"] = "end_of_data"
            seg["used_bytes"] = read.offset - seg["start_offset"]
            if ended_in is None:
                ended_in = seg["start_offset"]
        else:
            seg["end"] = "corrupt"
            corrupt.append((seg["start_offset"], read.offset, read.reason))
            if ended_in is None:
                ended_in = seg["start_offset"]
    for seg in segments.values():
        if seg["end"] is None and seg["used_bytes"] == segment_size:
            seg["end"] = "full"  # records to its last byte (no blank record): the log goes on in the next file
    out["max_offset"] = last_data_end
    out["records_reach"] = reach
    out["first_zeros"] = first_zeros  # (not in the report's JSON; see inspect_store)
    out["unreadable"] = unreadable  # (likewise)
    out["message_after_zeros"] = message_after_zeros
    tail_corrupt = [offset for _, offset, _ in corrupt if offset >= last_data_end]
    out["tail_corrupt"] = min(tail_corrupt) if tail_corrupt else None
    out["topics"] = {t: topics[t] for t in sorted(topics)}
    for seg_start, offset, reason in corrupt:
        path = directory / segments[seg_start]["file"]
        position = offset - seg_start
        tail = offset >= (last_data_end if torn_from is None else torn_from)
        if "expected" in reason and "bytes" in reason and position == 0:
            problems.append(_problem("segment_size", DAMAGED, f"{path}: {reason}", file=str(path), file_position=0,
                                     commitlog_offset=offset))  # fmt: skip
            continue
        severity = NEEDS_RECOVERY if tail and abort else DAMAGED
        what = "torn record at the end of the log (recovery truncates it)" if severity == NEEDS_RECOVERY else "corrupt record"
        problems.append(_problem("corrupt_record", severity,
                                 f"{what} in {path} at file position {position} (commitlog offset {offset}): {reason}",
                                 file=str(path), file_position=position, commitlog_offset=offset, reason=reason))  # fmt: skip
    cut = [offset for offset in data_after_end if torn_from is not None and offset >= torn_from]
    if cut:  # (the next open's recovery drops them with the torn tail before them)
        problems.append(_problem("data_after_end", NEEDS_RECOVERY,
                                 f"{len(cut)} records after the torn tail at commitlog offset {torn_from}, first at "
                                 f"{cut[0]}: recovery cuts them with it", commitlog_offset=cut[0]))  # fmt: skip
    if data_after_end := [offset for offset in data_after_end if offset not in cut]:
        first = data_after_end[0]
        problems.append(_problem("data_after_end", DAMAGED,
                                 f"{len(data_after_end)} records after the end of the log, first at commitlog offset {first}",
                                 commitlog_offset=first))  # fmt: skip
    return out, remembered, problems


def disk_allocated_bytes_of(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_blocks * 512, st.st_size


# ---------------------------------------------------------------------------------------------
# consume queues


def _inspect_consume_queues(
    root: Path,
    *,
    commitlog_min: int,
    commitlog_max: int,
    remembered: dict[int, tuple[str, int, int, int]] | None,
    full: bool,
    live: bool = False,
    written_before: dict[tuple[str, int], int] | None = None,
    unreadable: Sequence[tuple[int, int]] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each queue's figures and the problems of its units. `written_before`: each queue's end
    (next queue offset) as read before the log was (`_queue_ends`): a unit at or past it was
    written after, for a record the log's reading may have ended before (a running store).
    `unreadable`: commitlog ranges that could not be read; units into them are not checked."""
    fs = RealFileSystem()
    cq_root = root / "consumequeue"
    queues: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    for topic, queue_id in list_consume_queues(str(cq_root), fs):
        qdir = cq_root / topic / str(queue_id)
        present = _present_segments(_segment_files(qdir))
        files = [p for p, _ in present]
        info: dict[str, Any] = {"topic": topic, "queue_id": queue_id, "files": len(files),
                                "bytes": sum(size for _, size in present), "min_offset": 0, "max_offset": 0,
                                "messages": 0, "min_commitlog_offset": None, "max_commitlog_offset": None}  # fmt: skip
        queues.append(info)
        for p in sorted(qdir.iterdir()):
            if _digits(p.name, 20) and not p.is_file():  # a directory, FIFO or dangling link: "0 files" said nothing
                problems.append(_problem("cq_not_a_file", DAMAGED, f"{p} is in the way: a ConsumeQueue file belongs "
                                         "there", file=str(p), topic=topic, queue_id=queue_id))  # fmt: skip
        if not files:
            continue
        file_size = present[0][1]
        for p, size in present:
            if live and being_created(p.name, files[-1].name, size, file_size):
                continue  # a running store's next file, being made (review 53 L1)
            if size != file_size or file_size % CQ_STORE_UNIT_SIZE:
                problems.append(_problem("cq_file_size", DAMAGED, f"{p}: {size} bytes, expected {file_size}"
                                         " (a multiple of 20)", file=str(p)))  # fmt: skip
        if full:
            units: Iterable[tuple[int, int, int, int]] = iter_cq_units(str(qdir), fs)
        else:
            units = _edge_units(files, commitlog_min)
        first_q = last_q = only_fillers_to = None
        real = 0
        past_end = 0
        mismatches: list[tuple[int, int]] = []
        for q_off, phy, size, _tags in units:
            if is_filler(phy, size):
                # A lost record's queue offset: it counts in the queue's end, but it is no
                # message and never the queue's first (the store's min offset is its first
                # real unit: review 110 F5).
                if first_q is not None:
                    last_q = q_off
                else:
                    only_fillers_to = q_off
                continue
            if phy < commitlog_min:
                continue  # below the log's min offset: the message was cleaned (correctMinOffset)
            if first_q is None:
                first_q = q_off
                info["min_commitlog_offset"] = phy
            last_q = q_off
            real += 1
            info["max_commitlog_offset"] = phy
            if unreadable and any(start <= phy < end for start, end in unreadable):
                pass  # its record could not be read (the segment is reported once)
            elif phy + size > commitlog_max:
                if written_before is None or q_off < written_before.get((topic, queue_id), 0):
                    past_end += 1
            elif remembered is not None and full:
                seen = remembered.get(phy)
                if seen is None or seen[0] != topic or seen[1] != queue_id or seen[2] != q_off or seen[3] != size:
                    mismatches.append((q_off, phy))
        if first_q is not None and last_q is not None:
            info["min_offset"], info["max_offset"] = first_q, last_q + 1
            # Read whole, the real units; from the edge units only (`stats`), every offset
            # between them (a filler inside counts).
            info["messages"] = real if full else last_q + 1 - first_q
        elif only_fillers_to is not None:  # no message: the queue goes on after its fillers
            info["min_offset"] = info["max_offset"] = only_fillers_to + 1
        elif files:
            info["min_offset"] = info["max_offset"] = int(files[-1].name) // CQ_STORE_UNIT_SIZE
        if past_end:
            problems.append(_problem("cq_past_log_end", NEEDS_RECOVERY,
                                     f"{topic}/{queue_id}: {past_end} units point past the commitlog's end {commitlog_max}"
                                     " (recovery truncates them)", topic=topic, queue_id=queue_id))  # fmt: skip
        if mismatches:
            q_off, phy = mismatches[0]
            problems.append(_problem("cq_unit_mismatch", DAMAGED,
                                     f"{topic}/{queue_id}: {len(mismatches)} units do not point at their message, first at "
                                     f"queue offset {q_off} (commitlog offset {phy})",
                                     topic=topic, queue_id=queue_id, queue_offset=q_off, commitlog_offset=phy))  # fmt: skip
    return queues, problems


def _queue_ends(root: Path) -> dict[tuple[str, int], int]:
    """Each queue's end (its last valid unit's queue offset + 1) as its files say now."""
    ends: dict[tuple[str, int], int] = {}
    cq_root = root / "consumequeue"
    for topic, queue_id in list_consume_queues(str(cq_root), RealFileSystem()):
        files = [p for p, _ in _present_segments(_segment_files(cq_root / topic / str(queue_id)))]
        ends[(topic, queue_id)] = max((q_off + 1 for q_off, _, _, _ in _edge_units(files)), default=0)
    return ends


def _edge_units(files: list[Path], commitlog_min: int = 0) -> Iterable[tuple[int, int, int, int]]:
    """The queue's first message (the first file's first unit that is no filler and points at
    or past `commitlog_min`, as the store's min offset) and the queue's last valid unit, without
    reading the files in between (for `stats`)."""
    unpack = CQ_UNIT.unpack_from
    datas: dict[Path, bytes] = {}
    for path in files:  # the head ones may go meanwhile (a running store's cleaner): read from the first left
        try:
            datas[path] = path.read_bytes()
            break
        except FileNotFoundError:
            continue
    if not datas:
        return
    first, data = next(iter(datas.items()))
    for at in range(0, len(data) - CQ_STORE_UNIT_SIZE + 1, CQ_STORE_UNIT_SIZE):
        phy, size, tags = unpack(data, at)
        if phy < 0 or size <= 0:
            break  # the file's units end
        if phy >= commitlog_min and not is_filler(phy, size):
            yield (int(first.name) + at) // CQ_STORE_UNIT_SIZE, phy, size, tags
            break
    for path in reversed(files[files.index(first):]):
        data = datas[first] if path == first else path.read_bytes()
        n = len(data) // CQ_STORE_UNIT_SIZE
        lo, hi = 0, n  # units are written in order: find the first invalid one by bisection
        while lo < hi:
            mid = (lo + hi) // 2
            phy, size, _ = unpack(data, mid * CQ_STORE_UNIT_SIZE)
            if phy >= 0 and size > 0:
                lo = mid + 1
            else:
                hi = mid
        if lo > 0:
            phy, size, tags = unpack(data, (lo - 1) * CQ_STORE_UNIT_SIZE)
            yield (int(path.name) + (lo - 1) * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE, phy, size, tags
            return


# ---------------------------------------------------------------------------------------------
# index files and checkpoint


def _index_ends(config: StoreConfig) -> dict[str, int]:
    """Each index file's last entry's commitlog offset as its header says now (by file name)."""
    directory = Path(config.index_dir)
    ends: dict[str, int] = {}
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if _digits(path.name, 17):
            with contextlib.suppress(ValueError, OSError):  # (one being made, or just deleted)
                ends[path.name] = read_index_header(RealFileSystem(), str(path)).end_phy_offset
    return ends


def _inspect_index(
    root: Path, config: StoreConfig, commitlog_max: int, commitlog_min: int, live: bool = False,
    ends_before: dict[str, int] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The index files and their problems. `ends_before`: their ends as read before the log
    was (`_index_ends`): only those are checked against the log's end (a running store)."""
    fs = RealFileSystem()
    directory = Path(config.index_dir)
    files: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    # Review 45 F6: with index/ gone, inspect said healthy while the index progress listed its
    # files (their messages still in the log): queries miss those keys until an open rebuilds.
    names = sorted(p.name for p in directory.iterdir() if _digits(p.name, 17) and p.is_file()) if directory.is_dir() else []
    ends: dict[str, int] = {}
    unread: set[str] = set()  # there, but not readable now: not lost (reported below)
    for name in names:
        try:
            ends[name] = read_index_header(fs, str(directory / name)).end_phy_offset
        except OSError:
            unread.add(name)
        except ValueError:
            pass
    progress = None
    if commitlog_min >= 0:  # (no log: none)
        try:
            progress = peek_index_progress(fs, config.index_progress_path, strict=True)
        except OSError as exc:  # (without it a lost index file goes unseen)
            problems.append(_problem("index_progress_unreadable", UNREADABLE, unreadable_file(config.index_progress_path, exc),
                                     file=str(config.index_progress_path), errno=errno.errorcode.get(exc.errno or 0)))  # fmt: skip
    lost = first_lost_index_file(progress, ends, commitlog_min, unread)
    if lost is not None:
        problems.append(_problem("index_file_lost", NEEDS_RECOVERY, f"index file {lost[0]} {lost[1]}: keys of messages "
                                 "still in the log are not found until the next open rebuilds it",
                                 file=str(directory / lost[0])))  # fmt: skip
    if not directory.is_dir():
        return files, problems
    expected = index_file_size(config.max_hash_slot_num, config.max_index_num)
    for path in sorted(p for p in directory.iterdir() if _digits(p.name, 17) and p.is_file()):
        size = path.stat().st_size
        if live and being_created(path.name, names[-1], size, expected):
            continue  # a running store's next file, being made (review 53 L1)
        try:
            h = read_index_header(fs, str(path))
        except OSError as exc:
            # Not damage: this user (or the disk) cannot read it now (review 122 F5: exit 3).
            problems.append(_problem("index_unreadable", UNREADABLE, unreadable_file(path, exc), file=str(path),
                                     errno=errno.errorcode.get(exc.errno or 0)))  # fmt: skip
            files.append({"file": path.name, "size": size, "error": str(exc)})
            continue
        except ValueError as exc:
            problems.append(_problem("index_header", DAMAGED, f"{path}: {exc}", file=str(path)))
            files.append({"file": path.name, "size": size, "error": str(exc)})
            continue
        # The capacity is the geometry's (adopted from the files), never the header's hash-slot
        # count: 4.4.0 writes index count - 1 there, so a full file looked over-full.
        capacity = config.max_index_num if size == expected else 0
        entries = max(h.index_count - 1, 0)
        files.append({
            "file": path.name, "size": size, "entries": entries,
            "begin_timestamp": h.begin_timestamp, "end_timestamp": h.end_timestamp,
            "begin_time": _iso(h.begin_timestamp), "end_time": _iso(h.end_timestamp),
            "begin_phy_offset": h.begin_phy_offset, "end_phy_offset": h.end_phy_offset,
            "hash_slot_count": h.hash_slot_count, "full": capacity > 0 and h.index_count >= capacity,
        })  # fmt: skip
        if size != expected:
            problems.append(_problem("index_size", DAMAGED, f"{path}: {size} bytes, the other index files' size is "
                                     f"{expected}", file=str(path)))  # fmt: skip
        elif h.index_count > capacity or h.index_count < 0:
            problems.append(_problem("index_count", DAMAGED, f"{path}: index_count {h.index_count} exceeds the file's "
                                     f"{capacity} entries", file=str(path), file_position=36))  # fmt: skip
        end_phy = h.end_phy_offset if ends_before is None else ends_before.get(path.name, -1)
        if commitlog_max >= 0 and end_phy > commitlog_max:
            problems.append(_problem("index_past_log_end", "warning", f"{path}: entries up to commitlog offset "
                                     f"{h.end_phy_offset}, past the log's end {commitlog_max} (harmless, §11.7)",
                                     file=str(path)))  # fmt: skip
    return files, problems


def _inspect_checkpoint(root: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    path = root / "checkpoint"
    if not path.is_file():
        return None, []
    problems: list[dict[str, Any]] = []
    size = path.stat().st_size
    if size != CHECKPOINT_FILE_SIZE:
        problems.append(_problem("checkpoint_size", "warning", f"{path}: {size} bytes, expected {CHECKPOINT_FILE_SIZE}",
                                 file=str(path)))  # fmt: skip
    v = read_checkpoint(RealFileSystem(), str(path))
    out = {
        "file_size": size,
        "physic_msg_timestamp": v.physic_msg_timestamp, "physic_msg_time": _iso(v.physic_msg_timestamp),
        "logics_msg_timestamp": v.logics_msg_timestamp, "logics_msg_time": _iso(v.logics_msg_timestamp),
        "index_msg_timestamp": v.index_msg_timestamp, "index_msg_time": _iso(v.index_msg_timestamp),
        "min_timestamp": v.min_timestamp(), "min_timestamp_index": v.min_timestamp_index(),
        "master_flushed_offset": v.master_flushed_offset, "confirm_phy_offset": v.confirm_phy_offset,
        "physic_flushed_offset": v.physic_flushed_offset,
    }  # fmt: skip
    return out, problems


# ---------------------------------------------------------------------------------------------
# the two reports


def _check_store_dir(root: Path) -> None:
    if not root.exists():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} does not exist")
    if not root.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} is not a directory")
    markers = ("commitlog", "consumequeue", "index", "checkpoint", LOCK_FILE_NAME, ABORT_FILE_NAME)
    if not any((root / m).exists() for m in markers):
        raise CliError(ExitCode.NOT_A_STORE, f"{root} is not a store (no commitlog/, consumequeue/, index/ or checkpoint)")


def _refuse_what_the_open_refuses(config: StoreConfig) -> None:
    """StoreDirectoryError (exit 5), as the open says it, for something other than a regular
    file where the store keeps one of its files (its checkpoint, lock, abort marker, queue
    ledger, index progress, consumer offsets), or a file where one of its directories belongs:
    the open refuses such a store, and `inspect` called it HEALTHY (review 103 L4). The open's
    own checks, which read and change nothing."""
    from ..offsets import ConsumerOffsets
    from ..supervisor import refuse_odd_files

    fs = RealFileSystem()
    refuse_odd_files(fs, config)
    ConsumerOffsets(fs, config.store_path_root_dir).refuse_what_is_in_the_way()


def _verdict(lock: dict[str, Any], problems: list[dict[str, Any]]) -> str:
    severities = {p["severity"] for p in problems}
    if lock["held"]:
        return RUNNING
    if UNSUPPORTED in severities:
        return UNSUPPORTED
    if UNREADABLE in severities:  # (the checks are incomplete: the rest may be its consequence)
        return UNREADABLE
    if DAMAGED in severities:
        return DAMAGED
    if lock["abort_file"] or NEEDS_RECOVERY in severities:
        return NEEDS_RECOVERY
    return HEALTHY


def inspect_store(root: Path, config: StoreConfig, *, check_crc: bool = True) -> dict[str, Any]:
    """The whole report of `mqstore inspect` as a dict (what --json prints)."""
    _check_store_dir(root)
    _refuse_what_the_open_refuses(config)
    lock = lock_state(root, config.commitlog_dir)
    # A running store's queues and index go on while the log is read: what they held before
    # is what is checked against the log's end (review 53 L2: units and index entries of
    # records appended meanwhile were listed past the end, "needs recovery").
    queue_ends = _queue_ends(root) if lock["held"] else None
    index_ends = _index_ends(config) if lock["held"] else None
    # Read before the log: the flushed offset of a running store moves on during the scan.
    checkpoint, cp_problems = _inspect_checkpoint(root)
    commitlog_dir = Path(config.commitlog_dir)
    # After a crash, what is a torn tail is asked of recovery itself (review 97 L1: a tear it cuts
    # by its bytes, with records after it, was called damaged).
    verdict = verdict_of_stopped_store(config) if lock["abort_file"] and not lock["held"] else None
    commitlog, remembered, problems = _inspect_commitlog(
        commitlog_dir, max_message_size=config.max_stored_record_bytes, check_crc=check_crc, abort=lock["abort_file"],
        segment_size=config.mapped_file_size_commitlog_bytes, live=lock["held"],
        torn_from=verdict.torn_from if isinstance(verdict, CrashRecoveryVerdict) else None,
    )
    unreadable = commitlog.pop("unreadable", [])
    if isinstance(verdict, CrashRecoveryVerdict):
        # What recovery quarantines is damage, also where this scan, which stops at a segment's
        # first zeros, did not see it (review 99: a zeroed header with valid records after it
        # in its segment, under a broker's checkpoint, was "needs recovery").
        seen = {p.get("commitlog_offset") for p in problems if p["kind"] == "corrupt_record"}
        for quarantined in verdict.quarantined:
            if quarantined.start not in seen:
                problems.append(_problem("corrupt_record", DAMAGED, f"damaged bytes at commitlog offset "
                                         f"{quarantined.start} up to {quarantined.end}, with valid records after them: "
                                         f"{quarantined.reason} (recovery quarantines them)",
                                         commitlog_offset=quarantined.start, reason=quarantined.reason))  # fmt: skip
    # Units and index entries into what recovery cuts are cut with it (needs recovery, not damage).
    log_end = commitlog["max_offset"] if not isinstance(verdict, CrashRecoveryVerdict) else \
        min(commitlog["max_offset"], verdict.torn_from)  # fmt: skip
    queues, cq_problems = _inspect_consume_queues(
        root, commitlog_min=commitlog["min_offset"], commitlog_max=log_end, remembered=remembered, full=True,
        live=lock["held"], written_before=queue_ends, unreadable=unreadable,
    )
    gone = commitlog_gone(config, RealFileSystem())
    if gone is not None:
        # Not a log to recover: one away, or looked for in the wrong place (review 35 F6). The
        # units "past its end" are every unit; recovery refuses rather than truncate them.
        problems.append(_problem("commitlog_gone", DAMAGED, f"the commitlog directory {commitlog_dir} holds no segment, "
                                 f"but {gone}: the open and `mqstore recover` refuse it (a mount not up? "
                                 "store_path_commitlog as when it was written?)"))  # fmt: skip
        cq_problems = [p for p in cq_problems if p["kind"] != "cq_past_log_end"]
    for name in store_copies(RealFileSystem(), str(commitlog_dir)):
        problems.append(_problem("store_copy", DAMAGED, f"{store_copy_problem(name)}; the open and `mqstore recover` "
                                 "refuse until then", file=name))  # fmt: skip
    flushed = checkpoint["physic_flushed_offset"] if checkpoint is not None else None
    # Where recovery finds the records end below the flushed offset (storage.recovery): zeros
    # with no record after them below it (later segments may hold records: they stay out of the
    # log), a corrupt record with no record after it at all, or segments missing at the end.
    below: list[int] = []
    zeros, after_zeros = commitlog.pop("first_zeros", None), commitlog.pop("message_after_zeros", None)
    tail_corrupt = commitlog.pop("tail_corrupt", None)
    if flushed is not None:
        if zeros is not None and zeros < flushed and (after_zeros is None or after_zeros >= flushed):
            below.append(zeros)
        if tail_corrupt is not None and tail_corrupt < flushed:
            below.append(tail_corrupt)
        if flushed > commitlog["records_reach"]:
            below.append(commitlog["records_reach"])
        if unreadable and commitlog["segment_size"]:
            # Where the records end is not known at or before a segment that could not be read.
            size = commitlog["segment_size"]
            below = [at for at in below if not any(start >= at - at % size for start, _ in unreadable)]
    if gone is None and below and commitlog["segment_size"]:
        records_end = min(below)
        # Durable records gone (mqstore's flushed offset; a broker's checkpoint has none): the
        # open keeps the units into them and refuses puts; it does not truncate (storage.recovery).
        problems.append(_problem("commitlog_below_flushed", DAMAGED,
                                 f"the commitlog's records end at {records_end}, below {flushed} where "
                                 "the checkpoint says it was flushed: records made durable are not in the files, or "
                                 "not whole (a segment replaced by an older copy of itself, cut short or deleted, or "
                                 "a damaged record). The open serves what is there and refuses puts until the segment "
                                 "is back, or `mqstore recover` gives up the rest", commitlog_offset=records_end))  # fmt: skip
        cq_problems = [p for p in cq_problems if p["kind"] != "cq_past_log_end"]
    problems += cq_problems
    index, index_problems = _inspect_index(root, config, log_end, commitlog["min_offset"], lock["held"],
                                           index_ends)  # fmt: skip
    problems += index_problems
    problems += cp_problems
    if lock["abort_file"] and not lock["held"]:
        problems.append(_problem("abort_file", NEEDS_RECOVERY, "the abort file is present: the last run did not stop "
                                 "cleanly; the next start recovers abnormally"))  # fmt: skip
    # Features mqstore does not implement (storage.foreign): the open, `recover` and the other
    # commands refuse such a store; its "damage" may be the feature misread (review 61 L2).
    unsupported = foreign_layout(config, RealFileSystem())
    foreign_record = commitlog.pop("foreign_record", None)
    if foreign_record is not None:
        offset, topic, feature = foreign_record
        unsupported.append(f"the commitlog record at offset {offset} (topic {topic!r}) is {feature}")
    problems[:0] = [_problem("unsupported_feature", UNSUPPORTED, f"{line}. {SUPPORTED}") for line in unsupported]
    dispatched_to = max((q["max_commitlog_offset"] or 0) for q in queues) if queues else None
    verdict = _verdict(lock, problems)
    return {
        "store_dir": str(root),
        "verdict": verdict,
        "lock": lock,
        "commitlog": commitlog,
        "consume_queues": queues,
        "index": index,
        "checkpoint": checkpoint,
        "config_files": sorted(p.name for p in (root / "config").iterdir()) if (root / "config").is_dir() else [],
        "other_layout_directories": other_layout_directories(config, RealFileSystem()),
        "dispatched_to_commitlog_offset": dispatched_to,
        "problems": problems[:MAX_PROBLEMS_LISTED],
        "problem_count": len(problems),
    }


def _last_data_segment(files: list[Path]) -> Path | None:
    for path in reversed(files):
        try:
            with open(path, "rb") as f:
                head = f.read(8)
        except FileNotFoundError:
            if not os.path.lexists(path):  # removed since the listing (a running store's cleaner)
                continue
            raise
        if head.strip(b"\0"):
            return path
    return None


def _present_segments(files: list[Path]) -> list[tuple[Path, int]]:
    """The listed segments still there, with their sizes: a running store's cleaner removes
    the log's head while a command reads (review 53 M2: `stats` failed on FileNotFoundError)."""
    present = []
    for path in files:
        try:
            present.append((path, path.stat().st_size))
        except FileNotFoundError:
            if os.path.lexists(path):  # a symbolic link to nothing: damage, said as before
                raise
    return present


def store_file_stats(root: Path, config: StoreConfig) -> dict[str, Any]:
    """`mqstore stats`: the cheap figures, without scanning the whole log."""
    _check_store_dir(root)
    lock = lock_state(root, config.commitlog_dir)
    present = _present_segments(_segment_files(Path(config.commitlog_dir)))
    files = [path for path, _ in present]
    segment_size = present[0][1] if present else None
    min_offset = int(files[0].name) if files else -1
    max_offset = min_offset
    last = _last_data_segment(files)
    if last is not None and segment_size is not None:
        seg_size = segment_size
        start = int(last.name)
        reader = CommitLogReader(RealFileSystem(), config.commitlog_dir, mapped_file_size=seg_size,
                                 max_message_size=config.max_message_size_bytes, limit=start + seg_size)  # fmt: skip
        try:
            max_offset = start
            for read in reader.iter_records(start, start + seg_size, read_body=False):
                if read.kind is RecordKind.MESSAGE:
                    max_offset = read.offset + read.size
                elif read.kind is RecordKind.BLANK:
                    max_offset = read.offset  # where RocketMQ's recovery leaves the end (§11.5)
                    break
        finally:
            reader.close()
    queues, _ = _inspect_consume_queues(root, commitlog_min=min_offset, commitlog_max=2**62, remembered=None, full=False)
    topics: dict[str, dict[str, int]] = {}
    for q in queues:
        t = topics.setdefault(q["topic"], {"queues": 0, "messages": 0})
        t["queues"] += 1
        t["messages"] += q["messages"]
    checkpoint, _ = _inspect_checkpoint(root)
    allocated, apparent = disk_allocated_bytes(root)
    index_dir = Path(config.index_dir)
    return {
        "store_dir": str(root),
        "running": lock["held"],
        "lock": lock,
        "commitlog": {
            "segments": len(files),
            "segment_size": segment_size,
            "min_offset": min_offset,
            "max_offset": max_offset,
            "data_bytes": max(max_offset - min_offset, 0),
        },
        "topics": topics,
        "queues": [{k: q[k] for k in ("topic", "queue_id", "min_offset", "max_offset", "messages")} for q in queues],
        "messages": sum(t["messages"] for t in topics.values()),
        "index_files": len([p for p in index_dir.iterdir() if _digits(p.name, 17)]) if index_dir.is_dir() else 0,
        "checkpoint": checkpoint,
        "disk": {"allocated_bytes": allocated, "apparent_bytes": apparent},
        "snapshot": snapshot_view(root, lock),
    }


def snapshot_view(root: Path, lock: dict[str, Any], now_ms: int | None = None) -> dict[str, Any] | None:
    """The store's stats.msgpack with where it comes from: "live" when the process holding the
    lock wrote it during this run, else "last run"; its age in ms (None if there is none)."""
    try:
        document = read_snapshot(root)
    except (ValueError, OSError) as exc:
        return {"source": None, "error": str(exc)}
    if document is None:
        return None
    now = int(datetime.now(timezone.utc).timestamp() * 1000) if now_ms is None else now_ms
    pid = document.get("pid")
    live = bool(lock["held"]) and not document.get("final") and lock.get("holder_pid") in (None, pid)
    age_ms = max(now - int(document.get("timestamp_ms", 0)), 0)
    interval = int(document.get("interval_ms") or 0)
    return {
        "source": "live" if live else "last run",
        "file": str(root / SNAPSHOT_FILE_NAME),
        "age_ms": age_ms,
        "written_at": _iso(document.get("timestamp_ms")),
        "stale": live and interval > 0 and age_ms > SNAPSHOT_STALE_INTERVALS * interval,
        **document,
    }


# ---------------------------------------------------------------------------------------------
# printing


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def _lock_line(lock: dict[str, Any]) -> str:
    if lock["held"]:
        who = f"pid {lock['holder_pid']}" if lock["holder_pid"] else "a live process"
        if lock.get("held_through"):
            return (f"held by {who} through {lock['held_through']} (the store is running; its lock file was deleted or "
                    "replaced)")  # fmt: skip
        return f"held by {who} (the store is running)"
    return "free" if lock["lock_file"] else "no lock file"


def _print_inspect(report: dict[str, Any], out: Any) -> None:
    w = out.write
    cl = report["commitlog"]
    w(f"store {report['store_dir']}: {report['verdict'].upper()}\n")
    w(f"  lock: {_lock_line(report['lock'])}; abort file: {'present' if report['lock']['abort_file'] else 'absent'}\n")
    if report["lock"]["held"]:
        w("  note: a running store owns these files; what follows is what the files say right now\n")
    w(f"\ncommitlog {cl['dir']}: {len(cl['segments'])} segments of {_size(cl['segment_size'])}, offsets "
      f"{cl['min_offset']} .. {cl['max_offset']}, {cl['messages']} messages, {_size(cl['bytes'])}\n")  # fmt: skip
    if cl["segments"]:
        rows = [[s["file"], s["start_offset"], _size(s["size"]), _size(s["allocated_bytes"]), s["messages"],
                 s["used_bytes"], s["end"]] for s in cl["segments"]]  # fmt: skip
        w(_table(rows, ["segment", "start", "size", "on disk", "messages", "used bytes", "ends with"]) + "\n")
    if report["consume_queues"]:
        w(f"\nconsume queues ({len(report['consume_queues'])}):\n")
        rows = [[q["topic"], q["queue_id"], q["min_offset"], q["max_offset"], q["messages"], q["files"],
                 q["min_commitlog_offset"], q["max_commitlog_offset"]] for q in report["consume_queues"]]  # fmt: skip
        w(_table(rows, ["topic", "queue", "min offset", "max offset", "messages", "files", "first phy", "last phy"]) + "\n")
    if report["index"]:
        w(f"\nindex files ({len(report['index'])}):\n")
        rows = [[f["file"], f.get("entries"), f.get("begin_time"), f.get("end_time"), f.get("begin_phy_offset"),
                 f.get("end_phy_offset"), _size(f["size"])] for f in report["index"]]  # fmt: skip
        w(_table(rows, ["file", "entries", "begin time", "end time", "begin phy", "end phy", "size"]) + "\n")
    cp = report["checkpoint"]
    if cp is None:
        w("\ncheckpoint: none\n")
    else:
        w(f"\ncheckpoint: physic {cp['physic_msg_time']} ({cp['physic_msg_timestamp']}), logics {cp['logics_msg_time']} "
          f"({cp['logics_msg_timestamp']}), index {cp['index_msg_time']} ({cp['index_msg_timestamp']})\n")  # fmt: skip
    if report["config_files"]:
        w(f"config/: {', '.join(report['config_files'])}\n")
    if report["other_layout_directories"]:
        w(f"written by another RocketMQ version or mode (left alone): {', '.join(report['other_layout_directories'])}\n")
    if report["problems"]:
        w(f"\nproblems ({report['problem_count']}):\n")
        for p in report["problems"]:
            w(f"  [{p['severity']}] {p['message']}\n")
    else:
        w("\nno problems found\n")


def _print_stats(report: dict[str, Any], out: Any) -> None:
    w = out.write
    cl = report["commitlog"]
    w(f"store {report['store_dir']}\n")
    snap = report.get("snapshot")
    if report["running"]:
        holder = report["lock"]["holder_pid"]
        w(f"  the store is running ({f'pid {holder}' if holder else 'a live process'} holds the lock); the file figures "
          "below are what its files say now, which may lag the store's memory\n")  # fmt: skip
    elif report["lock"]["abort_file"]:
        w("  the abort file is present: the last run did not stop cleanly (the queues may lag the log)\n")
    w(f"  commitlog: {cl['segments']} segments of {_size(cl['segment_size'])}, offsets {cl['min_offset']} .. "
      f"{cl['max_offset']} ({_size(cl['data_bytes'])} of records)\n")  # fmt: skip
    w(f"  messages (from the consume queues): {report['messages']} in {len(report['topics'])} topics\n")
    w(f"  index files: {report['index_files']}\n")
    w(f"  disk: {_size(report['disk']['allocated_bytes'])} allocated ({_size(report['disk']['apparent_bytes'])} apparent, "
      "segments are sparse until written)\n")  # fmt: skip
    cp = report["checkpoint"]
    if cp:
        w(f"  checkpoint: physic {cp['physic_msg_time']}, logics {cp['logics_msg_time']}, index {cp['index_msg_time']}\n")
    if report["queues"]:
        rows = [[q["topic"], q["queue_id"], q["min_offset"], q["max_offset"], q["messages"]] for q in report["queues"]]
        w(_table(rows, ["topic", "queue", "min offset", "max offset", "messages"]) + "\n")
    _print_snapshot(report, snap, w)


def _age(ms: int) -> str:
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 3_600_000:.1f} h"


def _tps(tps: dict[str, float]) -> str:
    return " / ".join(f"{tps.get(f'{w}s', 0.0):.1f}" for w in TPS_WINDOWS_S)


def _print_snapshot(report: dict[str, Any], snap: dict[str, Any] | None, w: Any) -> None:
    if snap is None:
        if report["running"]:
            w("\n  no live figures yet: the store has not written its stats snapshot (it writes one every "
              "stats_snapshot_interval_ms)\n")  # fmt: skip
        return
    if snap.get("error"):
        w(f"\n  stats snapshot unreadable: {snap['error']}\n")
        return
    age = _age(snap["age_ms"])
    if snap["source"] == "live":
        w(f"\nlive figures (pid {snap['pid']}'s snapshot, written {age} ago at {snap['written_at']}; "
          f"one every {snap['interval_ms'] / 1000:g} s):\n")  # fmt: skip
        if snap["stale"]:
            w(f"  note: older than {SNAPSHOT_STALE_INTERVALS} intervals; the store may be stuck or unable to write\n")
    else:
        how = "at its close" if snap.get("final") else "before it stopped (it did not close: a crash or a kill)"
        w(f"\nlast run's figures (pid {snap['pid']}, written {how}, {age} ago at {snap['written_at']}):\n")
    st = snap["stats"]
    w(f"  puts: {st['put_message_times_total']} messages, {_size(st['put_message_size_total'])}, "
      f"{st['put_message_failed_times']} failed; TPS 10/60/600 s: {_tps(st['put_tps'])}; "
      f"max latency {st['put_message_entire_time_max_ms']:.1f} ms\n")  # fmt: skip
    buckets = st.get("put_message_distribute_time_total", {})
    shown = [f"{name} {buckets[name]}" for name in BUCKET_NAMES if buckets.get(name)]
    w(f"  put latency (since start): {', '.join(shown) if shown else 'no puts'}\n")
    w(f"  gets: {st['get_message_times_total_found']} found, {st['get_message_times_total_miss']} missed, "
      f"{st['get_message_transfered_msg_count']} messages transferred; found TPS 10/60/600 s: "
      f"{_tps(st['get_found_tps'])}, miss {_tps(st['get_miss_tps'])}\n")  # fmt: skip
    lag = snap.get("dispatch") or {}
    behind = lag.get("behind_bytes")
    w(f"  dispatch: {'unknown' if behind is None else _size(behind)} behind the log "
      f"(log end {lag.get('commitlog_max_offset')}, dispatched to {lag.get('reput_offset')}); "
      f"process RSS {_size(snap.get('rss_bytes'))}; up {_age(st['runtime_ms'])}\n")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the subcommands


def add_subcommands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="segments, queues, index files, checkpoint, lock/abort state and a health verdict",
        description="Read a store directory (ours or a broker's; safe while it runs) and report its segments, "
        "offset ranges, consume queues, index files, checkpoint, lock and abort state, and a verdict: healthy, "
        "running, needs recovery, damaged (exit 3) or unreadable (a segment this user cannot read: exit 1), naming "
        "the file and offset of any corrupt data.",
    )
    p.add_argument("store_dir", metavar="STORE_DIR", type=store_path)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--no-crc", action="store_true", help="skip the body CRC check (faster on large logs)")
    p.set_defaults(handler=_run_inspect)

    s = subparsers.add_parser(
        "stats",
        help="what a store's files say: segments, bytes, messages per topic/queue, checkpoint times",
        description="Cheap figures from a store's files (closed or running): segments and bytes, the end of the "
        "log, message counts per topic and queue from the consume queue offsets, checkpoint times.",
    )
    s.add_argument("store_dir", metavar="STORE_DIR", type=store_path)
    s.add_argument("--json", action="store_true", help="print one JSON document")
    s.set_defaults(handler=_run_stats)


def _run_inspect(args: argparse.Namespace) -> int:
    _check_store_dir(args.store_dir)
    config = store_config(args, args.store_dir, require_commitlog=False, diagnosing=True)
    report = inspect_store(args.store_dir, config, check_crc=not args.no_crc)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_inspect(report, sys.stdout)
    sys.stdout.flush()
    if report["verdict"] == UNSUPPORTED:
        first = next(p for p in report["problems"] if p["severity"] == UNSUPPORTED)
        print(f"mqstore inspect: unsupported: {first['message']}", file=sys.stderr)
        return ExitCode.NOT_A_STORE
    if report["verdict"] == UNREADABLE:
        first = next(p for p in report["problems"] if p["severity"] == UNREADABLE)
        print(f"mqstore inspect: unreadable: {first['message']}", file=sys.stderr)
        return ExitCode.FAILURE
    if report["verdict"] == DAMAGED:
        first = next(p for p in report["problems"] if p["severity"] == DAMAGED)
        print(f"mqstore inspect: damaged: {first['message']}", file=sys.stderr)
        return ExitCode.CORRUPT
    return ExitCode.OK


def _run_stats(args: argparse.Namespace) -> int:
    _check_store_dir(args.store_dir)
    config = store_config(args, args.store_dir, require_commitlog=False)
    report = store_file_stats(args.store_dir, config)  # (a file it may not read: cli._run says so)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_stats(report, sys.stdout)
    return ExitCode.OK
