"""Shared helpers for the tools tests: CLI runs, small stores, fixture copies."""

from __future__ import annotations

import logging
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path("/work/shared/fixtures")

@pytest.fixture(autouse=True)
def restore_mqstore_logger() -> Iterator[None]:
    """main() configures logging; undo it so later tests see the default."""
    root = logging.getLogger("mqstore")
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    root.propagate = saved[2]


@pytest.fixture
def copy_fixture(tmp_path: Path):  # type: ignore[no-untyped-def]
    """copy_fixture(name): a writable copy of a broker sample (the fixtures are never touched)."""
    return lambda name: _copy_fixture(name, tmp_path)


def _copy_fixture(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(FIXTURES / name, target)
    for p in [target, *target.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return target
