"""`.ci/find-python`: which interpreter `.ci/bootstrap` builds the venv with (mqstore needs
Python >= 3.11; Ubuntu 22.04's python3 is 3.10). The apt install it falls back to as root is
not run here: each case has an interpreter or is run as a user that is not root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIND_PYTHON = Path(__file__).resolve().parents[1] / ".ci" / "find-python"


def _stub(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


def _find(path_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", str(FIND_PYTHON)], env={"PATH": str(path_dir), **env},
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def test_a_new_enough_python_is_used_as_it_is(tmp_path: Path) -> None:
    done = _find(tmp_path, PYTHON=sys.executable)
    assert (done.returncode, done.stdout.strip()) == (0, sys.executable)


def test_an_old_python3_gives_way_to_a_newer_one_on_the_path(tmp_path: Path) -> None:
    _stub(tmp_path, "python3", "exit 1")  # answers the version check as 3.10 does
    (tmp_path / "python3.11").symlink_to(sys.executable)
    done = _find(tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "python3.11")
    assert "older than 3.11; using python3.11" in done.stderr


def test_without_any_new_enough_python_it_says_what_to_install(tmp_path: Path) -> None:
    _stub(tmp_path, "python3", 'case "$1" in -V) echo "Python 3.10.12";; *) exit 1;; esac')
    _stub(tmp_path, "id", "echo 1000")  # not root: no apt install
    done = _find(tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert "needs Python 3.11 or newer (Python 3.10.12)" in done.stderr
    assert os.access(FIND_PYTHON, os.X_OK)


def test_a_python_the_caller_chose_is_never_replaced(tmp_path: Path) -> None:
    _stub(tmp_path, "old-python", 'case "$1" in -V) echo "Python 3.9.2";; *) exit 1;; esac')
    (tmp_path / "python3.11").symlink_to(sys.executable)
    done = _find(tmp_path, PYTHON=str(tmp_path / "old-python"))
    assert done.returncode == 1 and done.stdout == ""
    assert "is not Python >= 3.11 (Python 3.9.2)" in done.stderr


def test_a_newer_python_than_3_13_is_taken_too(tmp_path: Path) -> None:
    _stub(tmp_path, "python3", "exit 1")
    (tmp_path / "python3.14").symlink_to(sys.executable)
    done = _find(tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "python3.14")
