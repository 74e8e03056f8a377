"""The examples run as written and print what their README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXPECTED = {
    "embedded.py": [
        "put PUT_OK queue offset 0",
        "batch PUT_OK messages 2",
        "get FOUND ['order 1', 'order 2', 'order 3']",
        "query ['order 2']",
        "lookup order 2",
        "closed",
    ],
    "actor_client.py": [
        "put PUT_OK 1000 messages, window 32",
        "batch PUT_OK messages 3",
        "arrived orders 0 max offset",
        "get FOUND ['order 0', 'order 1', 'order 2']",
        "query ['order 1']",
        "done",
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_prints_its_results(name: str) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for expected in EXPECTED[name]:
        assert any(line.startswith(expected) for line in lines), f"{expected!r} not in {lines}"
