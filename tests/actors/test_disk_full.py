"""A disk with no room for the next commitlog blocks: puts are refused with a clear status,
nothing acknowledged is lost, and puts succeed again once space is back.

Without the reservation, the writer's memcpy into a page of a sparse file whose block cannot
be allocated would fault with SIGBUS and kill the process."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

import mqstore
from mqstore import Message
from mqstore.messages import Ping
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.storage.mapped_file import KEEP_FREE_FOR_MESSAGES_BYTES
from mqstore.store import MessageStore

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)
# Where a test reads while units wait for blocks on purpose, the read-your-writes wait times
# out: 300 ms instead of the default 5 s keeps those tests short.
WAITING = dict(SETTINGS, read_your_writes_timeout_ms=300)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_a_full_disk_refuses_puts_cleanly_and_loses_nothing(err: int) -> None:
    """Also a quota (EDQUOT) or an I/O error while blocks are reserved: those were taken for
    "fallocate unsupported", and the writer wrote into pages nothing backed (review 46 M2)."""
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    body = b"x" * 1000
    acked: list[str] = []
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        for i in range(10):
            assert store.put(mqstore.Message(topic="T", body=body, keys=[f"k{i}"])).ok
            acked.append(f"k{i}")
        # From now on the disk has no room: the current segment's reservation covers it whole
        # (64 KiB < the window), so the refusal comes with the next segment.
        fs.inject_fault("reserve", err=err, count=1_000_000)
        refused = None
        for i in range(10, 200):
            result = store.put(mqstore.Message(topic="T", body=body, keys=[f"k{i}"]))
            if not result.ok:
                refused = result
                break
            acked.append(f"k{i}")
        assert refused is not None, "the full disk was never noticed"
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in refused.detail
        assert store.supervisor.state.name == "RUNNING"  # refused, not crashed
        # Still refused while full; accepted again once space is back (the cleaner freed some).
        assert store.put(mqstore.Message(topic="T", body=body, keys=["again"])).status is refused.status
        fs.clear_faults()
        result = store.put(mqstore.Message(topic="T", body=body, keys=["after"]))
        assert result.ok, result
        acked.append("after")
        assert all_keys(store) == acked  # every acknowledged message, in order, none of the refused ones
    fs.assert_no_sigbus()


def all_keys(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[str]:
    """Every message's first key, paging (a get returns at most 32 messages from memory).
    `get` waits for this thread's own puts to be dispatched; `max_offset` does not."""
    keys: list[str] = []
    offset = 0
    while True:
        got = store.get(topic, queue_id, offset, 1000)
        if not got.messages:
            return keys
        keys += [m.key_list[0] for m in got.messages]
        offset = got.next_begin_offset


def test_bad_puts_get_message_illegal_on_either_encoder() -> None:
    """Mixed batches and bad topics are refused whichever encoder (C or Python) saw them first."""
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        ok = [mqstore.Message(topic="T", body=b"a"), mqstore.Message(topic="T", body=b"b")]
        assert store.put_batch(ok).ok
        illegal = mqstore.PutMessageStatus.MESSAGE_ILLEGAL
        for bad in (
            [mqstore.Message(topic="T", body=b"a"), mqstore.Message(topic="U", body=b"b")],
            [mqstore.Message(topic="T", body=b"a"), mqstore.Message(topic="T", body=b"b", queue_id=1)],
            [mqstore.Message(topic="T", body=b"a", keys=["has space"])],
            [mqstore.Message(topic="bad topic!", body=b"a")],
            [mqstore.Message(topic="T", body=b"a", queue_id=-1)],
        ):
            try:
                result = store.put_batch(bad)
            except ValueError:
                assert bad[0].queue_id == -1  # a negative queue id is a programming error
                continue
            assert result.status is illegal, (bad, result)
        assert store.get("T", 0, 0, 10).messages[-1].body == b"b"  # nothing of the bad puts
        assert store.max_offset("T", 0) == 2


SMALL_DISK = dict(
    SETTINGS,
    # The physical limit is what is tested here, not the cleaner's ratios.
    disk_space_warning_level_ratio=1.0,
    disk_space_clean_forcibly_ratio=1.0,
    clean_file_forcibly_enable=False,
)


def _put_until_refused(store: MessageStore, acked: list[str], prefix: str, limit: int) -> mqstore.PutResult | None:
    for i in range(limit):
        key = f"{prefix}{i}"
        result = store.put(mqstore.Message(topic="T", body=b"y" * 700, keys=[key]))
        if not result.ok:
            return result
        acked.append(key)
    return None


@pytest.mark.parametrize("segment_bytes", [64 * 1024, 4 * 1024 * 1024], ids=["segment-fits", "segment-larger-than-disk"])
def test_a_small_simulated_disk_fills_without_sigbus_and_takes_puts_again_when_space_returns(
    segment_bytes: int,
) -> None:
    """The simulated disk has a capacity: every write through a map into a page without
    blocks, once the disk is full, is recorded as the SIGBUS it would be. The store fills the
    disk itself; commitlog, ConsumeQueue, index and checkpoint must all reserve first. With a
    segment larger than the disk the reservation window must shrink to what fits."""
    settings = dict(SMALL_DISK, mapped_file_size_commitlog_bytes=segment_bytes)
    fs = SimulatedFileSystem(capacity_bytes=3 * 1024 * 1024)
    fs.makedirs("/sim")
    fs.write_atomic("/sim/filler", bytes(1536 * 1024))  # the space the user frees later
    acked: list[str] = []
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        refused = _put_until_refused(store, acked, "a", 10_000)
        assert refused is not None, "the disk never filled"
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in refused.detail
        assert len(acked) > 100
        assert store.supervisor.state.name == "RUNNING"
        # Full as far as the store goes: it leaves the filesystem's last blocks alone.
        assert fs.free_bytes() < 2 * KEEP_FREE_FOR_MESSAGES_BYTES
    fs.assert_no_sigbus()
    # Reopened on the full disk: recovery reads, and nothing faults; every ack is there.
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        assert all_keys(store) == acked
        assert store.query("T", acked[-1]).messages[0].key_list == [acked[-1]]
        assert not store.put(mqstore.Message(topic="T", body=b"y" * 700, keys=["full"])).ok
        # Space comes back (less than a 32 MiB window; with the larger segment, less than
        # the segment): puts succeed again, without a restart.
        fs.remove("/sim/filler")
        refused = _put_until_refused(store, acked, "b", 10_000)
        assert refused is not None and "disk full" in refused.detail
        assert any(key.startswith("b") for key in acked)
        assert all_keys(store) == acked
    fs.assert_no_sigbus()
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        assert all_keys(store) == acked  # nothing acknowledged lost
        assert store.query("T", acked[-1]).messages[0].key_list == [acked[-1]]
    fs.assert_no_sigbus()


def _put_while_derived_files_get_no_blocks(store: MessageStore, fs: SimulatedFileSystem, err: int = errno.ENOSPC) -> list[str]:
    """One put dispatched, then 599 more while the ConsumeQueue and index files cannot get
    blocks (past the first CQ file, 200 units, and index file, 400): the acknowledged keys."""
    assert store.put(mqstore.Message(topic="T", body=b"z", keys=["k0"])).ok
    assert all_keys(store) == ["k0"]
    fs.inject_fault("reserve", path_contains="consumequeue", err=err, count=1_000_000)
    fs.inject_fault("reserve", path_contains="index", err=err, count=1_000_000)
    acked = ["k0"]
    for i in range(1, 600):
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=[f"k{i}"])).ok
        acked.append(f"k{i}")
    store.get("T", 0, 0, 1)  # dispatch has seen every put
    assert store.max_offset("T", 0) < len(acked)  # units wait for blocks
    return acked


def _wait_indexed(store: mqstore.MessageStore, end_offset: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while store.read_view.view.indexed_end < end_offset:
        assert time.monotonic() < deadline, f"the index did not reach {end_offset}: {store.read_view.view}"
        time.sleep(0.005)  # the view's publications have no waiter for the index's end


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_dispatch_waits_for_space_and_resumes_without_a_restart(err: int) -> None:
    """The commitlog has its blocks but the ConsumeQueue and index cannot get theirs: the
    units wait (no crash, no restart storm) and are written once space returns. With an I/O
    error the index file was left sparse for good (review 48 M1): it waits too."""
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **WAITING) as store:
        acked = _put_while_derived_files_get_no_blocks(store, fs, err)
        fs.assert_no_sigbus()  # nothing was written into pages without blocks
        assert store.supervisor.state.name == "RUNNING"
        assert store.supervisor.restarts == []  # waited, never crashed
        fs.clear_faults()
        last = store.put(mqstore.Message(topic="T", body=b"z", keys=["last"]))
        assert last.ok
        acked.append("last")
        assert store.wait_for_messages("T", 0, len(acked) - 1, timeout_s=30)  # the backlog is written
        assert all_keys(store) == acked
        # The index owner writes its backlog after the queues': a query waits only 300 ms here
        # (WAITING), and under load answered "index behind" (CI: [] for k1).
        _wait_indexed(store, last.commitlog_offset + last.wrote_bytes)
        for key in ("k1", "k599", "last"):
            assert [m.key_list for m in store.query("T", key).messages] == [[key]]
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert all_keys(store) == acked


NEW_STORE_DISK_BYTES = 3 * 1024 * 1024  # above the 1 MiB the store always leaves free


def _full_disk(free_bytes: int) -> SimulatedFileSystem:
    """A small simulated disk with only `free_bytes` left, and no store on it yet."""
    fs = SimulatedFileSystem(capacity_bytes=NEW_STORE_DISK_BYTES)
    fs.makedirs("/sim")
    fs.write_atomic("/sim/filler", bytes(NEW_STORE_DISK_BYTES - free_bytes))
    return fs


@pytest.mark.parametrize(
    ("free_bytes", "missing"), [(0, "lock"), (100, "checkpoint")], ids=["no-room-for-the-lock", "no-room-for-the-checkpoint"]
)
def test_a_new_store_on_a_full_disk_refuses_to_open_and_leaves_nothing_behind(free_bytes: int, missing: str) -> None:
    """A new store whose lock or checkpoint cannot be had: open() refuses with one clear
    error naming the file, starts no actor (no restart storm, no ActorDeadError), and leaves
    no abort marker, no checkpoint and no held lock, so the same open works once space is
    freed."""
    fs = _full_disk(free_bytes)
    with pytest.raises(mqstore.StoreDiskFullError) as refused:
        mqstore.open("/sim/store", fs=fs, **SMALL_DISK)
    assert "disk full" in str(refused.value) and f"/sim/store/{missing}" in str(refused.value)
    assert refused.value.filename == f"/sim/store/{missing}"
    assert not fs.exists("/sim/store/abort") and not fs.exists("/sim/store/checkpoint")
    fs.assert_no_sigbus()
    fs.remove("/sim/filler")
    with mqstore.open("/sim/store", fs=fs, **SMALL_DISK) as store:  # the lock was not left held
        recovery = store.supervisor.recovery
        assert recovery is not None and recovery.last_exit_ok  # no abort marker was left behind
        assert store.put(mqstore.Message(topic="T", body=b"a", keys=["k0"])).ok
        assert all_keys(store) == ["k0"]
        assert store.supervisor.restarts == []
    with mqstore.open("/sim/store", fs=fs, **SMALL_DISK) as store:
        assert all_keys(store) == ["k0"]
    fs.assert_no_sigbus()


def test_a_new_store_with_no_room_for_its_first_segment_opens_refuses_puts_and_recovers() -> None:
    """Room for the lock and checkpoint but not for the first commitlog segment's blocks:
    the store opens (it records its checkpoint) and refuses puts as a full disk; once space
    is freed, puts succeed without a restart."""
    fs = _full_disk(5000)
    with mqstore.open("/sim/store", fs=fs, **SMALL_DISK) as store:
        refused = store.put(mqstore.Message(topic="T", body=b"a", keys=["no"]))
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in refused.detail
        assert store.supervisor.state.name == "RUNNING" and store.supervisor.restarts == []
        fs.remove("/sim/filler")
        assert store.put(mqstore.Message(topic="T", body=b"a", keys=["k0"])).ok
        assert all_keys(store) == ["k0"]
        assert store.supervisor.restarts == []
    with mqstore.open("/sim/store", fs=fs, **SMALL_DISK) as store:
        assert all_keys(store) == ["k0"]
        assert [m.key_list for m in store.query("T", "k0").messages] == [["k0"]]
    fs.assert_no_sigbus()


def test_a_new_store_with_no_room_for_its_first_queue_and_index_files_waits_then_dispatches() -> None:
    """The first ConsumeQueue and index files of a new store cannot get blocks: puts are
    acknowledged (the commitlog has its blocks), dispatch waits without a crash, and catches
    up once space returns."""
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    fs.inject_fault("reserve", path_contains="consumequeue", err=errno.ENOSPC, count=1_000_000)
    fs.inject_fault("reserve", path_contains="index", err=errno.ENOSPC, count=1_000_000)
    with mqstore.open("/sim/store", fs=fs, **WAITING) as store:
        for i in range(3):
            assert store.put(mqstore.Message(topic="T", body=b"z", keys=[f"k{i}"])).ok
        store.get("T", 0, 0, 1)  # dispatch has seen every put
        assert store.max_offset("T", 0) <= 0  # no unit written (-1: not even the queue)
        assert store.supervisor.state.name == "RUNNING" and store.supervisor.restarts == []
        fs.clear_faults()
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=["k3"])).ok
        assert store.wait_for_messages("T", 0, 3, timeout_s=30)
        assert all_keys(store) == ["k0", "k1", "k2", "k3"]
        assert [m.key_list for m in store.query("T", "k1").messages] == [["k1"]]
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert all_keys(store) == ["k0", "k1", "k2", "k3"]


def test_the_dispatch_backlog_held_while_the_disk_is_full_is_capped() -> None:
    """A small simulated disk filled while the commitlog's segment has its blocks: puts go on,
    the ConsumeQueue and index cannot get blocks for their next files. Reput stops reading
    ahead once DISPATCH_BACKLOG_MAX_BATCHES batches wait, so what they hold in memory stays
    bounded however many puts arrive; the commitlog is re-read once space returns. Before:
    one waiting batch per put pass, without limit."""
    from mqstore.actors.reput import DISPATCH_BACKLOG_MAX_BATCHES

    fs = SimulatedFileSystem(capacity_bytes=24 * 1024 * 1024)
    fs.makedirs("/sim")
    settings = dict(WAITING, mapped_file_size_commitlog_bytes=4 * 1024 * 1024)
    acked: list[str] = []
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=["k0"])).ok
        acked.append("k0")
        assert all_keys(store) == acked
        fs.write_atomic("/sim/filler", bytes(fs.free_bytes() - 64 * 1024))  # derived files keep 256 KiB
        peers = store.supervisor.ctx.peers
        cq, index = peers["consume_queue"].proxy()._actor, peers["index"].proxy()._actor  # reaching in
        most = 0
        for i in range(1, 3000):  # far past the first CQ file (200 units) and index file (400)
            last = store.put(mqstore.Message(topic="T", body=b"z", keys=[f"k{i}"]))
            assert last.ok
            acked.append(f"k{i}")
            most = max(most, len(cq._waiting), len(index._waiting))
        assert store.max_offset("T", 0) < len(acked)  # units wait for blocks
        assert 0 < most <= DISPATCH_BACKLOG_MAX_BATCHES + 1, most
        assert store.supervisor.state.name == "RUNNING" and store.supervisor.restarts == []
        # A thread that put nothing, reading past what the held queues hold: "not readable
        # now", its offset kept, not NO_MESSAGE_IN_QUEUE (a consumer moves on that: review 46 M4).
        import threading

        answers: list[object] = []
        reader = threading.Thread(target=lambda: answers.extend(
            (store.get("T", 0, len(acked) - 1, 1), store.query("T", f"k{len(acked) - 1}"))))  # fmt: skip
        reader.start()
        reader.join(30)
        got, found = answers
        assert isinstance(got, mqstore.GetResult) and isinstance(found, mqstore.QueryResult)
        assert got.status is mqstore.GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, got
        assert got.next_begin_offset == len(acked) - 1 and "the queues are behind the log" in got.detail
        assert not found.messages, found
        if "the index is behind the log" not in found.detail:
            # Reput stopped reading ahead before the index's first file filled (the held queue's
            # backlog capped it): the index holds all that was dispatched, and the key's record
            # is past it: a query covers what was dispatched when it started (the read contract).
            view = store.read_view.view
            assert found.detail == "" and view.indexed_end >= view.dispatched_end, (found, view)
            assert view.dispatched_end <= last.commitlog_offset, (view, last)
        fs.remove("/sim/filler")
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=["last"])).ok
        acked.append("last")
        assert store.wait_for_messages("T", 0, len(acked) - 1, timeout_s=30)
        assert all_keys(store) == acked  # read on from the commitlog, nothing skipped
        for key in ("k1", "k2999", "last"):
            assert [m.key_list for m in store.query("T", key).messages] == [[key]]
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        assert all_keys(store) == acked
    fs.assert_no_sigbus()


def test_a_close_while_dispatch_waits_for_space_is_not_a_clean_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing while ConsumeQueue and index batches wait for blocks: the queues and the index do
    not hold what was acknowledged, so the stop must not be marked clean (the abort marker
    stays); the next open recovers as after a crash and dispatches the rest from the log."""
    from mqstore import supervisor

    monkeypatch.setattr(supervisor, "DISPATCH_CATCH_UP_TIMEOUT_MS", 300)  # the close waits this long
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    store = mqstore.open("/sim/store", fs=fs, **WAITING)
    acked = _put_while_derived_files_get_no_blocks(store, fs)
    assert store.close() is False  # not clean
    assert fs.exists("/sim/store/abort")
    fs.clear_faults()
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert all_keys(store) == acked
        for key in ("k1", "k599"):
            assert [m.key_list for m in store.query("T", key).messages] == [[key]]


def test_a_queue_directory_blocked_while_the_store_runs_holds_dispatch_instead_of_stopping_the_store(
    tmp_path: Path,
) -> None:
    """A file where a queue's ConsumeQueue directory belongs, put there while the store runs:
    the ConsumeQueue actor cannot make the queue (where a new topic's directory belongs, the
    topic's put is refused now: tests/actors/test_topic_directories.py). It failed at each try until the supervisor
    gave up and stopped the store (FAILED: every put refused). Now dispatch waits, as for a
    full disk, the log keeps taking puts, and once the file is gone the queue is made."""
    from mqstore.messages import Tick

    with mqstore.open(tmp_path / "s", **dict(WAITING, flush_interval_consume_queue_ms=3_600_000)) as store:
        assert store.put(Message("t", b"before")).ok
        blocker = tmp_path / "s" / "consumequeue" / "t" / "1"
        blocker.write_bytes(b"in the way")
        assert store.put(Message("t", b"blocked", queue_id=1)).ok
        assert store.put(Message("t", b"behind it")).ok
        for _ in range(12):  # ticks retry; ten failures in a minute stopped the store
            store.supervisor.ctx.tell("consume_queue", Tick(now_ms=store.clock_ms()))
            store.flush()  # after the tick: it was handled
        assert store.running and store.supervisor.restarts == []
        assert store.put(Message("t", b"still taken")).ok
        blocker.unlink()
        store.supervisor.ctx.tell("consume_queue", Tick(now_ms=store.clock_ms()))
        assert store.wait_for_messages("t", 0, 2, timeout_s=10)
        assert [m.body for m in store.get("t", 1, 0, 8).messages] == [b"blocked"]
        assert [m.body for m in store.get("t", 0, 0, 8).messages] == [b"before", b"behind it", b"still taken"]


def test_an_index_file_that_cannot_be_made_holds_indexing_instead_of_stopping_the_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The index's first file full (400 entries) and the next one cannot be made (an I/O error
    creating it). The index actor raised, was restarted, failed again, and the supervisor gave
    up: FAILED, every put refused, though the log was fine (RocketMQ refuses puts too, with
    WRITE_INDEX_FILE_ERROR, until a restart). Now indexing waits, retried on its ticks, the
    store takes puts, and once a file can be made every key is found. (Past reput's backlog of
    32 batches the queues go on without the index: the next test.)"""
    import logging

    from mqstore.messages import Tick

    caplog.set_level(logging.ERROR, logger="mqstore")
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    settings = dict(WAITING, flush_interval_consume_queue_ms=3_600_000)
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=["k0"])).ok
        assert [m.key_list for m in store.query("T", "k0").messages] == [["k0"]]
        fs.inject_fault("map", path_contains="/index/", err=errno.EIO, count=1_000_000)
        acked = ["k0"]
        for i in range(1, 600):  # past the first file's 400 entries
            assert store.put(mqstore.Message(topic="T", body=b"z", keys=[f"k{i}"])).ok
            acked.append(f"k{i}")
        for _ in range(12):  # ticks retry; ten failures in a minute stopped the store
            store.supervisor.ctx.tell("index", Tick(now_ms=store.clock_ms()))
            store.flush()  # after the tick: it was handled
        assert store.running and store.supervisor.restarts == []
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=["k600"])).ok
        acked.append("k600")
        # Reput waits DISPATCH_BACKLOG_WAIT_S (1 s) on the stuck index's 32 batches before the
        # queues go on without it: all_keys' reads wait 300 ms only (WAITING).
        assert store.wait_for_messages("T", 0, 600, timeout_s=30)
        assert all_keys(store) == acked  # the queue has every put: only the index waits
        assert store.stats()["index_behind_bytes"] > 0
        assert store.query("T", "k599").messages == ()  # waits for the index, then a status
        held = [r for r in caplog.records if "cannot create an index file: indexing" in r.getMessage()]
        # Logged when it started, not at each retry (a new name per try is not a new cause).
        assert [r.getMessage() for r in held] == ["cannot create an index file: indexing waits, retried every tick"]
        assert held[0].mqstore_event["error"] == "Input/output error in /sim/store/index"
        fs.clear_faults()
        store.supervisor.ctx.tell("index", Tick(now_ms=store.clock_ms()))
        store.flush()
        # The index writes what it holds at the tick; what reput gave the queues alone meanwhile
        # it brings the index from the log on its own passes (every 100 ms), after the flush.
        deadline = time.monotonic() + 30
        while store.stats()["index_behind_bytes"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.stats()["index_behind_bytes"] == 0
        for key in ("k0", "k399", "k400", "k599", "k600"):
            assert [m.key_list for m in store.query("T", key).messages] == [[key]], key
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:  # and after a reopen
        assert [m.key_list for m in store.query("T", "k500").messages] == [["k500"]]


def test_an_index_held_for_long_holds_up_no_queue_and_catches_up_from_the_log() -> None:
    """Review 24: reput measured its backlog against the slower of the queues and the index.
    With the index held (no file can be made), after 32 dispatch batches reput stopped reading
    for the queues too: every put was still PUT_OK, but consumers saw nothing new and each
    read of a thread that had put waited out its timeout. Now the queues go on, and the index
    is brought its records again from the log once it writes."""
    import threading

    from mqstore.messages import Tick

    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        for i in range(399):  # the first index file's entries, then no file can be made
            assert store.put(mqstore.Message(topic="T", body=b"z", keys=[f"k{i}"])).ok
        fs.inject_fault("map", path_contains="/index/", err=errno.EIO, count=1_000_000)
        for i in range(399, 500):  # each its own dispatch batch: far past the backlog of 32
            assert store.put(mqstore.Message(topic="T", body=b"z", keys=[f"k{i}"])).ok
            assert store.get("T", 0, i, 1).messages, i  # read-your-writes: dispatched, by queue
        seen: list[bool] = []  # a consumer in another thread sees the last one at once too
        consumer = threading.Thread(target=lambda: seen.append(store.wait_for_messages("T", 0, 499, timeout_s=10)))
        consumer.start()
        consumer.join()
        assert seen == [True] and store.running
        assert store.stats()["index_behind_bytes"] > 0
        fs.clear_faults()
        deadline = time.monotonic() + 30  # (a loaded CI machine took more than three rounds)
        while store.stats()["index_behind_bytes"] and time.monotonic() < deadline:
            store.supervisor.ctx.tell("index", Tick(now_ms=store.clock_ms()))  # its retry
            store.supervisor.ctx.tell("reput", Tick(now_ms=store.clock_ms()))  # the index's catch-up
            store.flush()
            time.sleep(0.05)
        assert store.stats()["index_behind_bytes"] == 0
        for key in ("k0", "k398", "k399", "k450", "k499"):
            assert [m.key_list for m in store.query("T", key).messages] == [[key]], key
        assert store.put(mqstore.Message(topic="T", body=b"z", keys=["k500"])).ok  # together again
        assert [m.key_list for m in store.query("T", "k500").messages] == [["k500"]]
    assert all_keys_after_reopen(fs) == [f"k{i}" for i in range(501)]


def all_keys_after_reopen(fs: SimulatedFileSystem) -> list[str]:
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert all(store.query("T", f"k{i}").messages for i in (0, 250, 500))
        return all_keys(store)


def test_a_held_queue_is_retried_on_ticks_not_per_batch_and_shows_in_the_stats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While a queue file cannot be made, each new batch retried at once: under load two ERROR
    lines and a failing file creation per batch, and nothing in stats() said dispatch was held
    (reput had handed the batches on, so dispatch_behind_bytes was 0). Now only the actor's
    ticks retry (hourly here: none in the test), and stats() tells how far the queues and the
    index are behind the log."""
    import logging

    caplog.set_level(logging.ERROR, logger="mqstore")
    settings = dict(WAITING, flush_interval_consume_queue_ms=3_600_000)
    with mqstore.open(tmp_path / "s", **settings) as store:
        assert store.put(Message("t", b"before")).ok
        assert len(store.get("t", 0, 0, 32).messages) == 1  # read-your-writes: the queue has it
        assert store.stats()["consume_queue_behind_bytes"] == 0
        blocker = tmp_path / "s" / "consumequeue" / "t" / "1"
        blocker.write_bytes(b"in the way")
        first = store.put(Message("t", b"blocked", queue_id=1))
        assert first.ok
        for n in range(60):
            assert store.put(Message("t", b"behind %d" % n)).ok
        # Held: the read waits for its put, then answers a status, never the queue without it.
        assert store.get("t", 0, 0, 32).messages == ()
        assert store.query("t", "no such key").messages == ()  # waits until the index has every put
        # (A bounded wait: on a starved machine reput may hand on a batch per put, stop reading
        # ahead at 32 held by the queue, and bring the index the rest on its own passes.)
        deadline = time.monotonic() + 30
        while store.stats()["index_behind_bytes"] and time.monotonic() < deadline:
            time.sleep(0.01)
        store.supervisor._ask("consume_queue", Ping())  # it took every batch handed on before
        failures = [r for r in caplog.records if r.getMessage() == "creating a segment failed"]
        # The first try's; the retries (a late first tick) are quiet. Per batch: 4-6 here.
        assert len(failures) == 1
        stats = store.stats()
        assert stats["consume_queue_behind_bytes"] == stats["commitlog_max_offset"] - first.commitlog_offset
        assert stats["index_behind_bytes"] == 0  # the index is not held by a queue's file
        blocker.unlink()
        store.flush()  # retries once, as a tick would
        assert store.get("t", 0, 0, 32).max_offset == 61  # every put in its queue
        assert store.stats()["consume_queue_behind_bytes"] == 0


def test_a_full_disk_is_retried_on_the_ticks_not_per_batch() -> None:
    """ConsumeQueue and index waiting for blocks: each batch reput handed on retried at once,
    a failed reservation per batch per writer. Now only their ticks retry (hourly here: at most
    the one sent as the store started, which may come late), and close() once."""
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    # An index file of 200 entries: it needs its next file where the ConsumeQueue does. With
    # 400, reput could stop handing on batches (32 held by the queue) before the index got there.
    settings = dict(WAITING, flush_interval_consume_queue_ms=3_600_000, max_index_num=200)
    with mqstore.open("/sim/store", fs=fs, **settings) as store:
        _put_while_derived_files_get_no_blocks(store, fs)
        cq_fault, index_fault = fs._faults  # reaching in: the attempts each made
        # Counted once each has met the full disk and finished that batch (a Ping after it):
        # the helper's get waits 300 ms at most (the units never come), and on a loaded machine
        # the first failure (two tries) came after it. Reput hands on no more batches once 32
        # wait, so "dispatch caught up" is no barrier here.
        deadline = time.monotonic() + 30
        while (cq_fault.remaining == 1_000_000 or index_fault.remaining == 1_000_000) and time.monotonic() < deadline:
            time.sleep(0.005)
        for name in ("consume_queue", "index"):
            store.supervisor._ask(name, Ping())
        attempts = {"cq": 1_000_000 - cq_fault.remaining, "index": 1_000_000 - index_fault.remaining}
        assert attempts["cq"] >= 1 and attempts["index"] >= 1, attempts
        for i in range(200):
            assert store.put(mqstore.Message(topic="T", body=b"z", keys=[f"m{i}"])).ok
        store.get("T", 0, 0, 1)  # dispatch has seen every put
        assert 1_000_000 - cq_fault.remaining <= attempts["cq"] + 1
        assert 1_000_000 - index_fault.remaining <= attempts["index"] + 1


def test_a_held_queue_is_logged_when_it_starts_now_and_then_and_when_it_ends_not_per_try(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each tick's retry of a held ConsumeQueue logged the storage layer's two ERROR lines
    again (~170k lines a day at the default tick). Now the first failure is logged whole, the
    retries quietly, a reminder every HELD_REMINDER_INTERVAL_MS of the store's clock, and the
    end of the wait once."""
    import logging

    from mqstore.actors.base import HELD_REMINDER_INTERVAL_MS
    from mqstore.messages import Tick

    caplog.set_level(logging.INFO, logger="mqstore")
    now = [1_700_000_000_000]
    settings = dict(WAITING, flush_interval_consume_queue_ms=3_600_000)
    with mqstore.open(tmp_path / "s", clock_ms=lambda: now[0], **settings) as store:
        assert store.put(Message("t", b"before")).ok
        blocker = tmp_path / "s" / "consumequeue" / "t" / "1"
        blocker.write_bytes(b"in the way")
        assert store.put(Message("t", b"blocked", queue_id=1)).ok
        deadline = time.monotonic() + 10
        while store.dispatch_behind_bytes() and time.monotonic() < deadline:
            time.sleep(0.005)  # reput handed the batch on: it is ahead of our ticks in the inbox
        assert store.dispatch_behind_bytes() == 0

        def lines(text: str) -> int:
            return sum(text in r.getMessage() for r in caplog.records)

        def ticks(count: int) -> None:
            for _ in range(count):
                store.supervisor.ctx.tell("consume_queue", Tick(now_ms=now[0]))
            store.flush()  # after the ticks in the actor's inbox: they were handled

        ticks(5)
        assert lines("creating a segment failed") == 1
        assert lines("consume queue dispatch waits") == 1
        assert lines("still waits") == 0
        now[0] += HELD_REMINDER_INTERVAL_MS
        ticks(3)
        assert lines("still waits") == 1  # one reminder, not one per tick
        assert lines("creating a segment failed") == 1
        blocker.unlink()
        ticks(1)
        assert lines("consume queue dispatch resumed") == 1
        assert [m.body for m in store.get("t", 1, 0, 8).messages] == [b"blocked"]


def test_a_new_cause_while_a_queue_is_held_is_logged_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """Held for one cause (no space to map the next queue file), then another (permission
    denied): the retries run quietly, and the actor's lines said only "cannot write consume
    queue T/0" (the review's reproduction: no line named the new cause). The storage layer's
    reason now rides on the error, and a new one is logged at the next try."""
    import logging

    from mqstore.messages import Tick

    caplog.set_level(logging.INFO, logger="mqstore")
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    settings = dict(WAITING, flush_interval_consume_queue_ms=3_600_000, message_index_enable=False)
    with mqstore.open("/sim/store", fs=fs, clock_ms=lambda: 1_700_000_000_000, **settings) as store:
        assert store.put(mqstore.Message(topic="T", body=b"z")).ok
        store.get("T", 0, 0, 1)
        fs.inject_fault("map", path_contains="consumequeue", err=errno.ENOSPC, count=1_000_000)
        for _ in range(210):  # past the first queue file (200 units)
            assert store.put(mqstore.Message(topic="T", body=b"z")).ok
        store.get("T", 0, 0, 1)  # dispatch has seen every put

        def errors() -> list[str]:
            return [str(r.mqstore_event.get("error")) for r in caplog.records  # type: ignore[attr-defined]
                    if r.levelno >= logging.ERROR and r.name == "mqstore.actors.consume_queue"]  # fmt: skip

        assert len(errors()) == 1 and "No space left on device" in errors()[0]
        fs.clear_faults()
        fs.inject_fault("map", path_contains="consumequeue", err=errno.EACCES, count=1_000_000)
        store.supervisor.ctx.tell("consume_queue", Tick(now_ms=1_700_000_000_000))
        store.flush()
        assert len(errors()) == 2 and "Permission denied" in errors()[1]
        fs.clear_faults()


@pytest.mark.parametrize(("before_kib", "body_kib"), [(1536, 3072), (1, 5120)], ids=["3-mib", "5-mib"])
def test_a_message_larger_than_the_blocks_reserved_ahead_gets_its_blocks_first(before_kib: int, body_kib: int) -> None:
    """The reservation was topped up only below a low water of 2 MiB ahead: a record larger
    than what was reserved ahead (3 MiB at 1.5 MiB into a 4 MiB window, with the default
    max_message_size; any past 4 MiB with it raised) was written into pages with no blocks
    behind them, which on a full disk is a SIGBUS that kills the host (review 33's aside).
    It is reserved for whole first: stored where there is room, refused as disk full where
    there is none, and nothing faults."""
    settings = dict(SMALL_DISK, max_message_size_bytes=8 << 20, mapped_file_size_commitlog_bytes=16 << 20)
    for room in (True, False):
        fs = SimulatedFileSystem(capacity_bytes=64 << 20)
        fs.makedirs("/sim")
        with mqstore.open("/sim/store", fs=fs, **settings) as store:
            for k in range(max(before_kib // 100, 1)):  # the window [0, 4 MiB) reserved, this much used
                assert store.put(Message(topic="T", body=b"s" * min(before_kib * 1024, 100 * 1024), keys=[f"s{k}"])).ok
            if not room:
                fs.write_atomic("/sim/filler", bytes(fs.free_bytes() - 64 * 1024))  # less than a reservation keeps free
            big = store.put(Message(topic="T", body=b"b" * (body_kib * 1024), keys=["big"]))
            if room:
                assert big.ok, big
            else:
                assert big.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in big.detail
                assert store.put(Message(topic="T", body=b"s" * 100, keys=["after"])).ok  # the window still has room
        fs.assert_no_sigbus()


def test_a_short_checkpoint_on_a_full_disk_is_refused_naming_it() -> None:
    """Review 54 L1: a checkpoint cut short is padded to its 4 KiB before the store starts;
    on a full disk that write failed inside the flush actor's start, and the open failed with a
    bare ENOSPC after the supervisor's retries. Now it is refused at once, naming the file."""
    fs = SimulatedFileSystem(capacity_bytes=8 * 1024 * 1024)
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert store.put(mqstore.Message(topic="T", body=b"z")).ok
    fs.write_atomic("/sim/store/checkpoint", fs.read_bytes("/sim/store/checkpoint")[:24])
    fs.write_atomic("/sim/filler", bytes(fs.free_bytes()))
    with pytest.raises(mqstore.StoreDiskFullError, match="checkpoint"):
        mqstore.open("/sim/store", fs=fs, **SETTINGS)
    fs.remove("/sim/filler")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert [m.body for m in store.get("T", 0, 0, 8).messages] == [b"z"]


def test_write_faults_for_want_of_a_block_restart_the_owner_and_never_stop_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 70 M1: on a full btrfs each store through a map faults (btrfs allocates at every
    one, reserved or not), the owner fails at each, and past MAX_RESTARTS the supervisor
    stopped the store: puts and reads refused, and still so once space was back, until a
    reopen. Such a fault (FileWithoutRoomUnderMapError) is a full disk: the owner is restarted
    at the slowest back-off and never given up on. Here the ConsumeQueue owner meets it at
    its next eight batches."""
    from mqstore import supervisor
    from mqstore.actors.consume_queue import ConsumeQueueService
    from mqstore.storage.fs import FileWithoutRoomUnderMapError

    monkeypatch.setattr(supervisor, "BACKOFF_MAX_MS", 5)
    monkeypatch.setattr(supervisor, "MAX_RESTARTS", 3)
    left = [8]
    dispatch = ConsumeQueueService._dispatch

    def without_room(self: ConsumeQueueService, batch: object) -> None:
        if left[0] > 0:
            left[0] -= 1
            path = str(tmp_path / "s" / "consumequeue" / "t" / "0" / f"{0:020d}")
            raise FileWithoutRoomUnderMapError(path, OSError(errno.ENOSPC, "no room on the disk for the page", path))
        dispatch(self, batch)  # type: ignore[arg-type]

    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        assert store.put(Message("t", b"0")).ok
        monkeypatch.setattr(ConsumeQueueService, "_dispatch", without_room)
        acked = [b"0"]
        deadline = time.monotonic() + 30
        while (left[0] or len(store.supervisor.restarts) < 8) and time.monotonic() < deadline:
            put = store.put(Message("t", b"%d" % len(acked)))
            if put.ok:
                acked.append(b"%d" % (len(acked)))
            time.sleep(0.01)
        assert not left[0] and len(store.supervisor.restarts) >= 8, store.supervisor.restarts
        assert store.supervisor.state.name == "RUNNING"
        assert store.put(Message("t", b"%d" % len(acked))).ok
        acked.append(b"%d" % (len(acked)))
        assert store.wait_for_messages("t", 0, len(acked) - 1, timeout_s=10)
        assert [m.body for m in store.get("t", 0, 0, 64).messages] == acked


def test_a_restart_that_fails_after_a_no_room_fault_counts_and_names_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 72 H2: when the owner's restart after a no-room fault failed in its start, the
    supervisor queued the no-room error again, never counted: a persistent I/O error at each
    restart looped for good, the store RUNNING with reads refused and the I/O error never
    logged. A failed restart counts its own error now: the store gives up, naming it."""
    from mqstore import supervisor
    from mqstore.actors.consume_queue import ConsumeQueueService
    from mqstore.storage.fs import FileWithoutRoomUnderMapError

    monkeypatch.setattr(supervisor, "BACKOFF_MAX_MS", 5)
    monkeypatch.setattr(supervisor, "MAX_RESTARTS", 3)
    dispatch, on_start = ConsumeQueueService._dispatch, ConsumeQueueService.on_start

    def without_room(self: ConsumeQueueService, batch: object) -> None:
        path = str(tmp_path / "s" / "consumequeue" / "t" / "0" / f"{0:020d}")
        raise FileWithoutRoomUnderMapError(path, OSError(errno.ENOSPC, "no room on the disk for the page", path))

    def unreadable(self: ConsumeQueueService) -> None:
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "s" / "consumequeue"))

    store = mqstore.open(tmp_path / "s", **SETTINGS)
    try:
        assert store.put(Message("t", b"0")).ok
        monkeypatch.setattr(ConsumeQueueService, "on_start", unreadable)
        monkeypatch.setattr(ConsumeQueueService, "_dispatch", without_room)
        store.put(Message("t", b"1"))
        deadline = time.monotonic() + 30
        while store.supervisor.state.name == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.supervisor.state.name == "FAILED"
        assert "Input/output error" in repr(store.supervisor.fatal_error)
    finally:
        monkeypatch.setattr(ConsumeQueueService, "_dispatch", dispatch)
        monkeypatch.setattr(ConsumeQueueService, "on_start", on_start)
        store.close()


def test_a_restart_whose_start_finds_no_room_is_a_full_disk_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 74: counting a restarted child's own start error (review 72 H2) counted a start
    that found the disk full (ENOSPC), and the store was given up on a full disk again. Such a
    failure is a full disk: restarted at the slowest pace, never given up on."""
    from mqstore import supervisor
    from mqstore.actors.consume_queue import ConsumeQueueService
    from mqstore.storage.fs import FileWithoutRoomUnderMapError

    monkeypatch.setattr(supervisor, "BACKOFF_MAX_MS", 5)
    monkeypatch.setattr(supervisor, "MAX_RESTARTS", 3)
    dispatch, on_start = ConsumeQueueService._dispatch, ConsumeQueueService.on_start
    starts = [6]

    def without_room(self: ConsumeQueueService, batch: object) -> None:
        path = str(tmp_path / "s" / "consumequeue" / "t" / "0" / f"{0:020d}")
        raise FileWithoutRoomUnderMapError(path, OSError(errno.ENOSPC, "no room on the disk for the page", path))

    def no_room_to_start(self: ConsumeQueueService) -> None:
        if starts[0] > 0:
            starts[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "s" / "queue_ledger.msgpack"))
        monkeypatch.setattr(ConsumeQueueService, "_dispatch", dispatch)  # space is back
        on_start(self)

    store = mqstore.open(tmp_path / "s", **SETTINGS)
    try:
        assert store.put(Message("t", b"0")).ok
        monkeypatch.setattr(ConsumeQueueService, "on_start", no_room_to_start)
        monkeypatch.setattr(ConsumeQueueService, "_dispatch", without_room)
        assert store.put(Message("t", b"1")).ok
        deadline = time.monotonic() + 30
        while starts[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.wait_for_messages("t", 0, 1, timeout_s=10)
        assert store.supervisor.state.name == "RUNNING"
        assert [m.body for m in store.get("t", 0, 0, 8).messages] == [b"0", b"1"]
    finally:
        monkeypatch.setattr(ConsumeQueueService, "_dispatch", dispatch)
        monkeypatch.setattr(ConsumeQueueService, "on_start", on_start)
        store.close()
