"""What crash recovery would make of a stopped store's commitlog, worked out without a byte of
the store changing: the read-only commands ask this, so that what they call damage and what
they call a torn tail is what the next open's recovery does with it (reviews 94-97: the
commands' own copies of recovery's rules disagreed with it, and with each other, case after
case).

Recovery itself runs here, the code the writer runs at an open, over `DryRunFileSystem`: files
are read as they are, mapped copy-on-write (and asked to zero nothing), a file it would delete
is only hidden from it, and anything that would create or write a file is refused with EROFS
(recovery of the commitlog after a crash creates none; a refusal means it could not be worked
out, never a changed byte)."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Callable

from ..config import StoreConfig
from ..log import retrying
from .checkpoint import CheckpointError, CheckpointValues, read_checkpoint
from .commitlog import Quarantined
from .fs import RealFileSystem, RealMappedRegion
from .recovery import RecoveryMode, recover_commitlog

__all__ = ["CrashRecoveryVerdict", "DryRunFileSystem", "crash_recovery_verdict", "verdict_of_stopped_store"]


def _refused(path: str, what: str) -> OSError:
    return OSError(errno.EROFS, f"a dry run does not {what}", path)


class DryRunFileSystem(RealFileSystem):
    """The real files, read-only: maps are private, removals are hidden, writes refused."""

    def __init__(self) -> None:
        super().__init__()
        self._removed: set[str] = set()

    def _gone(self, path: str) -> bool:
        at = os.path.abspath(path)
        return any(at == removed or at.startswith(removed + os.sep) for removed in self._removed)

    def _there(self, path: str) -> None:
        if self._gone(path):
            raise FileNotFoundError(errno.ENOENT, "removed in this dry run", path)

    def map_file(self, path: str, size: int, *, create: bool = True, readonly: bool = False,
                 exclusive: bool = False) -> RealMappedRegion:
        self._there(path)
        if exclusive and create and super().exists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path)
        if create and not super().exists(path):
            raise _refused(path, "create files")
        return RealMappedRegion(path, size, create=False, readonly=True, private=True)

    def map_unnamed(self, path: str, size: int) -> RealMappedRegion:
        raise _refused(path, "create files")

    def sync_file(self, path: str, start: int, end: int) -> None:
        self._there(path)  # (nothing was written to force)

    def listdir(self, path: str) -> list[str]:
        self._there(path)
        return [name for name in super().listdir(path) if not self._gone(os.path.join(path, name))]

    def exists(self, path: str) -> bool:
        return not self._gone(path) and super().exists(path)

    def isdir(self, path: str) -> bool:
        return not self._gone(path) and super().isdir(path)

    def isfile(self, path: str) -> bool:
        return not self._gone(path) and super().isfile(path)

    def getsize(self, path: str) -> int:
        self._there(path)
        return super().getsize(path)

    def makedirs(self, path: str) -> None:
        if not self.isdir(path):
            raise _refused(path, "create directories")

    def remove(self, path: str) -> None:
        if not self.exists(path):
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        self._removed.add(os.path.abspath(path))

    def rmdir(self, path: str) -> None:
        self.remove(path)

    def mtime_ms(self, path: str) -> int:
        self._there(path)
        return super().mtime_ms(path)

    def set_mtime_ms(self, path: str, mtime_ms: int) -> None:
        raise _refused(path, "change files")

    def read_bytes(self, path: str) -> bytes:
        self._there(path)
        return super().read_bytes(path)

    def read_at(self, path: str, offset: int, length: int) -> bytes:
        self._there(path)
        return super().read_at(path, offset, length)

    def write_atomic(self, path: str, data: bytes) -> None:
        raise _refused(path, "write files")

    def set_aside(self, path: str, suffix: str) -> str:
        raise _refused(path, "rename files")

    def rename(self, path: str, target: str) -> None:
        raise _refused(path, "rename files")

    def link(self, path: str, target: str) -> None:
        raise _refused(path, "link files")

    def data_extents(self, path: str, start: int, end: int) -> list[tuple[int, int]]:
        self._there(path)
        return super().data_extents(path, start, end)


@dataclass(frozen=True)
class CrashRecoveryVerdict:
    """What the next open's crash recovery does with the commitlog as it is now."""

    end: int  # where the log would end: records at or past it are cut (a torn tail)
    quarantined: tuple[Quarantined, ...]  # damage with valid records after it: kept, skipped
    flushed_offset: int | None  # the checkpoint's: records end below it only by damage
    # Left out of the log, not cut: a segment of the wrong size (`mqstore recover` makes it
    # whole), segments missing below the flushed offset (review 100 M1: a cut-short last
    # segment's records were read as a torn tail, skipped unsaid).
    holes: tuple[tuple[int, int], ...] = ()

    @property
    def torn_from(self) -> int:
        """Where a torn tail starts: the log's end, or past it the flushed offset when the
        records end below it (recovery keeps what follows as a hole, durable bytes that are
        gone: damage, not a tear)."""
        return max(self.end, self.flushed_offset or 0)

    def is_torn_tail(self, offset: int) -> bool:
        return offset >= self.torn_from and not any(start <= offset < end for start, end in self.holes)


def crash_recovery_verdict(
    config: StoreConfig, checkpoint: CheckpointValues | None, clock_ms: Callable[[], int]
) -> CrashRecoveryVerdict:
    """Run the open's crash recovery of the commitlog (`recover_commitlog`, mode CRASH) over
    the files as they are, changing none. `checkpoint`: as the open reads it (None when there
    is none). OSError when it cannot be worked out (a file that cannot be read or mapped, or a
    step that would have to write one); its log lines are not emitted (a command's report
    says what matters)."""
    with retrying():
        # Not zeroing the tail it cuts: in a private map that would be memory, up to a segment's
        # worth (a tear early in a 1 GiB segment of records), for nothing the verdict needs.
        recovered = recover_commitlog(config, DryRunFileSystem(), mode=RecoveryMode.CRASH, checkpoint=checkpoint,
                                      clock_ms=clock_ms, zero_tail=False)  # fmt: skip
    flushed = checkpoint.physic_flushed_offset if checkpoint is not None else None
    return CrashRecoveryVerdict(recovered.facts.max_offset, tuple(recovered.quarantined), flushed, recovered.facts.holes)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def verdict_of_stopped_store(config: StoreConfig) -> CrashRecoveryVerdict | str:
    """`crash_recovery_verdict` of a stopped store's files with its checkpoint as the open
    reads it, for the read-only commands; or why it cannot be told (a file that cannot be
    read, a checkpoint the open refuses)."""
    fs = RealFileSystem()
    try:
        checkpoint = read_checkpoint(fs, config.checkpoint_path) if fs.exists(config.checkpoint_path) else None
        return crash_recovery_verdict(config, checkpoint, _wall_clock_ms)
    except (OSError, CheckpointError) as exc:
        return f"{type(exc).__name__}: {exc}"
