"""The SIGBUS guard of the store's file maps (storage/_mapguard.c), or its absence.

A store file cut short while it is mapped (another process truncates it, a restore rewrites it
in place) makes the next access to its lost pages a SIGBUS, which kills the host. With the
guard, such a page reads zeros instead and its map counts the fault; the owner of the map asks
`faults(slot)` where it matters (the writer before it answers a pass). A slot is a token of its
map: once the map is gone and the slot taken by another, the old token releases and reads
nothing, and guarding a map drops any slot still holding its addresses (a map gone without
release()). The guard is not one of
the kernels MQSTORE_PURE_PYTHON turns off: it is on whenever the extension was built (with a C
compiler at install, as CI checks). Without it, `available` is False and the open says so once.
"""

from __future__ import annotations

import importlib
import mmap
import sys
from types import ModuleType
from typing import Any, Callable

__all__ = [
    "available", "guard", "release", "faults", "held", "total_faults", "installed", "reinstall", "names_file",
    "map_keeping_no_descriptor",
]


def _load() -> ModuleType | None:
    try:  # a C extension: no type information, a plain module here
        return importlib.import_module(f"{__package__}._mapguard")
    except ImportError:
        return None


_guard: ModuleType | None = _load()
available = _guard is not None


def map_keeping_no_descriptor(fd: int, size: int, access: int, dev: int, ino: int) -> tuple[mmap.mmap, bool]:
    """`mmap.mmap(fd, size, access=access)` of the file (`dev`, `ino`) that `fd` is open on,
    without the descriptor CPython's mmap keeps of its own (a dup, used only by size() and
    resize(), which the store never calls): every segment, queue and index file the writer or
    a reading thread maps cost one, and a long log or many reading threads used up `ulimit -n`
    (the host's own open() then failed with EMFILE). 3.13 has `trackfd=False`; before it the
    extension closes the dup once it checked the object's layout. Without the extension, or
    where the layout is not the one it knows, the map keeps its descriptor, as before: the
    second value says so (True: a descriptor kept). The map's `size()` and `resize()` are not
    to be called (EBADF; on 3.11/3.12 a resize would map past the file, unguarded)."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, access=access, trackfd=False), False  # type: ignore[call-arg,unused-ignore]
    buf = mmap.mmap(fd, size, access=access)
    if _guard is None:
        return buf, True
    try:
        dropped = bool(_guard.drop_descriptor(buf, dev, ino))
    except BaseException:
        buf.close()
        raise
    return buf, not dropped


def guard(buf: Any) -> int | None:
    """Register a map; its slot, or None without the extension."""
    return None if _guard is None else int(_guard.guard(buf))


def release(slot: int | None) -> None:
    """Unregister a map before it is unmapped; again, or after its slot was reclaimed, nothing."""
    if _guard is not None and slot is not None:
        _guard.release(slot)


def faults(slot: int | None) -> int:
    """Pages of the map that were gone from its file when touched (they read zeros since)."""
    return 0 if _guard is None or slot is None else int(_guard.faults(slot))


def held() -> int:
    """Slots registered now: the maps guarded and not released (tests count them)."""
    return 0 if _guard is None else int(_guard.held())


def _no_faults() -> int:
    return 0


# Faults caught on every map of the process: a cheap test before asking each map. The C
# function itself where there is one (~30 ns; a Python wrapper cost ~120 ns a get).
total_faults: Callable[[], int] = _no_faults if _guard is None else _guard.total_faults


def installed() -> bool:
    return _guard is not None and bool(_guard.installed())


def reinstall() -> None:
    """The guard's handler back in front of one the host set since (faulthandler.enable()
    after the store opened, say), chaining to it; nothing before the first map."""
    if _guard is not None:
        _guard.reinstall()


def names_file(path: bytes, dev: int, ino: int) -> bool:
    """Whether `path` names the file (`dev`, `ino`), a mapped one whose descriptor is closed;
    only with the extension (`available`): storage/fs.py compares with os.stat without it."""
    assert _guard is not None
    return bool(_guard.names_file(path, dev, ino))
