"""Where the writing jobs may write: never over what they read, never into a live store.

Spark's overwrite mode empties an export's OUT before any task reads, and Spark's own guard
("Cannot overwrite a path that is also being read from") knows only its file sources, not a
Python data source's paths: an export into its own store, or into a directory above it,
deleted the store (review 31). A reindex into a store wrote the queue and index files of the
store's running owner under it. These checks run on the driver before the job starts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from mqstore.cli import CliError, ExitCode
from mqstore.storage.lockfiles import LOCK_FILE_NAME, StoreLock, StoreLockedError
from mqstore.storage.fs import RealFileSystem

__all__ = [
    "check_export_target", "claim_reindex_target", "refuse_foreign_file", "refuse_overlap", "refuse_store_around",
    "store_around",
]  # fmt: skip

# What an earlier export leaves at the top of OUT (Spark's markers, the partitions, our
# corrupt-range log): the only entries an overwrite may delete.
_EXPORT_ENTRY_PREFIXES: Final = ("topic=", "_corrupt", "_SUCCESS", "._SUCCESS", "_temporary", ".part-", "part-")


# What a store keeps in its own root. Its commitlog/ may live elsewhere (store_path_commitlog,
# RocketMQ's storePathCommitLog), so a root is known by these, never by commitlog/ alone: one
# without it had its checkpoint replaced by `spark stats --out ROOT/checkpoint` (review 63 F1).
# Files and directories by kind: a directory named checkpoint (Spark streaming's) is no store's.
_STORE_ROOT_FILES: Final = ("checkpoint", "lock", "abort", "queue_ledger.msgpack", "index_progress.msgpack",
                            "stats.msgpack", os.path.join("config", "consumerOffset.json"))  # fmt: skip
_STORE_ROOT_DIRS: Final = ("commitlog", "consumequeue", "consumequeue_ext", "index")
# A commitlog segment or ConsumeQueue file: its name is its first offset in 20 digits. A
# directory holding one is a store's data directory wherever it lies (a commitlog elsewhere).
_DATA_FILE_NAME: Final = re.compile(r"\d{20}")
_HEAD_BYTES: Final = 64  # of an existing output, to see whether a job wrote it


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _stores_of(inputs: Sequence[str], *, with_stores: bool = True) -> list[tuple[str, str]]:
    """(input, path) for every path an input reads or belongs to: the input itself (its glob's
    matches), a segment's directory, and the store that holds a commitlog directory (whose
    queue and index files the store writes beside it)."""
    found: list[tuple[str, str]] = []
    for given in inputs:
        matches = glob.glob(given) if glob.has_magic(given) else [given]
        for path in matches or [given]:
            real = _real(path)
            found.append((given, real))
            directory = real if os.path.isdir(real) else os.path.dirname(real)
            found.append((given, directory))
            if with_stores and os.path.basename(directory) == "commitlog":
                found.append((given, os.path.dirname(directory)))
    return found


def refuse_overlap(out: str, inputs: Sequence[str], what: str, *, with_stores: bool = True) -> None:
    """CliError (exit 2) when `out` is one of `inputs`, lies inside one or inside the store one
    belongs to (a glob's matches, a segment's directory, the store around a commitlog
    directory), or holds one: whatever writes OUT would change what is read, or what the
    store that owns it writes; without `with_stores`, the inputs alone: a rebuild writes the
    queue and index files of the store it reads, its own checks keep a running one out)."""
    target = _real(out)
    for given, source in _stores_of(inputs, with_stores=with_stores):
        if _within(target, source) or _within(source, target):
            raise CliError(ExitCode.USAGE, f"{what} {out} overlaps the input {given} ({target} and {source}): "
                                           "it would be written over what it reads; choose another directory")  # fmt: skip


def _first_entry_in(directory: str, files: Sequence[str], dirs: Sequence[str]) -> str | None:
    """The first of `files` (not a directory) or `dirs` (a directory, named with a trailing
    separator) that `directory` holds, or None."""
    for name in files:
        path = os.path.join(directory, name)
        if os.path.lexists(path) and not os.path.isdir(path):
            return name
    for name in dirs:
        if os.path.isdir(os.path.join(directory, name)):
            return name + os.sep
    return None


def _root_entry_in(directory: str) -> str | None:
    """The first entry of `directory` that a store keeps in its root, or None."""
    return _first_entry_in(directory, _STORE_ROOT_FILES, _STORE_ROOT_DIRS)


def _data_file_in(directory: str) -> str | None:
    """The first segment or queue file (by its name) in `directory`, or None."""
    try:
        with os.scandir(directory) as entries:
            return next((e.name for e in entries if _DATA_FILE_NAME.fullmatch(e.name)), None)
    except OSError:  # absent, not a directory, not readable: nothing of a store seen here
        return None


# Names only a store gives (or a store's own directories, which hold nothing else): one is
# enough. The others are common elsewhere (a model's `checkpoint`, a site's `index/`, any
# `lock`): an ancestor counts as a store's root by two of them, its `checkpoint` only at a
# checkpoint's 4096 bytes (review 64 F3: one such name above an output refused it).
_STRONG_ROOT_FILES: Final = ("queue_ledger.msgpack", "index_progress.msgpack", os.path.join("config", "consumerOffset.json"))
_STRONG_ROOT_DIRS: Final = ("commitlog", "consumequeue", "consumequeue_ext")
_CHECKPOINT_SIZE: Final = 4096


def _weak_root_entries(directory: str) -> list[str]:
    found = [name for name in ("lock", "abort", "stats.msgpack") if _first_entry_in(directory, (name,), ())]
    checkpoint = os.path.join(directory, "checkpoint")
    with contextlib.suppress(OSError):
        if os.path.isfile(checkpoint) and os.path.getsize(checkpoint) == _CHECKPOINT_SIZE:
            found.append("checkpoint")
    if os.path.isdir(os.path.join(directory, "index")):
        found.append("index" + os.sep)
    return found


def _store_entry_in(directory: str, *, near: bool) -> str | None:
    """What in `directory` makes it a store's own, or None: a name only a store gives, two of
    the common ones, or (`near`: the output's own directory or the one holding it) a segment
    or queue file, a commitlog kept elsewhere being a directory of them alone."""
    strong = _first_entry_in(directory, _STRONG_ROOT_FILES, _STRONG_ROOT_DIRS)
    if strong is not None:
        return strong
    weak = _weak_root_entries(directory)
    if len(weak) >= 2:
        return " and ".join(weak)
    return _data_file_in(directory) if near else None


def store_around(path: str, *, include_self: bool = True) -> tuple[str, str] | None:
    """(directory, entry) for the nearest directory at or above `path`'s real path (strictly
    above without `include_self`) that is a store's own, with the entry that says so; None
    when there is none. Through symbolic links: what counts is where a write would land."""
    directory = _real(path)
    if not include_self:
        directory = os.path.dirname(directory)
    level = 0
    while True:
        entry = _store_entry_in(directory, near=level < 2)
        if entry is not None:
            return directory, entry
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
        level += 1


def refuse_store_around(path: str, what: str, *, include_self: bool = True) -> None:
    """CliError (exit 2) when writing at `path` would put a file of ours in a store's
    directories (`store_around`): whatever is there is the store's, and a file of ours in
    its directories is in its owner's way."""
    found = store_around(path, include_self=include_self)
    if found is not None:
        directory, entry = found
        raise CliError(ExitCode.USAGE, f"{what} {path} lies in the store directory {directory} (it holds {entry}); "
                                       "a store's directory is its own: write the result elsewhere")  # fmt: skip


def refuse_foreign_file(out: str, what: str, earlier: Callable[[bytes], bool], kind: str) -> None:
    """CliError (exit 2) unless `out` (through links) is new, empty, or a regular file whose
    first bytes `earlier` takes for a previous output of this job: a job's output replaces
    the file whole, so anything else there (a store's checkpoint or segment, wherever it
    lies, a file of someone else's) would be lost (review 63 F1)."""
    target = _real(out)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CliError(ExitCode.USAGE, f"{what} {out}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CliError(ExitCode.USAGE, f"{what} {out} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(ExitCode.USAGE, f"{what} {out} exists and is not a regular file; give a new file")
    if st.st_size == 0:
        return  # nothing there to lose
    try:
        with open(target, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError as exc:
        raise CliError(ExitCode.USAGE, f"{what} {out} cannot be read ({exc.strerror}) to see what it is") from None
    if not earlier(head):
        raise CliError(ExitCode.USAGE, f"{what} {out} exists and is not an earlier {kind}; it would be replaced "
                                       "whole: give a new file, or move it aside first")  # fmt: skip


def check_export_target(out: str, inputs: Sequence[str]) -> None:
    """An export replaces OUT whole: OUT must not overlap an input, and must be absent, empty,
    or an earlier export (only what an export writes at its top). Anything else (a store, a
    home directory) is refused rather than deleted."""
    refuse_overlap(out, inputs, "OUT")
    if not os.path.lexists(out):
        refuse_store_around(out, "OUT")
        return
    if not os.path.isdir(out):
        raise CliError(ExitCode.USAGE, f"OUT {out} exists and is not a directory; an export writes a directory")
    foreign = sorted(n for n in os.listdir(out) if not n.startswith(_EXPORT_ENTRY_PREFIXES))
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise CliError(ExitCode.USAGE, f"OUT {out} holds entries an export did not write ({shown}); an export "
                                       "replaces its OUT whole: give an empty or new directory, or an earlier export")  # fmt: skip
    refuse_store_around(out, "OUT")


def _refuse_if_held(path: str) -> None:
    """CliError (exit 4) if a store holds the directory `path` (its flock); asks only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # absent (or not a directory): nothing holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise CliError(ExitCode.LOCKED, f"{path} is held by a running store; stop it first") from None
    finally:
        os.close(fd)  # drops the probe's shared lock


@contextlib.contextmanager
def claim_reindex_target(out_dir: str, sources: Sequence[str]) -> Iterator[tuple[str, str]]:
    """Hold OUT_DIR's consumequeue/ and index/ for a rebuild: (their paths). They must be
    absent or empty (a rebuild never deletes or appends to queue or index files: a symlinked
    directory's rmtree failed silently and the old queue was appended to, review 31), and no
    store may run there: OUT_DIR's `lock` is taken as a store takes it when OUT_DIR is a store
    root, and both directories are flock'd as a store claims them, so a store opened meanwhile
    is refused too. If the rebuild fails, what it wrote is removed: the directories were empty."""
    refuse_overlap(os.path.join(out_dir, "consumequeue"), sources, "OUT_DIR/consumequeue", with_stores=False)
    refuse_overlap(os.path.join(out_dir, "index"), sources, "OUT_DIR/index", with_stores=False)
    # OUT_DIR may be a store's root (a rebuild in place, its lock taken below), never a
    # directory inside one nor one of its data directories (a commitlog kept elsewhere).
    refuse_store_around(out_dir, "OUT_DIR", include_self=False)
    data_file = _data_file_in(out_dir)
    if data_file is not None:
        raise CliError(ExitCode.USAGE, f"OUT_DIR {out_dir} holds {data_file}, a segment or queue file: it is a store's "
                                       "data directory, not a store root; give the store's root or a new directory")  # fmt: skip
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise CliError(ExitCode.USAGE, f"OUT_DIR {out_dir} exists and is not a directory")
    os.makedirs(out_dir, exist_ok=True)
    for held in ("commitlog", "config"):
        # A running store holds every data directory: with its `lock` deleted and its queue and
        # index directories moved aside, these still say it runs (review 33).
        _refuse_if_held(os.path.join(out_dir, held))
    # Known by its own files: a root whose commitlog lives elsewhere has none here (F1).
    store_root = _root_entry_in(out_dir) is not None or os.path.lexists(os.path.join(out_dir, "commitlog"))
    lock = StoreLock(RealFileSystem(), os.path.join(out_dir, LOCK_FILE_NAME)) if store_root else None
    if lock is not None:
        try:
            lock.acquire()
        except StoreLockedError as exc:
            raise CliError(ExitCode.LOCKED, f"{out_dir} is a store that is running ({exc}); stop it first") from None
    fds: list[int] = []
    created: list[str] = []
    try:
        dirs = (os.path.join(out_dir, "consumequeue"), os.path.join(out_dir, "index"))
        for path in dirs:
            if not os.path.lexists(path):
                os.makedirs(path)
            elif not os.path.isdir(path):
                raise CliError(ExitCode.NOT_A_STORE, f"{path} is not a directory")
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise CliError(ExitCode.LOCKED, f"{path} is in use by a running store; stop it first") from None
                # No flock on this filesystem: the store's lock (above) is all there is.
            if os.listdir(path):
                raise CliError(ExitCode.USAGE, f"{path} is not empty: a rebuild writes new files and never deletes or "
                                               "appends to existing ones; move it aside first (queues whose records "
                                               "have all left the log cannot be rebuilt: keep those)")  # fmt: skip
            created.append(path)
        yield dirs
    except BaseException:
        for path in created:  # empty when claimed, held by us since: only our files are there
            for name in os.listdir(path):
                entry = os.path.join(path, name)
                if os.path.isdir(entry) and not os.path.islink(entry):
                    shutil.rmtree(entry)
                else:
                    os.unlink(entry)
        raise
    finally:
        for fd in fds:
            os.close(fd)
        if lock is not None:
            lock.release()
