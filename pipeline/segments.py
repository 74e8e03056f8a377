"""Finding CommitLog segments and walking their record boundaries (spec §2.4, §3.7, §4.1).

No Spark here: the planner and the readers of the `rocketmq` data source, the bench and the
lookup job all share this walk, so every split size yields the same records.

The walk is memoryless: the next position depends only on the current position and the
bytes of the segment. The planner walks each segment once (8-byte headers, jumping by
TOTALSIZE) and cuts splits at positions the walk visits; a reader started at such a position
therefore visits exactly the positions the planner would have visited after it.
"""

from __future__ import annotations

import errno
import glob
import mmap
import os
import re
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Final, Iterator

from mqstore.storage import speedups

from mqstore.storage.codec import (
    BLANK_MAGIC_CODE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RecordKind,
    cal_msg_length,
    read_record,
)

_SEGMENT_NAME: Final = re.compile(r"^\d{20}$")
_II: Final = struct.Struct(">ii")
_MIN_RECORD_V1: Final = cal_msg_length(0, 0, 0)
_MIN_RECORD_V2: Final = cal_msg_length(0, 0, 0, 0, True)
_MAGIC_V1_BYTES: Final = struct.pack(">i", MESSAGE_MAGIC_CODE)
_MAGIC_V2_BYTES: Final = struct.pack(">i", MESSAGE_MAGIC_CODE_V2)
_BLANK_BYTES: Final = struct.pack(">i", BLANK_MAGIC_CODE)


class SegmentError(ValueError):
    """A path that is neither a store, a commitlog directory nor a segment file."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One CommitLog segment file.

    `base_offset` is the global offset of its first byte (from the 20-digit name), or None
    when the file was renamed and the name says nothing; `file_size` is its length, which is
    the segment size (segments are created full size, §4.1).
    """

    path: str
    base_offset: int | None
    file_size: int


def _segment(path: str) -> Segment:
    name = os.path.basename(path)
    base = int(name) if _SEGMENT_NAME.match(name) else None
    return Segment(path=os.path.abspath(path), base_offset=base, file_size=os.path.getsize(path))


def discover_segments(paths: str | list[str]) -> list[Segment]:
    """Segments under store dirs, commitlog dirs or single files (glob patterns too), in
    offset order per dir."""
    if isinstance(paths, str):
        paths = [p for p in paths.split(",") if p]
    expanded: list[str] = []
    for path in paths:
        if glob.has_magic(path):  # "store/commitlog/*", "stores/*/commitlog"
            matches = sorted(glob.glob(path))
            if not matches:
                raise SegmentError(f"{path}: the pattern matches nothing")
            expanded.extend(matches)
        else:
            expanded.append(path)
    found: list[Segment] = []
    for path in expanded:
        if os.path.isfile(path):
            found.append(_segment(path))
            continue
        if not os.path.isdir(path):
            raise SegmentError(f"{path}: no such file or directory")
        clog = os.path.join(path, "commitlog")
        directory = clog if os.path.isdir(clog) else path
        names = sorted(n for n in os.listdir(directory) if _SEGMENT_NAME.match(n))
        if not names:
            raise SegmentError(f"{path}: no 20-digit CommitLog segment files in {directory}")
        found.extend(_segment(os.path.join(directory, n)) for n in names)
    return found


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
    """TOTALSIZE if the 8 bytes at pos start a plausible message record, else 0."""
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
        fd = os.open(path, os.O_RDONLY)
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
    record. (-1, False) when nothing valid follows. Bounded by the segment size.
    """
    limit = seg.file_size
    if not _data_follows(seg.path, pos + 8) or not _nonzero_follows(buf, pos + 8, limit):
        return -1, False
    best_blank = -1
    i = buf.find(_BLANK_BYTES, pos + 5)
    while i != -1:
        cand = i - 4
        if _II.unpack_from(buf, cand)[0] == limit - cand:
            best_blank = cand
            break
        i = buf.find(_BLANK_BYTES, i + 1)
    for magic_bytes in (_MAGIC_V1_BYTES, _MAGIC_V2_BYTES):
        i = buf.find(magic_bytes, pos + 5)
        while i != -1 and (best_blank == -1 or i - 4 < best_blank):
            cand = i - 4
            if header_ok(buf, cand, limit, max_message_size):
                found = read_record(buf, cand, limit, read_body=False, max_message_size=max_message_size)
                if found.kind is RecordKind.MESSAGE and found.record is not None and (
                    seg.base_offset is None or found.record.commitlog_offset == seg.base_offset + cand
                ):
                    return cand, False
            i = buf.find(magic_bytes, i + 1)
    return (best_blank, True) if best_blank != -1 else (-1, False)


def step_at(
    buf: mmap.mmap | bytes, pos: int, seg: Segment, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> StepResult:
    """One step of the walk at pos (see the module doc)."""
    limit = seg.file_size
    total = header_ok(buf, pos, limit, max_message_size)
    if total:
        return StepResult(Step.MESSAGE, pos, pos + total)
    if pos + 8 > limit:
        return StepResult(Step.END, pos, limit)
    size, magic = _II.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return StepResult(Step.END, pos, limit)
    # Zeros are the end of written data only if nothing valid follows: a zeroed header in the
    # middle of a segment is damage, and must not silently hide the records after it.
    cand, is_blank = _resync(buf, pos, seg, max_message_size)
    if size == 0 and magic == 0:
        if cand == -1 or is_blank:
            return StepResult(Step.END, pos, limit)
        return StepResult(Step.CORRUPT, pos, cand, "zeroed record header followed by more records")
    if magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        reason = f"record size {size} is implausible"
    else:
        reason = f"bad magic code 0x{magic & 0xFFFFFFFF:08X}"
    if cand == -1:
        return StepResult(Step.CORRUPT, pos, limit, reason + "; no valid record follows in this segment")
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
    """A read-only map of the segment (an empty file cannot be mapped: return b"")."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


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
