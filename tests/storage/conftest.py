"""Shared fixtures for the storage tests: a manual clock and both file systems."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqstore.storage.fs import FileSystem, RealFileSystem, SimulatedFileSystem

FIXTURES = Path("/work/shared/fixtures")


@dataclass
class ManualClock:
    now_ms: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["real", "sim"])
def any_fs(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[tuple[FileSystem, str]]:
    """The same test on real mmap files and on the simulated disk: (fs, root dir)."""
    if request.param == "real":
        yield RealFileSystem(), str(tmp_path)
    else:
        fs = SimulatedFileSystem(clock_ms=clock)
        fs.makedirs("/store")
        yield fs, "/store"


@pytest.fixture
def real_fs() -> RealFileSystem:
    return RealFileSystem()


@pytest.fixture
def copy_commitlog(tmp_path: Path) -> Callable[[str], str]:
    """Makes a private copy of a broker sample's commitlog dir (fixtures are never modified)."""

    def copy(sample: str) -> str:
        target = tmp_path / sample / "commitlog"
        shutil.copytree(FIXTURES / sample / "commitlog", target)
        for name in os.listdir(target):
            os.chmod(target / name, 0o644)
        return str(target)

    return copy
