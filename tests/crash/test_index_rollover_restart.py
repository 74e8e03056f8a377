"""Issue 19: an index file that rolls over in the middle of a dispatch batch, with the index
writer killed (the process, or the actor) in the middle of that batch. After the restart
every key is found exactly once: no entry is lost, none written twice (a query returns the
message once per index entry it finds, so a double entry shows as a duplicate message)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import mqstore
from mqstore.faults import FaultPlan
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import read_index_header

# 7 usable entries per index file (entry 0 is never used); a batch message has 2 (a, b; no
# UNIQ_KEY): in the batch's first half the file rolls inside message 3.
SETTINGS: dict[str, Any] = dict(
    mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=4, max_index_num=8,
)  # fmt: skip
TOPIC = "roll"
BATCH = 10


def _batch() -> list[mqstore.Message]:
    return [mqstore.Message(topic=TOPIC, queue_id=0, body=b"m%d" % i, keys=[f"a{i}", f"b{i}"]) for i in range(BATCH)]


def _index_files(store_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(store_dir, "index")))


def _assert_each_key_once(store: mqstore.MessageStore) -> None:
    got = store.get(TOPIC, 0, 0, 64)
    assert [m.body for m in got.messages] == [b"m%d" % i for i in range(BATCH)], got
    for m in got.messages:
        for key in (*m.key_list, *([m.uniq_key] if m.uniq_key else [])):
            found = store.query(TOPIC, key, max_count=32).messages
            assert [f.commitlog_offset for f in found] == [m.commitlog_offset], (key, found)


class _KillAtMidBatch(FaultPlan):
    """SIGKILL the process when the index actor is half-way through its batch (a kill -9)."""

    def hit(self, point: str) -> None:
        if point == "index.mid_write" and self._armed:
            os.kill(os.getpid(), signal.SIGKILL)
        super().hit(point)


def test_the_index_actor_crashing_mid_batch_across_a_roll_over_indexes_each_key_once(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    faults = FaultPlan()
    with mqstore.open(store_dir, faults=faults, **SETTINGS) as store:
        faults.arm("index.mid_write")
        assert store.put_batch(_batch()).ok
        deadline = time.monotonic() + 10
        while not store.supervisor.restarts:
            assert time.monotonic() < deadline, "the index actor never crashed"
            time.sleep(0.01)
        assert faults.fired["index.mid_write"] == 1
        assert len(_index_files(store_dir)) >= 2  # rolled before the crash
        _assert_each_key_once(store)
    with mqstore.open(store_dir, **SETTINGS) as store:
        _assert_each_key_once(store)


_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import mqstore
    from test_index_rollover_restart import SETTINGS, _KillAtMidBatch, _batch
    faults = _KillAtMidBatch()
    store = mqstore.open({store_dir!r}, faults=faults, **SETTINGS)
    faults.arm("index.mid_write")
    store.put_batch(_batch())
    import time
    time.sleep(30)  # killed before this ends
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_kill_mid_batch_across_an_index_roll_over_leaves_each_key_indexed_once(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    child = _CHILD.format(tests=os.path.dirname(__file__), store_dir=store_dir)
    proc = subprocess.run([sys.executable, "-c", child], timeout=60, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert os.path.exists(os.path.join(store_dir, "abort"))
    files = _index_files(store_dir)
    assert len(files) == 2  # rolled before the kill, in the batch's first half
    first = read_index_header(RealFileSystem(), os.path.join(store_dir, "index", files[0]))
    with mqstore.open(store_dir, **SETTINGS) as store:
        _assert_each_key_once(store)
        # The roll split message 3: a3 in the full file, b3 in the next.
        assert first.index_count == SETTINGS["max_index_num"]
        assert first.end_phy_offset == store.get(TOPIC, 0, 3, 1).messages[0].commitlog_offset
    with mqstore.open(store_dir, **SETTINGS) as store:  # and after a clean restart
        _assert_each_key_once(store)
