"""The index progress `<root>/index_progress.msgpack`: mqstore's own record of how far the
index got, so an open can tell an index that is complete from one that is not.

The index files alone cannot say it. The newest file's endPhyOffset is the last message that
had keys, so a log whose last messages had none looks the same as a log whose keyed messages
were put while the index was disabled, or whose newest index files were deleted by hand. A
RocketMQ broker takes the index for complete in all three cases, and those keys are never
found. With this file an open re-dispatches from where the index stopped, and rebuilds the
files after one that is missing.

`indexed_below`: every key of every message below this commitlog offset is in the index (as
the files were when it was written). `files`: each index file's name and endPhyOffset then;
a file missing at the next open whose endPhyOffset is below the log's min offset was expired
by the cleaner (its messages are gone too), any other was lost.

Only the index's owner writes it: its recovery, when it decides to re-dispatch (before the
open can be interrupted, so a later clean open still rebuilds), and the index actor after a
flush of every file (at close). A lower `indexed_below` than the truth only costs a longer
re-dispatch (the index does not add a key twice); a higher one would lose keys, so every
writer writes what it knows is indexed. Each write replaces the whole file atomically. A
store without the file (written by a broker, or by an older mqstore) is recovered as before;
an unreadable one is set aside as `.damaged`, logged, and not used. One a newer mqstore wrote
is refused (UnknownVersionError) and left in place. No RocketMQ version reads it.
"""

from __future__ import annotations

from typing import Collection, Final, Mapping, NamedTuple

from mqstore.log import get_logger
from mqstore.storage.fs import FileSystem
from mqstore.storage.sealed import UnknownVersionError, seal, unseal

__all__ = [
    "IndexProgress", "IndexProgressError", "first_lost_index_file", "load_index_progress", "pack_index_progress",
    "peek_index_progress", "unpack_index_progress", "write_index_progress",
]

_FORMAT: Final = "mqstore-index-progress"
_VERSION: Final = 1

log = get_logger(__name__)


class IndexProgress(NamedTuple):
    indexed_below: int
    files: tuple[tuple[str, int], ...]  # (name, endPhyOffset), oldest first


class IndexProgressError(ValueError):
    """The file's bytes are not an index progress this version can trust."""


def pack_index_progress(progress: IndexProgress) -> bytes:
    return seal(_FORMAT, _VERSION, "progress", [progress.indexed_below, [list(f) for f in progress.files]])


def unpack_index_progress(data: bytes) -> IndexProgress:
    """The progress in `data`; UnknownVersionError for a newer mqstore's; IndexProgressError
    for anything else, a flipped bit included."""
    _, content = unseal(data, _FORMAT, (_VERSION,), "progress", IndexProgressError)
    if not (isinstance(content, list) and len(content) == 2 and type(content[0]) is int and content[0] >= 0
            and isinstance(content[1], list)):  # fmt: skip
        raise IndexProgressError(f"bad progress {content!r}")
    files: list[tuple[str, int]] = []
    for entry in content[1]:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and entry[0].isdigit() and type(entry[1]) is int and entry[1] >= 0):  # fmt: skip
            raise IndexProgressError(f"bad file entry {entry!r}")
        files.append((entry[0], entry[1]))
    return IndexProgress(content[0], tuple(files))


def load_index_progress(fs: FileSystem, path: str) -> IndexProgress | None:
    """The progress at `path`, or None: no file (recovered as a broker's store), or one that
    cannot be trusted (set aside as `.damaged` for a person to look at, and logged). A newer
    mqstore's raises UnknownVersionError naming it, and it stays where it is."""
    if not fs.exists(path):
        return None
    try:
        return unpack_index_progress(fs.read_bytes(path))
    except UnknownVersionError as exc:
        raise exc.at(path) from None
    except OSError as exc:
        log.error("index progress unreadable: an incomplete index cannot be detected at this open",
                  path=path, error=str(exc))  # fmt: skip
        return None
    except IndexProgressError as exc:
        kept = fs.set_aside(path, ".damaged")
        log.error("index progress unreadable: an incomplete index cannot be detected at this open",
                  path=path, kept_as=kept, error=str(exc))  # fmt: skip
        return None


def peek_index_progress(fs: FileSystem, path: str, *, strict: bool = False) -> IndexProgress | None:
    """`load_index_progress` for a read-only command: nothing set aside nor logged (None for no
    file, or one that cannot be read or trusted; `strict`: one that cannot be read now raises
    its OSError, as an answer built without it could be wrong). A newer mqstore's raises
    UnknownVersionError, as at an open."""
    try:
        return unpack_index_progress(fs.read_bytes(path)) if fs.exists(path) else None
    except UnknownVersionError as exc:
        raise exc.at(path) from None
    except OSError as exc:
        if strict and not isinstance(exc, FileNotFoundError):
            raise  # a file there that this process may not read now: a command says so
        return None
    except IndexProgressError:
        return None


def first_lost_index_file(
    progress: IndexProgress | None, ends: Mapping[str, int], min_offset: int, unread: Collection[str] = ()
) -> tuple[str, str] | None:
    """The oldest file the progress lists whose keys are not all in the files now (`ends`: each
    index file's name and header endPhyOffset), and why: gone though messages it indexed are
    still in the log (one whose endPhyOffset is below the log's min offset was expired by the
    cleaner), or there with a header ending below the endPhyOffset the progress recorded for
    it: an older copy of the file put in its place (a restore from a backup, or a copy renamed
    over it while the index wrote into the file it had open). A header only moves forward and
    the progress is written after the files are flushed; only a recovery moves one back, and
    it writes the progress after. `unread`: files there that could not be read (not lost)."""
    if progress is None:
        return None
    for name, end_phy in sorted(progress.files):
        if name in unread:
            continue
        now = ends.get(name)
        if now is None and end_phy >= min_offset:
            return name, "is gone (the index progress lists it)"
        if now is not None and now < end_phy:
            return name, f"ends at {now}, below the {end_phy} the index progress recorded (an older copy)"
    return None


def write_index_progress(fs: FileSystem, path: str, progress: IndexProgress) -> bool:
    """Replace the file atomically; False (logged) when it could not be written, e.g. on a
    full disk: the old file stays whole, and says less than the truth or the same."""
    try:
        fs.write_atomic(path, pack_index_progress(progress))
        return True
    except OSError as exc:
        log.error("index progress not written: the next open may re-dispatch more than it needs",
                  path=path, error=str(exc))  # fmt: skip
        return False
