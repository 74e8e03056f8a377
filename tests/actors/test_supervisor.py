"""The supervisor's contract: start in TREE order behind a ready handshake, stop in reverse,
restart with back-off, give up cleanly past the restart intensity, and never hang a host
that forgets close()."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mqstore import FaultPlan, InjectedFault, Message, PutResult, StoreLockedError
from mqstore import supervisor as supervisor_module
from mqstore.actors.commitlog_writer import CommitLogWriter
from mqstore.actors.consume_queue import ConsumeQueueService
from mqstore.storage.status import GetMessageStatus, PutMessageStatus
from mqstore.actors.reput import REPUT_LINGER_MS, ReputMessageService
from mqstore.faults import HoldAt
from mqstore.messages import Tick
from mqstore.supervisor import MAX_RESTARTS, TREE, Supervisor, SupervisorState
from mqstore.ticker import ManualTicker

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py

EXIT_WITHOUT_CLOSE_MAX_S = 10.0
TICK_WAIT_S = 10.0


def _record_lifecycle(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """(event, child, alive) for each start handshake passed and each stop begun."""
    events: list[tuple[str, str, bool]] = []
    start_child, stop_child = Supervisor._start_child, Supervisor._stop_child

    def recording_start(self: Supervisor, name: str, *, first: bool) -> None:
        start_child(self, name, first=first)
        events.append(("started", name, self.ctx.peers[name].is_alive()))

    def recording_stop(self: Supervisor, name: str) -> bool:
        ref = self.ctx.peers.get(name)
        if ref is not None:
            events.append(("stopping", name, ref.is_alive()))
        return stop_child(self, name)

    monkeypatch.setattr(Supervisor, "_start_child", recording_start)
    monkeypatch.setattr(Supervisor, "_stop_child", recording_stop)
    return events


def test_children_start_in_tree_order_and_stop_in_reverse(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _record_lifecycle(monkeypatch)
    store = h.open_small(store_dir)
    expected = [spec.name for spec in TREE if spec.enabled(store.config)]
    # The writer recovers the log first: the index's and the queues' recovery need its end.
    assert expected[:5] == ["allocator", "writer", "flush", "index", "consume_queue"]
    assert expected.index("consume_queue") < expected.index("reput")
    assert events == [("started", name, True) for name in expected]  # each alive once its handshake passed
    assert store.put(Message(topic="t", body=b"x")).ok
    events.clear()
    assert store.close() is True
    assert events == [("stopping", name, True) for name in reversed(expected)]
    assert not Path(store.config.abort_path).exists()


def test_a_child_failing_in_on_start_fails_open_and_releases_everything(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _record_lifecycle(monkeypatch)
    refs: list[Any] = []
    start_child = Supervisor._start_child

    def keep_refs(self: Supervisor, name: str, *, first: bool) -> None:
        start_child(self, name, first=first)
        refs.append(self.ctx.peers[name])

    monkeypatch.setattr(Supervisor, "_start_child", keep_refs)

    def broken_on_start(self: ConsumeQueueService) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(ConsumeQueueService, "on_start", broken_on_start)
    with pytest.raises(OSError, match="disk on fire"):  # the owner's own error, not the handshake's
        h.open_small(store_dir)
    started = [name for event, name, _ in events if event == "started"]
    assert started == ["allocator", "writer", "flush", "index"], "a child after the failed one was started"
    # The failed child first (dead already: a start that times out is stopped, review 78 M2), then the rest in reverse.
    stopping = [(name, alive) for event, name, alive in events if event == "stopping"]
    assert stopping == [("consume_queue", False), ("index", True), ("flush", True), ("writer", True), ("allocator", True)]
    assert not any(ref.is_alive() for ref in refs)

    monkeypatch.undo()  # the disk is fine again: the lock was released, the store opens
    with h.open_small(store_dir) as store:
        assert store.put(Message(topic="t", body=b"x")).ok


def test_a_child_failing_to_restart_counts_as_another_failure_and_is_retried(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = FaultPlan()
    store = h.open_small(store_dir, faults=plan)
    try:
        assert store.put(Message(topic="t", body=b"before", keys=["before"])).ok
        real_on_start = CommitLogWriter.on_start
        failures = [1]

        def on_start_failing_once(self: CommitLogWriter) -> None:
            if failures[0]:
                failures[0] -= 1
                raise OSError("segment busy")
            real_on_start(self)

        monkeypatch.setattr(CommitLogWriter, "on_start", on_start_failing_once)
        plan.arm("writer.after_append")
        crashed = store.put(Message(topic="t", body=b"crash", keys=["crash"]))
        assert crashed.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the writer's restart")
        record = store.supervisor.restarts[0]
        assert record.failed == "writer" and record.restarted == tuple(store.supervisor._restart_group("writer"))
        # The restart that worked cured the original fault; the failed start in between is
        # retried under the same failure rather than counted as a second one.
        assert "InjectedFault" in record.error or "segment busy" in record.error
        assert failures == [0]
        assert store.running
        after = store.put(Message(topic="t", body=b"after", keys=["after"]))
        assert after.ok
        h.wait_dispatched(store)
        bodies = [m.body for m in store.get("t", 0, 0, 10).messages]
        assert bodies == [b"before", b"crash", b"after"]  # appended before the crash, so kept
    finally:
        store.close()


def test_too_many_restarts_fail_the_store_cleanly(store_dir: Path) -> None:
    plan = FaultPlan()
    ticker = ManualTicker()
    fatal: list[BaseException] = []
    fatal_called = threading.Event()

    def on_fatal(error: BaseException) -> None:
        fatal.append(error)
        fatal_called.set()

    store = h.open_small(store_dir, faults=plan, on_fatal=on_fatal, ticker=ticker)
    acked: list[str] = []
    for i in range(20):
        assert store.put(Message(topic="t", body=b"ok", keys=[f"k{i}"])).ok
        acked.append(f"k{i}")
    h.wait_dispatched(store)
    sup = store.supervisor
    ticker.sleeps.clear()  # the reput lingers of the puts above
    plan.arm("writer.mid_batch_append", 100)
    # Every put that reaches the writer crashes it. One at a time, each after the previous
    # restart finished: no put races a restart, so every count below is exact.
    for n in range(1, MAX_RESTARTS + 1):
        crashed = store.put(Message(topic="t", body=b"doomed"))
        assert crashed.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        h.wait_until(lambda: len(sup.restarts) == n, what=f"restart {n}")
    assert not fatal_called.is_set() and store.running
    store.put(Message(topic="t", body=b"doomed"))  # one failure more than the intensity allows
    assert fatal_called.wait(30), "the supervisor never gave up"
    assert sup.state is SupervisorState.FAILED and not store.running
    assert len(fatal) == 1 and sup.fatal_error is fatal[0] and isinstance(fatal[0], InjectedFault)
    assert plan.fired["writer.mid_batch_append"] == MAX_RESTARTS + 1
    assert [r.failed for r in sup.restarts] == ["writer"] * MAX_RESTARTS
    # Back-off doubles from BACKOFF_FIRST_MS up to BACKOFF_MAX_MS with the failures in the
    # period, on the supervisor's ticker: slept exactly that, and the restarts that far apart.
    expected = [
        min(supervisor_module.BACKOFF_FIRST_MS * 2**k, supervisor_module.BACKOFF_MAX_MS) for k in range(MAX_RESTARTS)
    ]
    assert [r.backoff_ms for r in sup.restarts] == expected
    assert ticker.sleeps == expected  # and nothing else slept on it (no linger: nothing dispatched)
    assert [b.at_ms - a.at_ms for a, b in zip(sup.restarts, sup.restarts[1:])] == expected[1:]
    assert not sup.peers, "children left running after giving up"

    started = time.monotonic()
    refused = store.put(Message(topic="t", body=b"late"))
    assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert store.get("t", 0, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.close() is False
    assert time.monotonic() - started < 5
    assert Path(store.config.abort_path).exists(), "the abort file must stay so the next start recovers"
    assert len(fatal) == 1

    with h.open_small(store_dir) as reopened:  # the lock was released
        assert reopened.supervisor.recovery is not None and not reopened.supervisor.recovery.last_exit_ok
        h.wait_dispatched(reopened)
        for key in acked:
            assert [m.body for m in reopened.query("t", key).messages] == [b"ok"]


def test_failures_further_apart_than_the_restart_period_never_add_up(store_dir: Path) -> None:
    plan = FaultPlan()
    ticker = ManualTicker()
    with h.open_small(store_dir, faults=plan, ticker=ticker) as store:
        sup = store.supervisor
        for n in range(1, MAX_RESTARTS + 3):
            plan.arm("writer.mid_batch_append")
            assert store.put(Message(topic="t", body=b"doomed")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            h.wait_until(lambda: len(sup.restarts) == n, what=f"restart {n}")
            ticker.advance(supervisor_module.RESTART_PERIOD_MS + 1)  # the previous failure leaves the window
        assert sup.state is SupervisorState.RUNNING
        assert [r.backoff_ms for r in sup.restarts] == [supervisor_module.BACKOFF_FIRST_MS] * (MAX_RESTARTS + 2)
        assert store.put(Message(topic="t", body=b"fine")).ok


def test_the_ticker_ticks_children_when_its_time_comes(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reput's linger is a ticker sleep: moving the time, one after the first tick pass made
    # the 100 ms tick due at the test's 99 (a flake under load; every time with the put below).
    ticker = ManualTicker(sleeps_move_time=False)
    ticks: list[int] = []
    seen = threading.Event()
    real_handle = ReputMessageService.handle

    def recording(self: ReputMessageService, message: Any) -> Any:
        # This store's reput only: an earlier test's store still stopping (its reput ticked
        # by its own, real, ticker) made a tick "seen" at the 99 ms (CI, stop 42).
        if isinstance(message, Tick) and self.ctx.ticker is ticker:
            ticks.append(message.now_ms)
            seen.set()
        return real_handle(self, message)

    monkeypatch.setattr(ReputMessageService, "handle", recording)
    with h.open_small(store_dir, ticker=ticker) as store:
        assert seen.wait(TICK_WAIT_S)  # everything is due at once on the first pass
        assert store.put(Message(topic="t", body=b"x")).ok  # reput lingers after that pass
        h.wait_dispatched(store)
        seen.clear()
        first = len(ticks)
        ticker.advance(99)  # reput ticks every 100 ms of the ticker
        assert not seen.wait(0.2) and len(ticks) == first
        ticker.advance(1)
        assert seen.wait(TICK_WAIT_S) and len(ticks) == first + 1


def test_reput_lingers_one_ticker_ms_per_notice(store_dir: Path) -> None:
    ticker = ManualTicker()
    with h.open_small(store_dir, ticker=ticker) as store:
        for i in range(5):
            assert store.put(Message(topic="t", body=b"%d" % i)).ok
            h.wait_dispatched(store)  # one notice per put: nothing to coalesce
        assert ticker.sleeps == [REPUT_LINGER_MS] * 5


CHILD = textwrap.dedent(
    """
    import os, sys
    import mqstore
    store = mqstore.open(sys.argv[1], flush_disk_type="SYNC_FLUSH",
                         mapped_file_size_commitlog_bytes=64 * 1024,
                         mapped_file_size_consume_queue_bytes=20 * 1000,
                         max_hash_slot_num=5000, max_index_num=20000)
    n = 0
    for i in range(int(sys.argv[2])):
        result = store.put(mqstore.Message(topic="host", body=b"m%d" % i, keys=["k%d" % i]))
        assert result.ok, result
        n += 1
    print("acked", n, flush=True)
    if sys.argv[3] == "abrupt":
        os._exit(0)  # no atexit, no close: only the disk is left
    # else: fall off the end without close()
    """
)


@pytest.mark.parametrize("ending", ["forgets_close", "abrupt"])
def test_a_host_exiting_without_close_exits_promptly_and_keeps_acked_messages(store_dir: Path, ending: str) -> None:
    count = 150  # rolls a couple of 64 KiB segments
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(store_dir), str(count), "abrupt" if ending == "abrupt" else "normal"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"acked {count}" in done.stdout
    assert elapsed < EXIT_WITHOUT_CLOSE_MAX_S, f"the host took {elapsed:.1f} s to exit"
    with h.open_small(store_dir) as store:
        h.wait_dispatched(store)
        records = h.walk_queue(store, "host", 0, h.wait_dispatched(store))
        assert [records[i].body for i in range(count)] == [b"m%d" % i for i in range(count)]
        assert [m.body for m in store.query("host", f"k{count - 1}").messages] == [b"m%d" % (count - 1)]


def test_a_writer_that_did_not_stop_keeps_the_store_locked_until_it_ends(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stuck mid-append (a stalled disk; here a held fault point) past the stop
    timeout: close() released the lock anyway, another opener acknowledged a put at the same
    offset, and the old writer, once woken, wrote over it (the review's reproduction: the
    record was damaged at the next open). Now the lock is kept until the writer has ended."""
    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 0.5)
    plan = HoldAt("writer.mid_batch_append", hold_s=60)
    first = h.open_small(store_dir, faults=plan)
    assert first.put(Message(topic="t", body=b"first")).ok
    plan.armed.set()
    first.put_async(Message(topic="t", body=b"H" * 200))
    assert plan.entered.wait(5)
    assert first.close() is False  # the writer never answered: not a clean stop
    with pytest.raises(StoreLockedError):
        h.open_small(store_dir)  # it may still write: the store is still ours
    assert not first.supervisor.lock_released.is_set()
    plan.release.set()
    assert first.supervisor.lock_released.wait(10)  # the writer ended, then the lock went
    with h.open_small(store_dir) as second:
        acked = second.put(Message(topic="t", body=b"second's"))
        assert acked.ok
    with h.open_small(store_dir) as third:
        got = third.get("t", 0, acked.queue_offset, 1)
        assert got.status is GetMessageStatus.FOUND and got.messages[0].body == b"second's"


def test_a_restart_waits_for_no_straggler_it_gives_up_and_keeps_the_lock(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer fails while reput, restarted with it, is stuck mid-dispatch past the stop
    timeout. Starting a second reput beside the first would give its files two writers: the
    supervisor gives up instead (FAILED), and keeps the lock until the stuck one ends."""
    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 0.5)
    plan = HoldAt("reput.mid_dispatch", hold_s=60)
    store = h.open_small(store_dir, faults=plan)
    assert store.put(Message(topic="t", body=b"first")).ok
    plan.armed.set()
    assert store.put(Message(topic="t", body=b"held in dispatch")).ok
    assert plan.entered.wait(5)
    plan.arm("writer.mid_batch_append")
    store.put(Message(topic="t", body=b"the writer fails here"))
    h.wait_until(lambda: store.supervisor.state is SupervisorState.FAILED, what="the supervisor gave up")
    assert "reput did not stop" in repr(store.supervisor.fatal_error)
    assert not store.supervisor.lock_released.is_set()
    with pytest.raises(StoreLockedError):
        h.open_small(store_dir)
    plan.release.set()
    assert store.supervisor.lock_released.wait(10)
    store.close()
    with h.open_small(store_dir) as again:
        assert [m.body for m in again.get("t", 0, 0, 8).messages][:2] == [b"first", b"held in dispatch"]


def test_the_lock_is_kept_until_a_late_actors_on_stop_has_returned(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pykka marks an actor stopped before its on_stop runs, and the allocator's on_stop deleted
    the segments it made ahead: waiting for the flag, the lock went while a late allocator was
    still to delete a segment a second owner was writing (the review's reproduction lost 60 of
    200 acknowledged puts). The lock is now kept until the stop itself has returned. (Its files
    made ahead have no name now, and its release deletes nothing; the rule stands for any
    actor's on_stop, which the late allocator here stands for.)"""
    from mqstore.actors.allocator import AllocateMappedFileService

    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 0.5)
    plan = HoldAt("allocator.mid_allocation", hold_s=60)
    in_release, finish_release = threading.Event(), threading.Event()
    release = AllocateMappedFileService.release

    def slow_release(self: AllocateMappedFileService) -> None:
        if plan.entered.is_set():  # the late one, not the restarts of other tests
            in_release.set()
            finish_release.wait(10)
        release(self)

    monkeypatch.setattr(AllocateMappedFileService, "release", slow_release)
    store = h.open_small(store_dir, faults=plan, allocate_wait_timeout_ms=200)
    plan.armed.set()
    while not plan.entered.is_set():
        assert store.put(Message(topic="t", body=b"a" * 1000)).ok
    assert store.close() is False
    plan.release.set()  # the allocator finishes its allocation, then stops: on_stop runs
    assert in_release.wait(10)
    assert not store.supervisor.lock_released.wait(0.3)  # stopped in pykka's eyes, not yet done
    with pytest.raises(StoreLockedError):
        h.open_small(store_dir)
    finish_release.set()
    assert store.supervisor.lock_released.wait(10)
    with h.open_small(store_dir) as again:
        assert again.put(Message(topic="t", body=b"after")).ok


def test_an_open_whose_actor_start_times_out_keeps_the_lock_until_that_actor_ends(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 78 M2: an actor whose start timed out (its recovery made no progress in 30 s,
    e.g. across a 35 s pause) was only dropped from the peers: it went on recovering the files
    after the failed open released the lock, and a retried open's own recovery read a segment
    it deleted. It is now stopped, or kept as a straggler holding the lock until it ends."""
    with h.open_small(store_dir) as store:
        assert store.put(Message(topic="t", body=b"before")).ok
    monkeypatch.setattr(supervisor_module, "START_TIMEOUT_S", 0.3)
    monkeypatch.setattr(supervisor_module, "PAUSE_GRACE_S", 0.1)
    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 0.3)
    finish = threading.Event()
    on_start = ConsumeQueueService.on_start

    def slow_on_start(self: ConsumeQueueService) -> None:
        finish.wait(10)  # a recovery that reports no progress for longer than the start timeout
        on_start(self)

    monkeypatch.setattr(ConsumeQueueService, "on_start", slow_on_start)
    with pytest.raises(TimeoutError, match="consume_queue actor did not start"):
        h.open_small(store_dir)
    with pytest.raises(StoreLockedError):  # the late actor still owns the files
        h.open_small(store_dir)
    monkeypatch.setattr(ConsumeQueueService, "on_start", on_start)
    finish.set()
    deadline = time.monotonic() + 10
    while True:
        try:
            again = h.open_small(store_dir)
            break
        except StoreLockedError:
            assert time.monotonic() < deadline, "the lock was never released"
            time.sleep(0.05)
    with again:
        assert [m.body for m in again.get("t", 0, 0, 8).messages] == [b"before"]


class _IndexRestartThatHangs:
    """An index actor that fails, and whose restarts' on_start makes no progress until
    `finish` is set (a pause, a stalled disk): its start times out, then its stop, and it is a
    straggler. `most_starting`: the most index actors inside on_start at once."""

    def __init__(self, store_dir: Path, monkeypatch: pytest.MonkeyPatch, *, stop_timeout_s: float) -> None:
        from mqstore.actors.index import IndexActor

        monkeypatch.setattr(supervisor_module, "START_TIMEOUT_S", 0.3)
        monkeypatch.setattr(supervisor_module, "PAUSE_GRACE_S", 0.1)
        monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", stop_timeout_s)
        self.finish = threading.Event()
        self.most_starting = 0
        slow, starting, guard, on_start = threading.Event(), [0], threading.Lock(), IndexActor.on_start

        def counted_on_start(actor: IndexActor) -> None:
            with guard:
                starting[0] += 1
                self.most_starting = max(self.most_starting, starting[0])
            try:
                if slow.is_set():
                    self.finish.wait(20)
                on_start(actor)
            finally:
                with guard:
                    starting[0] -= 1

        monkeypatch.setattr(IndexActor, "on_start", counted_on_start)
        plan = FaultPlan()
        self.store = h.open_small(store_dir, faults=plan)
        assert self.store.put(Message(topic="t", body=b"before")).ok
        slow.set()
        plan.arm("index.mid_write")
        self.store.put(Message(topic="t", body=b"the index fails on this one", keys=["k"]))

    def end(self) -> None:
        self.finish.set()
        self.store.close()


def test_a_restart_whose_start_times_out_never_starts_a_second_owner_beside_the_first(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 79's note: a restarted actor whose start timed out and then did not stop (still
    recovering its files) was kept as a straggler, and the failure it counted restarted the
    group again: a second incarnation recovered the same files beside the first. Now a
    restart waits for the straggler of a name it starts; if it still runs, the store is
    given up, the lock kept until the straggler ends (as for an actor that does not stop)."""
    hangs = _IndexRestartThatHangs(store_dir, monkeypatch, stop_timeout_s=0.3)
    store = hangs.store
    try:
        h.wait_until(lambda: store.supervisor.state is SupervisorState.FAILED, what="the supervisor gave up")
        assert hangs.most_starting == 1, "a second index actor started beside the one still starting"
        assert "index" in repr(store.supervisor.fatal_error)
        assert not store.supervisor.lock_released.is_set()
        hangs.finish.set()
        assert store.supervisor.lock_released.wait(10)
    finally:
        hangs.end()
    with h.open_small(store_dir) as again:
        assert [m.body for m in again.get("t", 0, 0, 8).messages][0] == b"before"


def test_a_close_racing_a_restart_that_gives_up_returns_with_the_give_up(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 81 M1: a give-up ended the supervisor's thread without saying its shutdown was
    done; a close() asked meanwhile waited out 3 x STOP_TIMEOUT_S (30 s), then said False."""
    waiting = threading.Event()
    earlier_still_running = Supervisor._earlier_still_running

    def noted(self: Supervisor, names: list[str]) -> list[str]:
        waiting.set()
        return earlier_still_running(self, names)

    monkeypatch.setattr(Supervisor, "_earlier_still_running", noted)
    hangs = _IndexRestartThatHangs(store_dir, monkeypatch, stop_timeout_s=2.0)
    store = hangs.store
    try:
        h.wait_until(lambda: waiting.is_set() and bool(store.supervisor._stragglers), what="the restart's wait")  # noqa: SLF001
        closed: list[tuple[bool, float]] = []
        closer = threading.Thread(target=lambda: closed.append((store.close(), time.monotonic())))
        closer.start()
        h.wait_until(lambda: store.supervisor.state is SupervisorState.FAILED, what="the give-up")
        failed_at = time.monotonic()
        closer.join(10)
        assert closed and closed[0][0] is False
        assert closed[0][1] - failed_at < 1.0, "close() waited on after the give-up"
    finally:
        hangs.end()
    assert store.supervisor.lock_released.wait(20)


def test_a_writer_restart_beside_an_allocator_stalled_in_a_file_creation_keeps_the_store(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 80 F2: the writer's restart group took the allocator too (its files made ahead
    had names then, which a restarted writer's recovery could delete); an allocator stalled in
    a file creation past the stop's wait made one writer crash give the whole store up. It is
    not restarted with the writer now: the new writer makes its segments itself meanwhile."""
    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 0.3)
    monkeypatch.setattr(supervisor_module, "PAUSE_GRACE_S", 0.1)
    plan = HoldAt("allocator.mid_allocation", hold_s=60)
    store = h.open_small(store_dir, faults=plan, allocate_wait_timeout_ms=100)
    try:
        assert store.put(Message(topic="t", body=b"first")).ok
        plan.armed.set()
        bodies = [b"first"]
        while not plan.entered.is_set():  # a roll-over asks, the allocator stalls
            bodies.append(b"a%05d" % len(bodies) + b"x" * 900)
            assert store.put(Message(topic="t", body=bodies[-1])).ok
        plan.arm("writer.after_append")
        bodies.append(b"the writer fails after appending this")
        store.put(Message(topic="t", body=bodies[-1]))  # appended (kept by recovery), not acknowledged
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the writer's restart")
        assert store.supervisor.state is SupervisorState.RUNNING
        assert store.supervisor.restarts[0].restarted == ("writer", "reput")
        for _ in range(200):  # more roll-overs: made by the writer while the allocator stalls
            bodies.append(b"b%05d" % len(bodies) + b"x" * 900)
            assert store.put(Message(topic="t", body=bodies[-1])).ok
        plan.release.set()
    finally:
        plan.release.set()
        store.close()
    with h.open_small(store_dir) as again:
        got: list[bytes] = []
        while page := again.get("t", 0, len(got), 64).messages:
            got.extend(bytes(m.body) for m in page)
        assert got == bodies


def test_a_put_answered_just_after_its_reply_timeout_is_answered_as_stored(store_dir: Path) -> None:
    """Review 78 M3: a pause (SIGSTOP, a suspended VM) or a host thread holding the GIL runs
    the clock, not the writer; the put's wait timed out at the resume and answered "not
    stored" for a put the writer stored a moment later, and a retry stored it twice. The wait
    now gives the answer PAUSE_GRACE_S more. (The writer held 0.4 s stands for the pause.)"""
    hold = HoldAt("writer.mid_batch_append", hold_s=0.4)
    with h.open_small(store_dir, faults=hold) as store:
        assert store.put(Message(topic="t", body=b"first")).ok
        store._reply_timeout_s = 0.2  # noqa: SLF001
        hold.armed.set()
        result = store.put(Message(topic="t", body=b"held"))
        assert result.ok, result
        assert [m.body for m in store.get("t", 0, 0, 8).messages] == [b"first", b"held"]


def test_a_busy_timeout_of_zero_refuses_only_puts_that_waited(store_dir: Path) -> None:
    """Review 103 L2: `os_page_cache_busy_timeout_ms=0` refused every put OS_PAGE_CACHE_BUSY
    (any wait in the mailbox, in ns, is more than 0). RocketMQ's check is whole milliseconds
    (`diff > osPageCacheBusyTimeOutMills`): busy once a put waited a millisecond past it."""
    hold = HoldAt("writer.mid_batch_append", hold_s=0.2)
    with h.open_small(store_dir, faults=hold, os_page_cache_busy_timeout_ms=0) as store:
        # (Not all: under load a put may wait a millisecond in the mailbox, and is then busy;
        # before the fix every put was.)
        taken = sum(store.put(Message(topic="t", body=b"%d" % i)).ok for i in range(20))
        assert taken >= 1
        hold.armed.set()
        held_results: list[PutResult] = []
        for _ in range(50):  # (under load the held put itself may wait a millisecond: busy, not held)
            held = threading.Thread(target=lambda: held_results.append(store.put(Message(topic="t", body=b"held"))))
            held.start()
            if hold.entered.wait(1):
                break
            held.join(5)
        assert hold.entered.is_set()
        behind = store.put(Message(topic="t", body=b"behind"))  # waits the hold out in the mailbox
        held.join(5)
        assert behind.status is PutMessageStatus.OS_PAGE_CACHE_BUSY, behind
        assert held_results[-1].ok, held_results
        assert store.wait_for_messages("t", 0, taken, 5)  # the held put, told by another thread
        bodies = [bytes(m.body) for m in store.get("t", 0, 0, 64).messages]
        assert bodies[-1] == b"held" and b"behind" not in bodies


def test_an_actor_that_stops_just_after_the_stop_timeout_is_restarted_not_given_up(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 78 M1: a pause of more than STOP_TIMEOUT_S while the supervisor restarted a
    crashed actor made it "not stop within 10 s" at the resume, and the store was given up
    for good after one crash. The stop's wait now gives it PAUSE_GRACE_S more. (A stop that
    takes 0.5 s against a 0.2 s timeout stands for the pause.)"""
    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 0.2)
    on_stop = ReputMessageService.on_stop
    slow = threading.Event()

    def slow_on_stop(self: ReputMessageService) -> None:
        if slow.is_set():
            time.sleep(0.5)
        on_stop(self)

    monkeypatch.setattr(ReputMessageService, "on_stop", slow_on_stop)
    plan = FaultPlan()
    with h.open_small(store_dir, faults=plan) as store:
        assert store.put(Message(topic="t", body=b"before")).ok
        slow.set()
        plan.arm("consume_queue.mid_write")  # its crash restarts reput with it: reput, alive, stops slowly
        store.put(Message(topic="t", body=b"crashes the queues' owner"))
        h.wait_until(lambda: store.supervisor.restart_count >= 1 and store.put(Message(topic="t", body=b"after")).ok,
                     what="the restart")  # fmt: skip
        assert store.supervisor.state is SupervisorState.RUNNING


def _watch_only_for_the_close(self: Supervisor) -> None:
    """The supervisor's thread, waiting only for the close: a test handles the failures itself."""
    while not any(isinstance(e, supervisor_module._Stop) for e in list(self._events.queue)):
        time.sleep(0.02)
    self._shutdown()


def test_a_restart_blocked_by_a_dead_peer_waits_for_that_peers_restart(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 117 F3: reput crashed, and its restart could not start while the ConsumeQueue
    actor, which it needs, had died meanwhile: the supervisor put reput's failure back at each
    try, each counted against the budget and doubled the back-off (four restarts for one fault),
    and after the ConsumeQueue actor's own restart (which restarts reput with it) a stale retry
    restarted reput once more. Under load, two faults used the budget up (FAILED). The retry
    waits for the pending restart that covers it, and a stale one is dropped. (The supervisor's
    own thread only waits for the close here: the failures are handled on this thread.)"""
    import pykka

    from mqstore.actors.base import ChildFailed

    monkeypatch.setattr(Supervisor, "_watch", _watch_only_for_the_close)
    store = h.open_small(store_dir)
    try:
        supervisor = store.supervisor
        starts: list[str] = []
        start_child = Supervisor._start_child

        def reput_needs_the_dead_queues(self: Supervisor, name: str, first: bool) -> None:
            starts.append(name)
            if name == "reput" and len(starts) == 1:
                # (its peer died while it started: that failure is queued)
                self._events.put(ChildFailed(name="consume_queue", error=InjectedFault("died")))
                raise pykka.ActorDeadError("consume_queue stopped")
            start_child(self, name, first=first)

        monkeypatch.setattr(Supervisor, "_start_child", reput_needs_the_dead_queues)
        assert supervisor._handle_failure(ChildFailed(name="reput", error=InjectedFault("reput")))
        queued = [e for e in list(supervisor._events.queue) if isinstance(e, ChildFailed)]
        assert [(e.name, e.retry) for e in queued] == [("consume_queue", False)]  # no retry of reput's
        supervisor._events.queue.clear()
        # The covering restart: both started again.
        assert supervisor._handle_failure(ChildFailed(name="consume_queue", error=InjectedFault("died")))
        assert starts == ["reput", "consume_queue", "reput"]
        # A retry that restart overtook: dropped, not counted, nothing restarted.
        recent = len(supervisor._recent_failures)
        assert supervisor._handle_failure(ChildFailed(name="reput", error=InjectedFault("reput"), retry=True))
        assert len(supervisor._recent_failures) == recent and starts == ["reput", "consume_queue", "reput"]
        assert store.put(Message(topic="t", body=b"after")).ok
        assert store.wait_for_messages("t", 0, 0, 10)
    finally:
        assert store.close()


def test_a_writer_restarted_while_the_queues_were_dead_is_resumed_by_their_restart(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 123 F2: the writer and the ConsumeQueue actor crashed close together; the
    writer's restart could not be resumed (the queues' owner dead), and the queues' own
    restart did not resume it: every put was refused "store not writeable" for good, the
    store RUNNING, no give-up. (The failures are handled on this thread, as above.)"""
    import pykka

    from mqstore.actors.base import ChildFailed

    monkeypatch.setattr(Supervisor, "_watch", _watch_only_for_the_close)
    store = h.open_small(store_dir)
    try:
        supervisor = store.supervisor
        resume = Supervisor._resume_writer
        calls: list[int] = []

        def queues_dead_at_first(self: Supervisor) -> None:
            calls.append(1)
            if len(calls) == 1:
                self._events.put(ChildFailed(name="consume_queue", error=InjectedFault("died")))
                raise pykka.ActorDeadError("consume_queue stopped")
            resume(self)

        monkeypatch.setattr(Supervisor, "_resume_writer", queues_dead_at_first)
        supervisor._handle_failure(ChildFailed(name="writer", error=InjectedFault("writer")))
        for event in [e for e in list(supervisor._events.queue) if isinstance(e, ChildFailed)]:
            supervisor._events.queue.remove(event)
            supervisor._handle_failure(event)
        assert len(calls) >= 2
        put = store.put(Message(topic="t", body=b"after"))
        assert put.ok, put
    finally:
        store.close()


def _handle_queued_failures(supervisor: Supervisor) -> None:
    """Handle the failures queued (on this thread), as the supervisor's own thread would."""
    from mqstore.actors.base import ChildFailed

    while events := [e for e in list(supervisor._events.queue) if isinstance(e, ChildFailed)]:
        supervisor._events.queue.remove(events[0])
        supervisor._handle_failure(events[0])


@pytest.mark.parametrize("overlapping", ["a peer's failure pending", "a later member failing to start"])
def test_a_restart_cut_short_is_retried_until_every_actor_of_its_group_runs(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, overlapping: str
) -> None:
    """Review 136 F2: the index's restart (with reput) failed while reput's own failure was
    pending, and its retry was dropped though reput's restart does not start the index; or the
    writer's restart started the writer, then reput failed to start, and the retry was dropped
    because the writer ran. Either way an actor stayed down for good while the store said
    RUNNING (the index: queries missed every new key; reput: every put refused)."""
    import pykka

    from mqstore.actors.base import ChildFailed

    monkeypatch.setattr(Supervisor, "_watch", _watch_only_for_the_close)
    store = h.open_small(store_dir)
    try:
        supervisor = store.supervisor
        first, failing = ("index", "index") if overlapping == "a peer's failure pending" else ("writer", "reput")
        start_child = Supervisor._start_child
        failed: list[str] = []

        def fails_once(self: Supervisor, name: str, first: bool) -> None:
            if name == failing and not failed:
                failed.append(name)
                if overlapping == "a peer's failure pending":
                    self._events.put(ChildFailed(name="reput", error=InjectedFault("reput died too")))
                raise pykka.ActorDeadError(f"{name} could not start")
            start_child(self, name, first=first)

        monkeypatch.setattr(Supervisor, "_start_child", fails_once)
        assert supervisor._handle_failure(ChildFailed(name=first, error=InjectedFault(first)))
        _handle_queued_failures(supervisor)
        assert failed == [failing]
        down = [name for name in supervisor._restart_group(first) if not supervisor._running(name)]
        assert down == [] and supervisor.state is SupervisorState.RUNNING
        assert store.put(Message(topic="t", body=b"after", keys=["after"])).ok
        assert store.wait_for_messages("t", 0, 0, 10)
        if first == "index":
            h.wait_until(lambda: len(store.query("t", "after").messages) == 1, what="the key indexed")
    finally:
        store.close()


def test_a_give_up_for_a_file_names_the_file(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 123 F4: the detail of what a store refuses once its supervisor gave up over an
    OSError carried the error's repr, which drops its file (an unreadable queue ledger)."""
    store = h.open_small(store_dir)
    try:
        monkeypatch.setattr(store.supervisor, "state", SupervisorState.FAILED)
        monkeypatch.setattr(store.supervisor, "fatal_error", OSError(5, "Input/output error", "/s/queue_ledger.msgpack"))
        detail = store.put(Message(topic="t", body=b"x")).detail
        assert "queue_ledger.msgpack" in detail and "Input/output error" in detail, detail
    finally:
        monkeypatch.undo()
        store.close()


class _HostActor(__import__("pykka").ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return message


def test_a_system_exit_in_a_store_actor_is_a_crash_restarted_and_stops_no_actor_of_the_host(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 136 F1: pykka's loop met a SystemExit (code the actor ran: a host's mapping, a
    subscriber's name) by stopping the actor unreported and running ActorRegistry.stop_all():
    the writer stayed down for good while the store said RUNNING, and every actor of the host
    was stopped. It is a crash like any other now, restarted by the supervisor."""
    handle = CommitLogWriter.handle
    armed = threading.Event()

    def exits_on_a_tick(self: CommitLogWriter, message: Any) -> Any:
        if isinstance(message, Tick) and armed.is_set():
            armed.clear()
            raise SystemExit(2)
        return handle(self, message)

    monkeypatch.setattr(CommitLogWriter, "handle", exits_on_a_tick)
    host = _HostActor.start()
    try:
        with h.open_small(store_dir) as store:
            assert store.put(Message(topic="t", body=b"before")).ok
            armed.set()
            store.supervisor.peers["writer"].tell(Tick(now_ms=0))
            h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the writer's restart")
            assert store.supervisor.restarts[0].error == "SystemExit(2)"
            h.wait_until(lambda: store.put(Message(topic="t", body=b"after")).ok, what="a put after the restart")
            assert host.is_alive() and host.ask("still here", timeout=5) == "still here"
    finally:
        host.stop()


def test_a_system_exit_in_a_restarting_actors_start_gives_the_store_up_and_its_lock_back(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 136 F3: a SystemExit out of a restarted actor's on_start ended its thread with
    nothing answered; the supervisor waited 31 s, took the dead actor for a straggler, gave up,
    and the lock was kept for the process's life (a reopen: StoreLockedError). Then, once the
    start was reported, the SystemExit ended the supervisor's own thread. It is a start that
    failed now: restarted, and given up on once it keeps failing."""
    on_start, handle = CommitLogWriter.on_start, CommitLogWriter.handle
    failing = threading.Event()

    def exits_at_start(self: CommitLogWriter) -> None:
        if failing.is_set():
            raise SystemExit(2)
        on_start(self)

    def crashes_on_a_tick(self: CommitLogWriter, message: Any) -> Any:
        if isinstance(message, Tick) and failing.is_set():
            raise RuntimeError("one ordinary crash")
        return handle(self, message)

    monkeypatch.setattr(CommitLogWriter, "on_start", exits_at_start)
    monkeypatch.setattr(CommitLogWriter, "handle", crashes_on_a_tick)
    store = h.open_small(store_dir)
    assert store.put(Message(topic="t", body=b"kept")).ok
    failing.set()
    store.supervisor.peers["writer"].tell(Tick(now_ms=0))
    h.wait_until(lambda: store.supervisor.state is SupervisorState.FAILED, timeout_s=20, what="the give-up")
    assert "SystemExit(2)" in repr(store.supervisor.fatal_error)
    store.close()
    assert store.supervisor.lock_released.wait(10)
    failing.clear()
    with h.open_small(store_dir) as again:
        assert [bytes(m.body) for m in again.get("t", 0, 0, 8).messages] == [b"kept"]


class _RaisedIntoTheThread(BaseException):
    pass


@pytest.mark.parametrize("name", ["flush", "writer"])
def test_an_exception_raised_into_an_idle_actors_thread_is_a_crash_restarted(store_dir: Path, name: str) -> None:
    """Review 139 F1: an exception raised into an idle store actor's thread from another thread
    (PyThreadState_SetAsyncExc) landed in its inbox wait, outside every handler: the actor was
    gone for good, its ref said alive, the store said RUNNING (no flush, or every put refused
    after 21 s), and the close kept the lock for the process's life."""
    import ctypes

    with h.open_small(store_dir) as store:
        assert store.put(Message(topic="t", body=b"before")).ok
        actor = store.supervisor.peers[name]._actor_weakref()
        assert actor is not None
        thread = actor.loop_thread
        time.sleep(0.2)  # idle, waiting in its inbox
        raised = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_RaisedIntoTheThread))
        assert raised == 1
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what=f"the {name}'s restart")
        h.wait_until(lambda: store.put(Message(topic="t", body=b"after")).ok, what="a put after the restart")
        assert store.supervisor.state is SupervisorState.RUNNING
    assert store.supervisor.lock_released.is_set()
