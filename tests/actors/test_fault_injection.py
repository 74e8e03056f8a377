"""Fault injection through the supervisor: each named fault point, hit three times under
concurrent puts, must restart exactly its restart group and keep every invariant of
conftest.check_invariants after each crash."""

from __future__ import annotations

from pathlib import Path

import sys

import pytest

from mqstore import FaultPlan, Message
from mqstore.faults import FAULT_POINTS
from mqstore.storage.status import PutMessageStatus

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py

# point -> (the actor it crashes, the actors the strategy restarts, extra settings)
CASES: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {
    "writer.mid_batch_append": ("writer", ("writer", "reput"), {}),
    "writer.after_append": ("writer", ("writer", "reput"), {}),
    "allocator.mid_allocation": ("allocator", ("allocator",), {}),
    "flush.mid_fsync": ("flush", ("flush",), {"flush_disk_type": "SYNC_FLUSH"}),
    "reput.mid_dispatch": ("reput", ("reput",), {}),
    "consume_queue.mid_write": ("consume_queue", ("consume_queue", "reput"), {}),
    "index.mid_write": ("index", ("index", "reput"), {}),
}
CRASHES = 3
PUTS_BETWEEN_CRASHES = 40
# Puts that roll a 64 KiB segment: ~130 records of ~500 bytes each.
PUTS_BETWEEN_ALLOCATIONS = 160
PUT_LATENCY_MAX_S = 5.0  # far above any restart; a put this slow lost its reply


def test_every_existing_fault_point_is_covered() -> None:
    # The gateway holds no files: its restart is tested in test_gateway.py.
    # The cleaner's point: test_a_cleaner_crash_between_its_deletions_is_restarted_alone.
    # A refused put's: tests/crash/test_cut_under_map.py (puts here are never refused).
    missing = FAULT_POINTS - set(CASES) - {"cleaner.mid_delete", "gateway.mid_request", "writer.after_refusal"}
    assert not missing, f"fault points without a test: {missing}"


@pytest.mark.parametrize("point", sorted(CASES))
def test_crash_at_point_restarts_its_group_and_keeps_every_acknowledged_message(
    point: str, store_dir: Path
) -> None:
    failed, group, settings = CASES[point]
    plan = FaultPlan()
    store = h.open_small(store_dir, faults=plan, **settings)
    try:
        supervisor = store.supervisor
        # The TREE's rest_for_one group: the brief's (the writer's took the allocator too while
        # its files made ahead had names a restarted writer's recovery could delete).
        assert tuple(supervisor._restart_group(failed)) == group
        between = PUTS_BETWEEN_ALLOCATIONS if failed == "allocator" else PUTS_BETWEEN_CRASHES
        with h.Producers(store, threads=3) as producers:
            for crash in range(1, CRASHES + 1):
                acked = producers.ledger.ok_count()
                h.wait_until(lambda: producers.ledger.ok_count() >= acked + between, what="puts between crashes")
                plan.arm(point, 1)
                h.wait_until(lambda: len(supervisor.restarts) >= crash, what=f"restart {crash} after {point}")
                producers.pause()
                assert plan.fired[point] == crash
                assert len(supervisor.restarts) == crash, f"one fault, several restarts: {supervisor.restarts}"
                record = supervisor.restarts[-1]
                assert record.failed == failed
                assert record.restarted == group
                assert "InjectedFault" in record.error
                assert store.running
                assert set(supervisor.peers) >= set(group)
                entries = producers.ledger.snapshot()
                counts = h.check_invariants(store, entries)
                assert counts["stored"] > 0
                producers.resume()
        assert not producers.errors, producers.errors
        entries = producers.ledger.snapshot()
        slow = [e for e in entries if e.seconds > PUT_LATENCY_MAX_S]
        assert not slow, f"{len(slow)} puts waited > {PUT_LATENCY_MAX_S} s, e.g. {slow[0]}"
        statuses = {e.result.status for e in entries}
        assert statuses <= {
            PutMessageStatus.PUT_OK,
            PutMessageStatus.SERVICE_NOT_AVAILABLE,
            PutMessageStatus.FLUSH_DISK_TIMEOUT,
        }, statuses
        h.check_invariants(store, entries)
        assert store.close() is True
    finally:
        store.close()

    # What was stored survives a clean reopen too (derived files rebuilt or kept, not doubled).
    with h.open_small(store_dir) as reopened:
        h.check_invariants(reopened, entries)


@pytest.mark.parametrize("point", ["consume_queue.mid_write", "index.mid_write", "reput.mid_dispatch"])
def test_a_crash_during_the_opens_re_dispatch_is_restarted_and_the_open_succeeds(point: str, store_dir: Path) -> None:
    """The supervisor restarts a child that crashes while the open rebuilds the queues, as it
    would once running. Before, the open waited for the dead actor, then failed with pykka's
    ActorDeadError (found by the power-loss soak under load, through a test double's race)."""
    import shutil

    from mqstore import Message

    store = h.open_small(store_dir)
    try:
        for i in range(60):
            assert store.put(Message(topic="T", body=b"m%d" % i, keys=[f"k{i}"])).status is PutMessageStatus.PUT_OK
    finally:
        store.close()
    shutil.rmtree(store_dir / "consumequeue")  # the open rebuilds every queue and the index
    shutil.rmtree(store_dir / "index")
    (store_dir / "abort").touch()
    plan = FaultPlan()
    plan.arm(point, 1)
    store = h.open_small(store_dir, faults=plan)
    try:
        assert plan.fired[point] == 1
        assert [r.failed for r in store.supervisor.restarts] == [point.split(".")[0]]
        bodies = [m.body for m in store.get("T", 0, 0, 32).messages] + [m.body for m in store.get("T", 0, 32, 32).messages]
        assert bodies == [b"m%d" % i for i in range(60)]
        assert [m.body for m in store.query("T", "k59").messages] == [b"m59"]
    finally:
        store.close()


def test_a_restart_does_not_wait_for_reputs_pass_through_a_dispatch_backlog(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 115 F1: a writer crash under load restarts reput with it; the stop waited in
    reput's inbox behind its pass, 16 batches, each waiting up to a second for a ConsumeQueue
    actor slowed by the producers: reput did not stop within the supervisor's 10 s, and the
    whole store gave up (FAILED, every put refused, close() False). Reput ends its pass at
    the next batch once a stop waits."""
    import time

    import mqstore
    from mqstore import Message
    from mqstore import supervisor as supervisor_module
    from mqstore.supervisor import SupervisorState

    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 2.0)  # (with 1 s of grace)

    slow = True

    class SlowQueues(FaultPlan):
        def hit(self, point: str) -> None:
            if point == "consume_queue.mid_write" and slow:
                time.sleep(0.3)  # a ConsumeQueue actor behind: ~5 s for reput's 16 batches
            super().hit(point)

    plan = SlowQueues()
    store = mqstore.open(store_dir, faults=plan)
    try:
        body = b"x" * 100
        for _ in range(1_500):  # ~47 dispatch batches of 1,024 records
            assert store.put_batch([Message(topic="T", body=body)] * 32).ok
        time.sleep(1.0)  # reput's backlog fills (32 batches), then it waits for each one written
        plan.arm("writer.mid_batch_append", 1)
        store.put_batch([Message(topic="T", body=body)] * 32)  # crashes the writer: reput restarts too
        started = time.monotonic()
        while not store.put(Message(topic="T", body=b"after")).ok:
            assert store.supervisor.state is SupervisorState.RUNNING, store.supervisor.state
            assert time.monotonic() - started < 20
            time.sleep(0.1)
        assert store.supervisor.state is SupervisorState.RUNNING
        assert plan.fired["writer.mid_batch_append"] == 1
    finally:
        plan.disarm_all()
        slow = False  # (the close waits for dispatch to catch up: 47 batches at 0.3 s otherwise)
        store.close()


def test_the_puts_a_failed_pass_appended_are_answered_stored_and_no_failed_put_is_stored(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 124 F3: a writer pass that failed midway answered every put of it SERVICE_NOT_AVAILABLE,
    those it had appended too, which were served (209-218 a crash): a producer that retries on
    that answer stored each twice. Here the writer fails once a pass has appended three puts or
    more, before it appends the next; those are answered stored, the rest are not stored."""
    import threading
    from typing import Any

    from mqstore import Message
    from mqstore.actors.commitlog_writer import CommitLogWriter

    real_append = CommitLogWriter._append
    armed = threading.Event()
    fired: list[int] = []

    def failing_append(self: CommitLogWriter, put: Any, answers: list[Any], group_commits: list[Any]) -> None:
        if armed.is_set() and len(answers) >= 3:
            armed.clear()
            fired.append(len(answers))
            raise RuntimeError("the writer fails midway through a pass")
        real_append(self, put, answers, group_commits)

    monkeypatch.setattr(CommitLogWriter, "_append", failing_append)
    store = h.open_small(store_dir)
    unpublished: list[int] = []

    def published_before_answered(future: Any) -> None:  # review 128 F6: reads told after it wait for it
        r = future.result()
        if r.stored and r.commitlog_offset + r.wrote_bytes > store.read_view.acked_end:
            unpublished.append(r.commitlog_offset)

    try:
        futures = []
        for i in range(20_000):  # batches of 8 queues: each put is its own append
            futures.append(([b"%06d" % i], store.put_batch_async([Message(topic="T", queue_id=i % 8, body=b"%06d" % i)])))
            futures[-1][1].add_done_callback(published_before_answered)
            if i == 2_000:
                armed.set()
        results = [(bodies, future.result(30)) for bodies, future in futures]
        assert len(fired) == 1 and fired[0] >= 3, fired  # (armed mid-pass: that pass had appended more)
        stored = {b for bodies, r in results if r.stored for b in bodies}
        failed = {b for bodies, r in results if not r.stored for b in bodies}
        assert failed and all(r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE for _, r in results if not r.stored)
        served: set[bytes] = set()
        for queue_id in range(8):
            offset = 0
            while (got := store.get("T", queue_id, offset, 64)).messages:
                served.update(m.body for m in got.messages)
                offset = got.next_begin_offset
        assert stored <= served and not (failed & served), (len(stored - served), len(failed & served))
        assert not unpublished, unpublished[:5]
    finally:
        store.close()


@pytest.mark.parametrize("commit_fails", [None, "at once", "after one file"])
@pytest.mark.parametrize("stored_before", [300, 0])
def test_a_failed_pass_with_write_buffers_leaves_no_hole_before_the_segments_it_wrote_directly(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, commit_fails: str | None, stored_before: int
) -> None:
    """Review 128 F1: with the transient store pool, a pass that ran out of write buffers wrote
    its later segments straight into their maps; failing midway, the earlier segments' buffered
    bytes never reached their files: a hole before records of puts answered refused. The
    restart carried on past it, handed their queue offsets out again, and a kill -9 then cut
    the log at the hole. The failed pass now commits its buffers first. Review 129 F1: where
    that commit fails too (`commit_fails`), the hole stays; the restart ends the log at it,
    as nothing past where the log was read was acknowledged (`stored_before` 0: nothing was)."""
    import threading
    import time
    from typing import Any

    import mqstore
    from mqstore import Message
    from mqstore.actors.commitlog_writer import CommitLogWriter
    from mqstore.storage.commitlog import CommitLog

    real_commit = CommitLog.commit
    commit_armed = [False]

    def commit(self: CommitLog, least_pages: int) -> bool:
        if commit_armed[0]:
            commit_armed[0] = False
            if commit_fails == "after one file":
                real_commit(self, least_pages)
            raise OSError(28, "injected: no space left on device")
        return real_commit(self, least_pages)

    monkeypatch.setattr(CommitLog, "commit", commit)

    settings = dict(mapped_file_size_commitlog_bytes=64 * 1024, transient_store_pool_enable=True, transient_store_pool_size=2)
    real_append = CommitLogWriter._append
    armed = threading.Event()
    count = [0]

    def failing_append(self: CommitLogWriter, put: Any, answers: list[Any], group_commits: list[Any]) -> None:
        if armed.is_set():
            count[0] += 1
            if count[0] == 200:
                armed.clear()
                commit_armed[0] = commit_fails is not None
                raise RuntimeError("the writer fails midway through a pass")
        real_append(self, put, answers, group_commits)

    real_append_run = CommitLogWriter._append_run

    def failing_append_run(self: CommitLogWriter, chunk: list[Any], *args: Any) -> None:
        if armed.is_set() and count[0] + len(chunk) >= 200:  # (a fresh store's queues meet in runs)
            count[0] = 199
            return failing_append(self, chunk[0], *args[1:])
        if armed.is_set():
            count[0] += len(chunk)
        real_append_run(self, chunk, *args)

    monkeypatch.setattr(CommitLogWriter, "_append", failing_append)
    monkeypatch.setattr(CommitLogWriter, "_append_run", failing_append_run)
    acked: dict[bytes, tuple[int, int]] = {}
    store = mqstore.open(store_dir, **settings)
    n = 0

    def put_round(how_many: int) -> None:
        nonlocal n
        futures = []
        for _ in range(how_many):
            key = b"m%010d" % n
            n += 1
            futures.append((key, n % 8, store.put_async(Message(topic="T", queue_id=n % 8, body=key + b"." * 2000))))
        for key, queue_id, future in futures:
            r = future.result(30)
            if r.ok:
                acked[key] = (queue_id, r.queue_offset)

    def unserved(s: mqstore.MessageStore) -> list[bytes]:
        served = {}
        for queue_id in range(8):
            offset = 0
            while (got := s.get("T", queue_id, offset, 64)).messages:
                served.update({(queue_id, m.queue_offset): bytes(m.body[:11]) for m in got.messages})
                offset = got.next_begin_offset
        return [key for key, place in acked.items() if served.get(place) != key]

    try:
        put_round(stored_before)
        armed.set()
        put_round(256)  # one pass of ~8 segments: past the pool's two free buffers
        assert count[0] >= 200
        deadline = time.monotonic() + 10
        while not store.put(Message(topic="P", body=b"probe")).ok:  # the writer's restart
            assert time.monotonic() < deadline
            time.sleep(0.05)
        put_round(300)
        store.flush()
        assert unserved(store) == []
    finally:
        store.close()
    with mqstore.open(store_dir, **settings) as reopened:
        assert unserved(reopened) == []


def test_a_cleaner_crash_between_its_deletions_is_restarted_alone(store_dir: Path) -> None:
    """`cleaner.mid_delete` (review 130 I1: listed, never hit): the cleaner crashes after the
    log's expired segments went and before their queues' files did. It is restarted alone, the
    manual deletion that hit it answers 0, and the next one cleans the queues it left."""
    plan = FaultPlan()
    settings = dict(file_reserved_time_hours=0, delete_when=";".join(f"{h:02d}" for h in range(24)))
    with h.open_small(store_dir, faults=plan, **settings) as store:
        for i in range(PUTS_BETWEEN_ALLOCATIONS * 3):
            assert store.put(Message(topic="t", body=b"%d" % i + b"." * 400)).ok
        h.wait_dispatched(store)
        segments = len(list((store_dir / "commitlog").iterdir()))
        plan.arm("cleaner.mid_delete", 1)
        assert store.delete_expired_files_now() == 0  # (its answer: the cleaner crashed)
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the cleaner's restart")
        record = store.supervisor.restarts[-1]
        assert (record.failed, record.restarted) == ("cleaner", ("cleaner",))
        assert plan.fired["cleaner.mid_delete"] == 1
        assert len(list((store_dir / "commitlog").iterdir())) < segments  # they went before the crash
        assert store.min_offset("t", 0) == 0  # their queue's units not yet
        h.wait_until(lambda: "cleaner" in store.supervisor.peers, what="the cleaner back")
        store.delete_expired_files_now()
        assert store.min_offset("t", 0) > 0
        got = store.get("t", 0, store.min_offset("t", 0), 1)
        assert got.found and store.running
