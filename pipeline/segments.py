"""Finding CommitLog segments and walking their record boundaries (spec §2.4, §3.7, §4.1).

No Spark here: the planner and the readers of the `rocketmq` data source, the bench and the
lookup job all share this walk, so every split size yields the same records.

The walk is memoryless: the next position depends only on the current position, the bytes
of the segment and its span (`Segment.file_size`; at the end of its records, whether the
next segment starts with one). The planner walks each segment once (8-byte headers, jumping
by TOTALSIZE) and cuts splits at positions the walk visits; a reader started at such a
position therefore visits exactly the positions the planner would have visited after it.

A segment ends at an END_OF_FILE blank, or (the last one written) at unwritten zeros. Bytes of
its span that no file holds (a missing segment, a file cut short) and zeros before a segment
that holds records are damage: CORRUPT steps, which the data source reports as error rows.
"""

from __future__ import annotations

import errno
import glob
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Final, Iterator

from mqstore.storage import speedups
from mqstore.storage.commitlog import expired_since_listed, max_record_size, segment_size_of
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.mapped_file_queue import named_past_the_largest_offset

from mqstore.storage.codec import (
    BLANK_MAGIC_CODE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RecordKind,
    body_crc_mismatch,
    cal_msg_length,
    read_record,
)

_SEGMENT_NAME: Final = re.compile(r"\A\d{20}\Z")
_II: Final = struct.Struct(">ii")
_MIN_RECORD_V1: Final = cal_msg_length(0, 0, 0)
_MIN_RECORD_V2: Final = cal_msg_length(0, 0, 0, 0, True)
_MAGIC_V1_BYTES: Final = struct.pack(">i", MESSAGE_MAGIC_CODE)
_MAGIC_V2_BYTES: Final = struct.pack(">i", MESSAGE_MAGIC_CODE_V2)
_BLANK_BYTES: Final = struct.pack(">i", BLANK_MAGIC_CODE)
# A range past a file's end is reported in pieces that end on multiples of this (absolute
# offsets): the `size` column is an int32, and several missing 1 GiB segments are not.
_GAP_PIECE: Final = 1 << 30


class SegmentError(ValueError):
    """A path that is neither a store, a commitlog directory nor a segment file."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One CommitLog segment file.

    `base_offset` is the global offset of its first byte (from the 20-digit name), or None
    when the file was renamed and the name says nothing. `file_size` is the span of the log
    the segment stands for: its length (segments are created full size, §4.1), or more when
    the file is shorter than that span, cut short or followed by missing segments
    (`discover_segments`); the walk reports the bytes past the file's end as damage.
    """

    path: str
    base_offset: int | None
    file_size: int


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _not_regular(path: str, mode: int, what: str = "a CommitLog segment file") -> SegmentError:
    return SegmentError(f"{path} is {_kind(mode)} where {what} belongs; move it out of the directory")


def read_regular(path: str, what: str) -> bytes:
    """The bytes of the regular file at path (links followed). Opened without blocking and
    checked by fstat: a FIFO (or device) where `what` belongs is a SegmentError naming it, never
    a read that waits for a writer for good."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode, what)
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, max(st.st_size, 1 << 16))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _regular_size(path: str) -> int:
    """The length of the regular file at path (links followed, as the store does); a FIFO,
    directory or device where a segment belongs is an error naming it: reading a FIFO would
    block for good."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SegmentError(f"{path}: cannot read this segment: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    return st.st_size


def expired_by_retention(path: str) -> bool:
    """Whether a file a listing named (a segment, or a ConsumeQueue file), found gone (ENOENT)
    when opened, was expired by the store's retention (`storage.commitlog.expired_since_listed`,
    the tools' rule); damage (False) otherwise, as is one whose name says nothing of where it lies."""
    name = os.path.basename(path)
    if not _SEGMENT_NAME.match(name):
        return False
    return expired_since_listed(RealFileSystem(), os.path.dirname(os.path.abspath(path)), int(name))


def missing_steps(seg: Segment, start: int, end: int) -> list[StepResult]:
    """The CORRUPT steps for bytes [start, end) of a segment whose file was deleted after the
    job listed it, and not by retention (`expired_by_retention`): its bytes are on no file,
    reported as a hole's are, in pieces whose size an int32 holds (`_GAP_PIECE`)."""
    base = seg.base_offset or 0
    steps: list[StepResult] = []
    pos = start
    while pos < end:
        nxt = min(end, ((base + pos) // _GAP_PIECE + 1) * _GAP_PIECE - base)
        steps.append(StepResult(Step.CORRUPT, pos, nxt, f"no segment file holds commitlog offsets [{base + pos}, "
                                f"{base + nxt}) ({os.path.basename(seg.path)} was deleted after this job listed it, "
                                "and not as the log's oldest segment: a segment file is missing)"))  # fmt: skip
        pos = nxt
    return steps


def _size_unless_gone(path: str) -> int | None:
    """`_regular_size`, or None when the file is gone (ENOENT, and no name left: a symbolic
    link to nothing is still listed, and is damage, review 56 H1)."""
    try:
        return _regular_size(path)
    except SegmentError as exc:
        if isinstance(exc.__cause__, FileNotFoundError) and not os.path.lexists(path):
            return None
        raise


def _segment(path: str) -> Segment:
    name = os.path.basename(path)
    base = int(name) if _SEGMENT_NAME.match(name) else None
    return Segment(path=os.path.abspath(path), base_offset=base, file_size=_regular_size(path))


def _directory_segments(directory: str, names: list[str]) -> list[Segment]:
    """The segments `names` (ascending) of one commitlog directory, each spanning the log up to
    where the next one starts, and the last up to the segment size (the store tools' rule,
    `segment_size_of`): the bytes no file holds (a missing segment, a file cut short) are then
    walked past the file's end and reported, never skipped."""
    past = named_past_the_largest_offset(directory, names)
    if past is not None:  # as the store's tools refuse it (review 52 L1)
        raise SegmentError(past)
    paths = [os.path.join(directory, n) for n in names]
    sizes = [_size_unless_gone(p) for p in paths]
    # Files gone since the listing, every one of them older than the oldest file left: the
    # store's retention deleted them meanwhile (review 53 M1); they are not listed. Any other
    # file gone is an error naming it, as before.
    first = next((i for i, n in enumerate(sizes) if n is not None), len(sizes))
    if first == len(sizes) or None in sizes[first:]:
        gone = paths[sizes.index(None, first)] if first < len(sizes) else paths[0]
        raise SegmentError(f"{gone}: cannot read this segment: {os.strerror(errno.ENOENT)}")
    names, paths = names[first:], paths[first:]
    starts = [int(n) for n in names]
    lengths = [n for n in sizes[first:] if n is not None]
    size = segment_size_of(starts, list(lengths))
    # An empty file cannot be mapped or read: its span belongs to the file before it. Empty
    # files after the last one with data are segments being created (a live store's roll).
    present = [i for i, n in enumerate(lengths) if n > 0]
    if present and present[0] > 0:
        raise SegmentError(f"{paths[0]} is empty but later segments hold data: commitlog offsets "
                           f"[{starts[0]}, {starts[present[0]]}) are on no file")  # fmt: skip
    found: list[Segment] = []
    for k, i in enumerate(present):
        if k + 1 < len(present):
            span = starts[present[k + 1]] - starts[i]
        else:  # the last file with data: up to its segment's end
            span = size if size and starts[i] % size == 0 else 0
        found.append(Segment(os.path.abspath(paths[i]), starts[i], max(lengths[i], span)))
    # Empty files (nothing to read) stay listed as before, spanning nothing.
    found.extend(Segment(os.path.abspath(paths[i]), starts[i], 0) for i, n in enumerate(lengths) if n == 0)
    found.sort(key=lambda seg: seg.base_offset or 0)
    return found


def _named_segments(directory: str, names: list[str]) -> list[Segment]:
    """The segment files `names` of one commitlog directory, named by hand or by a glob, with
    the spans `_directory_segments` gives them in their whole directory: each reaches the next
    segment file the directory holds (named or not), the last one its segment's end. Bytes no
    file holds (a missing segment after a named one, a named file cut short) are then
    reported, as for the directory; a segment that is there but not named is not damage."""
    kept: list[str] = []
    for name in names:  # a named FIFO or directory is an error naming it, before the listing
        path = os.path.join(directory, name)
        if _size_unless_gone(path) is None:
            if expired_by_retention(path):
                continue  # deleted by the store's retention since it was named (review 53 M1)
            _regular_size(path)  # an error naming it
        kept.append(name)
    try:
        listing = sorted(n for n in os.listdir(directory) if _SEGMENT_NAME.match(n))
    except OSError as exc:
        raise SegmentError(f"{directory}: cannot list this directory: {exc.strerror or exc}") from exc
    wanted = set(kept)
    return [seg for seg in _directory_segments(directory, listing) if os.path.basename(seg.path) in wanted]


def discover_segments(paths: str | list[str]) -> list[Segment]:
    """Segments under store dirs, commitlog dirs or single files (glob patterns too), in
    offset order per dir. Only regular files are read (a FIFO named like a segment would
    block the reader for good): anything else named like a segment is a SegmentError.

    Segment files named one by one or by a glob (`STORE/commitlog/*`, the documented form)
    span the log as in their directory (`_named_segments`): the files named in one directory
    are one group, in offset order, at the place of the first of them."""
    if isinstance(paths, str):
        paths = [p for p in paths.split(",") if p]
    expanded: list[tuple[str, bool]] = []  # (path, found by a glob)
    for path in paths:
        if glob.has_magic(path):  # "store/commitlog/*", "stores/*/commitlog"
            matches = sorted(glob.glob(path))
            if not matches:
                raise SegmentError(f"{path}: the pattern matches nothing")
            expanded.extend((m, True) for m in matches)
        else:
            expanded.append((path, False))
    groups: list[list[Segment] | str] = []  # segments, or a directory whose named files go there
    named: dict[str, list[str]] = {}
    for path, globbed in expanded:
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            if globbed and isinstance(exc, FileNotFoundError) and expired_by_retention(path):
                continue  # the store's retention deleted it since the glob listed it (review 53 M1)
            raise SegmentError(f"{path}: no such file or directory") from exc
        if not stat.S_ISDIR(mode):
            name = os.path.basename(path)
            if not _SEGMENT_NAME.match(name):
                # A renamed file says nothing of where it lies: it spans its own length.
                groups.append([_segment(path)])
                continue
            directory = os.path.dirname(os.path.abspath(path))
            if directory not in named:
                named[directory] = []
                groups.append(directory)
            if name not in named[directory]:
                named[directory].append(name)
            continue
        clog = os.path.join(path, "commitlog")
        directory = clog if os.path.isdir(clog) else path
        names = sorted(n for n in os.listdir(directory) if _SEGMENT_NAME.match(n))
        if not names:
            raise SegmentError(f"{path}: no 20-digit CommitLog segment files in {directory}")
        groups.append(_directory_segments(directory, names))
    found: list[Segment] = []
    for group in groups:
        found.extend(_named_segments(group, named[group]) if isinstance(group, str) else group)
    return found


def record_bound(seg: Segment, max_message_size: int) -> int:
    """The largest TOTALSIZE the walk takes for one record of seg: what fits the segment, not
    the put limit (`max_record_size`, as the store's recovery reads). A broker configured with
    a larger maxMessageSize writes such records, and the store reads them back; calling them
    implausible would report a healthy store as corrupt. A damaged size is still caught: the
    record's field lengths must add up to it, and its CRC must match."""
    return max_record_size(seg.file_size, max_message_size)


def crc_failure(
    buf: mmap.mmap | bytes, pos: int, limit: int, max_size: int, check: Callable[[Any, int, int], str] = body_crc_mismatch
) -> str:
    """`body_crc_mismatch` (`check`) for a record that may be larger than the put limit: "" when
    the record at pos passes the integrity checks, else why not. The codec's reference check
    (the C kernel declines V2 and IPv6 records, and MQSTORE_PURE_PYTHON=1 has no kernel) bounds
    a size by the default maxMessageSize; a record past it is checked again by `max_size`."""
    why = check(buf, pos, limit)
    if why and pos + 8 <= len(buf) and _II.unpack_from(buf, pos)[0] > DEFAULT_MAX_MESSAGE_SIZE:
        got = read_record(buf, pos, limit, check_crc=True, max_message_size=max_size)
        why = "" if got.kind is RecordKind.MESSAGE else got.reason or got.kind.value
    return why


class Step(Enum):
    MESSAGE = "message"  # a plausible record header at pos; next = pos + TOTALSIZE
    CORRUPT = "corrupt"  # bytes [pos, next) hold no record; next = resync point or segment end
    END = "end"  # END_OF_FILE blank or unwritten space: nothing more in this segment


@dataclass(frozen=True, slots=True)
class StepResult:
    step: Step
    pos: int
    next_pos: int
    reason: str = ""


def header_ok(buf: mmap.mmap | bytes, pos: int, limit: int, max_message_size: int) -> int:
    """TOTALSIZE if the 8 bytes at pos start a plausible message record that ends by limit
    (at most the buffer's end), else 0."""
    if limit > len(buf):  # a file cut short of its span: no record runs past its bytes
        limit = len(buf)
    if pos + 8 > limit:
        return 0
    total: int
    magic: int
    total, magic = _II.unpack_from(buf, pos)
    if magic == MESSAGE_MAGIC_CODE:
        min_len = _MIN_RECORD_V1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        min_len = _MIN_RECORD_V2
    else:
        return 0
    if total < min_len or total > max_message_size or pos + total > limit:
        return 0
    return total


def _data_follows(path: str, pos: int) -> bool:
    """False when everything after pos is a hole: a preallocated (sparse) segment's unwritten
    tail. Saves scanning, and faulting in, up to a GiB of zeros; True when unsure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # never blocks, even on a FIFO
    except OSError:
        return True
    try:
        os.lseek(fd, pos, os.SEEK_DATA)
        return True
    except OSError as exc:  # ENXIO: no data at or after pos; anything else: unsure
        return exc.errno != errno.ENXIO
    finally:
        os.close(fd)


def _nonzero_follows(buf: mmap.mmap | bytes, pos: int, limit: int, chunk: int = 16 << 20) -> bool:
    """Whether any byte in [pos, limit) is non-zero: one pass at memory speed, instead of
    three magic-code searches over a zero-filled tail."""
    import numpy as np

    while pos < limit:
        n = min(chunk, limit - pos)
        if np.frombuffer(buf, np.uint8, n, pos).any():
            return True
        pos += n
    return False


def _resync(buf: mmap.mmap | bytes, pos: int, seg: Segment, max_message_size: int) -> tuple[int, bool]:
    """The first position after pos where a record verifiably starts: (position, is_blank).

    A candidate must decode fully and, when the segment's base is known, carry its own
    PHYSICALOFFSET, so a body that happens to contain the magic bytes is not mistaken for a
    record. (-1, False) when nothing valid follows. Bounded by the file's end.
    """
    limit = min(seg.file_size, len(buf))
    if not _data_follows(seg.path, pos + 8) or not _nonzero_follows(buf, pos + 8, limit):
        return -1, False
    best_blank = -1
    i = buf.find(_BLANK_BYTES, pos + 5, limit)
    while i != -1:
        cand = i - 4
        # A blank fills its segment to the end: the file's, or the span's when only the
        # filler is cut off.
        if _II.unpack_from(buf, cand)[0] in (limit - cand, seg.file_size - cand):
            best_blank = cand
            break
        i = buf.find(_BLANK_BYTES, i + 1, limit)
    for magic_bytes in (_MAGIC_V1_BYTES, _MAGIC_V2_BYTES):
        i = buf.find(magic_bytes, pos + 5, limit)
        while i != -1 and (best_blank == -1 or i - 4 < best_blank):
            cand = i - 4
            if header_ok(buf, cand, limit, max_message_size):
                found = read_record(buf, cand, limit, read_body=False, max_message_size=max_message_size)
                if found.kind is RecordKind.MESSAGE and found.record is not None and (
                    seg.base_offset is None or found.record.commitlog_offset == seg.base_offset + cand
                ):
                    return cand, False
            i = buf.find(magic_bytes, i + 1, limit)
    return (best_blank, True) if best_blank != -1 else (-1, False)


def _piece_end(seg: Segment, pos: int, end: int) -> int:
    """Where a damaged range from pos stops when no valid record follows it in the file:
    the segment's end, the pieces past the file's end (`end`) bounded by `_GAP_PIECE`."""
    if end >= seg.file_size or (pos < end and end - pos >= _GAP_PIECE):
        return end if pos < end else seg.file_size
    base = seg.base_offset or 0
    past = base + max(pos, end)
    return min(seg.file_size, (past // _GAP_PIECE + 1) * _GAP_PIECE - base)


def _missing(seg: Segment, pos: int, end: int) -> str:
    """Why the bytes from pos (at or past the file's end) are damage."""
    base = seg.base_offset or 0
    nxt = _piece_end(seg, pos, end)
    return (f"no segment file holds commitlog offsets [{base + pos}, {base + nxt}) ({os.path.basename(seg.path)} "
            f"ends at offset {base + end}, the next segment starts at {base + seg.file_size}: a segment file is "
            "missing or cut short)")  # fmt: skip


def _next_segment_has_data(seg: Segment) -> bool:
    """Whether the segment file that follows seg's span starts with a record (or anything
    but zeros). Then zeros to seg's end are not its unwritten tail: records are missing."""
    if seg.base_offset is None:
        return False
    path = os.path.join(os.path.dirname(seg.path), "%020d" % (seg.base_offset + seg.file_size))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and any(os.pread(fd, 8, 0))
    except OSError:
        return False
    finally:
        os.close(fd)


def _end_of_data(
    buf: mmap.mmap | bytes, pos: int, seg: Segment, covered: int, end: int, zeros: bool, max_message_size: int
) -> StepResult:
    """The step at pos where the segment's records end, its bytes accounted for up to
    `covered` (a blank's end; pos for unwritten zeros, `zeros`). Normal (END) when that is the
    segment's whole span; the rest, past the file's end, is damage, as are zeros to the end
    when the next segment holds records."""
    if zeros and _next_segment_has_data(seg):
        if any(buf[pos : pos + 8]):  # written meanwhile (a live store): decide again
            return step_at(buf, pos, seg, max_message_size)
        nxt = _piece_end(seg, pos, end)
        return StepResult(Step.CORRUPT, pos, nxt, "unwritten (zero) bytes to the end of the segment, but the next "
                          "segment holds records: the records between are missing")  # fmt: skip
    start = max(covered, end)
    if start >= seg.file_size:
        return StepResult(Step.END, pos, seg.file_size)
    # Reported from where the file ends (the range starts there, not at pos).
    return StepResult(Step.CORRUPT, start, _piece_end(seg, start, end), _missing(seg, start, end))


def step_at(
    buf: mmap.mmap | bytes, pos: int, seg: Segment, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> StepResult:
    """One step of the walk at pos (see the module doc)."""
    span = seg.file_size
    end = min(span, len(buf))  # where the file's bytes end; short of span: damage follows
    if pos >= span:
        return StepResult(Step.END, pos, span)
    if pos >= end:
        return StepResult(Step.CORRUPT, pos, _piece_end(seg, pos, end), _missing(seg, pos, end))
    total = header_ok(buf, pos, end, max_message_size)
    if total:
        return StepResult(Step.MESSAGE, pos, pos + total)
    if pos + 8 > end:
        if end < span:
            return StepResult(Step.CORRUPT, pos, _piece_end(seg, pos, end), _missing(seg, pos, end))
        return StepResult(Step.END, pos, span)
    size, magic = _II.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return _end_of_data(buf, pos, seg, pos + max(size, 0), end, zeros=False, max_message_size=max_message_size)
    # Zeros are the end of written data only if nothing valid follows: a zeroed header in the
    # middle of a segment is damage, and must not silently hide the records after it.
    cand, is_blank = _resync(buf, pos, seg, max_message_size)
    if size == 0 and magic == 0:
        if cand == -1:
            return _end_of_data(buf, pos, seg, end, end, zeros=True, max_message_size=max_message_size)
        if is_blank:
            covered = cand + _II.unpack_from(buf, cand)[0]
            return _end_of_data(buf, pos, seg, covered, end, zeros=False, max_message_size=max_message_size)
        return StepResult(Step.CORRUPT, pos, cand, "zeroed record header followed by more records")
    min_len = _MIN_RECORD_V1 if magic == MESSAGE_MAGIC_CODE else _MIN_RECORD_V2
    if magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        if cand == -1 and min_len <= size <= max_message_size and pos + size > end:
            # The size is fine; the file ends inside the record.
            cut = "the file is cut short" if end < span else "cut short, or a damaged size"
            nxt = _piece_end(seg, pos, end)
            gap = f"; {_missing(seg, end, end)}" if nxt > end else ""
            return StepResult(Step.CORRUPT, pos, nxt, f"record of {size} bytes runs past the end of the "
                              f"segment file at byte {end} ({cut}){gap}")  # fmt: skip
        reason = f"record size {size} is implausible"
    else:
        reason = f"bad magic code 0x{magic & 0xFFFFFFFF:08X}"
    if cand == -1:
        nxt = _piece_end(seg, pos, end)
        gap = f"; {_missing(seg, end, end)}" if nxt > end else ""
        return StepResult(Step.CORRUPT, pos, nxt, reason + "; no valid record follows in this segment" + gap)
    return StepResult(Step.CORRUPT, pos, cand, reason)


def walk(
    buf: mmap.mmap | bytes,
    seg: Segment,
    start: int = 0,
    end: int | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> Iterator[StepResult]:
    """The steps from start until end (a position the walk visits) or the segment's end."""
    stop = seg.file_size if end is None else end
    pos = start
    while pos < stop:
        res = step_at(buf, pos, seg, max_message_size)
        if res.step is Step.END:
            return
        yield res
        pos = res.next_pos


def message_runs(
    buf: mmap.mmap | bytes,
    seg: Segment,
    start: int,
    end: int,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    max_rows: int = 8192,
    max_bytes: int = 64 << 20,
) -> Iterator[list[int] | StepResult]:
    """`walk` for readers, in bulk: lists of message positions (at most max_rows records or
    max_bytes), with a non-message StepResult (CORRUPT) yielded between them where met.

    Same steps as `walk`; the common case (a plausible header) is inlined, since this loop
    runs once per record."""
    unpack = _II.unpack_from
    v1, v2 = MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2
    limit = min(seg.file_size, len(buf))
    pos = start
    run: list[int] = []
    run_start = pos
    while pos < end:
        if pos + 8 <= limit:
            total, magic = unpack(buf, pos)
            if (
                (magic == v1 and _MIN_RECORD_V1 <= total or magic == v2 and _MIN_RECORD_V2 <= total)
                and total <= max_message_size
                and pos + total <= limit
            ):
                run.append(pos)
                pos += total
                if len(run) >= max_rows or pos - run_start >= max_bytes:
                    yield run
                    run, run_start = [], pos
                continue
        res = step_at(buf, pos, seg, max_message_size)
        if res.step is Step.END:
            break
        if run:
            yield run
        yield res
        pos = res.next_pos
        run, run_start = [], pos
    if run:
        yield run


def plan_segment(
    buf: mmap.mmap | bytes, seg: Segment, split_size: int, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of the segment, cut at the first step at or after each
    multiple of split_size; the last range ends where the data ends."""
    cuts = [0]
    target = split_size
    pos = 0
    limit = seg.file_size
    hdr = header_ok
    native = speedups.native
    while pos < limit:
        if native is not None:
            # The C walk over the plain records up to the next cut (the same steps: every
            # record it takes has a plausible header); it stops where this loop decides.
            pos = native.decode_arrow_run(buf, pos, min(target, limit), min(limit, len(buf)), max_message_size,
                                          1 << 40, 1 << 62, False, ())[0]  # fmt: skip
            if pos >= target and pos < limit:
                cuts.append(pos)
                target = (pos // split_size + 1) * split_size
                continue
            if pos >= limit:
                break
        # Inline fast path of step_at: the planner walks every header of the segment.
        total = hdr(buf, pos, limit, max_message_size)
        if total:
            nxt = pos + total
        else:
            res = step_at(buf, pos, seg, max_message_size)
            if res.step is Step.END:
                break
            nxt = res.next_pos
        pos = nxt
        if pos >= target and pos < limit:
            cuts.append(pos)
            target = (pos // split_size + 1) * split_size
    end = pos if pos < limit else limit
    if cuts[-1] >= end:
        cuts.pop()
    ranges = [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    if cuts and cuts[-1] < end:
        ranges.append((cuts[-1], end))
    return ranges


def open_segment(path: str) -> mmap.mmap | bytes:
    """A read-only map of the segment (an empty file cannot be mapped: return b"").

    Opened without blocking and checked to be a regular file: a FIFO put where a segment
    was would otherwise hang the open until a writer came, and every job with it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        if st.st_size == 0:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # the map keeps its own descriptor
    finally:
        os.close(fd)


def parse_size(text: str | int) -> int:
    """"64m", "1g", "512k", "4096" -> bytes."""
    if isinstance(text, int):
        return text
    t = text.strip().lower().rstrip("b").rstrip("i")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in ("k", "m", "g") else t
    value = int(float(num) * mult)
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value
