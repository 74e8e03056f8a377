"""How much memory this process may still take: the host's available memory (psutil), or less
when the process runs in a memory-limited cgroup (a container), whose limit the host's figures
do not show (review 71 F1: a transient store pool checked against the host's 20 GiB was
allocated in a 512 MiB container, and the OOM killer took the host process at the open).

cgroup v2 (`memory.max`, `memory.current`) and v1 (`memory.limit_in_bytes`,
`memory.usage_in_bytes`), each level from the process's own group up to the root: the
tightest wins. Page cache the kernel can drop (`inactive_file`) counts as free, as `docker
stats` counts it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import psutil

__all__ = ["MemoryRoom", "memory_room"]

_NO_LIMIT = 1 << 60  # v1 writes "unlimited" as a page-rounded 2^63 - 1


class MemoryRoom(NamedTuple):
    total: int  # the host's memory, or the tightest cgroup limit
    available: int  # what may still be taken without the OOM killer


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except (OSError, ValueError):
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value < _NO_LIMIT else None


def _inactive_file(stat_path: str, key: str) -> int:
    try:
        with open(stat_path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _groups(proc_cgroup: str) -> list[tuple[str, str]]:
    """(version, path) of this process's memory groups: ("2", path) and/or ("1", path)."""
    found = []
    try:
        with open(proc_cgroup, errors="surrogateescape") as f:  # a group's name need not be UTF-8 (review 72 M4)
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                _, controllers, path = parts
                if controllers == "":
                    found.append(("2", path))
                elif "memory" in controllers.split(","):
                    found.append(("1", path))
    except OSError:
        pass
    return found


def _levels(path: str) -> list[str]:
    """`path` and each parent up to the root ("/a/b" -> "/a/b", "/a", "/")."""
    levels = []
    at = "/" + path.strip("/")
    while True:
        levels.append(at)
        if at == "/":
            return levels
        at = os.path.dirname(at)


def cgroup_room(proc_cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> MemoryRoom | None:
    """The tightest memory limit of this process's cgroups and the room left under it; None
    when no level limits memory (or none can be read)."""
    best: MemoryRoom | None = None
    for version, path in _groups(proc_cgroup):
        base = cgroup_root if version == "2" else os.path.join(cgroup_root, "memory")
        if version == "2" and not os.path.exists(os.path.join(base, "cgroup.controllers")):
            continue  # a v1-only machine lists the v2 group too ("0::/")
        for level in _levels(path):
            directory = os.path.join(base, level.lstrip("/"))
            if version == "2":
                limit = _read_int(os.path.join(directory, "memory.max"))
                usage = _read_int(os.path.join(directory, "memory.current"))
                reclaimable = _inactive_file(os.path.join(directory, "memory.stat"), "inactive_file")
            else:
                limit = _read_int(os.path.join(directory, "memory.limit_in_bytes"))
                usage = _read_int(os.path.join(directory, "memory.usage_in_bytes"))
                reclaimable = _inactive_file(os.path.join(directory, "memory.stat"), "total_inactive_file")
            if limit is None:
                continue
            room = max(0, limit - max(0, (usage or 0) - reclaimable))
            if best is None or room < best.available:
                best = MemoryRoom(total=min(limit, best.total) if best else limit, available=room)
            elif limit < best.total:
                best = best._replace(total=limit)
    return best


def memory_room() -> MemoryRoom:
    """The host's total and available memory, each cut to the process's cgroup limit. Never
    raises for a cgroup it cannot make sense of (it is asked at import): the host's figures."""
    host = psutil.virtual_memory()
    room = MemoryRoom(total=int(host.total), available=int(host.available))
    try:
        limited = cgroup_room()
    except (OSError, ValueError):
        return room
    if limited is None:
        return room
    return MemoryRoom(total=min(room.total, limited.total), available=min(room.available, limited.available))
