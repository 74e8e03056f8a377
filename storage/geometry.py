"""A store's geometry as its files have it: commitlog segment size, ConsumeQueue file size,
index file slots and entries (spec §4.1, §9.1, §10.1).

The files decide. `adopt_geometry` takes each value the caller left at its default from the
files (and logs it), and refuses with `StoreConfigMismatch` a value the caller set that the
files contradict. Nothing here writes: a file of another size than its kind's geometry is
damage, reported in `odd_files` for recovery and `inspect` to deal with, never resized.
"""

from __future__ import annotations

import array
import mmap
import os
import struct
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Final

from ..config import (
    CQ_STORE_UNIT_SIZE,
    MIN_COMMITLOG_SEGMENT_BYTES,
    MIN_CONSUME_QUEUE_FILE_BYTES,
    StoreConfig,
    StoreConfigMismatch,
    StoreGeometryAmbiguous,
)
from ..log import get_logger
from .commitlog import being_created, segment_lengths_in, segment_size_candidates
from .fs import FileSystem, RealFileSystem
from .index import HASH_SLOT_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, read_index_header

__all__ = ["StoreGeometry", "IndexGeometry", "adopt_geometry", "detect_geometry", "index_geometry_of"]

log = get_logger(__name__)

# RocketMQ's defaults keep max_index_num = 4 * max_hash_slot_num (5M slots, 20M entries).
DEFAULT_INDEX_RATIO: Final = 4
# A candidate geometry is checked against at most this many entries of a file (bounded work on
# every open; a wrong geometry shows itself within the first entries).
_WALK_ENTRIES: Final = 65_536
_SLOT_READ_BYTES: Final = 4 << 20
_SLOT_CHUNK_BYTES: Final = 64 << 10
_SLOTS_PER_CHUNK: Final = _SLOT_CHUNK_BYTES // 4
_ZERO_CHUNK: Final = bytes(_SLOT_CHUNK_BYTES)
_ENTRY: Final = struct.Struct(">iqii")
_SLOT: Final = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class IndexGeometry:
    max_hash_slot_num: int
    max_index_num: int


@dataclass(frozen=True, slots=True)
class StoreGeometry:
    """What the files say; None where there is no file of that kind (a new store)."""

    commitlog_segment_bytes: int | None = None
    consume_queue_file_bytes: int | None = None
    index: IndexGeometry | None = None
    index_file_bytes: int | None = None  # known even when `index` could not be decided
    odd_files: tuple[str, ...] = ()  # files of another size than their kind's: damage
    # Segment sizes the commitlog's files fit equally well, when more than one does (damage
    # leaves it open): `commitlog_segment_bytes` is then the one the caller set, or None.
    commitlog_segment_ambiguous: tuple[int, ...] = ()
    # The same for the ConsumeQueue file size (`consume_queue_file_bytes` then the caller's, or None).
    consume_queue_file_ambiguous: tuple[int, ...] = ()
    # The index geometries the index files read alike under, when more than one does (an index
    # with few entries may): `index` is then the one the caller's settings name, or None.
    index_ambiguous: tuple[IndexGeometry, ...] = ()

    def settings(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.commitlog_segment_bytes is not None:
            out["mapped_file_size_commitlog_bytes"] = self.commitlog_segment_bytes
        if self.consume_queue_file_bytes is not None:
            out["mapped_file_size_consume_queue_bytes"] = self.consume_queue_file_bytes
        if self.index is not None:
            out["max_hash_slot_num"] = self.index.max_hash_slot_num
            out["max_index_num"] = self.index.max_index_num
        return out


def _digit_files(fs: FileSystem, directory: str, width: int) -> list[str]:
    if not fs.isdir(directory):
        return []
    return sorted(
        os.path.join(directory, n) for n in fs.listdir(directory) if len(n) == width and n.isdigit()
    )


def _sizes(fs: FileSystem, paths: list[str]) -> dict[str, int]:
    """The length of each file of `paths` still there: a running store's cleaner deletes the
    oldest segment, queue and index files while a read-only command reads (a listed file
    gone failed `stats` with FileNotFoundError, or was warned of as damage). A symbolic link
    to nothing is not gone: its FileNotFoundError names it."""
    sizes: dict[str, int] = {}
    for p in paths:
        try:
            sizes[p] = fs.getsize(p)
        except FileNotFoundError:
            if isinstance(fs, RealFileSystem) and os.path.lexists(p):
                raise
    return sizes


def _odd(paths: dict[str, int], size: int, live: bool) -> list[str]:
    """The files of `paths` (path -> length) whose length is not `size`: damage, but for the
    newest of a directory a running store (`live`) is making (`being_created`)."""
    newest: dict[str, str] = {}
    for p in paths:
        directory, name = os.path.split(p)
        newest[directory] = max(newest.get(directory, name), name)
    return [p for p, s in paths.items()
            if s != size and not (live and being_created(os.path.basename(p), newest[os.path.dirname(p)], s, size))]  # fmt: skip


def _common_size(fs: FileSystem, paths: list[str], odd: list[str], live: bool = False) -> tuple[int | None, list[str]]:
    """The size most files share (ties: the first file's), and the files of that size; the
    others are damage (but one `_odd` takes for being made)."""
    sizes = _sizes(fs, paths)
    counted = Counter(s for s in sizes.values() if s > 0)
    if not counted:
        odd.extend(sizes)
        return None, []
    top = max(counted.values())
    size = next(s for p, s in sizes.items() if counted.get(s) == top)
    odd.extend(_odd(sizes, size, live))
    return size, [p for p, s in sizes.items() if s == size]


def _commitlog_segment_size(
    fs: FileSystem, directory: str, odd: list[str], explicit: int | None, live: bool = False
) -> tuple[int | None, tuple[int, ...]]:
    """The segment size that explains the segments' names and lengths best (the one rule the
    tools use too: `segment_size_candidates`), and the sizes that explain them equally well
    when more than one does. A file of another length, or named off the size's grid, is
    damage. Of equal explanations the caller's `explicit` size is taken, if it is one. Where
    no file has the winning length (every segment cut or grown: an interrupted copy), it is
    not taken either unless the caller set it: every file would be damage, and the store's
    own files (queues, index) would be recovered against a log it cannot read."""
    paths = _digit_files(fs, directory, 20)
    if not paths:
        return None, ()
    names = [os.path.basename(p) for p in paths]
    lengths = segment_lengths_in(fs, directory, names)
    candidates = segment_size_candidates([int(n) for n in names], lengths,
                                         min_size=MIN_COMMITLOG_SEGMENT_BYTES)  # fmt: skip
    if not candidates:  # no geometry: cut or emptied files only
        odd.extend(paths)
        return None, ()
    tied = tuple(c.size for c in candidates if c.cost == candidates[0].cost)
    if len(tied) > 1 and explicit not in tied:
        return None, tied
    unproven = not any(fs.isfile(p) and fs.getsize(p) == candidates[0].size for p in paths)
    if len(tied) == 1 and unproven and explicit != candidates[0].size:
        return None, tied
    size = explicit if len(tied) > 1 and explicit is not None else candidates[0].size
    for p, name, length in zip(paths, names, lengths):
        if length is None and not fs.exists(p) and not (isinstance(fs, RealFileSystem) and os.path.lexists(p)):
            continue  # gone since the listing (`_sizes`)
        # Segments start at multiples of the size (named by their first offset, §2.4).
        if length is None or int(name) % size:
            odd.append(p)
        elif length != size and not (live and being_created(name, names[-1], length, size)):
            odd.append(p)
    return size, tied if len(tied) > 1 or unproven else ()


def _consume_queue_file_size(
    fs: FileSystem, directory: str, odd: list[str], explicit: int | None = None, live: bool = False
) -> tuple[int | None, tuple[int, ...]]:
    """The ConsumeQueue file size most files have, counting a file only where its name allows
    its length (a file starts at a multiple of the size); the sizes tied for most when more than one is (with
    the caller's `explicit` size taken if it is one of them). A tie was broken by the first
    file: one queue's file cut short (an interrupted copy) beside another's whole one made
    the cut length the store's, set the whole file aside and rebuilt every queue in files
    RocketMQ cannot load (review 54 M2)."""
    if not fs.isdir(directory):
        return None, ()
    paths: list[str] = []
    for topic in sorted(fs.listdir(directory)):
        topic_dir = os.path.join(directory, topic)
        if not fs.isdir(topic_dir):
            continue
        for queue in sorted(fs.listdir(topic_dir)):
            if queue.isdigit():
                paths.extend(_digit_files(fs, os.path.join(topic_dir, queue), 20))
    sizes = _sizes(fs, paths)
    counted = Counter(size for p, size in sizes.items()
                      if size >= MIN_CONSUME_QUEUE_FILE_BYTES and size % CQ_STORE_UNIT_SIZE == 0
                      and int(os.path.basename(p)) % size == 0)  # fmt: skip
    if not counted:
        odd.extend(sizes)  # no geometry: cut files
        return None, ()
    top = max(counted.values())
    tied = tuple(sorted(size for size, n in counted.items() if n == top))
    if len(tied) > 1 and explicit not in tied:
        return None, tied
    size = explicit if len(tied) > 1 and explicit is not None else tied[0]
    odd.extend(_odd(sizes, size, live))
    return size, tied if len(tied) > 1 else ()


def _fits(size: int, slots: int, entries: int) -> bool:
    return slots > 0 and entries > 1 and INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE + entries * INDEX_ENTRY_SIZE == size


def _walks_cleanly_if_there(fs: FileSystem, path: str, slots: int, entries: int) -> bool:
    """`_walks_cleanly`, or True for a file deleted since its header was read (a running
    store's cleaner): gone, it tells nothing against the geometry (review 130 F4: a bare
    FileNotFoundError failed the read-only commands on a live store)."""
    try:
        return _walks_cleanly(fs, path, slots, entries)
    except FileNotFoundError:
        if isinstance(fs, RealFileSystem) and os.path.lexists(path):
            raise
        return True


def _walks_cleanly(fs: FileSystem, path: str, slots: int, entries: int) -> bool:
    """Do the slots and the first entries of `path` make sense read with this geometry? Every
    slot names an entry below the header's count, every entry's chain link points back to an
    earlier entry of the same slot (a wrong slot count scatters hashes across slots), and every
    entry no later one links back to is named by its slot (the head of its chain). The last
    holds only under the geometry the file was written with but where few entries tell little:
    zeros read as entries link nowhere, and every one of them would have to head slot 0."""
    header = read_index_header(fs, path)
    count = header.index_count if header.index_count > 0 else 1
    if count > entries:
        return False
    region = fs.map_file(path, fs.getsize(path), create=False, readonly=True)
    try:
        data = region.buf
        base = INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE
        if count > 1:
            # The header names the first and the last entry's offsets: a wrong slot count
            # shifts the entries, and a damaged file's size (cut or grown) fits no geometry.
            first_phy = _ENTRY.unpack_from(data, base + INDEX_ENTRY_SIZE)[1]
            last_phy = _ENTRY.unpack_from(data, base + (count - 1) * INDEX_ENTRY_SIZE)[1]
            if (first_phy, last_phy) != (header.begin_phy_offset, header.end_phy_offset):
                return False
        hashes: dict[int, int] = {}
        linked: set[int] = set()
        walked = min(count, _WALK_ENTRIES)
        for n in range(1, walked):
            key_hash, _phy, _diff, prev = _ENTRY.unpack_from(data, base + n * INDEX_ENTRY_SIZE)
            if key_hash < 0 or not 0 <= prev < n:
                return False
            if prev and prev in hashes and hashes[prev] % slots != key_hash % slots:
                return False
            hashes[n] = key_hash
            linked.add(prev)
        slot_bytes = min(slots * HASH_SLOT_SIZE, _SLOT_READ_BYTES)
        read = _SlotsRead(data, INDEX_HEADER_SIZE, INDEX_HEADER_SIZE + slot_bytes)
        if read.lowest < 0 or read.highest >= count:
            return False
        heads = 0
        for n, key_hash in hashes.items():
            if n in linked:
                continue
            heads += 1
            slot = key_hash % slots
            head = (read.value(slot) if slot < read.slots
                    else _SLOT.unpack_from(data, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE)[0])  # fmt: skip
            if head != n and not (count > walked and head >= walked):  # (a later entry may link to it)
                return False
        # Every slot naming an entry names a head: no more named slots than heads.
        whole = count == walked and read.slots == slots
        return not whole or read.named == heads
    finally:
        region.close()


class _SlotsRead:
    """The big-endian 4-byte slots of data[start:end], a chunk at a time: a chunk of zeros (most
    of a sparse index: a store's first file holds a few entries in 5M slots) is compared, not
    turned into ints, which took ~40 ms of CPU a walk and two walks on every open."""

    def __init__(self, data: mmap.mmap | bytearray, start: int, end: int) -> None:
        self.slots = (end - start) // HASH_SLOT_SIZE
        # The walk asks whether any slot is below 0, or at or past the header's count (>= 1):
        # `lowest` and `highest` count a zero in, as a skipped chunk holds them. `named`: the
        # slots not zero.
        self.lowest = self.highest = self.named = 0
        self._chunks: dict[int, array.array[int]] = {}
        for at in range(start, end, _SLOT_CHUNK_BYTES):
            raw = data[at : min(end, at + _SLOT_CHUNK_BYTES)]
            if raw == _ZERO_CHUNK[: len(raw)]:
                continue
            values = array.array("i", raw)
            if sys.byteorder == "little":
                values.byteswap()  # the file is big-endian
            self._chunks[(at - start) // _SLOT_CHUNK_BYTES] = values
            self.lowest = min(self.lowest, min(values))
            self.highest = max(self.highest, max(values))
            self.named += len(values) - values.count(0)

    def value(self, slot: int) -> int:
        chunk = self._chunks.get(slot // _SLOTS_PER_CHUNK)
        return 0 if chunk is None else chunk[slot % _SLOTS_PER_CHUNK]


def _where_entries_start(fs: FileSystem, path: str, size: int, count: int) -> list[IndexGeometry]:
    """The geometries that put the first entries of `path` where its content has them: the
    first int past the header too large for a slot (a slot names an entry below the header's
    count, so its high bytes are zero) is in entry 1, 2 or 3 (entry 0 is unused): a key's hash
    (nearly always above 2**16), or an offset. Candidates only: the walk decides.
    Review 103 M3: without them, a file of 1000 slots and 3160 entries, read with the settings
    at their defaults, had only the ratio's 800/3200 to try, and its own was never in question.
    Past 65,536 entries none: so many entries read consistently under one geometry only, and
    the walk of another fails within its first ones."""
    if not 1 < count <= _WALK_ENTRIES:
        return []
    zero_bytes = 2  # a slot value below 2**16 has two zero high bytes
    region = fs.map_file(path, size, create=False, readonly=True)
    try:
        data = region.buf
        first, pos = -1, INDEX_HEADER_SIZE
        while first < 0 and pos < size:
            end = min(size, pos + _SLOT_READ_BYTES)
            found = []
            for lane in range(zero_bytes):  # the n-th byte of every int, at C speed
                lane_bytes = bytes(data[pos + lane : end : HASH_SLOT_SIZE])
                rest = len(lane_bytes.lstrip(b"\0"))
                if rest:
                    found.append(len(lane_bytes) - rest)
            if found:
                first = (pos - INDEX_HEADER_SIZE) // HASH_SLOT_SIZE + min(found)
            pos = end
    finally:
        region.close()
    if first < 0:
        return []
    out: list[IndexGeometry] = []
    per_entry = INDEX_ENTRY_SIZE // HASH_SLOT_SIZE
    for ints_before in range(per_entry, 4 * per_entry):  # `first` is in entry 1, 2 or 3
        slots = first - ints_before
        entries_bytes = size - INDEX_HEADER_SIZE - slots * HASH_SLOT_SIZE
        if slots > 0 and entries_bytes > 0 and entries_bytes % INDEX_ENTRY_SIZE == 0:
            out.append(IndexGeometry(slots, entries_bytes // INDEX_ENTRY_SIZE))
    return out


def index_geometry_of(
    fs: FileSystem,
    paths: list[str],
    size: int,
    hints: list[IndexGeometry],
    explicit_slots: int | None = None,
    explicit_entries: int | None = None,
) -> tuple[IndexGeometry | None, tuple[IndexGeometry, ...]]:
    """The (slots, entries) of index files of `size` bytes, and the geometries they read alike
    under when more than one does. Tried: RocketMQ's 4:1 ratio, the caller's settings
    (`hints`), the fullest file's header count taken as max_index_num (a full file's count
    stops there), and where the files' content puts the first entries (`_where_entries_start`);
    each must fit the size and walk cleanly (in the oldest and the newest file). One that does
    is the geometry. Of several, the one the caller's explicit settings (`explicit_slots`,
    `explicit_entries`) name, if they name exactly one; else none: (None, the candidates), and
    the store refuses to guess (review 103 M3: the first that walked, the ratio, was taken over
    the files' own, and the index was written under it). (None, ()) if nothing fits."""
    candidates: list[IndexGeometry] = []
    per_ratio = HASH_SLOT_SIZE + DEFAULT_INDEX_RATIO * INDEX_ENTRY_SIZE
    if (size - INDEX_HEADER_SIZE) % per_ratio == 0:
        slots = (size - INDEX_HEADER_SIZE) // per_ratio
        candidates.append(IndexGeometry(slots, DEFAULT_INDEX_RATIO * slots))
    candidates.extend(hints)
    counts: dict[str, int] = {}
    for p in paths:
        try:
            counts[p] = read_index_header(fs, p).index_count
        except FileNotFoundError:
            if isinstance(fs, RealFileSystem) and os.path.lexists(p):
                raise
            continue  # deleted since the listing by a running store's cleaner (`_sizes`)
        except OSError as exc:
            # Not readable now (access, the disk): it tells nothing of the geometry, and the
            # index's own readers name it; commands that need no index go on (review 119 F3:
            # one such file made every offline command exit with a bare PermissionError).
            log.warning("an index file could not be read to learn the index's geometry", path=p, error=str(exc))
            continue
    paths = list(counts)
    count = max(counts.values(), default=0)
    slots_bytes = size - INDEX_HEADER_SIZE - count * INDEX_ENTRY_SIZE
    if count > 1 and slots_bytes > 0 and slots_bytes % HASH_SLOT_SIZE == 0:
        candidates.append(IndexGeometry(slots_bytes // HASH_SLOT_SIZE, count))
    sample = list(dict.fromkeys(paths[:1] + paths[-1:]))
    for p in sample:
        try:
            candidates.extend(_where_entries_start(fs, p, size, counts[p]))
        except FileNotFoundError:
            if isinstance(fs, RealFileSystem) and os.path.lexists(p):
                raise
    fitting = [c for c in dict.fromkeys(candidates) if _fits(size, c.max_hash_slot_num, c.max_index_num)]
    clean = tuple(c for c in fitting  # in order, once each
                  if all(_walks_cleanly_if_there(fs, p, c.max_hash_slot_num, c.max_index_num) for p in sample))  # fmt: skip
    if len(clean) <= 1:
        return (clean[0] if clean else None), ()
    if explicit_slots is not None or explicit_entries is not None:
        named = [c for c in clean
                 if explicit_slots in (None, c.max_hash_slot_num) and explicit_entries in (None, c.max_index_num)]  # fmt: skip
        if len(named) == 1:
            return named[0], clean
    return None, clean


def detect_geometry(fs: FileSystem, config: StoreConfig, *, live: bool = False) -> StoreGeometry:
    """Read the geometry of the store `config` points at. Reads only. `live`: a running store
    writes it; the newest file of a directory, shorter than its kind's size, is one being
    made (`being_created`), not damage."""
    odd: list[str] = []
    explicit = config.mapped_file_size_commitlog_bytes if "mapped_file_size_commitlog_bytes" in config.explicit else None
    segment, ambiguous = _commitlog_segment_size(fs, config.commitlog_dir, odd, explicit, live)
    explicit_cq = (config.mapped_file_size_consume_queue_bytes
                   if "mapped_file_size_consume_queue_bytes" in config.explicit else None)  # fmt: skip
    cq, cq_ambiguous = _consume_queue_file_size(fs, config.consume_queue_dir, odd, explicit_cq, live)
    index_paths = [
        os.path.join(config.index_dir, n)
        for n in (sorted(fs.listdir(config.index_dir)) if fs.isdir(config.index_dir) else [])
        if len(n) == 17 and n.isdigit()
    ]
    index_size, same = _common_size(fs, index_paths, odd, live)
    if index_size is not None and index_size < INDEX_HEADER_SIZE + HASH_SLOT_SIZE + 2 * INDEX_ENTRY_SIZE:
        odd.extend(p for p in index_paths if p not in odd)  # no index file at all: damage
        index_size = None
    index: IndexGeometry | None = None
    index_ambiguous: tuple[IndexGeometry, ...] = ()
    if index_size is not None:
        hints = [IndexGeometry(config.max_hash_slot_num, config.max_index_num)]
        if "max_hash_slot_num" in config.explicit or "max_index_num" not in config.explicit:
            entries = (index_size - INDEX_HEADER_SIZE - config.max_hash_slot_num * HASH_SLOT_SIZE) // INDEX_ENTRY_SIZE
            hints.append(IndexGeometry(config.max_hash_slot_num, entries))
        if "max_index_num" in config.explicit:
            slots = (index_size - INDEX_HEADER_SIZE - config.max_index_num * INDEX_ENTRY_SIZE) // HASH_SLOT_SIZE
            hints.append(IndexGeometry(slots, config.max_index_num))
        index, index_ambiguous = index_geometry_of(
            fs, same, index_size, hints,
            config.max_hash_slot_num if "max_hash_slot_num" in config.explicit else None,
            config.max_index_num if "max_index_num" in config.explicit else None,
        )  # fmt: skip
    return StoreGeometry(segment, cq, index, index_size, tuple(odd), ambiguous, cq_ambiguous, index_ambiguous)


def adopt_geometry(fs: FileSystem, config: StoreConfig, *, live: bool = False) -> tuple[StoreConfig, StoreGeometry]:
    """`config` with the files' geometry where the caller gave none; StoreConfigMismatch where
    the caller's explicit value contradicts the files. Reads only. `live`: see detect_geometry."""
    geometry = detect_geometry(fs, config, live=live)
    if geometry.commitlog_segment_ambiguous and geometry.commitlog_segment_bytes is None:
        key = "mapped_file_size_commitlog_bytes"
        raise StoreGeometryAmbiguous(key, getattr(config, key), geometry.commitlog_segment_ambiguous, config.commitlog_dir)
    if geometry.consume_queue_file_ambiguous and geometry.consume_queue_file_bytes is None:
        key = "mapped_file_size_consume_queue_bytes"
        raise StoreGeometryAmbiguous(key, getattr(config, key), geometry.consume_queue_file_ambiguous,
                                     config.consume_queue_dir)  # fmt: skip
    if geometry.index_ambiguous and geometry.index is None:
        raise StoreGeometryAmbiguous(
            "max_hash_slot_num", config.max_hash_slot_num,
            tuple((c.max_hash_slot_num, c.max_index_num) for c in geometry.index_ambiguous), config.index_dir,
            keys=("max_hash_slot_num", "max_index_num"),
        )  # fmt: skip
    where = {
        "mapped_file_size_commitlog_bytes": config.commitlog_dir,
        "mapped_file_size_consume_queue_bytes": config.consume_queue_dir,
        "max_hash_slot_num": config.index_dir,
        "max_index_num": config.index_dir,
    }
    if geometry.index_file_bytes is not None and geometry.index is None and not live:
        # Nothing fits: adopt nothing; loading the index then refuses these files loudly. (Not
        # said of a running store's: its newest file, mid-write, may fit nothing for an
        # instant, and its own open checked them: review 119 F4, `dump` of a live store.)
        log.warning("no max_hash_slot_num/max_index_num pair fits the index files",
                    index_dir=config.index_dir, size=geometry.index_file_bytes)  # fmt: skip
    adopted: dict[str, int] = {}
    for key, on_disk in geometry.settings().items():
        given = getattr(config, key)
        if given == on_disk:
            continue
        if key in config.explicit:
            raise StoreConfigMismatch(key, given, on_disk, where[key])
        adopted[key] = on_disk
    if adopted:
        log.info("store geometry adopted from its files", store=config.root_dir, **adopted)
        config = config.adopt(**adopted)
    if geometry.odd_files:
        log.warning("files of another size than the store's geometry (damage; left as they are)",
                    files=list(geometry.odd_files))  # fmt: skip
    return config, geometry
