"""Recovery runs once, by each file's owner in on_start, in tree order, on the first start and
on every restart alike (issue 15): the writer recovers the log, the index actor its files, the
ConsumeQueue actor its queues; then the writer is told the queues' offsets. No other path
recovers a running store's files."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from mqstore import FaultPlan, Message
from mqstore.messages import Ping
from mqstore.actors import commitlog_writer, consume_queue, index
from mqstore.storage import recovery
from mqstore.storage.recovery import RecoveryMode
from mqstore.storage.status import PutMessageStatus

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py

Call = tuple[str, RecoveryMode, str]  # (owner, mode, thread name)


def _record_owner_recovery(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    calls: list[Call] = []

    def recording(owner: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, mode: RecoveryMode, **kwargs: Any) -> Any:
            calls.append((owner, mode, threading.current_thread().name))
            return real(*args, mode=mode, **kwargs)

        return wrapper

    monkeypatch.setattr(commitlog_writer, "recover_commitlog", recording("writer", recovery.recover_commitlog))
    monkeypatch.setattr(index, "recover_index", recording("index", recovery.recover_index))
    monkeypatch.setattr(consume_queue, "recover_consume_queues",
                        recording("consume_queue", recovery.recover_consume_queues))  # fmt: skip

    def no_second_path(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a store recovered through recover_store, not through its owners")

    monkeypatch.setattr(recovery, "recover_store", no_second_path)
    return calls


def _bodies(store: Any, topic: str) -> list[bytes]:
    return [m.body for m in store.get(topic, 0, 0, 100).messages]


def test_an_open_after_a_crash_has_each_owner_recover_once_on_its_own_thread(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with h.open_small(store_dir) as store:
        for i in range(5):
            assert store.put(Message(topic="t", body=b"m%d" % i, keys=[f"k{i}"])).ok
        abort_path = Path(store.config.abort_path)
    abort_path.write_bytes(b"")  # as a killed process leaves it
    calls = _record_owner_recovery(monkeypatch)

    with h.open_small(store_dir) as store:
        assert [(owner, mode) for owner, mode, _ in calls] == [
            ("writer", RecoveryMode.CRASH),
            ("index", RecoveryMode.CRASH),
            ("consume_queue", RecoveryMode.CRASH),
        ]
        threads = {thread for _, _, thread in calls}
        assert threading.current_thread().name not in threads and len(threads) == 3, "each on its owner's thread"
        report = store.supervisor.recovery
        assert report is not None and not report.last_exit_ok
        assert report.topic_queue_table == {"t-0": 5}
        # The queues were cut back to the crash scan's start and rebuilt by re-dispatch.
        assert report.dispatch_from <= report.max_offset
        result = store.put(Message(topic="t", body=b"after"))
        assert result.ok and result.queue_offset == 5, "the writer continued after every record"
        h.wait_dispatched(store)
        assert _bodies(store, "t") == [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]
        assert [r.body for r in store.query("t", "k3").messages] == [b"m3"]


def test_a_clean_open_has_each_owner_recover_once_in_clean_mode(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with h.open_small(store_dir) as store:
        assert store.put(Message(topic="t", body=b"x")).ok
    calls = _record_owner_recovery(monkeypatch)
    with h.open_small(store_dir) as store:
        assert [(owner, mode) for owner, mode, _ in calls] == [
            ("writer", RecoveryMode.CLEAN),
            ("index", RecoveryMode.CLEAN),
            ("consume_queue", RecoveryMode.CLEAN),
        ]
        assert store.supervisor.recovery is not None and store.supervisor.recovery.last_exit_ok
        assert store.put(Message(topic="t", body=b"y")).queue_offset == 1


def test_a_restarted_writer_recovers_its_log_again_the_same_way(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = FaultPlan()
    with h.open_small(store_dir, faults=plan) as store:
        calls = _record_owner_recovery(monkeypatch)
        assert store.put(Message(topic="t", body=b"before")).ok
        plan.arm("writer.after_append")
        crashed = store.put(Message(topic="t", body=b"crash"))
        assert crashed.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the writer's restart")
        # Only the restarted owner recovered: the queues and the index live on.
        assert [(owner, mode) for owner, mode, _ in calls] == [("writer", RecoveryMode.RESTART)]
        after = store.put(Message(topic="t", body=b"after"))
        # The record appended before the fault is kept; its queue offset is not given out again.
        assert after.ok and after.queue_offset == 2
        h.wait_dispatched(store)
        assert _bodies(store, "t") == [b"before", b"crash", b"after"]


def test_a_restarted_index_recovers_its_files_in_restart_mode_and_indexes_on(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = FaultPlan()
    with h.open_small(store_dir, faults=plan) as store:
        calls = _record_owner_recovery(monkeypatch)
        assert store.put(Message(topic="t", body=b"a", keys=["ka"])).ok
        h.wait_dispatched(store)
        plan.arm("index.mid_write")
        assert store.put(Message(topic="t", body=b"b", keys=["kb"])).ok
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the index's restart")
        assert [(owner, mode) for owner, mode, _ in calls] == [("index", RecoveryMode.RESTART)]
        assert store.put(Message(topic="t", body=b"c", keys=["kc"])).ok
        h.wait_dispatched(store)
        for key, body in (("ka", b"a"), ("kb", b"b"), ("kc", b"c")):
            assert [r.body for r in store.query("t", key).messages] == [body]


class _HoldReputAfterHandshake(FaultPlan):
    """Holds reput at its `nth` dispatch or the first one after its start handshake was
    answered, whichever comes later, until released. Never before the handshake: reput's
    passes can run ahead of a late Ping (a loaded machine descheduling the supervisor), and a
    hold there would hold the open too. Until then each dispatch sleeps a little, so the
    re-dispatch cannot finish before the handshake and leave nothing to hold."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
        super().__init__()
        self.nth, self.hits = nth, 0
        self.handshake, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()
        from mqstore.actors.reput import ReputMessageService

        handle = ReputMessageService.handle

        def handle_noting_the_handshake(actor: ReputMessageService, message: Any) -> Any:
            answer = handle(actor, message)
            if isinstance(message, Ping):
                self.handshake.set()
            return answer

        monkeypatch.setattr(ReputMessageService, "handle", handle_noting_the_handshake)

    def hit(self, point: str) -> None:
        if point != "reput.mid_dispatch" or self.entered.is_set():
            return
        self.hits += 1
        if not self.handshake.is_set():
            time.sleep(0.02)
        elif self.hits >= self.nth:
            self.entered.set()
            self.release.wait(60)


class _SlowDispatch(FaultPlan):
    """Each dispatch batch takes `delay_s` longer (a big re-dispatch, in small)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def hit(self, point: str) -> None:
        if point == "reput.mid_dispatch":
            time.sleep(self.delay_s)


@pytest.mark.parametrize("crashed", [False, True])
def test_an_open_whose_re_dispatch_outlasts_the_start_timeout_opens_with_its_queues_rebuilt(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, crashed: bool
) -> None:
    """Re-dispatch runs in bounded passes after reput's start handshake, and the open waits for
    it while it moves: a big store's re-dispatch can take longer than the supervisor waits for
    a handshake (it once ran inside on_start, and such a store failed to open), and when the
    open returns every message is readable (as after RocketMQ's recovery)."""
    from mqstore import supervisor
    from mqstore.actors.reput import DISPATCH_BATCH_MAX_RECORDS

    records = 24 * DISPATCH_BATCH_MAX_RECORDS  # about 40 batches (a batch ends with its 64 KiB segment)
    with h.open_small(store_dir) as store:
        for start in range(0, records, 256):
            assert store.put_batch([Message(topic="t", body=b"%d" % i) for i in range(start, start + 256)]).ok
        root = Path(store.config.store_path_root_dir)
    shutil.rmtree(root / "consumequeue")  # every queue is rebuilt from the log's start
    if crashed:
        (root / "abort").write_bytes(b"")
    # Re-dispatch takes about 40 batches x 0.08 s = 3.2 s, longer than any handshake may; the other
    # children's starts (a crash scan under a loaded CI) keep a handshake time that holds.
    monkeypatch.setattr(supervisor, "START_TIMEOUT_S", 2.0)
    with h.open_small(store_dir, faults=_SlowDispatch(0.08)) as store:
        assert store.max_offset("t", 0) == records, "the open returned with the queues rebuilt"
        got = store.get("t", 0, records - 2, 2)
        assert [m.body for m in got.messages] == [b"%d" % (records - 2), b"%d" % (records - 1)]


def test_a_crashed_store_whose_queues_are_gone_rebuilds_them_from_the_logs_start(store_dir: Path) -> None:
    """After a crash the re-dispatch starts at the crash scan's file; with no queue left at
    all it must start at the log's first record (else the records before that file would have
    no units: unreachable by get). The index is off, so it does not lower the start."""
    now = [1_800_000_000_000]
    settings: dict[str, Any] = {"message_index_enable": False, "clock_ms": lambda: now[0]}
    with h.open_small(store_dir, **settings) as store:
        for start in range(0, 4096, 256):
            now[0] += 60_000  # a minute between batches: the checkpoint's start file is a late one
            assert store.put_batch([Message(topic="t", body=b"%d" % i) for i in range(start, start + 256)]).ok
        root = Path(store.config.store_path_root_dir)
    assert len(list((root / "commitlog").iterdir())) > 3
    shutil.rmtree(root / "consumequeue")
    (root / "abort").write_bytes(b"")
    with h.open_small(store_dir, **settings) as store:
        report = store.supervisor.recovery
        assert report is not None and report.messages_scanned < 4096, "the crash scan started after the first file"
        assert report.dispatch_from == report.min_offset
        h.wait_dispatched(store)
        assert store.min_offset("t", 0) == 0 and store.max_offset("t", 0) == 4096
        assert store.get("t", 0, 0, 1).messages[0].body == b"0"


def test_a_close_during_a_long_re_dispatch_waits_for_it_while_it_moves(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-dispatch runs after the open; a close soon after waits for it as long as it makes
    progress (each wait slice of DISPATCH_CATCH_UP_TIMEOUT_MS), so the stop is clean and the
    next open is not a crash recovery again. Here reput is held in its second pass while the
    close begins (the first slice sees no progress yet), then let go."""
    from mqstore import supervisor
    from mqstore.actors.reput import DISPATCH_BATCH_MAX_RECORDS, REPUT_PASS_MAX_BATCHES

    monkeypatch.setattr(supervisor, "DISPATCH_CATCH_UP_TIMEOUT_MS", 100)
    records = 24 * DISPATCH_BATCH_MAX_RECORDS  # about 40 batches (a batch ends with its 64 KiB segment)
    with h.open_small(store_dir) as store:
        for start in range(0, records, 256):
            assert store.put_batch([Message(topic="t", body=b"%d" % i) for i in range(start, start + 256)]).ok
        root = Path(store.config.store_path_root_dir)
    shutil.rmtree(root / "consumequeue")
    plan = _HoldReputAfterHandshake(monkeypatch, nth=REPUT_PASS_MAX_BATCHES + 2)
    store = h.open_small(store_dir, faults=plan)
    assert plan.entered.wait(30)
    closed: list[bool] = []
    closing = threading.Thread(target=lambda: closed.append(store.close()))
    closing.start()
    time.sleep(0.35)  # a few of the close's wait slices pass with reput held
    plan.release.set()
    closing.join(60)
    assert closed == [True], "the stop waited for the moving re-dispatch"
    with h.open_small(store_dir) as reopened:
        assert reopened.supervisor.recovery is not None and reopened.supervisor.recovery.last_exit_ok
        assert reopened.max_offset("t", 0) == records
