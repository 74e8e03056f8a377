"""A thread that read before a writer restart kept its map of the segment the allocator had
made ahead; the restarted writer's recovery deletes that file and the allocator makes one of
the same name. The thread's map still read the deleted file's zeros where acknowledged
messages now were: its get answered NO_MATCHED_MESSAGE with next_begin_offset past one (a
consumer commits that) and its lookup None, until it happened to map the file again (found by
tests/test_model_store.py). Now a read that finds no record where a unit points (or a lookup, a store time, the
replication source) asks whether the segment's name names another file, and if so reads the
file named now (review 69 F3 for the last three).

Since the allocator makes its files ahead without a name (review 78 H1's fix), that file is
not in the directory before the writer takes it, so a reader cannot map it early: the test
keeps the sequence and checks the answers, and that the segment has no name until then."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import mqstore
from mqstore import FaultPlan, GetMessageStatus, Message, PutMessageStatus

SEG = 64 * 1024
SETTINGS = {"mapped_file_size_commitlog_bytes": SEG, "mapped_file_size_consume_queue_bytes": 20 * 200}


def test_a_thread_that_mapped_a_segment_before_a_writer_restart_reads_what_is_stored_there_after(tmp_path: Path) -> None:
    plan = FaultPlan()
    with mqstore.open(tmp_path / "store", faults=plan, **SETTINGS) as store:
        assert store.put(Message(topic="t", body=b"")).ok
        assert store.get("t", 0, 0, 1).found  # this thread maps every segment listed
        # Other threads that read before the restart too, each for one other read after it.
        reads_after: dict[str, Callable[[], object]] = {
            "lookup": lambda: store.lookup(SEG),
            "lookup_sized": lambda: store.lookup(SEG, 40_092),
            "store_time": lambda: store.message_store_time("t", 0, 3),
            "commitlog_data": lambda: store.get_commitlog_data(SEG, 64),
        }
        asked = threading.Event()
        answers: dict[str, object] = {}

        def read_after_the_restart(name: str, mapped: threading.Event) -> None:
            assert store.get("t", 0, 0, 1).found
            mapped.set()
            asked.wait(30)
            answers[name] = reads_after[name]()

        others = []
        for name in reads_after:
            mapped = threading.Event()
            others.append(threading.Thread(target=read_after_the_restart, args=(name, mapped)))
            others[-1].start()
            assert mapped.wait(30)
        made_ahead = tmp_path / "store" / "commitlog" / f"{SEG:020d}"
        assert not made_ahead.exists()  # made ahead (or not yet) without a name
        plan.arm("writer.after_append")
        assert store.put(Message(topic="t", body=b"")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        deadline = time.monotonic() + 10
        while not store.supervisor.restarts and time.monotonic() < deadline:
            threading.Event().wait(0.005)
        assert store.supervisor.restarts
        bodies = [bytes([i + 1]) * 40_000 for i in range(2)]
        results = [store.put(Message(topic="t", body=body)) for body in bodies]
        assert all(r.ok for r in results), results
        last = results[-1]
        assert last.commitlog_offset == SEG and made_ahead.exists()  # named by the writer that took it
        got = store.get("t", 0, last.queue_offset, 1)
        assert got.status is GetMessageStatus.FOUND and [m.body for m in got.messages] == [bodies[-1]], got
        asked.set()
        for other in others:
            other.join(30)
        for name in ("lookup", "lookup_sized"):
            record = answers[name]
            assert isinstance(record, mqstore.MessageRecord) and record.body == bodies[-1], name
        assert answers["store_time"] == store.message_store_time("t", 0, 3) > 0
        data = answers["commitlog_data"]
        assert isinstance(data, tuple) and data[0] == SEG and data[1][:4] == (40_092).to_bytes(4, "big")
