"""One fixed-size segment file, memory-mapped (spec §4.3-§4.8).

A `MappedFile` tracks how far it was written, committed (write-buffer path only) and
flushed, and is reference counted so that a file being deleted is only unmapped once nobody
reads it (or a forcible interval has passed). All I/O goes through the `FileSystem` it is
given; all times are passed in.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import time
from collections import deque
from typing import Any, Callable, Final

from mqstore.log import get_logger
from mqstore.storage.fs import (
    OS_PAGE_SIZE, OUT_OF_RESOURCES_ERRNOS, FileCutUnderMapError, FileReplacedUnderMapError, FileSystem, MappedRegion,
)
from mqstore.storage.status import AppendMessageResult, AppendMessageStatus

__all__ = [
    "AppendCallback",
    "MappedFile",
    "OS_PAGE_SIZE",
    "TransientStorePool",
    "WriteBufferPool",
    "parse_segment_offset",
]

log = get_logger(__name__)

_ZERO_CHUNK_BYTES: Final = 1 << 20
_ZERO_CHUNK: Final = bytes(_ZERO_CHUNK_BYTES)
_Q = struct.Struct(">q")

# (buffer, file_from_offset, position, max_blank) -> result. The callback writes into
# `buffer` at `position` (never beyond position + max_blank) and says how much it wrote.
AppendCallback = Callable[[bytearray, int, int, int], AppendMessageResult]


def parse_segment_offset(path: str) -> int:
    """The start offset a segment's 20-digit name encodes (§2.4)."""
    name = os.path.basename(path)
    if len(name) != 20 or not name.isdigit():
        raise ValueError(f"not a segment file name: {name!r}")
    return int(name)


_RESERVE_FAILURE_LOG_INTERVAL_S: Final = 10.0


class ReserveFailureLog:
    """Says a reservation failure when it starts, then at most every `interval_s` with a count
    (each refused append retries: one line per append was a flood, review 48 M2), per directory
    and errno: one throttle for the whole process hid a second store's, another directory's or
    a new errno's failures for up to 10 s (review 49 L4). `now` is passed in (monotonic s)."""

    def __init__(self, interval_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._now = now
        self._lock = threading.Lock()
        self._said: dict[tuple[str, int | None], tuple[float, int]] = {}  # -> (said at, failures since)

    def __call__(self, path: str, exc: OSError) -> bool:
        """Count the failure; True if it was logged."""
        key = (os.path.dirname(path), exc.errno)
        with self._lock:
            now = self._now()
            said_at, failures = self._said.get(key, (None, 0))
            failures += 1
            if said_at is not None and now - said_at < self._interval_s:
                self._said[key] = (said_at, failures)
                return False
            self._said[key] = (now, 0)
        log.error("reserving blocks failed; appends wait until it works", file=path, error=str(exc),
                  failures_since_last_said=failures)  # fmt: skip
        return True


_log_reserve_failure = ReserveFailureLog(_RESERVE_FAILURE_LOG_INTERVAL_S)


class DiskFullError(OSError):
    """No room on the disk for the blocks the next appends need: the append is refused
    (SERVICE_NOT_AVAILABLE, or dispatch waits) rather than faulting on an unbacked page."""

    def __init__(self, message: str, cause: OSError | None = None) -> None:
        super().__init__(errno.ENOSPC, message)
        # Why the blocks could not be reserved, when it was not the disk (None: no room).
        self.cause_errno = cause.errno if cause is not None else None

    @property
    def out_of_descriptors(self) -> bool:
        """No descriptor to spare (the file is opened again per reservation window)."""
        return self.cause_errno in (errno.EMFILE, errno.ENFILE)

    @property
    def not_writable(self) -> bool:
        """The file may not be written (EPERM, EACCES, EROFS: chattr +i on a segment made
        ahead, its mode or owner; review 66 F2 said "disk full" for it)."""
        return self.cause_errno in (errno.EPERM, errno.EACCES, errno.EROFS)

    @property
    def past_size_limit(self) -> bool:
        """The file would pass the process's RLIMIT_FSIZE (review 90 L3 said "disk full")."""
        return self.cause_errno == errno.EFBIG

    def __str__(self) -> str:
        return str(self.strerror)


# Message appends reserve file blocks this far ahead, topped up when fewer than the low
# water mark remain: a write fault on a sparse page costs ~8 us, on a reserved one ~1 us.
# A top-up also writes zeros over the new pages (fs.RealMappedRegion._initialise, ~0.5 ms
# per MiB here) on the writer's thread, so puts wait for it: a 16 MiB top-up held them
# ~9 ms and was most of put_async's lag p99 at half load; 2 MiB holds them ~1 ms, for the
# same total work.
RESERVE_AHEAD_BYTES: Final = 4 * 1024 * 1024
RESERVE_LOW_WATER_BYTES: Final = 2 * 1024 * 1024
# Raw appends (ConsumeQueue units) reserve a smaller window: there may be thousands of
# queues, each filling its file slowly.
APPEND_BYTES_RESERVE_AHEAD_BYTES: Final = 256 * 1024
# What an idle file keeps reserved past its data when it gives the rest back (`unmap`): room for
# ~800 ConsumeQueue units, so a queue that comes back on a disk another process filled takes
# its next units without new blocks (review 88 F2: with none kept, the first unit past its page
# needed a block, and dispatch, which runs in log order, held every queue behind it).
IDLE_RESERVATION_KEPT_BYTES: Final = 16 * 1024
# After a window had to shrink to fit the free space, the full window is tried again only
# after this many more bytes were appended (not on every append of a nearly full disk).
RESERVE_RETRY_AFTER_BYTES: Final = 1024 * 1024
# A shrunk window takes at most this share of the free space: the rest stays for the
# derived files (ConsumeQueue units, index entries) of what is appended meanwhile.
RESERVE_SHARE_OF_FREE_SPACE: Final = 2
# Never reserved, so the store itself never takes a filesystem to 100%: on a full ext4, a
# write fault into fallocated (unwritten) blocks was seen to die with SIGBUS all the same
# (tests/crash/test_small_filesystem.py). Messages stop first; their derived files (CQ
# units, index entries) may go further, down to the smaller margin.
KEEP_FREE_FOR_MESSAGES_BYTES: Final = 1024 * 1024
KEEP_FREE_FOR_DERIVED_BYTES: Final = 256 * 1024


def free_bytes(fs: FileSystem, path: str) -> int | None:
    """Free space of the filesystem holding `path` (None if it cannot be told)."""
    try:
        return fs.disk_usage(os.path.dirname(path) or ".").free_bytes
    except OSError:
        return None


class MappedFile:
    """One segment: positions, commit/flush, warm-up and reference counting. Not thread-safe.

    The owner (one writer) appends and flushes; readers in other threads map the file
    themselves (`CommitLogReader`). `hold`/`release` guard the mapping against `destroy`
    within the owner's own code paths.
    """

    def __init__(
        self,
        fs: FileSystem,
        path: str,
        file_size: int,
        *,
        write_buffer: bytearray | None = None,
        on_write_buffer_released: Callable[[bytearray], None] | None = None,
        create: bool = True,
        readonly: bool = False,
        unnamed: bool = False,
        exclusive: bool = False,
    ) -> None:
        if file_size <= 0:
            raise ValueError(f"file_size must be positive, not {file_size}")
        if write_buffer is not None and len(write_buffer) < file_size:
            raise ValueError(f"write_buffer of {len(write_buffer)} bytes is smaller than file_size {file_size}")
        self.fs = fs
        self.file_name = path
        self.file_from_offset = parse_segment_offset(path)
        self.file_size = file_size
        if create:
            fs.makedirs(os.path.dirname(path) or ".")
        # unnamed: made ahead by the allocator, no directory holds it until take_name() (its
        # owner-to-be does that): a writer that made the file of that name itself meanwhile,
        # or a release of the one made ahead, can never meet the other's file by its name.
        self._region: MappedRegion | None = (
            fs.map_unnamed(path, file_size)
            if unnamed
            else fs.map_file(path, file_size, create=create and not readonly, readonly=readonly, exclusive=exclusive)
        )
        self.named = not unnamed
        # Mapped read-only: the file may not be written now (a writer's segment under chattr +i
        # or another owner, review 65 F3); nothing may be written through this map until
        # `map_writable` succeeded.
        self.readonly = readonly
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.store_timestamp = 0
        self.first_create_in_queue = False
        self.write_buffer = write_buffer
        self._on_write_buffer_released = on_write_buffer_released
        # §4.8 reference counting
        self.ref_count = 1
        self.available = True
        self.cleanup_over = False
        self.first_shutdown_timestamp_ms = 0
        self.last_io_error: OSError | None = None
        self.locked_in_memory = False
        # Every byte written through the map lies below this (blocks reserved by fallocate).
        # Public for CommitLog.append_fast, which must know an append needs no reservation;
        # only this class writes it.
        self.reserved_until = 0
        self._retry_full_window_at = 0
        self._reserve_error: OSError | None = None  # why the last reservation failed, if not for room
        self._unmapped = False  # unmap() gave the map back: mapped again at the next use

    def __repr__(self) -> str:
        return (
            f"MappedFile({os.path.basename(self.file_name)}, wrote={self.wrote_position}, "
            f"committed={self.committed_position}, flushed={self.flushed_position})"
        )

    # positions ---------------------------------------------------------------------------
    @property
    def read_position(self) -> int:
        """Highest position readers may see: with a write buffer only committed bytes count."""
        return self.wrote_position if self.write_buffer is None else self.committed_position

    def is_full(self) -> bool:
        return self.wrote_position == self.file_size

    def set_positions(self, position: int) -> None:
        """Truncation/recovery: wrote = committed = flushed = `position`."""
        assert 0 <= position <= self.file_size
        self.wrote_position = self.committed_position = self.flushed_position = position
        # What was written has its blocks (whole pages: a page holding data is backed on
        # tmpfs; the free-space estimate of the next reservation must not count it again).
        self.reserved_until = position - position % OS_PAGE_SIZE

    @property
    def mapped_buffer(self) -> bytearray:
        """The mapping itself, for scans by the owner (recovery). Do not keep it."""
        return self._mapped().buf  # type: ignore[return-value]

    # giving the map back (idle ConsumeQueue files, review 58 F2) ------------------------------
    @property
    def is_mapped(self) -> bool:
        return self._region is not None

    def unmap(self) -> bool:
        """Give the map (and the descriptor mmap keeps) back, every position kept: the file is
        mapped again at its next read or write (`map`). Only a file that has nothing left to
        flush, no write buffer, no failed flush (its pages must stay dirty in this map to be
        written again), no reader of the owner holding it and no mlock; False (still mapped)
        otherwise."""
        region = self._region
        if (region is None or not self.available or self.ref_count != 1 or self.write_buffer is not None
                or self.locked_in_memory or self.last_io_error is not None
                or self.flushed_position < self.read_position):  # fmt: skip
            return False
        self._give_back_reservation(region)
        try:
            region.close()
        except BufferError:  # an export of the map is still alive
            return False
        self._region = None
        self._unmapped = True
        return True

    def _give_back_reservation(self, region: MappedRegion) -> None:
        """The blocks reserved past the data end go back to the disk as an idle file's map does:
        they serve writes through this map, and the next map reserves again at its first
        write. Each idle queue kept its 256 KiB window before (2,000 queues of one message
        each held 524 MB). Only here, in the owner's own thread with its positions whole: a
        stop (`_cleanup`) may follow a crash mid-write, and a successor may be writing. Best
        effort: where the file cannot punch holes, the blocks stay reserved, as before. Not
        with a write buffer (the commit writes through without asking)."""
        if self.write_buffer is not None or not self.named:
            return
        kept_end = self.wrote_position + (-self.wrote_position) % OS_PAGE_SIZE + IDLE_RESERVATION_KEPT_BYTES
        if self.reserved_until > kept_end and region.unreserve(kept_end, self.reserved_until):
            self.reserved_until = kept_end

    def give_back_faulted_map(self) -> bool:
        """Give back a map that met a page it could not read (the SIGBUS guard replaced it with
        zeros from that page to its end), every position kept: the next read or write maps the
        file again. Unlike `unmap`, also with units not yet flushed: a shared map's dirty pages
        are the page cache's, which the guard's replacement did not take, and the new map's
        flush writes them. False (kept) with a write buffer, a failed flush, an mlock or a
        reader of the owner holding it."""
        region = self._region
        if (region is None or not self.available or self.ref_count != 1 or self.write_buffer is not None
                or self.locked_in_memory or self.last_io_error is not None):  # fmt: skip
            return False
        try:
            region.close()
        except BufferError:
            return False
        self._region = None
        self._unmapped = True
        return True

    def map(self) -> None:
        """Map a file `unmap` gave back again (nothing for a mapped one). OSError when the process
        has no descriptor, memory or map left for it (EMFILE, ENFILE, ENOMEM: the file is fine,
        and mapped at a later try); FileCutUnderMapError when the file is not there at its
        length any more (deleted, or cut short by another process meanwhile), as if cut while
        mapped: what the owner knows of it is not in the file."""
        self._mapped()

    def _mapped(self) -> MappedRegion:
        region = self._region
        if region is not None:
            return region
        assert self._unmapped and self.available, f"{self.file_name} is already unmapped"
        try:
            region = self.fs.map_file(self.file_name, self.file_size, create=False)
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES_ERRNOS:
                raise
            log.error("a file given back while idle cannot be mapped again", file=self.file_name, error=str(exc))
            raise FileCutUnderMapError(self.file_name) from exc
        self._region = region
        self._unmapped = False
        return region

    def _target(self) -> bytearray:
        """Where appends go: the write buffer if there is one, else the mapping."""
        if self.write_buffer is not None:
            return self.write_buffer
        return self.mapped_buffer

    # appending (§4.4) --------------------------------------------------------------------
    def append_message(self, callback: AppendCallback, need: int | None = None) -> AppendMessageResult:
        """Let `callback` write at wrote_position, then advance by what it says it wrote.

        `need`: the most the callback may write (it must stay below it); blocks for it are
        reserved first, DiskFullError when they cannot be. Without it the low-water mark
        (more than any record) is what must be reserved."""
        pos = self.wrote_position
        if pos >= self.file_size:
            log.error("append to a full mapped file", file=self.file_name, wrote=pos)
            return AppendMessageResult(status=AppendMessageStatus.UNKNOWN_ERROR)
        need_end = min(self.file_size, pos + (RESERVE_LOW_WATER_BYTES if need is None else need))
        window_end = max(need_end, min(self.file_size, pos + RESERVE_AHEAD_BYTES))
        # A record larger than what is reserved ahead gets its blocks first, whatever the low
        # water says: written into pages with none behind them, it was a SIGBUS on a full
        # disk (a 3 MiB message 2.5 MiB short of the window's end; review 33).
        below_low_water = pos + RESERVE_LOW_WATER_BYTES > self.reserved_until and window_end > self.reserved_until
        if need_end > self.reserved_until or below_low_water:
            if need_end > self.reserved_until or pos >= self._retry_full_window_at:
                if not self._reserve(need_end, window_end, KEEP_FREE_FOR_MESSAGES_BYTES):
                    raise self._reserve_failure(pos)
                if self.reserved_until < window_end:  # shrunk to what fits: retry the window later
                    self._retry_full_window_at = pos + RESERVE_RETRY_AFTER_BYTES
        result = callback(self._target(), self.file_from_offset, pos, self.file_size - pos)
        if pos + result.wrote_bytes > self.reserved_until and result.status is not AppendMessageStatus.END_OF_FILE:
            # Too late to refuse (the bytes are in the map); a caller bug, said loudly. (A
            # blank record counts the whole rest of the file but writes only its header.)
            log.error("append wrote past its reservation", file=self.file_name, position=pos,
                      wrote=result.wrote_bytes, reserved_until=self.reserved_until)  # fmt: skip
        assert pos + result.wrote_bytes <= self.file_size, "append callback wrote past the file end"
        self.wrote_position = pos + result.wrote_bytes
        if result.store_timestamp:
            self.store_timestamp = result.store_timestamp
        return result

    def _reserve(self, need_end: int, window_end: int, keep_free: int = 0) -> bool:
        """Blocks up to `need_end` at least, up to `window_end` if the disk has room for it
        (fs.RealMappedRegion.reserve). When it has not, the window shrinks to a share of the
        free space, then to `need_end` itself: appends go on while anything fits. False
        (nothing more reserved) only when not even `need_end` fits."""
        region = self._region if self._region is not None or not self._unmapped else self._mapped()
        need_end = min(need_end, self.file_size)
        window_end = min(max(window_end, need_end), self.file_size)
        if need_end <= self.reserved_until and window_end <= self.reserved_until:
            return True
        if region is None:
            return False  # unmapped: nothing can be written anyway
        self._reserve_error = None
        try:
            target = window_end
            wanted = window_end - self.reserved_until
            free = self._free_bytes()
            spare = None if free is None else free - keep_free
            if spare is not None and spare < need_end - self.reserved_until:
                return False
            if spare is not None and spare < wanted * RESERVE_SHARE_OF_FREE_SPACE:
                # Do not ask for what is not there: ext4 keeps the blocks of a failed
                # fallocate, and the derived files would find the disk taken.
                share = spare // RESERVE_SHARE_OF_FREE_SPACE
                target = max(need_end, min(window_end, self.reserved_until + share - share % OS_PAGE_SIZE))
            for end in (target, need_end) if target > need_end else (need_end,):
                if end <= self.reserved_until or region.reserve(end, unwritten_from=self.wrote_position):
                    self.reserved_until = max(self.reserved_until, end)
                    return True
            return False
        except FileCutUnderMapError as exc:  # the owner's own checks name the cut file
            log.warning("reserve ahead failed", file=self.file_name, error=str(exc))
            self.reserved_until = max(self.reserved_until, window_end)
            return True
        except OSError as exc:
            # EDQUOT, EIO, EROFS...: never write into pages nothing backs (review 46 M2); the
            # owner refuses the append and tries again later, as for a full disk.
            _log_reserve_failure(self.file_name, exc)
            self._reserve_error = exc
            return False

    def _free_bytes(self) -> int | None:
        return free_bytes(self.fs, self.file_name)

    def _reserve_failure(self, pos: int) -> DiskFullError:
        """The refusal of an append at `pos` whose blocks could not be reserved, saying why."""
        cause = self._reserve_error
        why = ("the disk is full, a quota is reached, or it failed: see the log" if cause is None
               else cause.strerror or str(cause))  # fmt: skip
        return DiskFullError(f"no disk blocks could be reserved for {self.file_name} past {pos} ({why})", cause)

    def reserve(self, end: int, ahead: int = 0) -> bool:
        """Blocks for every byte below `end` (and `ahead` more if there is room) before
        anything is written there through the map; False when the disk has no room."""
        if end <= self.reserved_until:
            return True
        return self._reserve(end, end + ahead, KEEP_FREE_FOR_DERIVED_BYTES)

    def append_bytes(self, data: bytes | bytearray | memoryview) -> bool:
        """Raw append (ConsumeQueue units, replicated data): all of `data` or nothing. False
        when it does not fit the file; DiskFullError (nothing written) when the disk has no
        blocks for it."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            return False
        if end > self.reserved_until and not self._reserve(
            end, end + APPEND_BYTES_RESERVE_AHEAD_BYTES, KEEP_FREE_FOR_DERIVED_BYTES
        ):
            raise self._reserve_failure(pos)
        self._target()[pos:end] = data
        self.wrote_position = end
        return True

    def rewrite_bytes(self, pos: int, data: bytes) -> None:
        """Write `data` over bytes already appended at `pos` (below the write position, so
        its blocks are reserved); the next flush covers it."""
        end = pos + len(data)
        assert end <= self.wrote_position, (pos, end, self.wrote_position)
        assert self.write_buffer is None  # ConsumeQueue files: no write buffers
        self.mapped_buffer[pos:end] = data
        self.flushed_position = min(self.flushed_position, pos)

    def read_data(self, start: int, end: int) -> bytes:
        """A copy of [start, end) that reads only where the file has data; holes read as the
        zeros they are. A read fault on a hole of a full tmpfs must allocate a page, cannot,
        and kills the process with SIGBUS; the file's unwritten tail is such a hole."""
        end = min(end, self.file_size)
        if start >= end:
            return b""
        buf = self.mapped_buffer
        out = bytearray(end - start)
        for extent_start, extent_end in self.fs.data_extents(self.file_name, start, end):
            out[extent_start - start : extent_end - start] = buf[extent_start:extent_end]
        return bytes(out)

    # commit and flush (§4.5) ---------------------------------------------------------------
    def is_able_to_commit(self, least_pages: int) -> bool:
        if self.is_full():
            return True
        if least_pages > 0:
            return self.wrote_position // OS_PAGE_SIZE - self.committed_position // OS_PAGE_SIZE >= least_pages
        return self.wrote_position > self.committed_position

    def is_able_to_flush(self, least_pages: int) -> bool:
        if self.is_full():
            return True
        read = self.read_position
        if least_pages > 0:
            return read // OS_PAGE_SIZE - self.flushed_position // OS_PAGE_SIZE >= least_pages
        return read > self.flushed_position

    def commit(self, least_pages: int) -> int:
        """Copy written-but-uncommitted bytes from the write buffer into the mapping."""
        if self.write_buffer is None:
            return self.wrote_position  # direct path: nothing to copy, everything is visible
        if self.is_able_to_commit(least_pages) and self.hold():
            try:
                start, end = self.committed_position, self.wrote_position
                self.mapped_buffer[start:end] = self.write_buffer[start:end]
                self.committed_position = end
            finally:
                self.release()
        if self.committed_position == self.file_size and self.write_buffer is not None:
            buffer, self.write_buffer = self.write_buffer, None
            if self._on_write_buffer_released is not None:
                self._on_write_buffer_released(buffer)
        return self.committed_position

    def flush(self, least_pages: int) -> int:
        """Force [flushed, read_position) to disk; an I/O error leaves flushed where it was."""
        if not self.is_able_to_flush(least_pages):
            return self.flushed_position
        value = self.read_position  # captured before forcing: later appends are not covered
        if self.hold():
            try:
                self._mapped().flush(self.flushed_position, value)
                self.flushed_position = value
                self.last_io_error = None
            except OSError as exc:
                self.last_io_error = exc
                log.error("flush failed", file=self.file_name, error=str(exc))
            finally:
                self.release()
        else:
            # Being destroyed: Java records the position without forcing.
            self.flushed_position = value
        return self.flushed_position

    # truncation ----------------------------------------------------------------------------
    def zero_from(self, position: int, limit: int | None = None) -> None:
        """Zero [position, limit or file_size) and force it, so stale bytes never look like
        records. Callers that know junk can only sit just past `position` pass a `limit`:
        reading the rest of a 1 GiB segment costs seconds.

        Only chunks that hold non-zero bytes are written: zeroing an untouched sparse tail
        would allocate it.

        A failed force raises (and is `last_io_error`): the zeros are in memory only, and a
        power loss would bring the stale bytes back past the new end. Review 49 L3: it was
        only recorded, which nobody read for the commitlog, and which the next flush of a
        ConsumeQueue cleared before its owner looked.
        """
        assert 0 <= position <= self.file_size
        stop = self.file_size if limit is None else min(limit, self.file_size)
        buf = self.mapped_buffer
        dirty_end = position
        for extent_start, extent_end in self.fs.data_extents(self.file_name, position, stop):
            dirty_end = max(dirty_end, self._zero_chunks(buf, extent_start, extent_end))
        if self.write_buffer is not None:
            self.write_buffer[position : self.file_size] = bytes(self.file_size - position)
        if dirty_end > position:
            try:
                self._mapped().flush(position, dirty_end)
            except OSError as exc:
                self.last_io_error = exc
                log.error("flush of a zeroed tail failed", file=self.file_name, error=str(exc))
                raise OSError(exc.errno, f"the zeroed tail of {self.file_name} from {position} could not be forced "
                              f"to disk ({exc.strerror}): stale bytes may come back after a power loss") from exc

    @staticmethod
    def _zero_chunks(buf: Any, start: int, stop: int) -> int:
        """Zero the non-zero chunks of [start, stop); the end of the last one written."""
        dirty_end = start
        pos = start
        while pos < stop:
            end = min(pos + _ZERO_CHUNK_BYTES, stop)
            if buf[pos:end] != _ZERO_CHUNK[: end - pos]:
                buf[pos:end] = _ZERO_CHUNK[: end - pos]
                dirty_end = end
            pos = end
        return dirty_end

    # reading -------------------------------------------------------------------------------
    def select(self, pos: int, size: int | None = None) -> bytes | None:
        """A copy of [pos, pos+size) (or [pos, read_position)), only below read_position."""
        read = self.read_position
        if size is None:
            if not 0 <= pos < read:
                return None
            end = read
        else:
            if pos < 0 or size < 0 or pos + size > read:
                return None
            end = pos + size
        if not self.hold():
            return None
        try:
            return bytes(self.mapped_buffer[pos:end])
        finally:
            self.release()

    def read_long(self, pos: int) -> int | None:
        """The 8-byte big-endian value at `pos` if it lies below read_position."""
        if pos < 0 or pos + 8 > self.read_position or not self.hold():
            return None
        try:
            return int(_Q.unpack_from(self.mapped_buffer, pos)[0])
        finally:
            self.release()

    def last_modified_ms(self) -> int:
        try:
            return self.fs.mtime_ms(self.file_name)
        except OSError:
            return 0

    # warm-up (§4.7) --------------------------------------------------------------------------
    def warm_up(self, sync_flush: bool, flush_least_pages: int) -> None:
        """Touch every page with a zero byte (forcing every N pages with sync flush), then
        madvise WILLNEED and mlock, best effort. Only for a fresh, unwritten file."""
        if self.wrote_position != 0:  # a guard against overwriting data: kept under python -O
            raise RuntimeError(f"warm-up of {self.file_name} would overwrite data")
        buf = self.mapped_buffer
        region = self._mapped()
        if not self._reserve(self.file_size, self.file_size, KEEP_FREE_FOR_MESSAGES_BYTES):
            # Touching pages with no blocks behind them would die with SIGBUS.
            log.warning("no disk space to warm up a new file; it stays cold", file=self.file_name)
            return
        last_flush = 0
        for i in range(0, self.file_size, OS_PAGE_SIZE):
            buf[i] = 0
            if sync_flush and i // OS_PAGE_SIZE - last_flush // OS_PAGE_SIZE >= flush_least_pages:
                region.flush(last_flush, i)
                last_flush = i
        if sync_flush:
            region.flush(last_flush, self.file_size)
        self.locked_in_memory = region.lock_in_memory()
        if not self.locked_in_memory:
            log.info("mlock refused by the OS; continuing without it", file=self.file_name, size=self.file_size)
        region.advise_willneed()

    def munlock(self) -> None:
        if self._region is not None and self.locked_in_memory:
            self._region.unlock_from_memory()
            self.locked_in_memory = False

    def cut_short(self) -> bool:
        """The file lost pages under its map (storage/fs.py FileCutUnderMapError)."""
        return self._region is not None and self._region.cut_short()

    def cut_error(self, *, writing: bool = False) -> FileCutUnderMapError:
        """What the fault `cut_short` saw was: a cut, a file that may not be written now
        (FileNotWritableUnderMapError), or, asked after writes, no room on the disk,
        looked at now (storage/fs.py fault_error)."""
        if self._region is None:
            return FileCutUnderMapError(self.file_name)
        return self._region.fault_error(writing=writing)

    def map_writable(self) -> None:
        """Map a file loaded `readonly` for writing again (OSError while it may still not be
        written: EPERM, EACCES); its positions are kept. FileReplacedUnderMapError, this map
        kept, when the path names another file now (review 66 F1: an older copy restored
        over the segment while it was not writable was taken over, positions and all, and the
        acknowledged records it lacked were gone with no copy saved)."""
        if not self.readonly:
            return
        region = self.fs.map_file(self.file_name, self.file_size, create=False)
        if self._region is not None and self._region.replaced():
            # Checked after the new map is made: a file swapped in before it is seen here.
            region.close()
            raise FileReplacedUnderMapError(self.file_name)
        old, self._region = self._region, region
        self._unmapped = False
        self.readonly = False
        if old is not None:
            try:
                old.close()
            except BufferError:  # a reader of the owner still holds its buffer: it goes with it
                pass

    def replaced(self, *, deleted_too: bool = True) -> bool:
        """Its path names another file now, or none (storage/fs.py MappedRegion.replaced)."""
        return self._region is not None and self._region.replaced(deleted_too=deleted_too)

    @property
    def identity(self) -> tuple[int, int] | None:
        """Its file's (device, inode) while mapped (None while given back idle)."""
        return self._region.identity if self._region is not None else None

    def save_copy(self, path: str) -> None:
        """What readers may read of this file, from its map, to a new file `path`."""
        self._mapped().save_copy(path, self.read_position)

    # reference counting (§4.8) ------------------------------------------------------------------
    def hold(self) -> bool:
        if self.available:
            self.ref_count += 1
            if self.ref_count - 1 > 0:
                return True
            self.ref_count -= 1
        return False

    def release(self) -> None:
        self.ref_count -= 1
        if self.ref_count > 0:
            return
        self.cleanup_over = self._cleanup()

    def _cleanup(self) -> bool:
        if self.available:
            log.error("refusing to unmap a mapped file that was not shut down", file=self.file_name)
            return False
        if self.cleanup_over:
            return True
        if self._region is not None:
            self._region.close()
            self._region = None
        if self.write_buffer is not None:
            buffer, self.write_buffer = self.write_buffer, None
            if self._on_write_buffer_released is not None:
                self._on_write_buffer_released(buffer)
        return True

    def shutdown(self, interval_forcibly_ms: int, now_ms: int) -> None:
        if self.available:
            self.available = False
            self.first_shutdown_timestamp_ms = now_ms
            self.release()
        elif self.ref_count > 0 and now_ms - self.first_shutdown_timestamp_ms >= interval_forcibly_ms:
            # Readers kept it too long: force the count below zero so release() unmaps.
            self.ref_count = -1000 - self.ref_count
            self.release()

    def is_available(self) -> bool:
        return self.available

    def is_cleanup_over(self) -> bool:
        return self.ref_count <= 0 and self.cleanup_over

    def take_name(self) -> None:
        """Gives a file made unnamed its name (durably): FileExistsError, still unnamed, if
        that name holds a file already; other OSErrors as linkat gives them."""
        if self.named:
            return
        assert self._region is not None, "an unnamed file is never unmapped"
        self._region.take_name()
        self.named = True

    def destroy(self, interval_forcibly_ms: int, now_ms: int) -> bool:
        """Shut down and, once nobody holds the file, delete it. False: try again later.
        A file never named has nothing to delete: the name it was made for may be another
        file's now. Nor one whose path names another file than its map now (renamed over by
        another process): that file is not the store's to delete (review 151 F1); False, and
        the owner's check finds the segment replaced, as at a pass."""
        if self.named and self._region is not None and self._region.replaced(deleted_too=False):
            log.error("not deleted: the file at this path is not the one the store mapped (another process replaced "
                      "it)", file=self.file_name)  # fmt: skip
            return False
        self.shutdown(interval_forcibly_ms, now_ms)
        if not self.is_cleanup_over():
            log.warning("mapped file still referenced; delete later", file=self.file_name, refs=self.ref_count)
            return False
        if not self.named:
            return True
        try:
            self.fs.remove(self.file_name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.last_io_error = exc
            log.error("deleting a mapped file failed", file=self.file_name, error=str(exc))
            return False
        log.info("mapped file destroyed", file=self.file_name, wrote=self.wrote_position)
        return True


class WriteBufferPool:
    """What `MappedFileQueue` needs from a TransientStorePool."""

    def borrow_buffer(self) -> bytearray | None:  # pragma: no cover - protocol
        raise NotImplementedError

    def return_buffer(self, buffer: bytearray) -> None:  # pragma: no cover - protocol
        raise NotImplementedError


class TransientStorePool(WriteBufferPool):
    """`transientStorePoolSize` write buffers of one segment each (§4.6). Not thread-safe.

    Buffers are plain bytearrays (the spec allows it); a returned buffer is zeroed so that
    the bytes after a blank record, copied by the final commit, are zeros as on the mmap path.
    """

    def __init__(self, pool_size: int, file_size: int) -> None:
        if pool_size < 0 or file_size <= 0:
            raise ValueError(f"pool_size must be >= 0 and file_size > 0, not {pool_size} and {file_size}")
        self.pool_size = pool_size
        self.file_size = file_size
        self._free: deque[bytearray] = deque(bytearray(file_size) for _ in range(pool_size))

    def borrow_buffer(self) -> bytearray | None:
        if not self._free:
            log.warning("TransientStorePool has no buffer left")
            return None
        buffer = self._free.popleft()
        if self.pool_size and len(self._free) / self.pool_size < 0.4:
            log.warning("TransientStorePool running low", remain=len(self._free), size=self.pool_size)
        return buffer

    def return_buffer(self, buffer: bytearray) -> None:
        assert len(buffer) == self.file_size
        ctypes.memset((ctypes.c_char * len(buffer)).from_buffer(buffer), 0, len(buffer))
        self._free.appendleft(buffer)

    def remain_buffer_numbs(self) -> int:
        return len(self._free)
