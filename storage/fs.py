"""The file layer every storage class is given: real files, or a simulated disk for tests.

Storage code never calls `os` or `mmap` itself; it asks a `FileSystem`. `RealFileSystem`
maps files with mmap. `SimulatedFileSystem` keeps, per file, a volatile image (the page
cache) and a durable image (what survived the last fsync/msync), and `crash()` returns the
disk as a power loss would leave it: unsynced pages dropped or torn, chosen by a seeded RNG,
so a failing run can be replayed from its seed (TigerBeetle's simulated storage, in small).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import random
import resource
import shutil
import stat
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Final, Hashable, Protocol

from mqstore import log as mqstore_log
from mqstore.log import get_logger
from mqstore.storage import mapguard, speedups
from mqstore.storage.map_areas import MAP_AREAS

log = get_logger(__name__)

OS_PAGE_SIZE = 4096

# Descriptors 0, 1 and 2 are the host's stdio. A host that closed them (a daemon, `<&- >&- 2>&-`)
# would get the store's files there, and whatever writes to "stderr" by number (a C library, a
# fatal error, a child given the host's stdio) would write into a store file (review 94 M2: the
# lock file, an index file). So no store file is ever opened there (SQLite's robust_open does
# the same): it is moved above 2, and the slot it took holds /dev/null.
_STDIO_FDS: Final = 3


def open_fd(path: str | bytes, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    """`os.open`, never onto descriptor 0, 1 or 2 (the host's stdio)."""
    fd = os.open(path, flags, mode, dir_fd=dir_fd)
    if fd >= _STDIO_FDS:
        return fd
    try:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _STDIO_FDS)  # (os.open's are never inheritable)
    except BaseException:
        os.close(fd)
        raise
    _fill_with_dev_null(fd, moved)
    return moved


def _fill_with_dev_null(fd: int, copy: int | None = None) -> None:
    """/dev/null in place of descriptor `fd`, so that later opens do not land there either: in
    place of the file `copy` is a copy of (only while `fd` still holds it: a host thread may
    have put its own stdio there meanwhile, review 95 L5; a window of a few instructions is
    left), or where `fd` is closed. Inheritable, as stdio is: a child given the host's stdio
    got the slot closed, and its own first file there (review 95 M2). Where /dev/null cannot
    be opened, `fd` is just closed."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        if copy is not None and _same_file(fd, copy):
            os.close(fd)
        return
    if null != fd and (copy is None or _same_file(fd, copy)):
        os.dup2(null, fd)  # inheritable
    if null >= _STDIO_FDS:
        os.close(null)
    else:
        os.set_inheritable(null, True)  # fills `fd`, or another closed stdio slot: kept


def _same_file(fd: int, other: int) -> bool:
    try:
        a, b = os.fstat(fd), os.fstat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def fill_stdio_with_dev_null() -> None:
    """/dev/null on each of descriptors 0, 1 and 2 that is closed (the command line's start)."""
    for fd in range(_STDIO_FDS):
        try:
            os.fstat(fd)
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise
            _fill_with_dev_null(fd)


@dataclass(frozen=True, slots=True)
class DiskUsage:
    total_bytes: int
    used_bytes: int
    free_bytes: int

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


class MappedRegion(Protocol):
    """A file mapped in memory. `buf` supports slicing, slice assignment and struct *_from/_into."""

    size: int
    path: str

    @property
    def buf(self) -> mmap.mmap | bytearray: ...  # read-only here, so a region may narrow it
    def flush(self, start: int = 0, end: int | None = None) -> None: ...
    def redirty(self, start: int, end: int) -> None: ...
    def close(self) -> None: ...
    def reserve(self, end: int, *, unwritten_from: int = 0) -> bool: ...
    def unreserve(self, start: int, end: int) -> bool: ...
    def advise_willneed(self) -> None: ...
    def lock_in_memory(self) -> bool: ...
    def unlock_from_memory(self) -> None: ...
    def cut_short(self) -> bool: ...
    def fault_error(self, *, writing: bool = False) -> FileCutUnderMapError: ...
    def replaced(self, *, deleted_too: bool = True) -> bool: ...
    def renewed(self) -> bool: ...
    @property
    def identity(self) -> tuple[int, int]: ...
    def save_copy(self, path: str, length: int) -> None: ...
    @property
    def named(self) -> bool: ...
    def take_name(self) -> None: ...


class FileCutUnderMapError(OSError):
    """A page of a mapped store file was not there when touched: another process cut the
    file short (truncated it, or rewrote it in place), or, in a write, the disk had no room
    for the page. The SIGBUS guard put a zero page there, so what was stored in it is not in
    the file. The owner raises this rather than answer, write or flush as if nothing
    happened: its actor fails, and the restart reads the file as the damage it is."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EIO, "a page of the file was gone when touched: cut short by another process "
                                    "while mapped (or no room on the disk for it)", path)  # fmt: skip


class UnreadPageError(OSError):
    """A page of a mapped store file could not be read when touched (an I/O error on the
    disk, or another process cut the file short meanwhile): the SIGBUS guard handed the
    reader zeros for it, which are not the file's content. A reader that meets one acts on
    nothing it read there (no end, no damage, no expiry, no "no such message"): it stops
    and says the file cannot be read now, as for a segment it cannot map. Not damage."""

    def __init__(self, path: str, what: str = "nothing was changed; read again once the file reads whole") -> None:
        super().__init__(errno.EIO, "a page could not be read (an I/O error, or the file was cut short by another "
                                    f"process meanwhile): not damage; {what} (check the disk and the kernel log)",
                         path)  # fmt: skip


class UnreadDuringRecoveryError(UnreadPageError):
    """A page of a store file faulted while recovery read it: the zeros read as the end of the
    log. Trusting them would have ended the log there, deleting or writing over every record
    after it. Raised before recovery changes a byte: the store does not open until the file
    reads whole."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "recovery read the file and changed nothing: the store opens once it reads whole")


class FileNotWritableUnderMapError(FileCutUnderMapError):
    """A write through the map faulted on a file that is still whole and still the mapped
    one, but may not be written now: an immutable or append-only attribute (chattr +i/+a:
    ext4 refuses the page fault with SIGBUS), or its mode or owner changed. Not a cut: what
    the file held is there, and puts resume once it is writable again (see
    `not_writable_cause`). A FileCutUnderMapError still, for every owner that handles one."""

    def __init__(self, path: str, cause: OSError) -> None:
        OSError.__init__(self, cause.errno, f"not writable: {cause.strerror} (not cut: an immutable or "
                                            "append-only attribute, or its mode or owner); make it writable and "
                                            "puts resume", path)  # fmt: skip
        self.cause = cause


# linux/fs.h: FS_IOC_GETFLAGS (read as an int, as chattr does) and the flags that refuse writes.
_FS_IOC_GETFLAGS = 0x80086601
FS_IMMUTABLE_FL = 0x00000010
FS_APPEND_FL = 0x00000020
# What open(O_RDWR) answers for a file this process may not write (mode, owner, attribute).
NOT_WRITABLE_ERRNOS: frozenset[int] = frozenset({errno.EPERM, errno.EACCES})


def not_writable_cause(path: str) -> OSError | None:
    """Why `path` may not be written now (an OSError with errno, strerror and the file), or
    None: its immutable or append-only attribute (FS_IOC_GETFLAGS), else what open(O_RDWR)
    answers, EPERM or EACCES. Other errors (gone, EIO) are not this cause: None."""
    try:
        fd = open_fd(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            flags = struct.unpack("=i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
        except OSError:
            flags = 0  # no attributes on this filesystem (tmpfs): the open below decides
        finally:
            os.close(fd)
        if flags & FS_IMMUTABLE_FL:
            return OSError(errno.EPERM, "its immutable attribute is set (chattr +i)", path)
        if flags & FS_APPEND_FL:
            return OSError(errno.EPERM, "its append-only attribute is set (chattr +a)", path)
    try:
        os.close(open_fd(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno in NOT_WRITABLE_ERRNOS:
            return exc
    return None


# Below this much room left, a write fault on a whole file is taken for a full disk (the
# store itself leaves a filesystem's last 1 MiB; btrfs reports a few MiB it cannot give).
NO_ROOM_BYTES: Final = 16 * 1024 * 1024


def no_room_cause(path: str) -> OSError | None:
    """ENOSPC naming the room left when `path`'s filesystem has (nearly) none, else None:
    a store through a map into a whole file faulted for want of a block (review 70 L1: btrfs,
    and xfs for blocks a reflink copy shares, allocate at every such store, reserved or not)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    # Root may write into the blocks ext4 reserves for it (review 72 M3).
    room = (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) * stat.f_frsize
    if room >= NO_ROOM_BYTES:
        return None
    return OSError(errno.ENOSPC, f"no room on the disk for the page ({room} bytes left; btrfs, and xfs for blocks "
                                 "a reflink copy shares, need a new block at every store through a map)", path)  # fmt: skip


class FileWithoutRoomUnderMapError(FileCutUnderMapError):
    """A store through the map into a file that is still whole faulted on a (nearly) full
    disk: not a cut. Handled as one by every owner (what went into the faulted map is in
    memory only), but named for what it is."""

    def __init__(self, path: str, cause: OSError) -> None:
        OSError.__init__(self, errno.ENOSPC, f"a page of the file could not be written through its map: "
                                             f"{cause.strerror}; the file was not cut", path)  # fmt: skip


class FileReplacedUnderMapError(FileCutUnderMapError):
    """The path of a mapped store file names another file now, or none: another process
    renamed a file over it, renamed it away or deleted it (found when reserve() opened it
    again). Handled as a cut: what is written through the map reaches no file a directory
    holds, and the owner's checks (replaced(), cut_under_map) say so."""

    def __init__(self, path: str) -> None:
        OSError.__init__(self, errno.ESTALE, "the path names another file now, or none: replaced, renamed away or "
                                             "deleted by another process while mapped", path)  # fmt: skip


class NotARegularFileError(OSError):
    """A FIFO, socket or device where the store keeps a file: reading or writing it could
    block for good, so it is neither read nor written."""


def _require_regular(mode: int, path: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not stat.S_ISREG(mode):
        raise NotARegularFileError(errno.EINVAL, "not a regular file (a FIFO, socket or device?)", path)


def read_regular_file(path: str, limit: int = -1) -> bytes:
    """The file's bytes (at most `limit`). A FIFO, socket or device at `path` raises
    NotARegularFileError: opening a FIFO to read blocks until a writer comes (for good, here),
    so it is opened without blocking and looked at first."""
    fd = open_fd(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _require_regular(os.fstat(fd).st_mode, path)
        with open(fd, "rb", closefd=False) as f:
            return f.read(limit)
    finally:
        os.close(fd)


class FileSystem(Protocol):
    # `exclusive`: made new, never an existing file opened (FileExistsError): a segment the
    # store is about to write whose path another process took (review 152 F2).
    def map_file(self, path: str, size: int, *, create: bool = True, readonly: bool = False,
                 exclusive: bool = False) -> MappedRegion: ...
    def map_unnamed(self, path: str, size: int) -> MappedRegion: ...
    def sync_file(self, path: str, start: int, end: int) -> None: ...
    def map_faults(self) -> int: ...
    def cut_mark(self) -> int: ...
    def cut_under_map(self, since: int = 0) -> set[str]: ...
    def listdir(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def isdir(self, path: str) -> bool: ...
    def isfile(self, path: str) -> bool: ...
    def getsize(self, path: str) -> int: ...
    # (device, inode) of the file `path` names now, as a region's `identity`; OSError if none.
    def identity(self, path: str) -> tuple[int, int]: ...
    def makedirs(self, path: str) -> None: ...
    def remove(self, path: str) -> None: ...
    # An empty directory; OSError if it is not. No recursive removal: each owner deletes its
    # own files, and a tree removed whole took what another process had put in it (review 134 F2).
    def rmdir(self, path: str) -> None: ...
    def mtime_ms(self, path: str) -> int: ...
    def dir_state(self, path: str) -> Hashable | None: ...
    def set_mtime_ms(self, path: str, mtime_ms: int) -> None: ...
    def read_bytes(self, path: str) -> bytes: ...
    def read_at(self, path: str, offset: int, length: int) -> bytes: ...
    def shared_with(self, path: str) -> str | None: ...
    def write_atomic(self, path: str, data: bytes) -> None: ...
    def set_aside(self, path: str, suffix: str) -> str: ...
    def rename(self, path: str, target: str) -> None: ...
    # A second name `target` for the file `path` (a hard link: no new inode), made durable.
    def link(self, path: str, target: str) -> None: ...
    def disk_usage(self, path: str) -> DiskUsage: ...
    def data_extents(self, path: str, start: int, end: int) -> list[tuple[int, int]]: ...


# ---------------------------------------------------------------------------------------
# Real files

_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name:
            _libc = ctypes.CDLL(name, use_errno=True)
    return _libc


# Errors that say the process, not the file, is out of something: descriptors (EMFILE: its
# RLIMIT_NOFILE; ENFILE: the system's), or memory or map count (ENOMEM: vm.max_map_count).
OUT_OF_RESOURCES_ERRNOS: frozenset[int] = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})

# Modes of what the store creates (the umask still narrows them): written by the store's
# owner only, whatever the umask (review 65 F7: 0666 files and 0777 directories under umask
# 000 let any local user rewrite the ledger or the committed offsets).
FILE_MODE: Final = 0o644
DIR_MODE: Final = 0o755


def _keep_mode_and_owner(fd: int, old: os.stat_result) -> None:
    """Give a replacement (`write_atomic`'s temporary file) the replaced file's permission bits
    and, where the process may (root), its owner: an operator's chmod or chown of the file
    outlives the next rewrite. Best effort: a refusal never fails the write."""
    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(OSError):  # EPERM unless root (or a group of ours): ours kept
            os.fchown(fd, old.st_uid, old.st_gid)
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)

_reserve_failed_logged = False
# fallocate(2) errors that mean "this filesystem cannot", not "this disk cannot now".
_FALLOCATE_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV})


_FALLOC_FL_KEEP_SIZE: Final = 0x01
_FALLOC_FL_PUNCH_HOLE: Final = 0x02


def _fallocate(fd: int, offset: int, length: int, mode: int = 0) -> int:
    """fallocate(2), by default mode 0 (blocks reserved as unwritten extents, contents still
    zero); 0 or errno. ctypes drops the GIL for the call."""
    libc = _load_libc()
    fallocate = getattr(libc, "fallocate", None) if libc is not None else None
    if fallocate is None:
        return errno.EOPNOTSUPP
    while fallocate(fd, mode, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
        err = ctypes.get_errno() or errno.EIO
        if err != errno.EINTR:  # a signal: asked again (review 48 M2), never a refusal
            return err
    return 0


_ZEROS = bytes(1 << 20)


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_EXTENT_UNWRITTEN = 0x800
_FIEMAP_EXTENTS_PER_CALL = 128
_FIEMAP_HEADER = struct.Struct("=QQIIII")
_FIEMAP_EXTENT = struct.Struct("=QQQ16xI12x")


def _unwritten_or_holes(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """Ranges of [start, end) that are unwritten extents or holes (FS_IOC_FIEMAP). A hint
    only, never a reason to write (an unwritten extent may have dirty pages not yet written
    back); [] where FIEMAP is not supported."""
    found: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        request = bytearray(_FIEMAP_HEADER.pack(pos, end - pos, 0, 0, _FIEMAP_EXTENTS_PER_CALL, 0))
        request += bytes(_FIEMAP_EXTENT.size * _FIEMAP_EXTENTS_PER_CALL)
        try:
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, request)
        except OSError:
            return found
        mapped = _FIEMAP_HEADER.unpack_from(request)[3]
        if mapped == 0:
            found.append((pos, end))
            return found
        last_end = pos
        for i in range(mapped):
            logical, _physical, length, flags = _FIEMAP_EXTENT.unpack_from(
                request, _FIEMAP_HEADER.size + i * _FIEMAP_EXTENT.size
            )
            if logical > last_end:
                found.append((last_end, min(logical, end)))  # a hole
            if flags & _FIEMAP_EXTENT_UNWRITTEN:
                found.append((max(logical, pos), min(logical + length, end)))
            last_end = max(last_end, logical + length)
            if last_end >= end:
                return found
        if mapped < _FIEMAP_EXTENTS_PER_CALL:
            found.append((last_end, end))  # no extent after the last one: a hole to the end
            return found
        pos = last_end
    return found


def check_file_size_limit(path: str, end: int) -> None:
    """OSError(EFBIG) if writing a file up to `end` bytes passes the process's file size limit
    (RLIMIT_FSIZE, `ulimit -f`). Past it the kernel sends SIGXFSZ, whose default action kills
    the process: CPython ignores the signal at start, but a host may have restored it
    (review 52 M2). Checked before a file is grown or written with write(2); stores through a
    map draw no signal."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and end > soft:
        raise OSError(errno.EFBIG, f"the process's file size limit (RLIMIT_FSIZE, ulimit -f) is {soft} bytes, and "
                                   f"this file needs {end}: raise the limit or make the files smaller", path)  # fmt: skip


def _pwrite_zeros(fd: int, start: int, end: int, path: str) -> None:
    """Zeros over [start, end) with pwrite, a chunk at a time; OSError (ENOSPC) as it comes."""
    check_file_size_limit(path, end)
    zeros = memoryview(_ZEROS)
    while start < end:
        start += os.pwrite(fd, zeros[: min(len(zeros), end - start)], start)


def _open_unnamed(path: str) -> int:
    """A descriptor of a new file without a name in `path`'s directory (O_TMPFILE), which
    RealMappedRegion.take_name can link to `path`. OSError where that cannot be done: the
    filesystem has no O_TMPFILE (EOPNOTSUPP; EISDIR on kernels before 3.11), or /proc is not
    mounted (nothing to link the descriptor by)."""
    fd = open_fd(os.path.dirname(os.path.abspath(path)), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, FILE_MODE)
    if not os.path.exists(f"/proc/self/fd/{fd}"):
        os.close(fd)
        raise OSError(errno.EOPNOTSUPP, "an unnamed file cannot be named here: /proc is not mounted", path)
    return fd


class RealMappedRegion:
    def __init__(self, path: str, size: int, *, create: bool, readonly: bool, unnamed: bool = False,
                 private: bool = False, exclusive: bool = False) -> None:
        """`private`: the file opened read-only and mapped copy-on-write (MAP_PRIVATE): what
        is written through the map stays in this process's memory, never in the file (a dry
        run of recovery, storage/dry_run.py); flush() forces nothing."""
        readonly = readonly or private
        self.path = path
        self.size = size
        created = False
        # O_NONBLOCK: a FIFO under a segment's name must not block the open (read-only tools
        # hung on one); it is refused below, and cleared for a regular file.
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        # An unnamed file (O_TMPFILE) keeps its descriptor until take_name() links it: once
        # closed, nothing could give it a name.
        self._unnamed_fd: int | None = None
        self._close_unnamed: weakref.finalize[[int], RealMappedRegion] | None = None
        if unnamed:
            fd = _open_unnamed(path)
            self._unnamed_fd = fd
            self._close_unnamed = weakref.finalize(self, os.close, fd)
        elif readonly or not create:
            fd = open_fd(path, (os.O_RDONLY if readonly else os.O_RDWR) | flags)
        else:
            try:
                fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o644)
                created = True
            except FileExistsError:
                if exclusive:
                    raise
                fd = open_fd(path, os.O_RDWR | flags)
        release_area: Callable[[], None] | None = None
        try:
            status = os.fstat(fd)
            _require_regular(status.st_mode, path)
            self._identity = (status.st_dev, status.st_ino)
            self._path_bytes = os.fsencode(path)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            # Taken before the file grows: ENOMEM past the store's share (map_areas.py), for a
            # new file a little before it (what is left is for reading what is there).
            release_area = MAP_AREAS.take(path, new_file=created or unnamed)
            actual = status.st_size
            if actual != size:
                if readonly or not create:
                    raise OSError(errno.EINVAL, f"file is {actual} bytes, expected {size}", path)
                check_file_size_limit(path, size)
                os.ftruncate(fd, size)  # sparse: reads as zeros until written
            access = mmap.ACCESS_COPY if private else mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
            self.buf: mmap.mmap
            try:
                self.buf, kept = mapguard.map_keeping_no_descriptor(fd, size, access, status.st_dev, status.st_ino)
            except OSError as exc:
                if exc.filename is not None:
                    raise
                # mmap's own error names nothing: the open refused "[Errno 12] Cannot allocate
                # memory" for a process short of address space (review 119 F3, RLIMIT_AS).
                raise OSError(exc.errno, f"{exc.strerror} (mapping {size} bytes)", path) from None
            # Given back by close(), or when the map goes without one (a reader's, collected).
            self._release_area = weakref.finalize(self.buf, release_area)
            self._release_area.atexit = False
            if kept:
                _log_descriptor_kept(path)
            self._guard, self._unguard = _guard(self.buf, path)
            if created:
                # The new name made durable before anything in the file is acknowledged: a
                # flush (msync) makes the data durable, not the directory entry that finds it,
                # and a segment lost at a power loss with flushed records in it is a hole.
                fsync_dir(os.path.dirname(os.path.abspath(path)))
        except BaseException:
            if hasattr(self, "buf"):
                unguard = getattr(self, "_unguard", None)
                if unguard is not None:
                    unguard()
                self.buf.close()
            if release_area is not None:
                release_area()  # (once: the finalizer made of it, if any, does nothing after)
            if self._close_unnamed is not None:
                self._close_unnamed()  # nothing was named: the file is gone with its descriptor
                raise
            os.close(fd)
            if created:  # so the next try creates it again, and syncs its name then
                with contextlib.suppress(OSError):
                    os.remove(path)
            raise
        # The descriptor is closed once mapped, read-only or not: the map keeps the file alive
        # (and no descriptor of its own where mapguard can drop mmap's), so a kept one was a
        # second descriptor per map, 2 per consume queue ever written (review 58 F2: EMFILE at
        # ~500 queues under `ulimit -n 1024`). reserve() opens the file again for each window.
        if self._unnamed_fd is None:
            os.close(fd)
        self._writable = not readonly
        self._private = private
        self._reserved = 0
        self._locked = False
        self._cut_seen = False  # reserve() found the file shorter than the map

    @property
    def named(self) -> bool:
        return self._unnamed_fd is None

    def take_name(self) -> None:
        """Gives an unnamed file (map_unnamed) its name, `path`, and makes the name durable;
        FileExistsError, and still unnamed, if something has that name already. One step
        (linkat): the name never holds anything but this whole file, so a writer that made
        the file of that name itself meanwhile keeps it, records and all."""
        fd = self._unnamed_fd
        if fd is None:
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        name = os.path.basename(self.path)
        dir_fd = open_fd(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: AT_EMPTY_PATH would need
            # CAP_DAC_READ_SEARCH. (os.link without a dir_fd calls link(2), which links the
            # /proc symlink itself: EXDEV.)
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
            try:
                os.fsync(dir_fd)  # the name durable before anything in the file is acknowledged
            except BaseException:
                # A failed fsync is reported once: a later one may pass without the name on
                # disk. So the name goes, and the caller's fallback creates the file anew and
                # syncs the directory then (review 80 F1: it opened the linked name, unsynced).
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
                raise
        finally:
            os.close(dir_fd)
        assert self._close_unnamed is not None
        self._close_unnamed()
        self._unnamed_fd = self._close_unnamed = None

    def reserve(self, end: int, *, unwritten_from: int = 0) -> bool:
        """Reserve the file's blocks up to `end` ahead of the writes that will fill them.

        A write fault on a sparse page makes the filesystem allocate inside the fault: on ext4
        here 8.6 us of kernel time per 4 KiB page, 0.9 us once the blocks exist (for 1 KiB
        messages a third of a put's cost). Reserving a window ahead of the writer (not the
        whole segment) keeps that gain without taking a segment's worth of disk on open.
        Where the filesystem cannot, the file stays sparse, as RocketMQ's are: slower, and
        said once in the log.

        False only when the disk has no room (ENOSPC): writing there would fault with SIGBUS
        and kill the process, so the owner refuses the append instead (and tries again later,
        once the cleaner freed space). A failed call reserves nothing the caller may count on
        (ext4 may keep part of the range; tmpfs undoes it): only `end` values that returned
        True are reserved.

        `unwritten_from`: where the owner's data ends (nothing at or above it was written
        through this map). The reserved pages above it are initialised (see _initialise): a
        fallocated block alone does not make a store through the map safe on ext4.
        """
        # Whole pages: a write through the map dirties a page, and the filesystem must back
        # all of it (with 1 KiB blocks, a page's other blocks would be allocated in the fault).
        end = min(end + (-end) % OS_PAGE_SIZE, self.size)
        if not self._writable or end <= self._reserved:
            return True
        fd = self._reopen()
        try:
            return self._reserve(fd, end, unwritten_from)
        finally:
            os.close(fd)

    def unreserve(self, start: int, end: int) -> bool:
        """Give the blocks of [start, end) back to the disk: a hole punched, the size kept. For
        blocks reserved ahead of writes that did not come (an idle ConsumeQueue kept its 256 KiB
        window: 2,000 queues of one message each held 524 MB). `start` is at or above the
        owner's data end, so only zeros nothing was written to go (a hole reads as zeros). The
        owner's map must not be written there again without a reservation. True if given back;
        False where it could not be (no hole punching here, an unnamed file, the file replaced)."""
        start += (-start) % OS_PAGE_SIZE
        end = min(end + (-end) % OS_PAGE_SIZE, self.size)  # (reserve() backs whole pages)
        if not self._writable or self._unnamed_fd is not None or start >= end:
            return False
        if self._identity[0] in _NO_HOLE_PUNCHING:
            return False
        try:
            # (any OSError: made immutable or read-only since, no descriptor left now. Giving
            # back is best effort and never fails its caller: an idle queue's eviction raised
            # EPERM, and the ConsumeQueue owner's restarts ended in the supervisor giving up,
            # review 88 F1)
            fd = self._reopen()
        except OSError as exc:
            _log_unreserve_failed(self.path, exc)
            return False
        try:
            err = _fallocate(fd, start, end - start, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE)
        finally:
            os.close(fd)
        if err:
            if err in _FALLOCATE_UNSUPPORTED:
                _NO_HOLE_PUNCHING.add(self._identity[0])  # (not asked again on each eviction: review 89)
            else:
                _log_unreserve_failed(self.path, OSError(err, os.strerror(err)))
            return False
        self._reserved = min(self._reserved, start)
        return True

    def _reopen(self) -> int:
        """A descriptor of the mapped file, opened again by its path, for reserve(): the same
        file (device and inode) or FileReplacedUnderMapError. A file another process renamed
        over the path, or deleted, is not ours to grow or write zeros into; what is written
        through the map goes to a file no directory holds, which the owner's own checks name
        (replaced(), cut_under_map)."""
        try:
            fd = open_fd(self._path_bytes, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            _record_cut(self.path)
            raise FileReplacedUnderMapError(self.path) from None
        try:
            status = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if (status.st_dev, status.st_ino) != self._identity:
            os.close(fd)
            _record_cut(self.path)
            raise FileReplacedUnderMapError(self.path)
        return fd  # our regular file: O_NONBLOCK changes nothing for it

    def _reserve(self, fd: int, end: int, unwritten_from: int) -> bool:
        global _reserve_failed_logged
        if os.fstat(fd).st_size < self.size:
            # Cut short under the map by another process: fallocate and the zeros below would
            # grow it back with holes where its records were, and writes would go on as if
            # nothing had happened.
            self._cut_seen = True
            raise FileCutUnderMapError(self.path)
        err = _fallocate(fd, self._reserved, end - self._reserved)
        if err in (errno.ENOSPC, errno.EDQUOT):
            return False
        if err and err not in _FALLOCATE_UNSUPPORTED:
            # An I/O error, a read-only filesystem, a file too large: no permission to write
            # through the map into pages nothing backs (review 46 M2: EDQUOT and EIO were taken
            # for "unsupported", and only the SIGBUS guard kept the process alive).
            raise OSError(err, f"reserving blocks failed: {os.strerror(err)}", self.path)
        if err:
            self._reserved = self.size  # unsupported here: do not retry on every append
            if not _reserve_failed_logged:
                _reserve_failed_logged = True
                log.warning("fallocate_failed_file_stays_sparse", path=self.path, error=os.strerror(err))
            return True
        try:
            self._initialise_holes(fd, self._reserved, min(unwritten_from, end))
            self._initialise(fd, max(self._reserved, unwritten_from), end)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return False
            raise
        self._reserved = end
        return True

    def _initialise_holes(self, fd: int, start: int, end: int) -> None:
        """Write zeros over the holes (and unwritten extents) of [start, end), below the data
        end, where the file may hold data: a file written by RocketMQ (sparse index slots), or
        reserved by an older version of this store. A hole reads as zeros, so no byte changes;
        what SEEK_DATA calls data is left alone (its pages are cached or on disk)."""
        if start >= end:
            return
        # A clean cached page of an unwritten extent counts as data to SEEK_DATA; dropping
        # it (it reads as zeros on disk, so nothing is lost) lets the hole show. Only those
        # ranges are dropped: the cached pages of real data stay.
        for lo, hi in _unwritten_or_holes(fd, start, end):
            os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
        pos = start
        while pos < end:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    data = end  # no data after pos: the rest is a hole
                elif exc.errno == errno.EINVAL:
                    return  # no SEEK_DATA on this filesystem
                else:
                    raise
            _pwrite_zeros(fd, pos, min(data, end), self.path)
            if data >= end:
                return
            pos = os.lseek(fd, data, os.SEEK_HOLE)

    def _initialise(self, fd: int, start: int, end: int) -> None:
        """Write zeros with pwrite over the pages of [start, end), which hold no data.

        fallocate leaves unwritten extents. On ext4 filled to its last block by another
        process, the first store through the map into such a block can still fail with ENOSPC
        inside the page fault, which kills the process with SIGBUS
        (tests/crash/test_small_filesystem.py: every run on a 24 or 32 MiB image). A page
        written once with pwrite before the first store does not: the write path sets up its
        blocks, and there a failure is an error code (ENOSPC, an orderly refusal). Measured
        too: it does not help a page already in the page cache from a read, so cached copies
        of the range are dropped first (best effort: the kernel keeps dirty or busy pages).
        Only pages at or above the owner's data end are written, and those hold nothing yet.
        """
        start += (-start) % OS_PAGE_SIZE
        if start >= end:
            return
        if hasattr(self.buf, "madvise"):
            self.buf.madvise(mmap.MADV_DONTNEED, start, end - start)
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        _pwrite_zeros(fd, start, end, self.path)

    def flush(self, start: int = 0, end: int | None = None) -> None:
        if self._private:
            return  # (its pages are this process's copies: nothing to force)
        end = self.size if end is None else min(end, self.size)
        start -= start % mmap.PAGESIZE  # msync needs a page-aligned start
        if end > start:
            native = speedups.native
            if native is not None:
                native.msync(self.buf, start, end - start)  # without the GIL
            else:
                self.buf.flush(start, end - start)

    def redirty(self, start: int, end: int) -> None:
        """Mark the pages of [start, end) dirty again, each by a store of one of its own bytes:
        after a failed writeback Linux leaves them clean (their bytes in memory, not on disk)
        and reports the error once, so a later msync would write nothing and succeed
        ("fsyncgate"). Dirty again, the next msync writes them, or fails again."""
        buf = self.buf
        end = min(end, self.size)
        for page in range(start - start % mmap.PAGESIZE, end, mmap.PAGESIZE):
            buf[page] = buf[page]

    def close(self) -> None:
        if self._close_unnamed is not None:
            self._close_unnamed()  # never named: the file goes with its last reference
            self._unnamed_fd = self._close_unnamed = None
        if self._locked:
            self.unlock_from_memory()
        if self._unguard is not None:
            # A fault stays known after the close: a reader sharing this map (index/) that read
            # the guard's zeros asks cut_short() after another thread closed it (review 87 F1:
            # it answered no hits, no detail), and a map guarded again below starts a new count.
            self._cut_seen = self._cut_seen or mapguard.faults(self._guard) > 0
            self._unguard()  # before the address can be mapped again
            self._guard = self._unguard = None
        if not self.buf.closed:
            try:
                self.buf.close()
            except BufferError:
                # Still mapped: a reader holds an export (closed from another thread, review 51
                # M1). Guarded again at once: unguarded until its owner closed it, a page cut
                # from the file meanwhile killed the process (SIGBUS).
                self._guard, self._unguard = _guard(self.buf, self.path)
                raise
        self._release_area()  # unmapped: its area is the process's again

    def advise_willneed(self) -> None:
        if hasattr(self.buf, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
            self.buf.madvise(mmap.MADV_WILLNEED)

    def cut_short(self) -> bool:
        """Whether a page of this map was gone from the file when touched (it reads zeros
        now, and what is written there stays in memory): the file was cut under the map."""
        return self._cut_seen or mapguard.faults(self._guard) > 0

    def fault_error(self, *, writing: bool = False) -> FileCutUnderMapError:
        """What a fault on this map (cut_short) was, looked at before it is named: the path
        still names the mapped file at its full length and that file may not be written (an
        immutable or append-only attribute, or permission: review 65 F3, a chattr +i was
        reported as a cut), or, found by a write (`writing`: an owner's check after its
        writes), a disk with no room left for the page; or else a cut (or an unread page)."""
        try:
            status = os.stat(self._path_bytes)
        except OSError:
            return FileCutUnderMapError(self.path)
        if (status.st_dev, status.st_ino) != self._identity or status.st_size < self.size or self._cut_seen:
            return FileCutUnderMapError(self.path)
        cause = not_writable_cause(self.path)
        if cause is not None:
            return FileNotWritableUnderMapError(self.path, cause)
        # Only a write's fault: a page the disk could not read, on a full disk, is no full disk
        # (review 72 M3: the supervisor does not count a no-room fault against its budget).
        room = no_room_cause(self.path) if writing else None
        return FileCutUnderMapError(self.path) if room is None else FileWithoutRoomUnderMapError(self.path, room)

    def replaced(self, *, deleted_too: bool = True) -> bool:
        """Whether `path` no longer names the mapped file: another process renamed a file
        over it (rsync without --inplace, an atomic save), renamed it away or deleted it. What is written
        through this map then goes to a file no directory holds, lost at the next open.
        Recorded for cut_under_map() (the supervisor's log, stats, an unclean close)."""
        if self._writable and mapguard.available:
            # Renamed over, renamed away (logrotate's `create`), hard-linked then replaced, or
            # deleted: the path no longer names our file (the map holds the inode, so no other
            # file can have its number meanwhile). In C, no stat results built (the writer asks
            # every pass).
            gone = not mapguard.names_file(self._path_bytes, *self._identity)
        else:
            try:
                status = os.stat(self.path)
                gone = (status.st_dev, status.st_ino) != self._identity
            except FileNotFoundError:
                gone = True
        if gone and not deleted_too and not os.path.lexists(self.path):
            gone = False  # deleted, not replaced: the caller does not count that
        if gone:
            _record_cut(self.path)
        return gone

    def renewed(self) -> bool:
        """Whether `path` names another file now, made in place of this map's (which was
        deleted): a reader's stale map, not another process's replacement (nothing recorded:
        the store itself deletes and makes a segment of that name again at a writer restart)."""
        try:
            status = os.stat(self._path_bytes)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) != self._identity

    @property
    def identity(self) -> tuple[int, int]:
        """The mapped file's (device, inode), whatever its path names now."""
        return self._identity

    def save_copy(self, path: str, length: int) -> None:
        """The map's first `length` bytes written to a new file `path` of the map's size (the
        rest a hole: zeros, as in the map), made durable: a copy of a file replaced under it
        that can take the file's place."""
        if self._private:
            raise OSError(errno.EROFS, "a private map's copies are not written anywhere", path)
        check_file_size_limit(path, self.size)
        fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                view = memoryview(self.buf)[:length]
                try:
                    written = 0
                    while written < length:
                        written += os.write(fd, view[written : written + (1 << 20)])
                finally:
                    view.release()
                os.ftruncate(fd, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            # Not left half written under its name: a store copy is what an open asks the owner
            # to move over the segment, and a part of one served puts answered not stored
            # (review 142 F1: a full disk cut it at 36,864 bytes).
            with contextlib.suppress(OSError):
                os.unlink(path)
                fsync_dir(os.path.dirname(os.path.abspath(path)))
            raise
        try:
            fsync_dir(os.path.dirname(os.path.abspath(path)))
        except OSError as exc:
            # Whole, and kept: only its name is not known to be on disk, as the answers of the
            # puts in it say (FLUSH_DISK_TIMEOUT). Dropped, the acknowledged ones went with it.
            log.error("the directory of a store copy could not be forced", path=path, error=repr(exc))

    def _address(self) -> int:
        # ctypes cannot take the address of a read-only buffer; our writable maps are fine.
        return ctypes.addressof(ctypes.c_char.from_buffer(self.buf))

    def lock_in_memory(self) -> bool:
        """mlock, best effort: an unprivileged process usually has a small RLIMIT_MEMLOCK."""
        libc = _load_libc()
        if libc is None:
            return False
        try:
            ok = bool(libc.mlock(ctypes.c_void_p(self._address()), ctypes.c_size_t(self.size)) == 0)
        except (TypeError, ValueError, BufferError):
            return False
        self._locked = ok
        return ok

    def unlock_from_memory(self) -> None:
        libc = _load_libc()
        if libc is not None and self._locked:
            try:
                libc.munlock(ctypes.c_void_p(self._address()), ctypes.c_size_t(self.size))
            except (TypeError, ValueError, BufferError):
                pass
        self._locked = False


def region_closed(region: MappedRegion) -> bool:
    """Whether a map was closed (a simulated file's never is)."""
    return bool(getattr(region.buf, "closed", False))


def close_region_if_free(region: MappedRegion) -> bool:
    """Close a reader's map; False if it could not be now. Closed from another thread (the
    store closing, deleted files given back) while a reader decodes in place or a C walk
    holds it: that holds the map for one call, and the map stays guarded and is unmapped
    with its last reference right after. Closing must not fail for it."""
    try:
        region.close()
    except BufferError:
        return False
    return True


_unguarded_logged = False
_NO_HOLE_PUNCHING: set[int] = set()  # devices (st_dev) whose filesystem refused to punch a hole


def _log_unreserve_failed(path: str, exc: OSError) -> None:
    """A line a minute per errno at most (the process's own repeats: no one store owns a map)."""
    mqstore_log.PROCESS_REPEATS.say(log, "warning", "idle_file_blocks_not_given_back",
                                    ("idle_file_blocks_not_given_back", exc.errno), path=path, error=str(exc),
                                    consequence="they stay reserved for the file's next writes")  # fmt: skip


_descriptor_kept_logged = False


def _log_descriptor_kept(path: str) -> None:
    """Once a process: maps keep a descriptor each here (no extension before Python 3.13)."""
    global _descriptor_kept_logged
    if not _descriptor_kept_logged:
        _descriptor_kept_logged = True
        log.warning("file_maps_keep_descriptors", path=path,
                    reason="Python before 3.13 without the extension storage/_mapguard.c (no C compiler at install)",
                    consequence="every map of a segment, queue or index file holds a file descriptor: size "
                                "`ulimit -n` for the mapped files (README, descriptors)")  # fmt: skip


# Guarded maps (slot -> path) and the paths of closed maps that had been cut, each with the
# count of such closes when it was closed: what RealFileSystem.cut_under_map() reports (the
# supervisor's tick, a store's close), for the closes since a store's start only.
_guarded: dict[int, str] = {}
_cut_under_map_before: dict[str, int] = {}
_cut_seq = 0


def _record_cut(path: str) -> None:
    """`path` was cut or replaced under a map of this process (see cut_under_map)."""
    global _cut_seq
    _cut_seq += 1
    _cut_under_map_before[path] = _cut_seq


def _guard(buf: mmap.mmap, path: str) -> tuple[int | None, weakref.finalize[[int, str], mmap.mmap] | None]:
    """The map registered with the SIGBUS guard (storage/mapguard.py): its slot, and what
    releases the slot, which its owner's close() calls and which runs by itself when the map
    goes without one (a reader of a thread that ended, collected with its maps: review 58 F1,
    4 slots per reading thread were never given back). (None, None) without the guard."""
    global _unguarded_logged
    try:
        slot = mapguard.guard(buf)
    except (OSError, RuntimeError) as exc:
        slot, reason = None, repr(exc)
    else:
        reason = "the extension storage/_mapguard.c was not built (no C compiler at install)"
    if slot is None:
        if not _unguarded_logged:
            _unguarded_logged = True
            log.warning("file_maps_unguarded", path=path, reason=reason,
                        consequence="a store file cut short by another process while mapped kills the process (SIGBUS)")  # fmt: skip
        return None, None
    _guarded[slot] = path
    # On the mmap, not its region: whoever holds the map last (a reader keeps `buf` itself),
    # it is guarded while it is mapped. The callback runs in the map's dealloc, after munmap:
    # a map made at its address meanwhile, on another thread, has taken the slot over already
    # (the C guard() drops slots its range overlaps), and the generation in the token makes
    # this release a no-op then.
    unguard = weakref.finalize(buf, _unguard, slot, path)
    unguard.atexit = False
    return slot, unguard


def _unguard(slot: int, path: str) -> None:
    """A guarded map closed or gone: its cut recorded (cut_under_map), its slot released."""
    if mapguard.faults(slot):
        _record_cut(path)
    _guarded.pop(slot, None)
    mapguard.release(slot)


def free_name(exists: Callable[[str], bool], wanted: str) -> str:
    """`wanted`, or `wanted.1`, `wanted.2`, ...: the first name not taken."""
    name, n = wanted, 0
    while exists(name):
        n += 1
        name = f"{wanted}.{n}"
    return name


def fsync_dir(directory: str) -> None:
    """Make a directory's entries (a file created, renamed or removed in it) durable."""
    dir_fd = open_fd(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class RealFileSystem:
    def sync_file(self, path: str, start: int, end: int) -> None:
        """Force [start, end) of `path` to disk through a descriptor, for a file that cannot be
        mapped (no memory or address space for a map): fdatasync, which forces the whole file
        (the same page-cache pages an msync of a shared map writes)."""
        fd = open_fd(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def map_file(self, path: str, size: int, *, create: bool = True, readonly: bool = False,
                 exclusive: bool = False) -> RealMappedRegion:
        return RealMappedRegion(path, size, create=create, readonly=readonly, exclusive=exclusive)

    def map_unnamed(self, path: str, size: int) -> RealMappedRegion:
        """A new file of `size` for `path` that no directory holds until the region's
        take_name(): made ahead (the allocator), it cannot be found, deleted or written by
        name meanwhile, and is gone without a trace if never named."""
        return RealMappedRegion(path, size, create=True, readonly=False, unnamed=True)

    def map_faults(self) -> int:
        """Faults on every map of the process so far: while it stands still, no region of
        this file system is cut short, and no owner need ask each of its maps."""
        return mapguard.total_faults()

    def cut_mark(self) -> int:
        """Where cut_under_map(since=...) starts counting closed and replaced maps: a store's
        start. It moves with each one recorded."""
        return _cut_seq

    def cut_under_map(self, since: int = 0) -> set[str]:
        """Paths of the files that lost pages under a map of this process (another process
        cut them while the store had them mapped), mapped now or closed after `since`, and
        of those found replaced (MappedRegion.replaced) since."""
        cut = {path for slot, path in list(_guarded.items()) if mapguard.faults(slot)}
        return cut | {path for path, seq in list(_cut_under_map_before.items()) if seq > since}

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        """A regular file (after symlinks): not a directory, FIFO, socket or device."""
        return os.path.isfile(path)

    def getsize(self, path: str) -> int:
        return os.path.getsize(path)

    def identity(self, path: str) -> tuple[int, int]:
        status = os.stat(path)
        return (status.st_dev, status.st_ino)

    def makedirs(self, path: str) -> None:
        """os.makedirs, each directory it creates made durable in its parent (a queue's
        new directory, and the files in it, must not vanish at a power loss)."""
        missing: list[str] = []
        at = os.path.abspath(path)
        while not os.path.isdir(at) and os.path.dirname(at) != at:
            missing.append(at)
            at = os.path.dirname(at)
        for created in reversed(missing):
            # 0755, not os.makedirs's 0777 (review 65 F7: under umask 000 any local user could
            # add or replace files in the store); each level itself: os.makedirs gives its
            # mode to the last one only.
            try:
                os.mkdir(created, DIR_MODE)
            except FileExistsError:
                if not os.path.isdir(created):  # a file in the way: os.makedirs raised too
                    raise
            fsync_dir(os.path.dirname(created))

    def remove(self, path: str) -> None:
        os.remove(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def mtime_ms(self, path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000

    def dir_state(self, path: str) -> Hashable | None:
        """What changes when a directory's permission to create in it may have: its mode,
        owner, ctime (a chmod, chown or ACL change) and mtime; None when it cannot be stat'ed."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mode, st.st_uid, st.st_gid, st.st_ctime_ns, st.st_mtime_ns)

    def set_mtime_ms(self, path: str, mtime_ms: int) -> None:
        os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))

    def read_bytes(self, path: str) -> bytes:
        return read_regular_file(path)

    def read_at(self, path: str, offset: int, length: int) -> bytes:
        """At most `length` bytes of a regular file from `offset` (fewer past its end)."""
        fd = open_fd(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (a FIFO opens, then is refused)
        try:
            _require_regular(os.fstat(fd).st_mode, path)
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def shared_with(self, path: str) -> str | None:
        """Why writing `path` in place would write bytes another name shows too: "a symbolic
        link to ..." or "one of N hard links to one file"; None for a file of its own or none."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return f"a symbolic link to {os.readlink(path)}"
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            return f"one of {st.st_nlink} hard links to one file"
        return None

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write a temporary file, fsync it, rename it over `path`, fsync the directory. A
        leftover temporary file is replaced; anything else there (a FIFO: opening it to write
        blocks for good) raises NotARegularFileError."""
        directory = os.path.dirname(os.path.abspath(path))
        tmp = f"{path}.tmp"
        # Before anything is written: past the limit a write draws SIGXFSZ, which kills a host
        # that restored its default action (review 90 M2: the offsets tick wrote
        # consumerOffset.json past `ulimit -f`, and the host died with no call of its own).
        check_file_size_limit(tmp, len(data))
        try:
            leftover = os.lstat(tmp)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISLNK(leftover.st_mode):
                _require_regular(leftover.st_mode, tmp)
            os.remove(tmp)
        try:
            # lstat: a symbolic link at `path` is replaced, not written through, so its
            # target's mode and owner are not the file's to keep (review 66 F3: a link to a
            # file of another user's, 0666, made the committed offsets theirs and writable).
            old: os.stat_result | None = os.lstat(path)
        except OSError:  # none yet (or not to be seen): the new file's own mode, and ours
            old = None
        if old is not None and not stat.S_ISREG(old.st_mode):
            old = None
        try:
            fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
            if old is not None:
                _keep_mode_and_owner(fd, old)
            with open(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):  # a full disk leaves no half-written temp file
                os.remove(tmp)
            raise
        dir_fd = open_fd(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def set_aside(self, path: str, suffix: str) -> str:
        """Rename `path` to `path + suffix` (or `path + suffix + ".N"` if taken), never over
        another file; returns the new path. For a damaged file kept for a person to look at."""
        target = free_name(self.exists, path + suffix)
        os.rename(path, target)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
        return target

    def rename(self, path: str, target: str) -> None:
        """Rename `path` to `target` in its directory, never over another file (FileExistsError),
        made durable: a file written under a temporary name put in its place."""
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "a file is in the way", target)
        os.rename(path, target)
        fsync_dir(os.path.dirname(os.path.abspath(target)))

    def link(self, path: str, target: str) -> None:
        os.link(path, target, follow_symlinks=False)
        fsync_dir(os.path.dirname(os.path.abspath(target)))

    def disk_usage(self, path: str) -> DiskUsage:
        usage = shutil.disk_usage(path)
        return DiskUsage(usage.total, usage.used, usage.free)

    def data_extents(self, path: str, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that may hold data: holes of a sparse file are skipped
        (SEEK_DATA/SEEK_HOLE; the page cache's dirty pages count as data). Where the file
        system cannot tell, the whole range."""
        if start >= end:
            return []
        fd = open_fd(path, os.O_RDONLY)
        try:
            extents: list[tuple[int, int]] = []
            pos = start
            while pos < end:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data at or after pos
                        break
                    return [(start, end)]
                if data >= end:
                    break
                hole = os.lseek(fd, data, os.SEEK_HOLE)
                extents.append((data, min(hole, end)))
                pos = hole
            return extents
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------
# Simulated disk


class _SimFile:
    __slots__ = ("volatile", "durable", "mtime_ms", "backed", "atomic", "cut", "lost_writeback")

    def __init__(self, size: int, mtime_ms: int, *, atomic: bool = False) -> None:
        self.volatile = bytearray(size)
        self.durable = bytearray(size)
        self.mtime_ms = mtime_ms
        # Pages with blocks behind them (reserved, or written while there was room). A mapped
        # file starts sparse; a file written with write_atomic is backed whole.
        self.backed = bytearray(b"\x01" if atomic else b"\x00") * _pages(size)
        self.atomic = atomic
        self.cut = False  # SimulatedFileSystem.cut_file_under_map
        # Pages whose writeback failed (an injected flush fault): clean, not durable, until
        # written to again or redirtied; their bytes at the failure.
        self.lost_writeback: dict[int, bytes] = {}


def _pages(size: int) -> int:
    return -(-size // OS_PAGE_SIZE)


class SimulatedRegion:
    def __init__(self, fs: SimulatedFileSystem, path: str, file: _SimFile, *, unnamed: bool = False,
                 readonly: bool = False) -> None:  # fmt: skip
        self._fs = fs
        self._file = file
        self._writable = not readonly
        self.path = path
        self.size = len(file.volatile)
        self.buf: bytearray = file.volatile  # shared, like the page cache
        self._unnamed = unnamed

    @property
    def named(self) -> bool:
        return not self._unnamed

    def take_name(self) -> None:
        if not self._unnamed:
            return
        self._fs._check_fault("take_name", self.path)
        with self._fs._lock:
            if self.path in self._fs._files:
                raise FileExistsError(errno.EEXIST, "file exists", self.path)
            self._fs._files[self.path] = self._file
        self._unnamed = False

    def flush(self, start: int = 0, end: int | None = None) -> None:
        end = self.size if end is None else min(end, self.size)
        start -= start % OS_PAGE_SIZE
        file = self._file
        try:
            self._fs._check_fault("flush", self.path)
        except OSError:
            # As Linux after a failed writeback: the pages are clean now, their bytes in memory
            # only; a later flush writes them only once written to again (or `redirty`).
            for page in range(start // OS_PAGE_SIZE, _pages(end)):
                lo = page * OS_PAGE_SIZE
                if file.volatile[lo : lo + OS_PAGE_SIZE] != file.durable[lo : lo + OS_PAGE_SIZE]:
                    file.lost_writeback[page] = bytes(file.volatile[lo : lo + OS_PAGE_SIZE])
            raise
        self._fs._check_backing(self.path, file)
        lost = file.lost_writeback
        if not lost:
            file.durable[start:end] = file.volatile[start:end]
            file.mtime_ms = self._fs.clock_ms()
            return
        for page in range(start // OS_PAGE_SIZE, _pages(end)):
            lo = page * OS_PAGE_SIZE
            if page in lost and lost[page] == file.volatile[lo : lo + OS_PAGE_SIZE]:
                continue  # clean since its failed writeback, not written since: nothing to write
            lost.pop(page, None)
            file.durable[lo : min(lo + OS_PAGE_SIZE, end)] = file.volatile[lo : min(lo + OS_PAGE_SIZE, end)]
        file.mtime_ms = self._fs.clock_ms()

    def redirty(self, start: int, end: int) -> None:
        for page in range(start // OS_PAGE_SIZE, _pages(min(end, self.size))):
            self._file.lost_writeback.pop(page, None)

    def close(self) -> None:
        pass

    def reserve(self, end: int, *, unwritten_from: int = 0) -> bool:
        """Back the pages below `end` with blocks, as fallocate does: False (nothing reserved)
        when the disk's capacity cannot hold them, or an injected "reserve" fault with ENOSPC."""
        try:
            self._fs._check_fault("reserve", self.path)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                return False
            raise
        return self._fs._back_pages(self._file, min(end, self.size))

    def unreserve(self, start: int, end: int) -> bool:
        """A hole punched, as fallocate(PUNCH_HOLE) does: the pages of [start, end) read as
        zeros, in memory and on disk, and lose their blocks (whatever they held: a punch over
        data is data lost, and the tests see it)."""
        start += (-start) % OS_PAGE_SIZE
        end = min(end + (-end) % OS_PAGE_SIZE, self.size)
        if not self._writable or start >= end or self._unnamed:
            return False
        try:
            self._fs._check_fault("unreserve", self.path)
        except OSError:
            return False
        file = self._file
        with self._fs._lock:
            zeros = bytes(end - start)
            file.volatile[start:end] = zeros
            file.durable[start:end] = zeros
            for page in range(start // OS_PAGE_SIZE, _pages(end)):
                file.backed[page] = 0
                file.lost_writeback.pop(page, None)
        return True

    def advise_willneed(self) -> None:
        pass

    def lock_in_memory(self) -> bool:
        return True

    def unlock_from_memory(self) -> None:
        pass

    def cut_short(self) -> bool:
        return self._file.cut

    def fault_error(self, *, writing: bool = False) -> FileCutUnderMapError:
        return FileCutUnderMapError(self.path)

    def replaced(self, *, deleted_too: bool = True) -> bool:
        now = self._fs._files.get(self.path)
        gone = now is not self._file and (deleted_too or now is not None)
        if gone:
            self._fs._replaced.add(self.path)
        return gone

    def renewed(self) -> bool:
        now = self._fs._files.get(self.path)
        return now is not None and now is not self._file

    @property
    def identity(self) -> tuple[int, int]:
        return (0, id(self._file))  # (a simulated file is its object: one per creation)

    def save_copy(self, path: str, length: int) -> None:
        self._fs.write_atomic(path, bytes(self._file.volatile[:length]).ljust(self.size, b"\0"))


@dataclass
class _Fault:
    op: str
    path_contains: str
    err: int
    remaining: int


class SimulatedFileSystem:
    """An in-memory disk with separate volatile and durable images. Thread-safe for metadata.

    Paths are plain strings; directories exist implicitly through `makedirs`. File creation and
    removal are durable at once (metadata journaling); file *contents* are durable only up to
    the last `flush` of each page.
    """

    def __init__(
        self,
        *,
        clock_ms: Callable[[], int] | None = None,
        total_bytes: int = 1 << 40,
        capacity_bytes: int | None = None,
    ) -> None:
        """`capacity_bytes` makes a small disk: reservations and write_atomic count against
        it, and a write through a map into a page with no blocks behind it is recorded as
        the SIGBUS it would be on a real disk (`sigbus_writes`, checked on every flush and
        by `assert_no_sigbus`)."""
        self._files: dict[str, _SimFile] = {}
        self._dirs: set[str] = {"/"}
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.total_bytes = total_bytes if capacity_bytes is None else capacity_bytes
        self.capacity_bytes = capacity_bytes
        self.used_ratio_override: float | None = None
        self.sigbus_writes: list[tuple[str, int]] = []  # (path, page offset)
        self._map_faults = 0
        self._replaced: set[str] = set()  # SimulatedRegion.replaced() found another file there

    # capacity --------------------------------------------------------------------------
    def _used_locked(self) -> int:
        return sum(
            len(f.volatile) if f.atomic else f.backed.count(1) * OS_PAGE_SIZE for f in self._files.values()
        )

    def _back_pages(self, file: _SimFile, end: int) -> bool:
        """Back file's pages below `end`; all or nothing."""
        with self._lock:
            missing = file.backed[: _pages(end)].count(0)
            if self.capacity_bytes is not None and missing:
                if self._used_locked() + missing * OS_PAGE_SIZE > self.capacity_bytes:
                    return False
            file.backed[: _pages(end)] = b"\x01" * _pages(end)
        return True

    def _check_backing(self, path: str, file: _SimFile) -> None:
        """Written (non-zero) pages with no blocks behind them get blocks if the disk has room,
        as a page fault would allocate them; with no room the write faulted with SIGBUS and
        killed the process on a real disk: recorded in `sigbus_writes`."""
        if self.capacity_bytes is None or file.atomic:
            return
        volatile, backed = file.volatile, file.backed
        with self._lock:
            for page in range(len(backed)):
                if backed[page]:
                    continue
                start = page * OS_PAGE_SIZE
                chunk = volatile[start : start + OS_PAGE_SIZE]
                if chunk.count(0) == len(chunk):
                    continue
                if self._used_locked() + OS_PAGE_SIZE <= self.capacity_bytes:
                    backed[page] = 1
                else:
                    self.sigbus_writes.append((path, start))
                    log.error("simulated_sigbus_write_to_unbacked_page", path=path, offset=start)

    def assert_no_sigbus(self) -> None:
        """Fail (AssertionError: this is for tests) if any write went where a real disk had
        no blocks to give it."""
        with self._lock:
            files = list(self._files.items())
        for path, file in files:
            self._check_backing(path, file)
        assert not self.sigbus_writes, f"writes that would have died with SIGBUS: {self.sigbus_writes[:10]}"

    def free_bytes(self) -> int:
        """Room left on a disk with a capacity (the free space of `disk_usage`)."""
        with self._lock:
            return max(self.total_bytes - self._used_locked(), 0)

    # fault injection -------------------------------------------------------------------
    def inject_fault(self, op: str, *, path_contains: str = "", err: int = errno.EIO, count: int = 1) -> None:
        """Make the next `count` calls of `op` ("map", "map_writable": maps for writing only,
        "flush", "write", "remove", "reserve") on a matching path fail."""
        with self._lock:
            self._faults.append(_Fault(op, path_contains, err, count))

    def clear_faults(self) -> None:
        """Remove every injected fault still armed (the disk got its space back)."""
        with self._lock:
            self._faults.clear()

    def _check_fault(self, op: str, path: str) -> None:
        with self._lock:
            for fault in self._faults:
                if fault.op == op and fault.path_contains in path and fault.remaining > 0:
                    fault.remaining -= 1
                    raise OSError(fault.err, os.strerror(fault.err), path)

    # FileSystem ------------------------------------------------------------------------
    def map_faults(self) -> int:
        return self._map_faults

    def cut_file_under_map(self, path: str) -> None:
        """As another process truncating `path` while it is mapped, once the store touched a
        page past the cut: its regions report cut_short() (their bytes stay as they were)."""
        with self._lock:
            self._files[os.path.normpath(path)].cut = True
            self._map_faults += 1

    def cut_mark(self) -> int:
        return self._map_faults + len(self._replaced)

    def cut_under_map(self, since: int = 0) -> set[str]:
        with self._lock:
            return {path for path, file in self._files.items() if file.cut} | self._replaced

    def sync_file(self, path: str, start: int, end: int) -> None:
        with self._lock:
            file = self._files.get(os.path.normpath(path))
        if file is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        SimulatedRegion(self, path, file).flush(start, end)  # the same writeback, failures and all

    def map_file(self, path: str, size: int, *, create: bool = True, readonly: bool = False,
                 exclusive: bool = False) -> SimulatedRegion:
        path = os.path.normpath(path)
        self._check_fault("map", path)
        if not readonly:  # a file it may read, not write (root-owned 0644, chattr +i)
            self._check_fault("map_writable", path)
        with self._lock:
            if os.path.dirname(path) not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", os.path.dirname(path))
            file = self._files.get(path)
            if file is None:
                if not create or readonly:
                    raise FileNotFoundError(errno.ENOENT, "no such file", path)
                file = self._files[path] = _SimFile(size, self.clock_ms())
            elif exclusive and create and not readonly:
                raise FileExistsError(errno.EEXIST, "File exists", path)
            elif len(file.volatile) != size:
                raise OSError(errno.EINVAL, f"file is {len(file.volatile)} bytes, expected {size}", path)
        return SimulatedRegion(self, path, file, readonly=readonly)

    def map_unnamed(self, path: str, size: int) -> SimulatedRegion:
        path = os.path.normpath(path)
        self._check_fault("map", path)
        self._check_fault("map_writable", path)
        self._check_fault("map_unnamed", path)
        with self._lock:
            if os.path.dirname(path) not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", os.path.dirname(path))
            file = _SimFile(size, self.clock_ms())
        return SimulatedRegion(self, path, file, unnamed=True)

    def listdir(self, path: str) -> list[str]:
        path = os.path.normpath(path)
        with self._lock:
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            names = {os.path.basename(p) for p in self._files if os.path.dirname(p) == path}
            names |= {os.path.basename(d) for d in self._dirs if d != path and os.path.dirname(d) == path}
        return sorted(names)

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        return path in self._files or path in self._dirs

    def isdir(self, path: str) -> bool:
        return os.path.normpath(path) in self._dirs

    def isfile(self, path: str) -> bool:
        return os.path.normpath(path) in self._files

    def getsize(self, path: str) -> int:
        file = self._files.get(os.path.normpath(path))
        if file is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return len(file.volatile)

    def identity(self, path: str) -> tuple[int, int]:
        file = self._files.get(os.path.normpath(path))
        if file is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return (0, id(file))  # (as its regions' identity)

    def makedirs(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._lock:
            while path not in self._dirs:
                self._dirs.add(path)
                path = os.path.dirname(path)

    def remove(self, path: str) -> None:
        path = os.path.normpath(path)
        self._check_fault("remove", path)
        with self._lock:
            if self._files.pop(path, None) is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)

    def rmdir(self, path: str) -> None:
        path = os.path.normpath(path)
        prefix = path + os.sep
        with self._lock:
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            if any(p.startswith(prefix) for p in self._files) or any(d.startswith(prefix) for d in self._dirs):
                raise OSError(errno.ENOTEMPTY, "directory not empty", path)
            self._dirs.discard(path)

    def dir_state(self, path: str) -> Hashable | None:
        """None: the simulated disk has no permissions (a create fault ends with its count)."""
        return None

    def mtime_ms(self, path: str) -> int:
        file = self._files.get(os.path.normpath(path))
        if file is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return file.mtime_ms

    def set_mtime_ms(self, path: str, mtime_ms: int) -> None:
        self._files[os.path.normpath(path)].mtime_ms = mtime_ms

    def shared_with(self, path: str) -> str | None:
        return None  # no links here

    def read_bytes(self, path: str) -> bytes:
        file = self._files.get(os.path.normpath(path))
        if file is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return bytes(file.volatile)

    def read_at(self, path: str, offset: int, length: int) -> bytes:
        return self.read_bytes(path)[offset : offset + length]

    def write_atomic(self, path: str, data: bytes) -> None:
        path = os.path.normpath(path)
        self._check_fault("write", path)
        file = _SimFile(len(data), self.clock_ms(), atomic=True)
        file.volatile[:] = data
        file.durable[:] = data
        with self._lock:
            if os.path.dirname(path) not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", os.path.dirname(path))
            if self.capacity_bytes is not None:
                old = self._files.get(path)
                old_bytes = 0 if old is None else (len(old.volatile) if old.atomic else old.backed.count(1) * OS_PAGE_SIZE)
                if self._used_locked() - old_bytes + len(data) > self.capacity_bytes:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            self._files[path] = file

    def set_aside(self, path: str, suffix: str) -> str:
        path = os.path.normpath(path)
        self._check_fault("rename", path)
        with self._lock:
            target = free_name(lambda p: p in self._files or p in self._dirs, path + suffix)
            file = self._files.pop(path, None)
            if file is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self._files[target] = file
        return target

    def link(self, path: str, target: str) -> None:
        path, target = os.path.normpath(path), os.path.normpath(target)
        self._check_fault("link", path)
        with self._lock:
            if target in self._files or target in self._dirs:
                raise FileExistsError(errno.EEXIST, "a file is in the way", target)
            file = self._files.get(path)
            if file is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self._files[target] = file

    def rename(self, path: str, target: str) -> None:
        path, target = os.path.normpath(path), os.path.normpath(target)
        self._check_fault("rename", path)
        with self._lock:
            if target in self._files or target in self._dirs:
                raise FileExistsError(errno.EEXIST, "a file is in the way", target)
            file = self._files.pop(path, None)
            if file is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self._files[target] = file

    def disk_usage(self, path: str) -> DiskUsage:
        if self.used_ratio_override is not None:
            used = int(self.total_bytes * self.used_ratio_override)
        elif self.capacity_bytes is not None:
            with self._lock:
                used = self._used_locked()
        else:
            with self._lock:  # another actor may be creating a file (RuntimeError: dict changed size)
                used = sum(len(f.volatile) for f in self._files.values())
        return DiskUsage(self.total_bytes, used, max(self.total_bytes - used, 0))

    def data_extents(self, path: str, start: int, end: int) -> list[tuple[int, int]]:
        return [(start, end)] if start < end else []  # the simulated disk has no holes

    # power loss ------------------------------------------------------------------------
    def crash(self, seed: int, *, tear: bool = True) -> SimulatedFileSystem:
        """The disk after a power loss: durable bytes, plus (if `tear`) a random subset of the
        unsynced pages, some of them torn at 512-byte sector granularity, as writeback may
        have reached the platter in any order. Reproducible from `seed`."""
        rng = random.Random(seed)
        after = SimulatedFileSystem(clock_ms=self.clock_ms, total_bytes=self.total_bytes, capacity_bytes=self.capacity_bytes)
        with self._lock:
            after._dirs = set(self._dirs)
            for path, file in sorted(self._files.items()):
                image = bytearray(file.durable)
                if tear:
                    for page in range(0, len(image), OS_PAGE_SIZE):
                        end = page + OS_PAGE_SIZE
                        if file.volatile[page:end] == image[page:end]:
                            continue
                        fate = rng.random()
                        if fate < 0.35:
                            image[page:end] = file.volatile[page:end]  # written back before the crash
                        elif fate < 0.6:
                            for sector in range(page, min(end, len(image)), 512):
                                if rng.random() < 0.5:
                                    image[sector : sector + 512] = file.volatile[sector : sector + 512]
                copy = _SimFile(len(image), file.mtime_ms, atomic=file.atomic)
                copy.volatile[:] = image
                copy.durable[:] = image
                copy.backed[:] = file.backed
                after._files[path] = copy
        return after

    def unsynced_pages(self) -> int:
        with self._lock:
            return sum(
                1
                for f in self._files.values()
                for page in range(0, len(f.volatile), OS_PAGE_SIZE)
                if f.volatile[page : page + OS_PAGE_SIZE] != f.durable[page : page + OS_PAGE_SIZE]
            )
