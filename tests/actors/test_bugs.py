"""Regression tests for bugs the actor tests found in files this suite does not own.

A writer restart used to lose acknowledged puts: CommitLog.recover_tail deleted the segment the
allocator had pre-created as next-next, and the allocator (not restarted) later handed that
unlinked file back to the writer, so records went into a file no reader could open."""

from __future__ import annotations

import sys
from pathlib import Path


from mqstore import FaultPlan, Message

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py


def test_acked_messages_survive_a_writer_restart_across_a_segment_roll(store_dir: Path) -> None:
    plan = FaultPlan()
    store = h.open_small(store_dir, faults=plan)
    try:
        keys = []
        for i in range(10):
            assert store.put(Message(topic="t", body=b"x" * 400, keys=[f"k{i}"])).ok
            keys.append(f"k{i}")
        plan.arm("writer.after_append")
        store.put(Message(topic="t", body=b"x" * 400, keys=["crash"]))
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the writer's restart")
        for i in range(10, 210):  # ~100 KiB: past the first 64 KiB segment
            assert store.put(Message(topic="t", body=b"x" * 400, keys=[f"k{i}"])).ok
            keys.append(f"k{i}")
    finally:
        store.close()
    with h.open_small(store_dir) as reopened:
        h.wait_dispatched(reopened)
        assert reopened.max_offset("t", 0) == len(keys) + 1  # the crash put was appended too
        assert all(len(reopened.query("t", k).messages) == 1 for k in keys[-5:])
