"""A store file cut short by another process while the store runs (truncate, a restore that
rewrites in place): the next touch of its lost pages was a SIGBUS that killed the host. With
the guard (storage/_mapguard.c) the host lives, no put whose bytes missed the file is
acknowledged, the store says which file (log, `stats()`, an unclean close), and the next open
(after `mqstore recover` for a commitlog segment) serves every acknowledged message that the
cut itself did not take. Each store runs in a child (cut_under_map_child.py): a SIGBUS kills
the child, not the test runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mqstore.storage import mapguard

CHILD = str(Path(__file__).with_name("cut_under_map_child.py"))
SEGMENT = 256 * 1024  # the child's settings, for `mqstore recover`
CHILD_ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES": str(SEGMENT),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE_BYTES": "20000",
    "MQSTORE_MAX_HASH_SLOT_NUM": "1000",
    "MQSTORE_MAX_INDEX_NUM": "4000",
}

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built (no C compiler)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    return subprocess.run([sys.executable, "-X", "faulthandler", *args], capture_output=True, text=True, timeout=120,
                          env={**env, **CHILD_ENV})  # fmt: skip


def _child(*args: str) -> dict[str, Any]:
    child = _run(CHILD, *args)
    said = f"{args}: exit {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-3000:]}"
    assert child.returncode != -signal.SIGBUS, "killed by SIGBUS: " + said
    assert child.returncode == 0, said
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def _cut(what: str, store: str) -> dict[str, Any]:
    cut = _child(what, store)
    assert cut["files_cut_under_map"] == [cut["cut"]]
    assert cut["clean_close"] is False  # the next open checks the files as after a crash
    assert cut["guard_faults"] > 0 or what in ("commitlog", "next_segment")  # (or reserve() saw it first)
    return cut


@pytest.mark.parametrize("what", ["queue", "index", "checkpoint"])
def test_a_queue_index_or_checkpoint_file_cut_while_open_kills_nothing_and_the_next_open_serves_every_message(
    tmp_path: Path, what: str
) -> None:
    cut = _cut(what, str(tmp_path / "store"))
    assert cut["refused_count"] == 0  # the commitlog is whole: puts go on, the queues are rebuilt later
    acked = {**cut["before"], **cut["after"]}
    assert len(acked) == 600
    reopened = _child("reopen", str(tmp_path / "store"))
    assert reopened["served"] == {key: at[0] for key, at in acked.items()}
    assert reopened["queried"] == {"b1": 1, "b399": 1, "a0": 1, "a199": 1}
    assert reopened["put"] == "PUT_OK"


@pytest.mark.parametrize("what", ["commitlog", "next_segment"])
def test_a_commitlog_segment_cut_while_open_kills_nothing_and_acknowledges_nothing_it_lost(
    tmp_path: Path, what: str
) -> None:
    store = str(tmp_path / "store")
    cut = _cut(what, store)
    segment_start = int(os.path.basename(cut["cut"]))
    assert cut["refused_count"] > 0
    assert all(status == "SERVICE_NOT_AVAILABLE" for status, _ in cut["refused"]), cut["refused"]
    assert "a page of the file was gone" in cut["refused"][0][1]
    for key, (_, end) in cut["after"].items():  # acknowledged only while the bytes went to the file
        assert end <= segment_start + cut["cut_at"], (key, end)
    if what == "commitlog":
        assert cut["after"] == {}  # the writer was in the cut part
    else:
        assert cut["after"]  # puts rolled into the cut segment's intact part, then were refused
    # Opened again: degraded (a wrong-sized segment is a hole), puts refused until recover.
    degraded = _child("reopen", store)
    assert degraded["put"] == "SERVICE_NOT_AVAILABLE" and "mqstore recover" in degraded["put_detail"]
    acked = {**cut["before"], **cut["after"]}
    assert degraded["served"].items() <= {key: at[0] for key, at in acked.items()}.items()
    recovered = _run("-m", "mqstore", "recover", "--no-progress", store)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    reopened = _child("reopen", store)
    # Every acknowledged record the cut did not take (what it took is reported lost by recover).
    kept = {key: at[0] for key, at in acked.items() if at[1] <= segment_start + cut["cut_at"]}
    assert reopened["served"] == kept
    assert reopened["put"] == "PUT_OK"


def test_a_fault_on_a_file_that_is_not_the_stores_still_kills_the_process(tmp_path: Path) -> None:
    # The guard answers for the store's maps only; any other SIGBUS is what it was without it
    # (here with Python's faulthandler, which the guard chains to, dumping the stack first).
    child = _run(CHILD, "foreign_fault", str(tmp_path))
    assert "touching" in child.stdout
    assert child.returncode == -signal.SIGBUS, child.stdout + child.stderr
    assert "Bus error" in child.stderr  # faulthandler's dump
