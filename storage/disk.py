"""Disk gauges: the used fraction of the partition holding a path (spec §12.3).

RocketMQ's `UtilAll.getDiskPartitionSpaceUsedPercent(path)` is `(total - free) / total` of
the path's partition, or -1 when the path does not exist or cannot be read. Each store path
is measured on its own, since the commitlog and the consume queues may live on different
disks. The cleaner is given a gauge (`mqstore.open(..., disk_gauge=...)`, kept in the
ActorContext; `default_disk_gauge` otherwise), so tests drive any disk level without filling a
disk; `mqstore clean` reads the same gauge to decide whether the disk forces a deletion.
"""

from __future__ import annotations

import collections
import os
from typing import Callable, Protocol

import psutil

from .fs import FileSystem, RealFileSystem

__all__ = ["DiskGauge", "PsutilDiskGauge", "FileSystemDiskGauge", "FixedDiskGauge", "default_disk_gauge"]

UNKNOWN_RATIO = -1.0  # RocketMQ's answer for a missing path or an I/O error
READINGS_KEPT_MAX = 1000


class DiskGauge(Protocol):
    def used_ratio(self, path: str) -> float:
        """Used fraction in [0, 1] of the partition holding `path`; -1.0 if unknown."""
        ...


class PsutilDiskGauge:
    """The real partition of each path, through psutil (statvfs)."""

    def used_ratio(self, path: str) -> float:
        if not os.path.exists(path):
            return UNKNOWN_RATIO
        try:
            usage = psutil.disk_usage(path)
        except OSError:
            return UNKNOWN_RATIO
        # Java's getFreeSpace counts blocks reserved for root as free, so used = total - bfree,
        # which is psutil's `used` (not its `percent`, which is measured against the non-root space).
        return usage.used / usage.total if usage.total else UNKNOWN_RATIO


class FileSystemDiskGauge:
    """Whatever the store's FileSystem reports (the simulated disk's fill or override)."""

    def __init__(self, fs: FileSystem) -> None:
        self.fs = fs

    def used_ratio(self, path: str) -> float:
        try:
            if not self.fs.exists(path):
                return UNKNOWN_RATIO
            return self.fs.disk_usage(path).used_ratio
        except OSError:
            return UNKNOWN_RATIO


class FixedDiskGauge:
    """A settable level per path prefix, for tests: `gauge.set(0.92)` or `gauge.set(0.5, path=...)`.
    A callable level is evaluated on each reading."""

    def __init__(self, level: float | Callable[[str], float] = 0.0) -> None:
        self.default: float | Callable[[str], float] = level
        self.levels: dict[str, float] = {}
        self.readings: collections.deque[tuple[str, float]] = collections.deque(maxlen=READINGS_KEPT_MAX)

    def set(self, level: float, *, path: str | None = None) -> None:
        if path is None:
            self.default = level
            self.levels.clear()
        else:
            self.levels[os.path.normpath(path)] = level

    def used_ratio(self, path: str) -> float:
        norm = os.path.normpath(path)
        level: float | Callable[[str], float] = self.default
        for prefix, value in self.levels.items():
            if norm == prefix or norm.startswith(prefix + os.sep):
                level = value
                break
        ratio = level(path) if callable(level) else level
        self.readings.append((path, ratio))
        return ratio


def default_disk_gauge(fs: FileSystem) -> DiskGauge:
    """psutil for real files, the file layer's own report for a simulated disk."""
    return PsutilDiskGauge() if isinstance(fs, RealFileSystem) else FileSystemDiskGauge(fs)
