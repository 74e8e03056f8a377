"""Segments deleted before reput dispatched their records (review 130 F1): the cleaner gave the
writer no bound, so retention deleted acknowledged records no ConsumeQueue had counted, and the
next start (a writer's restart, a reopen) handed their queue offsets out again; the queue's max
offset fell. The writer deletes only segments below what is dispatched."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import mqstore
from mqstore import Message
from mqstore.faults import HoldAt

SETTINGS = dict(mapped_file_size_commitlog_bytes=4096, mapped_file_size_consume_queue_bytes=20 * 1000,
                max_hash_slot_num=64, max_index_num=2000, file_reserved_time_hours=0,
                delete_when=";".join(f"{h:02d}" for h in range(24)))  # fmt: skip
TIMEOUT_S = 10.0


class _HoldReputCrashWriter(HoldAt):
    """Holds reput mid-dispatch once armed; crashes the writer once when asked."""

    crash_writer = False

    def hit(self, point: str) -> None:
        if point == "writer.after_append" and self.crash_writer:
            self.crash_writer = False
            raise mqstore.InjectedFault("the writer crashes (test)")
        super().hit(point)


@pytest.mark.parametrize("then", ["writer restart", "reopen"])
def test_segments_reput_has_not_dispatched_are_not_deleted_and_no_queue_offset_is_given_twice(
    tmp_path: Path, then: str
) -> None:
    plan = _HoldReputCrashWriter("reput.mid_dispatch", hold_s=60)
    root = tmp_path / "store"
    store = mqstore.open(root, faults=plan, **SETTINGS)  # type: ignore[arg-type]
    acked: dict[int, bytes] = {}
    try:
        def put(body: bytes, queue_id: int = 0) -> mqstore.PutResult:
            result = store.put(Message(topic="t", queue_id=queue_id, body=body + b"." * 100))
            if queue_id == 0 and result.stored:
                assert result.queue_offset not in acked, f"queue offset {result.queue_offset} given twice"
                acked[result.queue_offset] = body
            return result

        assert put(b"first").ok
        deadline = time.monotonic() + TIMEOUT_S
        while store.dispatch_behind_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        plan.armed.set()
        assert put(b"held-0").ok
        assert plan.entered.wait(TIMEOUT_S), "reput not held"
        for i in range(1, 60):
            assert put(b"held-%d" % i).ok
        for i in range(60):  # queue 1 fills the newest segments: queue 0's last records lie in older ones
            assert put(b"q1-%d" % i, queue_id=1).ok
        segments = len(list((root / "commitlog").iterdir()))
        assert segments > 3
        deleted_undispatched = store.delete_expired_files_now()  # (checked last: what follows shows the harm)
        if then == "writer restart":
            plan.crash_writer = True
            put(b"crash", queue_id=1)
            time.sleep(0.5)
            plan.release.set()
            deadline = time.monotonic() + TIMEOUT_S
            while not store.put(Message(topic="p", body=b"probe")).ok:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        else:
            plan.release.set()
            assert store.close()
            store = mqstore.open(root, **SETTINGS)  # type: ignore[arg-type]
        for i in range(5):
            assert put(b"after-%d" % i).queue_offset == 61 + i
        assert store.max_offset("t", 0) == 66
        deadline = time.monotonic() + TIMEOUT_S
        while store.dispatch_behind_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert deleted_undispatched == 0  # every segment but the first held undispatched records
        assert store.delete_expired_files_now() > 0  # dispatched now: retention deletes them
        assert store.max_offset("t", 0) == 66
        newest = store.get("t", 0, 61, 8)
        assert [bytes(m.body[:7]) for m in newest.messages] == [b"after-%d" % i for i in range(5)]
    finally:
        plan.release.set()
        store.close()


def test_an_index_that_cannot_write_does_not_hold_the_cleaning_back() -> None:
    """Review 133 F1: the bound above waited for the index too; an index that could not make a
    file (EIO, its own full disk) stopped every deletion for good, the disk filled and puts were
    refused. The index is derived: the queues alone bound the cleaning."""
    import errno

    from mqstore.storage.fs import SimulatedFileSystem

    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    settings = {**SETTINGS, "mapped_file_size_commitlog_bytes": 16384, "max_index_num": 200}
    with mqstore.open("/s", fs=fs, **settings) as store:  # type: ignore[arg-type]
        for i in range(50):
            assert store.put(Message(topic="t", body=b"x" * 300, keys=[f"k{i}"])).ok
        fs.inject_fault("map", path_contains="/index/", err=errno.EIO, count=10**9)
        for i in range(50, 1500):
            assert store.put(Message(topic="t", body=b"x" * 300, keys=[f"k{i}"])).ok
        deadline = time.monotonic() + TIMEOUT_S
        while store.stats()["consume_queue_behind_bytes"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert store.stats()["index_behind_bytes"] > 0  # the index is stuck behind
        indexed_end = store.read_view.view.indexed_end
        segments = len(fs.listdir("/s/commitlog"))
        assert (segments - 1) * 16384 > indexed_end + 4 * 16384
        while store.delete_expired_files_now():  # (at most a batch a round)
            pass
        oldest = min(int(name) for name in fs.listdir("/s/commitlog"))
        assert oldest > indexed_end  # past where the index stopped
        assert store.put(Message(topic="t", body=b"after")).ok
