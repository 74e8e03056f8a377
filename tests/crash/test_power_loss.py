"""Power loss on the simulated disk: what was acknowledged (SYNC_FLUSH) or flushed (ASYNC_FLUSH)
before the crash survives it.

Producers put while another thread takes `fs.crash(seed, tear=True)` (durable bytes plus a
random, partly torn subset of the unsynced pages) at a random moment. A new store opens the
crashed image, and every message acknowledged before the crash began (SYNC_FLUSH), or covered
by a `store.flush()` that completed before it (ASYNC_FLUSH), must be there, at its queue
offset, exactly once; batches all or nothing; verify passes. Seeded: failures print the seed,
and CRASH_SEED replays one.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

import mqstore
from mqstore.storage.fs import SimulatedFileSystem

from crashlib import QUEUES, TOPIC, Ack, assert_verified, check_store, read_all

ROOT = "/sim/store"
SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)


def _producer(store: mqstore.MessageStore, t: int, seed: int, stop: threading.Event,
              acks: list[Ack], acks_lock: threading.Lock) -> None:  # fmt: skip
    rng = random.Random(seed * 31 + t)
    n = 0
    while not stop.is_set():
        n += 1
        queue_id = rng.randrange(QUEUES)
        if rng.random() < 0.3:
            count = rng.randint(2, 5)
            msgs = [
                mqstore.Message(topic=TOPIC, queue_id=queue_id, keys=[f"{seed}-{t}-{n}-{i}"], body=b"b" * 300,
                                properties={"batch": f"B{seed}-{t}-{n}/{count}"})
                for i in range(count)
            ]  # fmt: skip
            result = store.put_batch(msgs)
            new = [Ack(m.keys[0], queue_id, result.queue_offset + i) for i, m in enumerate(msgs)]
        else:
            key = f"{seed}-{t}-{n}"
            result = store.put(mqstore.Message(topic=TOPIC, queue_id=queue_id, keys=[key], body=key.encode() * 20))
            new = [Ack(key, queue_id, result.queue_offset)]
        if result.status is mqstore.PutMessageStatus.PUT_OK:
            with acks_lock:
                acks.extend(new)
        elif not store.running:
            return


def _one_crash(seed: int, flush_disk_type: str, *, checkpoint_zeroed: bool = False) -> None:
    rng = random.Random(seed)
    fs = SimulatedFileSystem()
    store = mqstore.open(ROOT, fs=fs, flush_disk_type=flush_disk_type, **SETTINGS)
    acks: list[Ack] = []
    acks_lock = threading.Lock()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_producer, args=(store, t, seed, stop, acks, acks_lock), daemon=True)
        for t in range(rng.randint(2, 3))
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(rng.uniform(0.05, 0.4))
        if flush_disk_type == "SYNC_FLUSH":
            with acks_lock:
                promised = len(acks)  # acknowledged before the crash began
        else:
            with acks_lock:
                promised = len(acks)
            store.flush()  # everything acknowledged before this call is now durable
            time.sleep(rng.uniform(0.0, 0.1))
        crashed = fs.crash(seed, tear=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        store.close()
    if checkpoint_zeroed and crashed.exists(ROOT + "/checkpoint"):
        crashed.write_atomic(ROOT + "/checkpoint", bytes(4096))  # it records no flush now
    must_have = {a.key: a for a in acks[:promised]}
    context = f"seed {seed} ({flush_disk_type}, {len(must_have)} promised of {len(acks)} acknowledged)"
    reopened = mqstore.open(ROOT, fs=crashed, flush_disk_type=flush_disk_type, **SETTINGS)
    try:
        rec = reopened.supervisor.recovery
        assert rec is not None and not rec.last_exit_ok, context
        check_store(reopened, must_have, context, unacked_batches_whole=False)
        config = reopened.config
    finally:
        assert reopened.close(), f"{context}: unclean close"
    assert_verified(ROOT, context, fs=crashed, config=config)


def _seeds(default: list[int]) -> list[int]:
    env = os.environ.get("CRASH_SEED")
    return [int(env)] if env else default


# Seeds 3, 5, 7, 9, 10, 11, 14, 16 once failed: ConsumeQueue files with holes after a power loss
# (get() NO_MATCHED_MESSAGE at a file boundary, queue offsets not dense, half batches), and
# one message indexed twice. Kept as regression cases (timing still varies from run to run).
SYNC_SEEDS = _seeds(list(range(1, 17)))


@pytest.mark.parametrize("seed", SYNC_SEEDS)
def test_power_loss_keeps_every_sync_acknowledged_message(seed: int) -> None:
    _one_crash(seed, "SYNC_FLUSH")


@pytest.mark.parametrize("seed", _seeds(list(range(101, 105))))
def test_power_loss_keeps_everything_flushed_under_async_flush(seed: int) -> None:
    _one_crash(seed, "ASYNC_FLUSH")


@pytest.mark.parametrize("flush_disk_type", ["SYNC_FLUSH", "ASYNC_FLUSH"])
@pytest.mark.parametrize("seed", _seeds([2, 4, 6, 8]))
def test_power_loss_with_a_checkpoint_that_records_no_flush_cuts_the_torn_tail(seed: int, flush_disk_type: str) -> None:
    """Review 55 F1: with no flush in the checkpoint, recovery looked past zeros without a
    bound (8b5e65d, for review 54 H2's flipped byte): unflushed records past a torn hole were
    kept, the queue offsets not dense and the store reported damaged for good. Zeros and torn
    records are a torn tail again; only a corrupt record with no torn sector is looked past
    (test_damage_recovery: ..._no_checkpoint_to_tell_...)."""
    _one_crash(seed, flush_disk_type, checkpoint_zeroed=True)


@pytest.mark.soak
def test_power_loss_soak() -> None:
    for seed in range(1000, 1000 + int(os.environ.get("CRASH_SOAK_KILLS", "500"))):
        _one_crash(seed, "SYNC_FLUSH" if seed % 2 else "ASYNC_FLUSH")


def test_a_torn_record_in_the_last_flushed_millisecond_is_a_torn_tail_not_damage() -> None:
    """Deterministic (seeds 101 and 103 once failed this way, 3 runs in ~100): every record
    stored in one millisecond; a flush covers the first ones; after it, of the records
    appended in that same millisecond, one is torn and a later one reached the disk. The
    torn one is past the last flush, so recovery cuts there (a dense prefix), instead of
    quarantining it and keeping the later, unflushed record past a hole."""
    fs = SimulatedFileSystem()
    settings = dict(SETTINGS, flush_disk_type="ASYNC_FLUSH", flush_interval_commitlog_ms=3_600_000)
    store = mqstore.open(ROOT, fs=fs, clock_ms=lambda: 1_800_000_000_000, **settings)
    try:
        for i in range(5):
            assert store.put(mqstore.Message(topic=TOPIC, queue_id=0, keys=[f"f{i}"], body=f"f{i}".encode() * 100)).ok
        store.flush()  # durable, with the checkpoint saying up to where
        late = [store.put(mqstore.Message(topic=TOPIC, queue_id=0, keys=[f"l{i}"], body=f"l{i}".encode() * 100)) for i in range(3)]
        assert all(r.ok for r in late)
        crashed = fs.crash(0, tear=False)  # durable bytes only
        seg = ROOT + "/commitlog/" + "0" * 20
        with fs._lock:  # the last late record reached the disk, the first one half of it
            src = fs._files[seg].volatile
            for r, kept in ((late[0], 100), (late[2], late[2].wrote_bytes)):
                start = r.commitlog_offset
                crashed._files[seg].volatile[start : start + kept] = src[start : start + kept]
                crashed._files[seg].durable[start : start + kept] = src[start : start + kept]
    finally:
        store.close()
    reopened = mqstore.open(ROOT, fs=crashed, **settings)
    try:
        rec = reopened.supervisor.recovery
        assert rec is not None and not rec.quarantined, rec.summary()
        assert rec.max_offset == late[0].commitlog_offset, rec.summary()
        check_store(reopened, {}, "torn record in the last flushed millisecond")
        assert reopened.max_offset(TOPIC, 0) == 5
    finally:
        reopened.close()


def test_damage_to_flushed_bytes_of_the_last_millisecond_is_quarantined_not_cut() -> None:
    """The other side of the test above: a record below the checkpoint's flushed offset is
    damaged (not a power loss: the bytes were durable), in the same millisecond as the
    records after it. Those were flushed too, so they stay; only the damaged one is gone."""
    fs = SimulatedFileSystem()
    settings = dict(SETTINGS, flush_disk_type="ASYNC_FLUSH", flush_interval_commitlog_ms=3_600_000)
    store = mqstore.open(ROOT, fs=fs, clock_ms=lambda: 1_800_000_000_000, **settings)
    try:
        stored = [store.put(mqstore.Message(topic=TOPIC, queue_id=0, keys=[f"f{i}"], body=f"f{i}".encode() * 100))
                  for i in range(5)]  # fmt: skip
        assert all(r.ok for r in stored)
        store.flush()
        crashed = fs.crash(0, tear=False)
        seg = ROOT + "/commitlog/" + "0" * 20
        with crashed._lock:  # a bit of record 2's body flipped on the disk
            at = stored[2].commitlog_offset + stored[2].wrote_bytes - 20
            crashed._files[seg].durable[at] ^= 0x01
            crashed._files[seg].volatile[at] ^= 0x01
    finally:
        store.close()
    reopened = mqstore.open(ROOT, fs=crashed, **settings)
    try:
        rec = reopened.supervisor.recovery
        assert rec is not None and len(rec.quarantined) == 1, rec.summary()
        assert rec.max_offset == stored[4].commitlog_offset + stored[4].wrote_bytes, rec.summary()
        keys = [m.body[:2].decode() for m in reopened.get(TOPIC, 0, 0, 10).messages]
        assert keys == ["f0", "f1", "f3", "f4"]
    finally:
        reopened.close()


UNACKED_BATCH_TEAR = (
    "known limitation, not fixed: a power loss can keep the first records of an UNACKNOWLEDGED "
    "batch and tear the rest (sector-level write-back). The writer stores the first record's "
    "size and magic last, which makes a batch atomic against a process crash (page cache "
    "intact), not against a torn write-back; the 4.x record format has no batch marker for "
    "recovery to find the batch's extent, and a fix needs either one (a sysflag bit, as "
    "RocketMQ 5's INNER_BATCH) or a flush of the batch's body before its header is written"
)


@pytest.mark.xfail(strict=True, reason=UNACKED_BATCH_TEAR)
def test_power_loss_never_keeps_half_of_an_unacknowledged_batch() -> None:
    """Deterministic: a batch appended but not flushed; the crash keeps the page holding the
    batch's start (with the header written last) and loses the sectors after it."""
    fs = SimulatedFileSystem()
    settings = dict(SETTINGS, flush_disk_type="ASYNC_FLUSH", flush_interval_commitlog_ms=3_600_000)
    store = mqstore.open(ROOT, fs=fs, **settings)
    try:
        store.put(mqstore.Message(topic=TOPIC, queue_id=0, keys=["single"], body=b"single" * 20))
        store.flush()
        msgs = [mqstore.Message(topic=TOPIC, queue_id=0, keys=[f"b{i}"], body=b"b" * 900,
                                properties={"batch": "B/4"}) for i in range(4)]  # fmt: skip
        result = store.put_batch(msgs)
        assert result.status is mqstore.PutMessageStatus.PUT_OK
        crashed = fs.crash(0, tear=False)  # durable bytes only
        seg = ROOT + "/commitlog/" + "0" * 20
        with fs._lock:  # write back the batch's first 1024 bytes, as a torn page would
            start = result.commitlog_offset
            src = fs._files[seg].volatile
            crashed._files[seg].volatile[start : start + 1024] = src[start : start + 1024]
            crashed._files[seg].durable[start : start + 1024] = src[start : start + 1024]
    finally:
        store.close()
    reopened = mqstore.open(ROOT, fs=crashed, **settings)
    try:
        check_store(reopened, {}, "torn unacknowledged batch")
    finally:
        reopened.close()



@pytest.mark.parametrize("damage", ["body", "magic"])
def test_a_corrupt_flushed_record_does_not_keep_unflushed_records_past_a_tear(damage: str) -> None:
    """Review 42 G1: a flushed record damaged on the disk (the last below the checkpoint's
    flushed offset), and past that offset a torn write-back (the first late record never
    written, a later one was). The damage is quarantined; the scan goes on from the flushed
    offset, where the zeros are a torn tail: the later, unflushed record is not kept past the
    hole (the look past the damage once went on to it without a bound)."""
    fs = SimulatedFileSystem()
    settings = dict(SETTINGS, flush_disk_type="ASYNC_FLUSH", flush_interval_commitlog_ms=3_600_000)
    store = mqstore.open(ROOT, fs=fs, clock_ms=lambda: 1_800_000_000_000, **settings)
    try:
        flushed = [store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=f"f{i}".encode() * 100)) for i in range(5)]
        store.flush()
        late = [store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=f"l{i}".encode() * 100)) for i in range(3)]
        crashed = fs.crash(0, tear=False)  # durable bytes only
        seg = ROOT + "/commitlog/" + "0" * 20
        with fs._lock:
            source = fs._files[seg].volatile
            r = late[2]  # it alone reached the disk
            at = flushed[4].commitlog_offset + (4 if damage == "magic" else flushed[4].wrote_bytes - 20)
            for image in (crashed._files[seg].volatile, crashed._files[seg].durable):
                image[r.commitlog_offset : r.commitlog_offset + r.wrote_bytes] = source[
                    r.commitlog_offset : r.commitlog_offset + r.wrote_bytes
                ]
                image[at] ^= 0x5A
    finally:
        store.close()
    end = flushed[4].commitlog_offset + flushed[4].wrote_bytes
    with mqstore.open(ROOT, fs=crashed, **settings) as reopened:
        rec = reopened.supervisor.recovery
        assert rec is not None and [(q.start, q.end) for q in rec.quarantined] == [(flushed[4].commitlog_offset, end)]
        assert rec.max_offset == end, rec.summary()
        served = [m.body[:2] for m in reopened.get(TOPIC, 0, 0, 20).messages]
        assert served == [b"f0", b"f1", b"f2", b"f3"], served
        assert reopened.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"next")).commitlog_offset == end


def test_a_restarted_flush_actor_forces_what_the_dead_one_had_not() -> None:
    """Review 42 G2: the flush actor dies forcing segment 0 as the writer rolls into segment 1;
    its successor started from segment 1's start, so segment 0's tail was never forced, and a
    later flush() (and the checkpoint) covered bytes that a power loss then took. A restarted
    flush actor starts from what is known durable."""
    fs = SimulatedFileSystem()
    plan = mqstore.FaultPlan()
    settings = dict(SETTINGS, flush_disk_type="ASYNC_FLUSH", flush_interval_commitlog_ms=3_600_000,
                    flush_commitlog_thorough_interval_ms=3_600_000, flush_commitlog_least_pages=1_000_000)  # fmt: skip
    store = mqstore.open(ROOT, fs=fs, faults=plan, **settings)
    try:
        plan.arm("flush.mid_fsync", 1)  # the flush at the roll into segment 1 dies
        results = [store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"%05d" % i * 40)) for i in range(400)]
        assert all(r.ok for r in results) and results[-1].commitlog_offset > SETTINGS["mapped_file_size_commitlog_bytes"]
        deadline = time.monotonic() + 10
        while (not store.supervisor.restarts or store.supervisor.state.name != "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.supervisor.restarts, "the flush actor did not fail"
        store.flush()
        crashed = fs.crash(0, tear=True)  # only what was forced is sure to be there
    finally:
        store.close()
    with mqstore.open(ROOT, fs=crashed, **settings) as reopened:
        served = [m.body for m in read_all(reopened, TOPIC, 0)]
        assert served == [b"%05d" % i * 40 for i in range(400)], len(served)


def test_a_queue_unit_torn_at_a_sector_is_rebuilt_not_served_as_another_message() -> None:
    """Review 122 F3: a power loss wrote back the sector holding a unit's size and tags code but
    not the one before it holding its commitlog offset: the unit read (0, 282, 0), valid by
    RocketMQ's rule (offset >= 0, size > 0), and the acknowledged message at that queue
    offset was served as the log's first one (its own never again: the next put took the
    next offset). A unit not past the real one before it is no unit: the queue is rebuilt."""
    import struct

    n = 102  # unit 102 spans bytes 2040..2059 of the queue file; a 512-byte sector starts at 2048
    clock = [int(time.time() * 1000)]
    settings = dict(SETTINGS, mapped_file_size_commitlog_bytes=16 * 1024, mapped_file_size_consume_queue_bytes=20 * 1000,
                    message_index_enable=False, flush_disk_type="SYNC_FLUSH", flush_interval_consume_queue_ms=3_600_000,
                    flush_consume_queue_thorough_interval_ms=3_600_000)  # fmt: skip
    fs = SimulatedFileSystem(clock_ms=lambda: clock[0])
    store = mqstore.open(ROOT, fs=fs, clock_ms=lambda: clock[0], **settings)  # type: ignore[arg-type]
    acked: list[tuple[str, int, bytes]] = []

    def put(topic: str, i: int) -> None:
        clock[0] += 100
        body = b"%s%05d" % (topic.encode(), i) * 30
        r = store.put(mqstore.Message(topic=topic, body=body))
        assert r.ok, r
        acked.append((topic, r.queue_offset, body))

    for i in range(n):
        put("Q", i)
    for i in range(300):
        put("BUSY", i)
    store.flush()  # Q's unit n is the first not on disk
    for i in range(100):
        put("BUSY", 1000 + i)
    put("Q", n)
    for i in range(50):
        put("BUSY", 2000 + i)  # (SYNC_FLUSH forced the log; Q's queue file was not flushed since)
    cq = ROOT + "/consumequeue/Q/0/%020d" % 0
    written = bytes(fs._files[cq].volatile)
    crashed = fs.crash(0, tear=False)
    store.close()
    torn = crashed._files[cq]
    sector = 20 * n + 8
    torn.volatile[sector:4096] = written[sector:4096]  # this sector of the page written back, not the one before
    torn.durable[sector:4096] = written[sector:4096]
    assert struct.unpack(">qiq", bytes(torn.volatile[20 * n : 20 * n + 20]))[0] == 0
    with mqstore.open(ROOT, fs=crashed, clock_ms=lambda: clock[0], **settings) as reopened:  # type: ignore[arg-type]
        for topic, offset, body in acked:
            got = reopened.get(topic, 0, offset, 1).messages
            assert got and got[0].body == body, (topic, offset, got[0].body[:6] if got else None)
        assert reopened.put(mqstore.Message(topic="Q", body=b"after")).queue_offset == n + 1
