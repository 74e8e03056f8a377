"""IndexFile and IndexService: query-by-key files, byte-compatible with RocketMQ 4.4.0 (spec §10).

An index file is a fixed-size hash table on disk: a 40-byte header, `max_hash_slot_num` 4-byte
slots each holding the number of the newest entry of its chain, and `max_index_num` 20-byte
entries (entry 0 unused) linked newest-to-oldest through `prevIndex`. Files are named by their
creation time (local `yyyyMMddHHmmssSSS`) and kept oldest first.

Everything here is synchronous and not thread-safe: one owner (the Index actor) calls it.
Readers that are not the owner use `IndexFile.open_readonly` / the module-level helpers.
"""

from __future__ import annotations

import array
import mmap
import os
import re
import struct
import sys
import threading
import datetime
import time
from dataclasses import dataclass
from operator import mul
from typing import Any, Callable, Collection, Final, Iterator, NamedTuple, Sequence

from mqstore.log import get_logger
from mqstore.storage.codec import (
    ReadBuffer,
    KEY_SEPARATOR,
    TRANSACTION_MASK,
    TRANSACTION_ROLLBACK_TYPE,
    index_key_hash,
    java_split,
)
from mqstore.storage import mapguard, speedups
from mqstore.storage.fs import (
    FileCutUnderMapError, FileSystem, MappedRegion, UnreadPageError, close_region_if_free, region_closed,
)
from mqstore.storage.mapped_file import KEEP_FREE_FOR_DERIVED_BYTES, DiskFullError, _log_reserve_failure, free_bytes

__all__ = [
    "DEFAULT_MAX_HASH_SLOT_NUM",
    "DEFAULT_MAX_INDEX_NUM",
    "DEFAULT_MAX_MSGS_NUM_BATCH",
    "INDEX_HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "HASH_SLOT_SIZE",
    "MAX_TRY_IDX_CREATE",
    "IndexEntry",
    "IndexHeader",
    "IndexFile",
    "IndexMaps",
    "IndexReader",
    "IndexService",
    "QueryOffsetResult",
    "index_file_name",
    "index_file_size",
    "iter_index_entries",
    "iter_index_slots",
    "key_hash_and_slot",
    "query_offset_in_files",
    "read_index_header",
    "read_index_slot",
]

log = get_logger(__name__)

INDEX_HEADER_SIZE: Final = 40
HASH_SLOT_SIZE: Final = 4
INDEX_ENTRY_SIZE: Final = 20
INVALID_INDEX: Final = 0
DEFAULT_MAX_HASH_SLOT_NUM: Final = 5_000_000
DEFAULT_MAX_INDEX_NUM: Final = 20_000_000
DEFAULT_MAX_MSGS_NUM_BATCH: Final = 64
MAX_TRY_IDX_CREATE: Final = 3
# Entries get their blocks reserved this many at a time (1 MiB), ahead of the writes.
ENTRIES_RESERVE_AHEAD: Final = 52_428
_INT_MAX: Final = 2_147_483_647

_HEADER = struct.Struct(">qqqqii")  # beginTs, endTs, beginPhy, endPhy, hashSlotCount, indexCount
_HEADER_FROM_END_TS = struct.Struct(">qqqii")  # the same header from offset 8 (endTs onwards)
_HEADER_FROM_END_TS_POS: Final = 8
_HEADER_TIMES_AND_OFFSETS = struct.Struct(">qqqq")
_ENTRY = struct.Struct(">iqii")  # keyHash, phyOffset, timeDiff (s), prevIndex
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_ZERO_ENTRY: Final = bytes(INDEX_ENTRY_SIZE)

_NAME_RE = re.compile(r"\A\d{17}\Z")
DAMAGED_SUFFIX: Final = ".damaged"  # a derived file set aside, for a person to look at


# ---------------------------------------------------------------------------------------
# Key hash (§10.5)

# 31**k mod 2**32, lowest power first; a key's hash is sum(unit_i * 31**(n-1-i)).
_POW31_LEN: Final = 512
_POW31: Final = [pow(31, k, 1 << 32) for k in range(_POW31_LEN)]


def key_hash_and_slot(key: str, max_hash_slot_num: int) -> tuple[int, int]:
    """(keyHash, slot) of an index key: `abs(String.hashCode)`, 0 for Integer.MIN_VALUE.

    ASCII keys take a C-speed path (map/sum over a power table) because unique keys miss the
    codec's lru_cache and the dispatcher hashes one key per UNIQ_KEY and KEYS token.
    """
    if key.isascii() and len(key) <= _POW31_LEN:
        u = sum(map(mul, key.encode("ascii")[::-1], _POW31)) & 0xFFFFFFFF
        if u < 0x80000000:
            key_hash = u
        elif u == 0x80000000:
            key_hash = 0  # Math.abs(Integer.MIN_VALUE) stays negative; RocketMQ maps it to 0
        else:
            key_hash = 0x100000000 - u
    else:
        key_hash = index_key_hash(key)
    return key_hash, key_hash % max_hash_slot_num


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


# ---------------------------------------------------------------------------------------
# Names and sizes (§10.1)


def index_file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    return INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE + max_index_num * INDEX_ENTRY_SIZE


def index_file_name(timestamp_ms: int) -> str:
    """`UtilAll.timeMillisToHumanString`: yyyyMMddHHmmssSSS in the local time zone."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(timestamp_ms // 1000)) + "%03d" % (timestamp_ms % 1000)


def index_file_name_after(name: str) -> str:
    """The name 1 ms after `name` as the digits count (yyyyMMddHHmmssSSS, no time zone)."""
    moment = datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S") + datetime.timedelta(milliseconds=int(name[14:17]) + 1)
    return moment.strftime("%Y%m%d%H%M%S") + "%03d" % (moment.microsecond // 1000)


def index_file_name_to_ms(name: str) -> int:
    """Inverse of `index_file_name` (ambiguous in a DST fall-back hour: either reading is fine)."""
    return int(time.mktime(time.strptime(name[:14], "%Y%m%d%H%M%S"))) * 1000 + int(name[14:17])


# ---------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexHeader:
    """The 40-byte header as stored (index_count raw: a fresh file may hold 0 there)."""

    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int

    @classmethod
    def unpack(cls, buf: ReadBuffer) -> IndexHeader:
        bt, et, bp, ep, hsc, ic = _HEADER.unpack_from(buf, 0)
        return cls(
            begin_timestamp=bt,
            end_timestamp=et,
            begin_phy_offset=bp,
            end_phy_offset=ep,
            hash_slot_count=hsc,
            index_count=ic,
        )


class IndexEntry(NamedTuple):
    entry_no: int
    key_hash: int
    phy_offset: int
    time_diff: int  # seconds since the header's beginTimestamp
    prev_index: int


class QueryOffsetResult(NamedTuple):
    phy_offsets: list[int]  # newest first within each file, newest file first
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


# ---------------------------------------------------------------------------------------
# IndexFile (§10.2-§10.7)


class IndexFile:
    """One index file, mapped. Not thread-safe.

    Header fields live in memory and every setter writes through to the mapped header, as
    4.4.0's IndexHeader does; `flush()` rewrites all six and forces the whole file.
    """

    def __init__(
        self,
        region: MappedRegion,
        *,
        fs: FileSystem,
        max_hash_slot_num: int,
        max_index_num: int,
        readonly: bool = False,
        follows_owner: bool = False,
        fresh: bool = False,
    ) -> None:
        if max_hash_slot_num <= 0 or max_index_num <= 1:
            raise ValueError(f"max_hash_slot_num must be > 0 and max_index_num > 1, not {max_hash_slot_num} and {max_index_num}")
        if follows_owner and not readonly:
            raise ValueError("follows_owner is for read-only maps")
        if region.size != index_file_size(max_hash_slot_num, max_index_num):
            raise ValueError(f"{region.path}: {region.size} bytes, not the {index_file_size(max_hash_slot_num, max_index_num)} "
                             f"that max_hash_slot_num={max_hash_slot_num}, max_index_num={max_index_num} make")  # fmt: skip
        self._fs = fs
        self._region = region
        self._buf = region.buf
        self.path: str = region.path
        self.name: str = os.path.basename(region.path)
        self.max_hash_slot_num: Final = max_hash_slot_num
        self.max_index_num: Final = max_index_num
        self.readonly: Final = readonly
        # A reader of a file the owner is still writing: see `reload_header` and `_chain_bound`.
        self.follows_owner: Final = follows_owner
        self._entries_pos: Final = INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE
        self.begin_timestamp = self.end_timestamp = self.begin_phy_offset = self.end_phy_offset = 0
        self.hash_slot_count = self.index_count = 0
        # Every write through the map lies below this: blocks reserved (fallocate). The
        # header and the slots are reserved whole (slots are written and read anywhere, and a
        # read fault on a hole of a full tmpfs dies with SIGBUS too); entries a window ahead.
        self._reserved_end = 0
        if fresh:
            # A file just created is all holes: reading its header before its blocks are
            # reserved faults (SIGBUS) on a full tmpfs. Its header is zeros anyway.
            self.index_count = 1
        else:
            self.reload_header()
        # Where reservations start initialising pages (fs.RealMappedRegion._initialise): the
        # whole of a new file; only past the entries of one reopened (its slots were
        # initialised when it was created, and reading them all again costs the open time).
        self._unwritten_from = 0 if fresh else self._entries_pos + self.index_count * INDEX_ENTRY_SIZE

    # construction -----------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        fs: FileSystem,
        path: str,
        *,
        max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
        max_index_num: int = DEFAULT_MAX_INDEX_NUM,
        end_phy_offset: int = 0,
        end_timestamp: int = 0,
    ) -> IndexFile:
        """A new, empty file. `end_*` are the previous file's end values (the §10.6 quirk):
        they pre-set both begin and end header fields, exactly like 4.4.0's constructor."""
        if fs.exists(path):  # never map over an existing file: kept under python -O
            raise FileExistsError(f"index file {path} already exists")
        region = fs.map_file(path, index_file_size(max_hash_slot_num, max_index_num))
        f = cls(region, fs=fs, max_hash_slot_num=max_hash_slot_num, max_index_num=max_index_num, fresh=True)
        if f.reserve_entries(2) < 2:  # the header, every slot and the first entry
            region.close()
            fs.remove(path)  # nothing was written: no file is better than a sparse one
            raise DiskFullError(f"no disk space for a new index file {path}")
        if end_phy_offset > 0:
            f.begin_phy_offset = f.end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            f.begin_timestamp = f.end_timestamp = end_timestamp
        if end_phy_offset > 0 or end_timestamp > 0:
            # Java writes these four through; the counts stay 0 on disk until the first put.
            _HEADER_TIMES_AND_OFFSETS.pack_into(
                f._buf, 0, f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset
            )
        return f

    @classmethod
    def load(
        cls,
        fs: FileSystem,
        path: str,
        *,
        max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
        max_index_num: int = DEFAULT_MAX_INDEX_NUM,
    ) -> IndexFile:
        """Map an existing file for writing. Raises OSError if missing or of another size."""
        region = fs.map_file(path, index_file_size(max_hash_slot_num, max_index_num), create=False)
        f = cls(region, fs=fs, max_hash_slot_num=max_hash_slot_num, max_index_num=max_index_num)
        # Best effort: a file this store made has its slots reserved already; if the disk is
        # full the writes ask again, and refuse, before writing.
        f.reserve_entries(f.index_count)
        return f

    @classmethod
    def open_readonly(
        cls,
        fs: FileSystem,
        path: str,
        *,
        max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
        follows_owner: bool = False,
    ) -> IndexFile:
        """Map a file read-only; the entry count is derived from the file size. With
        `follows_owner` the file may be written meanwhile: call `reload_header` before each
        read, and chains are walked within the map rather than within the header's count."""
        size = fs.getsize(path)
        entries_bytes = size - INDEX_HEADER_SIZE - max_hash_slot_num * HASH_SLOT_SIZE
        if entries_bytes <= INDEX_ENTRY_SIZE or entries_bytes % INDEX_ENTRY_SIZE:
            raise ValueError(f"{path}: size {size} does not fit max_hash_slot_num={max_hash_slot_num}")
        region = fs.map_file(path, size, create=False, readonly=True)
        return cls(
            region,
            fs=fs,
            max_hash_slot_num=max_hash_slot_num,
            max_index_num=entries_bytes // INDEX_ENTRY_SIZE,
            readonly=True,
            follows_owner=follows_owner,
        )

    # header -----------------------------------------------------------------------------
    def reload_header(self) -> None:
        """Take the header fields from the map (a reader's view of the owner's progress)."""
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, index_count) = _HEADER.unpack_from(self._buf, 0)  # fmt: skip
        # A fresh file holds 0 here until its first put; entry 0 is never used.
        self.index_count = index_count if index_count > 0 else 1

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._buf,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    def header(self) -> IndexHeader:
        return IndexHeader(
            begin_timestamp=self.begin_timestamp,
            end_timestamp=self.end_timestamp,
            begin_phy_offset=self.begin_phy_offset,
            end_phy_offset=self.end_phy_offset,
            hash_slot_count=self.hash_slot_count,
            index_count=self.index_count,
        )

    @property
    def file_size(self) -> int:
        return self._region.size

    def is_write_full(self) -> bool:
        return self.index_count >= self.max_index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        fb, fe = self.begin_timestamp, self.end_timestamp
        return (begin < fb and end > fe) or (fb <= begin <= fe) or (fb <= end <= fe)

    # writing (§10.6) --------------------------------------------------------------------
    def reserve_entries(self, count: int) -> int:
        """Reserve blocks for the header, the slots and entries below `count` (a window more
        if the disk has room); how many entries have blocks behind them now."""
        if self.readonly:
            return 0
        need_end = self._entries_pos + min(count, self.max_index_num) * INDEX_ENTRY_SIZE
        if need_end > self._reserved_end:
            window_end = min(need_end + ENTRIES_RESERVE_AHEAD * INDEX_ENTRY_SIZE, self._region.size)
            free = free_bytes(self._fs, self.path)
            try:
                for end in (window_end, need_end):
                    if free is not None and free - (end - self._reserved_end) < KEEP_FREE_FOR_DERIVED_BYTES:
                        continue  # never the filesystem's last blocks (see mapped_file)
                    if self._region.reserve(end, unwritten_from=self._unwritten_from):
                        self._reserved_end = end
                        break
            except FileCutUnderMapError as exc:  # the owner's own checks name the cut file
                log.warning("index_reserve_failed", path=self.path, error=str(exc))
                self._reserved_end = self._region.size
            except OSError as exc:
                # An I/O error, a read-only filesystem: no entry into pages nothing backs
                # (review 48 M1); the index waits, as on a full disk, and tries again.
                _log_reserve_failure(self.path, exc)
        return max(self._reserved_end - self._entries_pos, 0) // INDEX_ENTRY_SIZE

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Head-insert `key` → `phy_offset`. False only when the file is full; DiskFullError
        (nothing written) when the disk has no blocks for the entry."""
        index_count = self.index_count
        if index_count >= self.max_index_num:
            return False
        if self.reserve_entries(index_count + 1) <= index_count:
            raise DiskFullError(f"no disk space for index entry {index_count} of {self.path}")
        buf = self._buf
        key_hash, slot = key_hash_and_slot(key, self.max_hash_slot_num)
        slot_pos = INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE
        slot_value = _INT.unpack_from(buf, slot_pos)[0]
        if slot_value <= INVALID_INDEX or slot_value > index_count:
            slot_value = INVALID_INDEX
        begin_timestamp = self.begin_timestamp
        diff_ms = store_timestamp - begin_timestamp
        # Java: long division truncating toward zero, then clamp to [0, Integer.MAX_VALUE].
        if begin_timestamp <= 0 or diff_ms < 0:
            time_diff = 0
        else:
            time_diff = diff_ms // 1000
            if time_diff > _INT_MAX:
                time_diff = _INT_MAX
        _ENTRY.pack_into(
            buf, self._entries_pos + index_count * INDEX_ENTRY_SIZE, key_hash, phy_offset, time_diff, slot_value
        )
        _INT.pack_into(buf, slot_pos, index_count)
        self.hash_slot_count += 1  # 4.4.0 counts every put, not only newly used slots
        self.index_count = index_count + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        if index_count <= 1:
            # After the entry was written against the pre-set begin (the §10.6 quirk).
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
            self._write_header()
        else:
            _HEADER_FROM_END_TS.pack_into(
                buf,
                _HEADER_FROM_END_TS_POS,
                store_timestamp,
                self.begin_phy_offset,
                phy_offset,
                self.hash_slot_count,
                index_count + 1,
            )
        return True

    def put_batch(self, requests: tuple[Any, ...], start: int, stop: int, indexed_below: int) -> int:
        """`IndexService.build_index` for requests[start:stop] in C, into this file only; the
        index of the first request it left (stop, or one that needs the next file)."""
        native = speedups.native
        assert native is not None and not self.readonly
        state = [
            self.index_count, self.hash_slot_count, self.begin_phy_offset,
            self.begin_timestamp, self.end_phy_offset, self.end_timestamp,
        ]  # fmt: skip
        # The kernel writes no entry at or past its max_index_num: give it only what has
        # blocks behind it. Where that stops it, the Python path reserves (or refuses).
        reserved = self.reserve_entries(self.index_count + ENTRIES_RESERVE_AHEAD)
        if reserved <= self.index_count:
            return start
        done: int = native.index_put_batch(
            self._buf, self.max_hash_slot_num, min(reserved, self.max_index_num), state, requests, start, stop,
            indexed_below,
        )  # fmt: skip
        if state[0] != self.index_count:
            (self.index_count, self.hash_slot_count, self.begin_phy_offset,
             self.begin_timestamp, self.end_phy_offset, self.end_timestamp) = state  # fmt: skip
            # One header write for the batch: the same bytes as put_key's per-key writes.
            self._write_header()
        return done

    # reading (§10.7) --------------------------------------------------------------------
    def slot_value(self, slot: int) -> int:
        assert 0 <= slot < self.max_hash_slot_num, slot
        value: int = _INT.unpack_from(self._buf, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE)[0]
        return value

    def entry(self, entry_no: int) -> IndexEntry:
        assert 0 <= entry_no < self.max_index_num, entry_no
        kh, phy, td, prev = _ENTRY.unpack_from(self._buf, self._entries_pos + entry_no * INDEX_ENTRY_SIZE)
        return IndexEntry(entry_no, kh, phy, td, prev)

    def select_phy_offset(
        self, key: str, max_num: int, begin: int, end: int, result: list[int] | None = None
    ) -> list[int]:
        """Offsets of entries whose keyHash equals `key`'s and whose time is in [begin, end],
        in chain order (newest first), appended to `result` until it holds `max_num`.

        Hash collisions are returned too: callers must compare the message's keys."""
        if result is None:
            result = []
        bound = self._chain_bound()
        native = speedups.native
        if native is not None and native.index_select(
            self._buf, key, self.max_hash_slot_num, self._entries_pos, bound, self.begin_timestamp,
            self.index_count, max_num, begin, end, result,
        ):  # fmt: skip
            return result  # the same walk in C (the walk below decides where it declines)
        key_hash, slot = key_hash_and_slot(key, self.max_hash_slot_num)
        n = self.slot_value(slot)
        if n <= INVALID_INDEX or n > bound or self.index_count <= 1:
            return result
        buf = self._buf
        entries_pos = self._entries_pos
        begin_timestamp = self.begin_timestamp
        # Bound the walk: a well-formed chain only goes backwards, a corrupt one may cycle.
        for _ in range(bound):
            if len(result) >= max_num:
                break
            kh, phy, time_diff, prev = _ENTRY.unpack_from(buf, entries_pos + n * INDEX_ENTRY_SIZE)
            if time_diff < 0:
                break
            # The first entry's time was taken against the begin a new file is seeded with (the
            # previous file's end), then the begin was set to its own store time (the §10.6
            # quirk): read as begin + diff it lay later by the gap (review 127 F4: missed by a
            # window holding it, for up to the gap). Its store time is the begin itself.
            time_read = begin_timestamp if n == 1 else begin_timestamp + time_diff * 1000
            if kh == key_hash and begin <= time_read <= end:
                result.append(phy)
            if prev <= INVALID_INDEX or prev > bound or prev == n or time_read < begin:
                break
            n = prev
        return result

    def has_entry(self, key: str, phy_offset: int) -> bool:
        """Does `key`'s chain hold an entry with its hash at `phy_offset`? (Re-indexing a
        message that may be partly indexed already skips what is there.)"""
        key_hash, slot = key_hash_and_slot(key, self.max_hash_slot_num)
        bound = self._chain_bound()
        n = self.slot_value(slot)
        for _ in range(bound):  # bounded: a corrupt chain may cycle
            if n <= INVALID_INDEX or n > bound:
                return False
            kh, phy, _time_diff, prev = _ENTRY.unpack_from(self._buf, self._entries_pos + n * INDEX_ENTRY_SIZE)
            if kh == key_hash and phy == phy_offset:
                return True
            if phy < phy_offset or prev == n:  # chains run newest first: past it
                return False
            n = prev
        return False

    def _chain_bound(self) -> int:
        """The highest entry number a slot or prevIndex may name. The owner's count is exact.
        A reader's header may trail what the owner has written (entry, then slot, then the
        header, once per batch): a slot can name an entry past the header's count whose chain
        leads to entries the reader must find, so a reader follows any entry inside the map;
        a torn read then only misses or yields an offset the caller's check rejects."""
        return self.max_index_num - 1 if self.follows_owner else self.index_count

    def iter_entries(self) -> Iterator[IndexEntry]:
        """Entries 1 .. indexCount-1 in write order."""
        for n in range(1, min(self.index_count, self.max_index_num)):
            yield self.entry(n)

    def iter_slots(self) -> Iterator[tuple[int, int]]:
        """(slot, head entry number) for every non-zero slot."""
        slots = array.array("i")
        assert slots.itemsize == 4
        slots.frombytes(bytes(self._buf[INDEX_HEADER_SIZE : self._entries_pos]))
        if sys.byteorder == "little":
            slots.byteswap()
        for slot, value in enumerate(slots):
            if value:
                yield slot, value

    # recovery support -------------------------------------------------------------------
    def truncate_entries_from(self, phy_offset: int) -> bool:
        """Undo the newest entries whose phyOffset >= `phy_offset` (they are a suffix: entries
        are written in commitlog order). Restores their slots to the previous heads, zeroes
        them and rewinds the header. Returns False, changing nothing, if that would leave the
        file empty or the chains do not agree with the entries (a torn file): the caller then
        deletes the whole file, to be rebuilt from the commitlog."""
        assert not self.readonly
        count = self.index_count
        first_removed = count
        while first_removed > 1 and self.entry(first_removed - 1).phy_offset >= phy_offset:
            first_removed -= 1
        if first_removed == count:
            return True
        if first_removed <= 1:
            return False
        overlay: dict[int, int] = {}
        for n in range(count - 1, first_removed - 1, -1):
            e = self.entry(n)
            slot = e.key_hash % self.max_hash_slot_num
            if overlay.get(slot, self.slot_value(slot)) != n or not (0 <= e.prev_index < n):
                return False
            overlay[slot] = e.prev_index
        for slot, head in overlay.items():
            _INT.pack_into(self._buf, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE, head)
        start = self._entries_pos + first_removed * INDEX_ENTRY_SIZE
        self._buf[start : self._entries_pos + count * INDEX_ENTRY_SIZE] = _ZERO_ENTRY * (count - first_removed)
        last = self.entry(first_removed - 1)
        self.end_phy_offset = last.phy_offset
        # Only second precision survives; rounding down keeps the file's time range honest.
        self.end_timestamp = self.begin_timestamp + (last.time_diff * 1000 if first_removed - 1 > 1 else 0)
        self.hash_slot_count = max(0, self.hash_slot_count - (count - first_removed))
        self.index_count = first_removed
        self._write_header()
        return True

    # durability and lifetime ------------------------------------------------------------
    def flush(self) -> None:
        """Rewrite the header and force the whole file (slots are scattered, so no ranges)."""
        assert not self.readonly
        self._write_header()
        self._region.flush(0, self._region.size)

    def close(self) -> None:
        self._region.close()

    def cut_short(self) -> bool:
        """Whether a page of this file's map faulted when touched (an I/O error, or the file cut
        meanwhile): what was read there is the guard's zeros, not the file's."""
        return self._region.cut_short()

    @property
    def unmapped(self) -> bool:
        """Whether this file's map was closed (a reader's, given back from another thread)."""
        return region_closed(self._region)

    def destroy(self) -> None:
        """Unmap and delete. Raises OSError if the file cannot be removed."""
        assert not self.readonly
        self._region.close()
        self._fs.remove(self.path)


# ---------------------------------------------------------------------------------------
# Read-only helpers for tools (dump, verify)


def read_index_header(fs: FileSystem, path: str) -> IndexHeader:
    """The header as stored, without any knowledge of the file's slot and entry counts."""
    size = fs.getsize(path)
    if size < INDEX_HEADER_SIZE:
        raise ValueError(f"{path}: shorter than the {INDEX_HEADER_SIZE}-byte index header")
    # Its bytes only: not read_bytes (420 MB), nor a map of the file (a process short of
    # address space refused a 40-byte read with a bare ENOMEM, review 119 F3).
    data = fs.read_at(path, 0, INDEX_HEADER_SIZE)
    if len(data) < INDEX_HEADER_SIZE:
        raise ValueError(f"{path}: shorter than the {INDEX_HEADER_SIZE}-byte index header")
    return IndexHeader.unpack(data)


def iter_index_entries(
    fs: FileSystem, path: str, *, max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM
) -> Iterator[IndexEntry]:
    f = IndexFile.open_readonly(fs, path, max_hash_slot_num=max_hash_slot_num)
    try:
        yield from f.iter_entries()
    finally:
        f.close()


def iter_index_slots(
    fs: FileSystem, path: str, *, max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM
) -> Iterator[tuple[int, int]]:
    f = IndexFile.open_readonly(fs, path, max_hash_slot_num=max_hash_slot_num)
    try:
        yield from f.iter_slots()
    finally:
        f.close()


def read_index_slot(
    fs: FileSystem, path: str, slot: int, *, max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM
) -> int:
    f = IndexFile.open_readonly(fs, path, max_hash_slot_num=max_hash_slot_num)
    try:
        return f.slot_value(slot)
    finally:
        f.close()


# ---------------------------------------------------------------------------------------
# Querying (§10.8 queryOffset): one walk for the owner and for readers


def query_offset_in_files(
    files: Sequence[IndexFile], topic: str, key: str, max_num: int, begin: int, end: int
) -> QueryOffsetResult:
    """`IndexService.queryOffset` over `files` (oldest first): newest file first, each file's
    chain newest first, until `max_num` offsets or a file that begins before `begin`. The
    last-update fields are the newest file's endTimestamp and endPhyOffset."""
    result: list[int] = []
    last_ts = 0
    last_phy = 0
    full_key = build_key(topic, key)
    for i in range(len(files) - 1, -1, -1):
        f = files[i]
        if i == len(files) - 1:
            last_ts = f.end_timestamp
            last_phy = f.end_phy_offset
        if f.is_time_matched(begin, end):
            f.select_phy_offset(full_key, max_num, begin, end, result)
        if f.begin_timestamp < begin:
            break
        if len(result) >= max_num:
            break
    return QueryOffsetResult(result, last_ts, last_phy)


_tuple_new = tuple.__new__  # QueryOffsetResult from the C walk's tuple, without _make's frame


class IndexMaps:
    """The read-only maps of index/ that every reading thread shares: one per file, made at the
    first thread's need, closed once its file is gone (`release_deleted`, from the store's
    tick), when a fault made it read zeros (`discard`), or at `close`. Thread-safe.

    Each thread mapped every file for itself before (review 84 F3), and CPython's mmap keeps a
    descriptor per map: 51 index files and 32 idle querying threads held 1,632 descriptors.
    Shared, a thread costs no descriptor, and the files cost as many as the owner's own maps.
    A map closed under another thread's walk is what that thread already expects of a file
    the cleaner deleted: its walk declines (None), and the owner answers instead."""

    def __init__(self, fs: FileSystem, index_dir: str, expected_size: int) -> None:
        self._fs = fs
        self.index_dir = index_dir
        self._expected_size = expected_size
        self._regions: dict[str, MappedRegion] = {}
        self._lock = threading.Lock()
        self.closed = False
        # Moves whenever a map is closed: a reader synced at another generation looks again.
        self.generation = 0

    @property
    def mapped_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(name for name, region in self._regions.items() if not region_closed(region))

    def region(self, name: str) -> MappedRegion | None:
        """The shared map of index/`name`, made if none is open (or the open one faulted);
        None if the file is not there at the size the settings give it. OSError if it cannot
        be mapped now (no descriptor, no address space)."""
        with self._lock:
            if self.closed:
                return None
            region = self._regions.get(name)
            if region is not None and not region_closed(region) and not region.cut_short():
                return region
            path = os.path.join(self.index_dir, name)
            if self._fs.getsize(path) != self._expected_size:
                return None
            fresh = self._fs.map_file(path, self._expected_size, create=False, readonly=True)
            if region is not None:
                self.generation += 1
                close_region_if_free(region)  # (faulted: readers still holding it drop it as they look)
            self._regions[name] = fresh
            return fresh

    def discard(self, region: MappedRegion) -> None:
        """A map that faulted (it reads zeros where pages were gone): closed, and the next
        `region` maps the file anew."""
        with self._lock:
            name = os.path.basename(region.path)
            if self._regions.get(name) is region:
                del self._regions[name]
            self.generation += 1
            close_region_if_free(region)

    def release_deleted(self, present: Collection[str]) -> int:
        """Unmap the files gone from index/ (`present`: the names listed now); how many maps it
        gave back. A deleted file's blocks go back to the disk only with its last map, and a
        thread that queries no more never looks again (review 46 M5). A map a walk holds now
        (its C walk's export) stays, and goes at the next call."""
        released = 0
        with self._lock:
            for name, region in list(self._regions.items()):
                if name in present or not isinstance(region.buf, mmap.mmap):
                    continue  # (a simulated file has no map to give back)
                if self._fs.exists(os.path.join(self.index_dir, name)):
                    continue  # made after `present` was listed
                was_open = not region_closed(region)
                if not was_open or close_region_if_free(region):
                    del self._regions[name]
                    released += was_open
            self.generation += released
        return released

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.generation += 1
            regions, self._regions = list(self._regions.values()), {}
            for region in regions:
                close_region_if_free(region)


class IndexReader:
    """A read-only view of the index directory for one reader thread. Not thread-safe,
    except `close`, which another thread may call (the store closing).

    It wraps the maps of the files the owner last published (`sync`), shared with the other
    reading threads (`IndexMaps`: one map per file), and answers `query_offset` with the
    owner's own walk (`query_offset_in_files`). Files the owner no longer lists (deleted by
    the cleaner, dropped by recovery) are dropped at the next `sync`; their maps are closed
    by `IndexMaps.release_deleted`. A reader made without `maps` (tools) has maps of its own,
    closed with it.
    """

    def __init__(
        self,
        fs: FileSystem,
        index_dir: str,
        *,
        max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
        max_index_num: int = DEFAULT_MAX_INDEX_NUM,
        max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
        maps: IndexMaps | None = None,
    ) -> None:
        self._fs = fs
        self.index_dir = index_dir
        self.max_hash_slot_num = max_hash_slot_num
        self.max_index_num = max_index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self._expected_size = index_file_size(max_hash_slot_num, max_index_num)
        self._owns_maps = maps is None
        self.maps = IndexMaps(fs, index_dir, self._expected_size) if maps is None else maps
        self._by_name: dict[str, IndexFile] = {}
        self._files: list[IndexFile] = []  # in the order of the synced names (oldest first)
        self._bufs: tuple[Any, ...] = ()  # their maps, for the C walk (native.index_query)
        # What the C query (`native.query_keyed`) walks, as `query_offset` walks it: the synced
        # files' maps (oldest first), max_hash_slot_num, where the entries start, the highest
        # entry number a chain may name, max_msgs_num_batch. None when not synced, or closed.
        self.walk_args: tuple[tuple[Any, ...], int, int, int, int] | None = None
        self._entries_pos = INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE
        self._synced: tuple[str, ...] | None = None
        self._synced_generation = -1  # the maps' generation at the last sync
        self.closed = False
        self.faults_seen = mapguard.total_faults()  # as CommitLogReader.faults_seen

    @property
    def mapped_names(self) -> tuple[str, ...]:
        """The files this reader reads through open maps (tests count them)."""
        return tuple(name for name, f in self._by_name.items() if not f.unmapped)

    def sync(self, names: tuple[str, ...]) -> bool:
        """Read the files `names` lists (oldest first), and no others. False if one cannot be
        mapped (just deleted, another size, no descriptor): then ask the owner instead."""
        maps = self.maps
        if names is self._synced and maps.generation == self._synced_generation:
            return not self.closed
        generation = maps.generation  # (read first: a close after it makes the next sync look)
        by_name = self._by_name
        self._files = []
        self._bufs = ()
        self.walk_args = None
        self._synced = None
        wanted = set(names)
        dropped = [n for n, f in by_name.items() if n not in wanted or f.unmapped]
        for name in dropped:
            del by_name[name]  # (one closed but still listed is read anew below, if it is there)
        if any(name not in wanted for name in dropped):
            maps.release_deleted(wanted)  # the owner deleted files: their blocks go back now
        try:
            for name in names:
                if name not in by_name and not self.closed:
                    region = maps.region(name)
                    if region is None:
                        return False
                    by_name[name] = IndexFile(
                        region, fs=self._fs, max_hash_slot_num=self.max_hash_slot_num,
                        max_index_num=self.max_index_num, readonly=True, follows_owner=True,
                    )  # fmt: skip
        except (OSError, ValueError):
            return False
        if self.closed:
            by_name.clear()
            return False
        self._files = [by_name[name] for name in names]
        self._bufs = tuple(f._buf for f in self._files)
        self.walk_args = (self._bufs, self.max_hash_slot_num, self._entries_pos, self.max_index_num - 1,
                          self.max_msgs_num_batch)  # fmt: skip
        self._synced = names
        self._synced_generation = generation
        return True

    def look_for_faults(self) -> list[UnreadPageError]:
        """The files whose map faulted since this reader last looked (their slots and entries
        read as the guard's zeros: no hits), each unmapped so the next `sync` maps it again."""
        self.faults_seen = mapguard.total_faults()
        # (closed ones too: another thread may have discarded a shared map this one read)
        faulted = [f for f in self._by_name.values() if f.cut_short()]
        if faulted:
            self._files, self._bufs, self.walk_args, self._synced = [], (), None, None
            for f in faulted:
                self._by_name.pop(f.name, None)
                self.maps.discard(f._region)
        return [UnreadPageError(f.path, "its hits are not in this answer; ask again once the file reads whole")
                for f in faulted]  # fmt: skip

    def raise_if_faulted(self) -> None:
        """UnreadPageError if one of this reader's maps faulted since it last looked (one
        compare when none did)."""
        if mapguard.total_faults() != self.faults_seen and (faulted := self.look_for_faults()):
            raise faulted[0]

    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryOffsetResult | None:
        """`IndexService.query_offset` read from this reader's maps; None if a map was closed
        under the read (the store closing). UnreadPageError if a page of one faulted."""
        found = self._query_offset(topic, key, max_num, begin, end)
        self.raise_if_faulted()
        return None if self.closed else found

    def _query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryOffsetResult | None:
        files = self._files
        max_num = min(max_num, self.max_msgs_num_batch)
        native = speedups.native
        try:
            for f in files:
                f.reload_header()
            if native is not None:
                # The same walk in C over the same maps (it reads each header again, as the
                # owner may have moved it since: both are a moment of the owner's progress).
                found = native.index_query(self._bufs, topic, key, self.max_hash_slot_num, self._entries_pos,
                                           self.max_index_num - 1, max_num, begin, end)  # fmt: skip
                if found is not None:
                    return _tuple_new(QueryOffsetResult, found)
            return query_offset_in_files(files, topic, key, max_num, begin, end)
        except ValueError:
            if self.closed or any(f.unmapped for f in files):
                return None  # closed under the read (the store closing, a deleted file given back)
            raise

    def close(self) -> None:
        """From any thread. The shared maps stay open for the other readers (the store closes
        them, `IndexMaps.close`); a reader's own maps are closed with it."""
        self.closed = True
        self.walk_args = None
        self._by_name = {}
        self._files = []
        self._bufs = ()
        if self._owns_maps:
            self.maps.close()


# ---------------------------------------------------------------------------------------
# IndexService (§10.8)


def _no_sleep(_ms: int) -> None:
    return None


class IndexService:
    """The ordered list of index files (oldest first) and the dispatcher's entry point.

    Not thread-safe: the owning actor is the only caller (4.4.0 guards the list with a
    read-write lock because its dispatcher, query and cleaner threads share it).
    """

    def __init__(
        self,
        fs: FileSystem,
        index_dir: str,
        *,
        clock_ms: Callable[[], int],
        max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
        max_index_num: int = DEFAULT_MAX_INDEX_NUM,
        max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
        on_index_file_full: Callable[[int], None] | None = None,
        on_flush_failed: Callable[[], None] | None = None,
        sleep_ms: Callable[[int], None] = _no_sleep,
        retry_interval_ms: int = 1000,
    ) -> None:
        self._fs = fs
        self.index_dir = index_dir
        self._clock_ms = clock_ms
        self.max_hash_slot_num = max_hash_slot_num
        self.max_index_num = max_index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self._on_index_file_full = on_index_file_full
        self._on_flush_failed = on_flush_failed
        self._sleep_ms = sleep_ms
        self.retry_interval_ms = retry_interval_ms
        self.files: list[IndexFile] = []
        # Set when no index file could be created after MAX_TRY_IDX_CREATE tries (4.4.0 maps it
        # to RunningFlags.WRITE_INDEX_FILE_ERROR until a restart). The owner clears it: its
        # batch waits and is retried on its ticks (actors/index.py).
        self.index_error = False
        self.last_create_error = ""  # why the last file creation failed, for the owner's log
        self.set_aside: list[str] = []  # what `load` found damaged and set aside, for people
        # Why the last build_index_until_full stopped early, if the disk was full: not an
        # error of the index, the owner retries once there is space.
        self.disk_full: DiskFullError | None = None

    # loading ----------------------------------------------------------------------------
    def load(self, last_exit_ok: bool, index_msg_timestamp: int) -> bool:
        """Map every file of the index directory, oldest first. After an abnormal exit, files
        whose endTimestamp is newer than the checkpoint's indexMsgTimestamp are deleted: they
        may be torn, and recovery re-dispatches their messages.

        An index file is derived data: one that is empty, short, of a size its siblings do not
        share, is set aside as `<name>.damaged` (never deleted) with every
        later file (deleted: the re-dispatch writes them again), listed in `set_aside`, and
        the caller rebuilds from the last kept file. False on an I/O error, or when every file
        holds together at one other size (a store of other max_hash_slot_num/max_index_num
        settings: not damage, so refused rather than "repaired"). The I/O error is kept in
        `load_error` (None for the geometry): the caller raises with its errno and file."""
        self.load_error: OSError | None = None
        if self.files:
            raise ValueError("load() on an index service that already has files")
        fs = self._fs
        self.set_aside = []
        if not fs.exists(self.index_dir):
            return True
        expected = index_file_size(self.max_hash_slot_num, self.max_index_num)
        try:
            names = []
            for name in fs.listdir(self.index_dir):
                path = os.path.join(self.index_dir, name)
                if not _NAME_RE.match(name) or fs.isdir(path):
                    log.warning("index_load_skip_foreign_file", path=path)
                    continue
                names.append(name)
            sizes = {name: fs.getsize(os.path.join(self.index_dir, name)) for name in names}
            if sizes and expected not in sizes.values() and self._other_geometry(sizes):
                size = next(iter(sizes.values()))
                log.error("index_load_wrong_size", dir=self.index_dir, size=size, expected=expected)
                return False
            for n, name in enumerate(names):
                path = os.path.join(self.index_dir, name)
                if sizes[name] != expected:
                    self._set_aside_from(names[n:], sizes, expected)
                    break
                f = IndexFile.load(
                    fs, path, max_hash_slot_num=self.max_hash_slot_num, max_index_num=self.max_index_num
                )
                if not last_exit_ok and f.end_timestamp > index_msg_timestamp:
                    log.info(
                        "index_load_drop_unflushed_file",
                        path=path,
                        end_timestamp=f.end_timestamp,
                        index_msg_timestamp=index_msg_timestamp,
                    )
                    f.destroy()
                    continue
                self.files.append(f)
        except OSError as e:
            log.error("index_load_failed", dir=self.index_dir, error=str(e))
            self.load_error = e
            return False
        return True

    def _other_geometry(self, sizes: dict[str, int]) -> bool:
        """Whether the index files hold together at one size that is not this service's: a
        store written with another max_index_num, which is not damage (refused, not rebuilt).
        Each file is a whole number of entries after this max_hash_slot_num's slots, and its
        header's count fits them (a file cut into its entries keeps a count they no longer
        have). A file of a size its siblings do not share is damage."""
        if len(set(sizes.values())) != 1:
            return False
        size = next(iter(sizes.values()))
        entries = size - INDEX_HEADER_SIZE - self.max_hash_slot_num * HASH_SLOT_SIZE
        if entries <= INDEX_ENTRY_SIZE or entries % INDEX_ENTRY_SIZE:
            return False
        for name in sizes:
            header = read_index_header(self._fs, os.path.join(self.index_dir, name))
            if not 0 <= header.index_count <= entries // INDEX_ENTRY_SIZE:
                return False
        return True

    def _set_aside_from(self, names: list[str], sizes: dict[str, int], expected: int) -> None:
        """The first of `names` is damaged: keep it as `.damaged`; its successors go (their
        keys are re-dispatched, and a kept later file would make build_index skip them)."""
        fs = self._fs
        first = os.path.join(self.index_dir, names[0])
        kept = fs.set_aside(first, DAMAGED_SUFFIX)
        why = f"{sizes[names[0]]} bytes, not {expected}"
        self.set_aside.append(f"{names[0]}: {why}; kept as {os.path.basename(kept)}")
        log.error("index_file_set_aside", path=first, reason=why, kept_as=kept)
        for name in names[1:]:
            fs.remove(os.path.join(self.index_dir, name))
            self.set_aside.append(f"{name}: after a damaged file")

    # writing ----------------------------------------------------------------------------
    def build_index(
        self,
        *,
        topic: str,
        commitlog_offset: int,
        store_timestamp: int,
        sys_flag: int,
        keys: str | None,
        uniq_key: str | None,
    ) -> bool:
        """Index one dispatched message: UNIQ_KEY first, then each KEYS token.

        True when indexed or deliberately skipped (already indexed, rollback message); False
        when no index file could be had (then `index_error` is set)."""
        f = self.retry_get_and_create_index_file()
        if f is None:
            log.error("index_build_no_file", commitlog_offset=commitlog_offset)
            return False
        # Re-dispatch after recovery; note `<`: the message at endPhyOffset is indexed again, as
        # in Java: its keys may be split across a full file and a newer one that recovery
        # dropped. Idempotent: a key already there with this offset is skipped, none dropped.
        if commitlog_offset < f.end_phy_offset:
            return True
        if sys_flag & TRANSACTION_MASK == TRANSACTION_ROLLBACK_TYPE:
            return True
        # All of a message's entries or none: a retry after DiskFullError must not index
        # its first keys twice.
        needed = (uniq_key is not None) + (len([k for k in java_split(keys, KEY_SEPARATOR) if k]) if keys else 0)
        if needed and f.reserve_entries(f.index_count + needed) < min(f.index_count + needed, f.max_index_num):
            raise DiskFullError(f"no disk space for index entries of {f.path}")
        indexed = [g for g in self.files[-2:] if g.end_phy_offset == commitlog_offset and g.index_count > 1]
        if uniq_key is not None:
            f = self._put_key_once(f, indexed, f"{topic}#{uniq_key}", commitlog_offset, store_timestamp)
            if f is None:
                return False
        if keys:
            for k in java_split(keys, KEY_SEPARATOR):
                if k:
                    f = self._put_key_once(f, indexed, f"{topic}#{k}", commitlog_offset, store_timestamp)
                    if f is None:
                        return False
        return True

    def _put_key_once(
        self, f: IndexFile, indexed: list[IndexFile], key: str, phy_offset: int, store_timestamp: int
    ) -> IndexFile | None:
        """`_put_key` unless one of `indexed` (the files that end at this message) has it."""
        if any(g.has_entry(key, phy_offset) for g in indexed):
            return f
        return self._put_key(f, key, phy_offset, store_timestamp)

    def build_index_batch(self, requests: tuple[Any, ...], start: int, stop: int, indexed_below: int) -> bool:
        """`build_index` for each of requests[start:stop] (DispatchFields) at or above
        `indexed_below`; False as build_index, or when the disk is full (`disk_full`)."""
        return self.build_index_until_full(requests, start, stop, indexed_below) == stop and not self.index_error

    def build_index_until_full(self, requests: tuple[Any, ...], start: int, stop: int, indexed_below: int) -> int:
        """Index requests[start:stop]; the position of the first request not indexed: `stop`
        when all are, less when the disk had no blocks for it (then `disk_full` says why;
        requests before it are indexed whole, it and those after are untouched) or no index
        file could be had (`index_error`). Plain runs go through the C kernel, which leaves
        file roll-overs and reservation edges to the Python path."""
        native = speedups.native
        self.disk_full = None
        i = start
        try:
            while i < stop:
                # The message at the newest file's endPhyOffset may be indexed in part: Python's
                # build_index skips the keys already there; the kernel would add them again.
                if native is not None and self.files and requests[i].commitlog_offset > self.files[-1].end_phy_offset:
                    i = self.files[-1].put_batch(requests, i, stop, indexed_below)
                    if i >= stop:
                        break
                r = requests[i]
                if r.commitlog_offset >= indexed_below and not self.build_index(
                    topic=r.topic,
                    commitlog_offset=r.commitlog_offset,
                    store_timestamp=r.store_timestamp,
                    sys_flag=r.sys_flag,
                    keys=r.keys,
                    uniq_key=r.uniq_key,
                ):
                    return i
                i += 1
        except DiskFullError as exc:
            self.disk_full = exc
        return i

    def _put_key(self, f: IndexFile, key: str, phy_offset: int, store_timestamp: int) -> IndexFile | None:
        while not f.put_key(key, phy_offset, store_timestamp):
            nf = self.retry_get_and_create_index_file()
            if nf is None:
                return None
            assert nf is not f, "a full index file was handed back"
            f = nf
        return f

    def retry_get_and_create_index_file(self) -> IndexFile | None:
        for attempt in range(MAX_TRY_IDX_CREATE):
            f = self.get_and_create_last_index_file()
            if f is not None:
                return f
            if attempt + 1 < MAX_TRY_IDX_CREATE:
                self._sleep_ms(self.retry_interval_ms)
        self.index_error = True
        log.error("index_file_create_failed", tries=MAX_TRY_IDX_CREATE)
        return None

    def get_and_create_last_index_file(self) -> IndexFile | None:
        """The last file if it has room, else a new one (None on an I/O error).

        A new file starts from the previous file's end values; a full previous file is then
        flushed and `on_index_file_full(end_timestamp)` tells the owner to advance the
        checkpoint's indexMsgTimestamp (4.4.0 does this on a new thread; here it is inline)."""
        prev: IndexFile | None = None
        if self.files:
            last = self.files[-1]
            if not last.is_write_full():
                return last
            prev = last
        try:
            self._fs.makedirs(self.index_dir)
            name = self._new_file_name(prev)
            if name is None:
                self.last_create_error = f"no free index file name in {self.index_dir}"
                return None
            f = IndexFile.create(
                self._fs,
                os.path.join(self.index_dir, name),
                max_hash_slot_num=self.max_hash_slot_num,
                max_index_num=self.max_index_num,
                end_phy_offset=prev.end_phy_offset if prev else 0,
                end_timestamp=prev.end_timestamp if prev else 0,
            )
        except DiskFullError:
            raise  # not an error of the index: the owner waits for space and retries
        except OSError as e:
            log.error("index_file_create_error", dir=self.index_dir, error=str(e))
            # Without the new file's name (the clock's): the same cause reads the same at
            # every retry, so the owner logs a change of cause, not each try.
            self.last_create_error = f"{e.strerror} in {self.index_dir}" if e.strerror else str(e)
            return None
        self.files.append(f)
        log.info("index_file_created", path=f.path, begin_phy_offset=f.begin_phy_offset)
        if prev is not None:
            self.flush_file(prev)
        return f

    def _new_file_name(self, prev: IndexFile | None) -> str | None:
        """Named by the clock; past an existing name and past the last file's name, so two
        files never collide and name order stays creation order. A name the clock gives at or
        below the last one (a clock stepped back, or the hour a DST fall-back repeats) is
        followed by the last name's successor in name space: counted in milliseconds through
        the local time (mktime), the repeated hour's names stayed below the last one, and the
        index could not start a file for up to an hour (review 57 F7)."""
        last_name = self.files[-1].name if self.files else ""
        name = index_file_name(self._clock_ms())
        if name <= last_name:
            name = index_file_name_after(last_name)
        for _ in range(1000):  # bounded: names taken by files of no store (set aside, copied in)
            if not self._fs.exists(os.path.join(self.index_dir, name)):
                return name
            name = index_file_name_after(name)
        log.error("index_file_no_free_name", dir=self.index_dir, last=last_name)
        return None

    def flush_file(self, f: IndexFile) -> bool:
        """`IndexService.flush(f)`: force the file; if it is full, report its endTimestamp."""
        full_end_timestamp = f.end_timestamp if f.is_write_full() else 0
        try:
            f.flush()
        except OSError as e:
            log.error("index_file_flush_error", path=f.path, error=str(e))
            if self._on_flush_failed is not None:
                self._on_flush_failed()
            return False
        if full_end_timestamp > 0 and self._on_index_file_full is not None:
            self._on_index_file_full(full_end_timestamp)
        return True

    def flush_all(self) -> bool:
        """Force every file (at shutdown; 4.4.0 leaves the current file to the OS)."""
        ok = True
        for f in self.files:
            ok = self.flush_file(f) and ok
        return ok

    # querying ---------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryOffsetResult:
        return query_offset_in_files(self.files, topic, key, min(max_num, self.max_msgs_num_batch), begin, end)

    def faulted_file(self) -> IndexFile | None:
        """The first file whose map met a page gone from the file (it reads zeros there)."""
        return next((f for f in self.files if f.cut_short()), None)

    # deleting ---------------------------------------------------------------------------
    def delete_expired_file(self, min_phy_offset: int) -> int:
        """Delete the oldest files whose every entry is below `min_phy_offset` (the commitlog's
        new head). The newest file is never deleted. Returns how many were deleted."""
        if not self.files or self.files[0].end_phy_offset >= min_phy_offset:
            return 0
        expired: list[IndexFile] = []
        for f in self.files[:-1]:
            if f.end_phy_offset < min_phy_offset:
                expired.append(f)
            else:
                break
        deleted = 0
        for f in expired:
            if f.cut_short():
                # Its header was read through a map that faulted: zeros, not proof it expired.
                error = UnreadPageError(f.path, "kept; its expiry is judged again once the file reads whole")
                log.error("index_file_not_deleted_unread", path=f.path, error=str(error))
                break
            try:
                f.destroy()
            except OSError as e:
                log.error("index_file_delete_error", path=f.path, error=str(e))
                break
            deleted += 1
        del self.files[:deleted]
        if deleted:
            log.info("index_files_expired", count=deleted, min_phy_offset=min_phy_offset)
        return deleted

    def drop_files_after(self, phy_offset: int) -> int:
        """Make the index consistent with a commitlog truncated to `phy_offset` (recovery).

        Not in 4.4.0 (§11.7 leaves index files alone), but there the stale endPhyOffset makes
        `build_index` skip new messages written below it. Files whose beginPhyOffset >=
        `phy_offset` are deleted; in the new last file, entries at or past `phy_offset` are
        undone (`IndexFile.truncate_entries_from`), or the whole file is deleted if it would be
        left empty or its chains are torn. Older files only hold smaller offsets. Readers still
        verify the message an offset points to. Returns the number of files deleted; raises
        OSError if one cannot be deleted (recovery cannot go on)."""
        deleted = 0
        while self.files:
            last = self.files[-1]
            if last.begin_phy_offset < phy_offset and last.truncate_entries_from(phy_offset):
                break
            last.destroy()
            self.files.pop()
            deleted += 1
        if deleted:
            log.info("index_files_dropped_after", phy_offset=phy_offset, count=deleted)
        return deleted

    def destroy(self) -> None:
        for f in self.files:
            f.destroy()
        self.files.clear()

    def close(self) -> None:
        """Unmap every file (no flush: call flush_all first)."""
        for f in self.files:
            f.close()
        self.files.clear()

    def resume_offset(self) -> int:
        """The newest file's endPhyOffset: the commitlog offset of the last indexed message (its
        start, not its end), 0 if none. `build_index` skips messages below it and indexes the
        one at it again, so re-dispatching from here loses nothing (4.4.0 does the same)."""
        return self.files[-1].end_phy_offset if self.files else 0

    def file_headers(self) -> list[tuple[str, IndexHeader]]:
        return [(f.name, f.header()) for f in self.files]
