"""Project-wide pytest hooks: tests marked `soak` run only when the run selects them (`-m soak`);
the 100k read-your-writes pairs start in their own process once collection ends (see
tests/read/ryw_child.py), so they run beside the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

RYW_TEST = "test_no_read_your_writes_miss_in_100k_put_then_max_offset_pairs_from_4_threads"
RYW_PAIRS, RYW_THREADS, RYW_BUDGET_S = 100_000, 4, 240
ryw_run_key = pytest.StashKey[tuple[subprocess.Popen[str], str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = config.getoption("-m", default="") or ""
    if "soak" in markexpr and "not soak" not in markexpr:
        return
    skip = pytest.mark.skip(reason="soak test: run with -m soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


def start_ryw_pairs(config: pytest.Config) -> tuple[subprocess.Popen[str], str]:
    """The read-your-writes child (tests/read/ryw_child.py), started once per session."""
    if ryw_run_key not in config.stash:
        root = tempfile.mkdtemp(prefix="mqstore-ryw-")
        child = Path(__file__).with_name("read") / "ryw_child.py"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
        env.update({k: v for k, v in os.environ.items() if k == "MQSTORE_PURE_PYTHON"})
        proc = subprocess.Popen(
            [sys.executable, str(child), os.path.join(root, "store"), str(RYW_PAIRS), str(RYW_THREADS), str(RYW_BUDGET_S)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        config.stash[ryw_run_key] = (proc, root)
    return config.stash[ryw_run_key]


@pytest.fixture(scope="session")
def ryw_pairs_run(request: pytest.FixtureRequest) -> tuple[subprocess.Popen[str], str]:
    """The read-your-writes child, started at collection's end (or now, if it was not)."""
    return start_ryw_pairs(request.config)


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.name == RYW_TEST and not item.get_closest_marker("skip") for item in session.items):
        start_ryw_pairs(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(ryw_run_key, None)
    if run is not None:
        proc, root = run
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
