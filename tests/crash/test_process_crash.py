"""SIGKILL a producing child process at random moments; every acknowledged message survives.

The child (producer.py) puts single messages and batches from several threads under
SYNC_FLUSH with 64 KiB segments and prints a line per acknowledged message. The test kills it
at a random moment (random.Random(seed)), reopens the store here, and checks the acknowledged
set, dense queue offsets, all-or-nothing batches, queries by key, and `verify`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import mqstore
from mqstore.tools.verify import verify_store

from crashlib import PRODUCER, Ack, assert_verified, check_store

STORE_SETTINGS = dict(
    flush_disk_type="SYNC_FLUSH",
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=1000,  # as producer.py
    max_index_num=4000,
)
READY_TIMEOUT_S = 30.0


def _run_and_kill(store_dir: str, seed: int, rng: random.Random, acks: dict[str, Ack]) -> int:
    threads = rng.randint(2, 4)
    stderr_path = os.path.join(os.path.dirname(store_dir), f"child-{seed}.stderr")
    stderr_file = open(stderr_path, "w")
    child = subprocess.Popen(
        [sys.executable, PRODUCER, store_dir, str(seed), str(threads)],
        stdout=subprocess.PIPE, stderr=stderr_file, text=True, bufsize=1,
    )  # fmt: skip
    ready = threading.Event()
    lines: list[str] = []

    def reader() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line == "READY\n":
                ready.set()
            elif line.endswith("\n"):  # a line cut by the kill was never acknowledged whole
                lines.append(line)
        ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        assert ready.wait(READY_TIMEOUT_S), f"seed {seed}: child not ready"
        if child.poll() is not None:
            stderr_file.flush()
            with open(stderr_path) as f:
                tail = f.read()[-2000:]
            raise AssertionError(f"seed {seed}: child exited with {child.returncode}: {tail}")
        time.sleep(rng.uniform(0.0, 0.5))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        t.join(timeout=10)
        stderr_file.close()
    for line in lines:
        _, key, _topic, queue_id, queue_offset = line.split()
        acks[key] = Ack(key, int(queue_id), int(queue_offset))
    return len(lines)


def _kill_loop(tmp_path: object, base_seed: int, stores: int, kills_per_store: int) -> None:
    for s in range(stores):
        store_dir = os.path.join(str(tmp_path), f"store{s}")
        acks: dict[str, Ack] = {}
        for k in range(kills_per_store):
            seed = base_seed + s * 1000 + k
            rng = random.Random(seed)
            new = _run_and_kill(store_dir, seed, rng, acks)
            context = f"seed {seed} (store {s}, kill {k}, {new} new acks, {len(acks)} in all)"
            assert os.path.exists(os.path.join(store_dir, "abort")), f"{context}: no abort file after a kill"
            store = mqstore.open(store_dir, **STORE_SETTINGS)
            try:
                rec = store.supervisor.recovery
                assert rec is not None and not rec.last_exit_ok, context
                total = check_store(store, acks, context)
                assert total >= len(acks), context
            finally:
                assert store.close(), f"{context}: unclean close"
            assert_verified(store_dir, context, config=mqstore.StoreConfig(**STORE_SETTINGS))


def test_sigkill_loses_no_acknowledged_message(tmp_path: object) -> None:
    """12 kills over 3 stores; each reopen is checked (the soak test runs thousands)."""
    _kill_loop(tmp_path, base_seed=int(os.environ.get("CRASH_SEED", "1")), stores=3, kills_per_store=4)


@pytest.mark.soak
def test_sigkill_soak(tmp_path: object) -> None:
    kills = int(os.environ.get("CRASH_SOAK_KILLS", "2000"))
    stores = max(1, kills // 50)
    _kill_loop(tmp_path, base_seed=int(os.environ.get("CRASH_SEED", "100000")), stores=stores,
               kills_per_store=max(1, kills // stores))  # fmt: skip


def test_verify_of_a_clean_store_passes_and_a_missing_unit_fails(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    with mqstore.open(store_dir, **STORE_SETTINGS) as store:
        for i in range(50):
            store.put(mqstore.Message(topic="crash", queue_id=i % 2, body=b"x" * 50, keys=[f"k{i}"]))
    assert verify_store(store_dir, config=mqstore.StoreConfig(**STORE_SETTINGS)).ok
    cq = os.path.join(store_dir, "consumequeue", "crash", "0", "0" * 20)
    with open(cq, "r+b") as f:
        f.seek(20 * 24)
        f.write(bytes(20))  # the queue now ends early: the last unit is missing
    report = verify_store(store_dir, config=mqstore.StoreConfig(**STORE_SETTINGS))
    assert not report.ok and {p.kind for p in report.problems} == {"cq_missing"}, report.problems
