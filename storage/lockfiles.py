"""The `lock` and `abort` files of a store root (spec §11.2).

`lock` keeps a second store (another process, or another store object in this process) off
the same directory: an exclusive lock on byte range [0, 1), then the ASCII bytes "lock",
forced. Classic POSIX record locks belong to the process, so a second `lockf` from the same
process would succeed silently; an in-process registry keyed by the real path catches that
case (and we use Linux OFD locks where available, see `_lock_byte_zero`). On a `SimulatedFileSystem` the registry alone is the lock (keyed by the fs object too).

`abort` exists while a store runs; finding it at start means the last run crashed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Final

from mqstore.log import get_logger
from mqstore.storage.fs import FileSystem, RealFileSystem, check_file_size_limit, fsync_dir, open_fd

__all__ = ["ABORT_FILE_NAME", "LOCK_FILE_NAME", "AbortFile", "StoreDirectoryError", "StoreLock", "StoreLockedError"]

LOCK_FILE_NAME: Final = "lock"
ABORT_FILE_NAME: Final = "abort"
_LOCK_CONTENT: Final = b"lock"

log = get_logger(__name__)

# (id of the fs object or 0 for real files, real path) of every lock held in this process.
_held: set[tuple[int, str]] = set()
_held_guard = threading.Lock()
# Locks whose holder could start no thread to release them once its last actor ends (a thread
# shortage): the next acquire of the same store in this process asks first (review 144 F1).
_deferred_releases: dict[tuple[int, str], Callable[[], bool]] = {}


_holding: "weakref.WeakSet[StoreLock]" = weakref.WeakSet()  # the locks with an open descriptor


def _none_held_in_a_forked_child() -> None:
    # The parent's locks are the parent's: a child's open of its store is "started by another
    # process", not "in this process" (the record lock, per process, says the same). Their
    # descriptors are closed here: an open file description's lock (OFD) lasts while any
    # descriptor of it is open, so a child outliving a killed parent kept the store locked
    # until it ended (review 29). The parent's own descriptors keep its locks.
    global _held_guard
    _held.clear()
    _deferred_releases.clear()
    _held_guard = threading.Lock()  # (a thread of the parent may have held it at the fork)
    for lock in list(_holding):
        for fd in ([lock._fd] if lock._fd is not None else []) + lock._directory_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        lock._fd = None
        lock._directory_fds = []
        lock._key = None
    _holding.clear()


os.register_at_fork(after_in_child=_none_held_in_a_forked_child)


class StoreDirectoryError(RuntimeError):
    """Something in the store root is in the way of the store's own files (a directory
    where the `abort` or `lock` file belongs), or missing from it (a commitlog without a
    segment beside files that say it held messages): the store does not guess what it is."""


class StoreLockedError(RuntimeError):
    """Another store holds the lock file: "Lock failed, MQ already started" in RocketMQ."""


# A classic POSIX record lock (lockf) is dropped when the process closes *any* descriptor of
# the file, e.g. a tool in the host process reading `lock`. Linux open-file-description locks
# (F_OFD_SETLK) belong to our descriptor only, and still conflict with the classic locks that
# Java's FileChannel.tryLock and other processes take. So: OFD where we know the struct flock
# layout (64-bit Linux), lockf elsewhere.
_OFD_SETLK: Final[int | None] = getattr(fcntl, "F_OFD_SETLK", None)
_FLOCK = struct.Struct("@hhqqi4x")  # l_type, l_whence, l_start, l_len, l_pid (must be 0 for OFD)
_USE_OFD: Final = (
    _OFD_SETLK is not None and sys.platform.startswith("linux") and sys.maxsize > 2**32 and _FLOCK.size == 32
)


def _lock_byte_zero(fd: int) -> None:
    """Exclusive, non-blocking lock on byte range [0, 1); OSError (EAGAIN/EACCES) if taken."""
    if _USE_OFD:
        assert _OFD_SETLK is not None
        fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)


def _unlock_byte_zero(fd: int) -> None:
    if _USE_OFD:
        assert _OFD_SETLK is not None
        fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, 0, 1, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)


# A read-only command asks whether a store runs by taking a shared flock on its commitlog
# directory for an instant (tools.inspect_cli.lock_state): an open meeting it tries again
# for this long before it calls the directory another store's.
_FLOCK_RETRY_S: Final = 0.1


def _flock_exclusive(fd: int) -> None:
    """An exclusive flock on `fd`, tried again while _FLOCK_RETRY_S lasts; OSError
    (EWOULDBLOCK) if another holds it still."""
    deadline = time.monotonic() + _FLOCK_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


def held_in_this_process(fs: FileSystem, path: str) -> bool:
    """Whether a StoreLock of this process holds `path` (asked without touching the file: with
    classic POSIX locks, closing any descriptor of it would drop this process's lock)."""
    key = (0, os.path.realpath(path)) if isinstance(fs, RealFileSystem) else (id(fs), os.path.normpath(path))
    with _held_guard:
        return key in _held


def _names(path: str, st: os.stat_result) -> bool:
    """Whether `path` names the file `st` was taken of (through a link too: a data directory
    may be one, to another disk)."""
    try:
        return os.path.samestat(st, os.stat(path))
    except OSError:
        return False


class StoreLock:
    """The store's `lock` file. Not thread-safe; `acquire` once, `release` once.

    Usage: `with StoreLock(fs, os.path.join(root, "lock")): ...` or `acquire()`/`release()`.
    """

    def __init__(self, fs: FileSystem, path: str) -> None:
        self._fs = fs
        self.path = path
        self._real = isinstance(fs, RealFileSystem)
        self._key: tuple[int, str] | None = None
        self._fd: int | None = None
        self._directory_fds: list[int] = []  # flock'd data directories (claim_directories)
        self._claimed: dict[tuple[int, int], str] = {}  # (dev, inode) -> path, across calls
        self._held_directories: set[tuple[int, int]] = set()  # (dev, inode) flock'd by this lock
        self._created = False  # this acquire made the file (a refused open removes it again)

    @property
    def locked(self) -> bool:
        return self._key is not None

    def acquire(self) -> None:
        """Take the lock or raise StoreLockedError naming the path. OSError on I/O errors."""
        if self._key is not None:
            raise RuntimeError(f"the store lock {self.path} is already acquired by this object")
        self._created = False
        self._fs.makedirs(os.path.dirname(os.path.abspath(self.path)))
        refuse_unless_regular_file(self._fs, self.path, "lock file")
        key = (0, os.path.realpath(self.path)) if self._real else (id(self._fs), os.path.normpath(self.path))
        with _held_guard:
            deferred = _deferred_releases.pop(key, None)
        if deferred is not None and not deferred():  # (True: it released the earlier holder's lock)
            with _held_guard:
                _deferred_releases.setdefault(key, deferred)
        mine = False  # set before the add: an exception between the two discards nothing
        try:
            with _held_guard:
                if key in _held:
                    raise StoreLockedError(f"lock failed, store already started in this process: {self.path}")
                mine = True
                _held.add(key)
            if self._real:
                self._lock_real()  # sets self._fd as soon as there is one (the except closes it)
            else:
                self._created = not self._fs.exists(self.path)
                self._fs.write_atomic(self.path, _LOCK_CONTENT)
            self._key = key
            if self._fd is not None:
                _holding.add(self)
            log.info("store_lock_acquired", path=self.path)
        except BaseException:
            # Whatever lands here (an exception raised into the thread during the log line,
            # review 85 F4) gives the lock back: held with no `_key`, no release could find it,
            # and every later open in this process was StoreLockedError.
            if self._key is not None:
                self.release()
            else:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                if mine:  # (an exception as the add returned left it there for good: review 86's fuzz)
                    with _held_guard:
                        _held.discard(key)
            raise

    def _lock_real(self) -> None:
        """Lock the file, its descriptor in `self._fd` from the moment it exists: an exception
        raised into the thread anywhere after leaves it for `acquire` to close (review 86's
        fuzz: a descriptor dropped between here and the caller kept its open-file lock, and
        every later open was refused). Only the return of `os.open` itself is not covered."""
        # A refused open removes a lock file it made (release(drop_created_file=True)): one
        # locked after that removal is a name no longer in the directory, so it is taken again.
        while True:
            self._lock_real_once()
            assert self._fd is not None
            try:
                same = os.path.samestat(os.fstat(self._fd), os.stat(self.path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if same:
                return
            fd, self._fd = self._fd, None
            os.close(fd)
            self._created = False

    def _lock_real_once(self) -> None:
        # Its bytes are written in place: never through a link into another file (a `lock`
        # linked to a segment had that segment's first record overwritten).
        flags = os.O_RDWR | os.O_NOFOLLOW
        try:
            try:
                fd = self._fd = open_fd(self.path, flags)
            except FileNotFoundError:
                try:
                    fd = self._fd = open_fd(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                    self._created = True
                except FileExistsError:  # made by another process meanwhile: take that one
                    fd = self._fd = open_fd(self.path, flags)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise StoreDirectoryError(f"{self.path} is a symbolic link where the store keeps its lock file; "
                                      "move it aside and start again") from None  # fmt: skip
        try:
            if (links := os.fstat(fd).st_nlink) > 1:
                raise StoreDirectoryError(f"{self.path} is one of {links} hard links to one file where the store "
                                          "keeps its lock file; move it aside and start again")  # fmt: skip
            try:
                _lock_byte_zero(fd)
            except OSError as e:
                # EACCES or EAGAIN: another process holds it.
                raise StoreLockedError(
                    f"lock failed, store already started by another process: {self.path} ({e.strerror})"
                ) from e
            check_file_size_limit(self.path, len(_LOCK_CONTENT))  # (SIGXFSZ: see write_atomic)
            os.pwrite(fd, _LOCK_CONTENT, 0)
            os.fsync(fd)
        except BaseException:
            self._fd = None
            os.close(fd)  # closing drops the record lock too
            raise

    def claim_directories(self, paths: Sequence[str], *, made: bool = False) -> None:
        """Hold each of the store's data directories (that exist) with an exclusive flock for as
        long as the lock is held. The root's `lock` keeps a second store off the root only: a
        directory reached from two roots (a symlinked commitlog directory copied with `cp -a`,
        a ConsumeQueue directory linked into another store) was written by both stores, each
        at its own end of the log, each over what the other had acknowledged (review 28).
        StoreLockedError if another store holds one of them; StoreDirectoryError if two of
        them are one directory. Where the filesystem has no flock (some network filesystems),
        it is logged and the store goes on as before. Real files only.
        `made`: the open has just made them, so one missing, or no longer at its path once
        held, was taken away by another process (a refused open of another store: review 138
        F1); StoreDirectoryError then, rather than a claim on a directory no path names, which
        the writer would make again unclaimed."""
        if not self._real or self._key is None:
            return
        seen = self._claimed
        for path in paths:
            try:
                fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                if made:
                    raise StoreDirectoryError(f"{path} was removed while the store opened (by another process): "
                                              "start again") from None  # fmt: skip
                continue
            self._directory_fds.append(fd)  # closed by release(), whatever happens next
            st = os.fstat(fd)
            if (same := seen.get((st.st_dev, st.st_ino))) is not None:
                raise StoreDirectoryError(f"{path} and {same} are one directory (through a link); each of the store's "
                                          "directories must be its own")  # fmt: skip
            seen[(st.st_dev, st.st_ino)] = path
            try:
                _flock_exclusive(fd)
                self._held_directories.add((st.st_dev, st.st_ino))
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    log.warning("cannot lock a store directory (no flock here); not checked for another store",
                                path=path, error=e.strerror)  # fmt: skip
                    continue
                raise StoreLockedError(
                    f"lock failed: {path} is held by another store (its lock file was deleted, or the same directory, "
                    f"{os.path.realpath(path)}, is reached through a link from another store's root); a directory "
                    "belongs to one store at a time"
                ) from e
            if made and not _names(path, st):
                raise StoreDirectoryError(f"{path} was removed while the store opened (by another process): start again")

    def claim_for_removal(self, path: str) -> bool:
        """Whether a refused open may take away `path`, a directory it made: it holds the
        directory's flock (claimed before, or taken now) and `path` still names it, so no other
        store can be using it; the flock stays until `release`, after the removal. An empty
        directory another store holds was removed otherwise, and a third store then opened on
        it beside that store (review 138 F1). A simulated file system has no other process."""
        if not self._real:
            return True
        if self._key is None:
            return False
        try:
            fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return False
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self._held_directories:
            os.close(fd)
            return _names(path, st)
        try:
            _flock_exclusive(fd)
        except OSError:  # held by another store, or no flock here: left as it is
            os.close(fd)
            return False
        self._directory_fds.append(fd)
        self._held_directories.add((st.st_dev, st.st_ino))
        return _names(path, st)

    def release_later(self, try_release: Callable[[], bool]) -> None:
        """Where no thread could be started to release this lock once the actors still running
        end: the next acquire of this store in this process calls `try_release` first, which
        releases it (returning True) if they have ended by then. Until then, or the process's
        exit, the lock stays held: those actors may yet write the files."""
        if self._key is not None:
            with _held_guard:
                _deferred_releases[self._key] = try_release

    def release(self) -> None:
        """Unlock and close; the file stays (RocketMQ never deletes it). Idempotent."""
        if self._key is None:
            return
        _holding.discard(self)
        for fd in self._directory_fds:
            try:
                os.close(fd)  # drops its flock
            except OSError:
                pass
        self._directory_fds = []
        self._claimed = {}
        self._held_directories = set()
        try:
            if self._fd is not None:
                try:
                    _unlock_byte_zero(self._fd)
                finally:
                    os.close(self._fd)  # drops the lock whatever the unlock said
                    self._fd = None
        finally:
            with _held_guard:  # else this process could never open the store again
                _held.discard(self._key)
                _deferred_releases.pop(self._key, None)
            self._key = None
        log.info("store_lock_released", path=self.path)

    def drop_created_file(self) -> None:
        """Remove the lock file if this acquire made it, before `release`: a refused open leaves
        the store root as it found it (review 61 L1); a lock file that was there stays. Removed
        while still locked: an open that locked it meanwhile finds the name gone and takes the
        new file (`_lock_real`)."""
        if self._key is None or not self._created:
            return
        try:
            if self._fd is None:
                self._fs.remove(self.path)
            elif os.path.samestat(os.fstat(self._fd), os.stat(self.path, follow_symlinks=False)):
                os.unlink(self.path)
        except OSError as exc:  # left behind: harmless (an empty lock file), said in the log
            log.warning("lock file made by a refused open not removed", path=self.path, error=repr(exc))
        self._created = False

    close = release

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class AbortFile:
    """The `abort` marker. Creation is durable (file and directory fsynced) because its
    presence after a crash is what makes the next start recover abnormally."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self._fs = fs
        self.path = path

    def exists(self) -> bool:
        """Whether the marker is there. StoreDirectoryError if a directory is in its place
        (checked before recovery runs, not when the marker is written after it)."""
        refuse_unless_regular_file(self._fs, self.path, "abort marker")
        return self._fs.exists(self.path)

    def create(self) -> None:
        """Create (or keep) the empty marker. Raises OSError on I/O errors. One already there
        (after a crash) is kept as it is: rewriting it took a new inode, so a disk with none
        free could not open a store at all, not even to read (review 46 M6)."""
        if self._fs.isfile(self.path):
            return
        self._fs.makedirs(os.path.dirname(os.path.abspath(self.path)))
        self._fs.write_atomic(self.path, b"")  # temp file, fsync, rename, fsync directory

    def remove(self) -> None:
        """Delete the marker after a clean shutdown. A missing marker is fine."""
        if not self._fs.exists(self.path):
            return
        self._fs.remove(self.path)
        if isinstance(self._fs, RealFileSystem):
            # Not strictly needed (a lost removal only costs an abnormal recovery), but cheap.
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))


def refuse_unless_regular_file(fs: FileSystem, path: str, what: str) -> None:
    """StoreDirectoryError if something other than a regular file is at `path`: a directory,
    or a FIFO, socket or device (opening a FIFO to read or write blocks for good)."""
    if fs.exists(path) and not fs.isfile(path):
        kind = "a directory" if fs.isdir(path) else "not a regular file"
        raise StoreDirectoryError(
            f"{path} is {kind} where the store keeps its {what}; move it out of the store root and start again"
        )
