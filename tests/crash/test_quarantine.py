"""Cut only torn tails (issue 19): a damaged commitlog record with valid records after it is
quarantined (left in place, reported, skipped), never a reason to cut what follows."""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

import mqstore
from mqstore.storage import consume_queue
from mqstore.storage.status import GetMessageStatus
from mqstore.tools.verify import verify_store

from .crashlib import flushed_only_to

SEG = 64 * 1024
SETTINGS: dict[str, Any] = dict(mapped_file_size_commitlog_bytes=SEG, mapped_file_size_consume_queue_bytes=20 * 200)
TOPIC = "q"


def _body(i: int) -> bytes:
    return b"%05d" % i * 20


def _fill(store_dir: str, n: int, settings: dict[str, Any] | None = None) -> list[int]:
    """Put n messages in one queue; their commitlog offsets."""
    offsets = []
    with mqstore.open(store_dir, **(SETTINGS if settings is None else settings)) as store:
        for i in range(n):
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=_body(i), keys=[f"k{i}"]))
            assert r.status is mqstore.PutMessageStatus.PUT_OK
            offsets.append(r.commitlog_offset)
    return offsets


def _flip_body_byte(store_dir: str, record_offset: int, body: bytes) -> int:
    seg = os.path.join(store_dir, "commitlog", "%020d" % (record_offset - record_offset % SEG))
    with open(seg, "r+b") as f:
        f.seek(record_offset % SEG)
        record = f.read(400)
        at = record_offset % SEG + record.index(body) + 3
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    return record_offset - record_offset % SEG + at


def _all_bodies(store: mqstore.MessageStore) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    offset = 0
    end = store.max_offset(TOPIC, 0)
    while offset < end:
        r = store.get(TOPIC, 0, offset, 64)
        if r.status is not GetMessageStatus.FOUND:
            break
        for m in r.messages:
            got[m.queue_offset] = m.body
        offset = r.next_begin_offset
    return got


@pytest.mark.parametrize("aborted", [False, True])
def test_one_flipped_body_byte_loses_nothing_after_it(tmp_path: object, aborted: bool) -> None:
    """The issue's repro: put 200, close cleanly, flip one body byte of message 3, reopen.
    Before: recovery cut the log at message 3 and max_offset was 3."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 200)
    _flip_body_byte(store_dir, offsets[3], _body(3))
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        assert rec.max_offset == offsets[-1] + (offsets[-1] - offsets[-2]), rec.summary()
        assert [(q.start, q.end) for q in rec.quarantined] == [(offsets[3], offsets[4])], rec.summary()
        assert store.max_offset(TOPIC, 0) == 200
        bodies = _all_bodies(store)
        for i in range(200):
            if i != 3:
                assert bodies.get(i) == _body(i), i
        # New puts go after the last record, not over anything.
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.queue_offset == 200, r
        assert r.commitlog_offset == rec.max_offset
    report = verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS))
    damaged = [p for p in report.problems if p.kind == "commitlog_damaged"]
    assert [p.where for p in damaged] == [f"offset {offsets[3]}"], [str(p) for p in report.problems]


def test_a_zeroed_range_in_the_middle_is_quarantined_not_cut(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 200)
    seg = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(seg, "r+b") as f:  # records 10..12 zeroed, header and all
        f.seek(offsets[10])
        f.write(b"\0" * (offsets[13] - offsets[10]))
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        assert [(q.start, q.end) for q in rec.quarantined] == [(offsets[10], offsets[13])], rec.summary()
        bodies = _all_bodies(store)
        assert all(bodies.get(i) == _body(i) for i in range(13, 200)), sorted(set(range(200)) - set(bodies))


def test_a_torn_tail_is_still_cut(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 50)
    _flip_body_byte(store_dir, offsets[49], _body(49))
    flushed_only_to(store_dir, offsets[49])  # torn by a power loss before its flush
    open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and rec.max_offset == offsets[49] and not rec.quarantined, rec.summary()
    assert verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS)).ok


def test_a_zeroed_header_below_the_flushed_offset_is_damage_not_an_unfinished_put(tmp_path: object) -> None:
    """Review 97 M2: a record whose size and magic (8 bytes) were zeroed, its physical-offset
    field intact, far below the offset the checkpoint says was flushed, was taken for "a put
    the writer did not finish": the segment ended there and the 150 flushed, acknowledged
    records after it were cut from the log (kept only in a .damaged copy). Below the flushed
    offset every put was finished: it is damage, quarantined, and what follows is kept."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 200)
    seg = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(seg, "r+b") as f:
        f.seek(offsets[30])
        f.write(bytes(8))
    flushed_only_to(store_dir, offsets[199])
    open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and [q.start for q in rec.quarantined] == [offsets[30]], rec.summary()
        bodies = _all_bodies(store)
        assert all(bodies.get(i) == _body(i) for i in range(31, 200)), sorted(set(range(200)) - set(bodies))


# -------------------------------------------------------------------------------------------
# Holes: a missing or wrong-sized segment (never overwrite, never hide)

SMALL = dict(SETTINGS, mapped_file_size_commitlog_bytes=8 * 1024)


def _fill_small(store_dir: str, n: int) -> list[int]:
    return _fill(store_dir, n, SMALL)


def _segments(store_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(store_dir, "commitlog")))


def _make_hole(store_dir: str, damage: str) -> list[str]:
    """The fourth segment removed, emptied or cut to 1,000 bytes; the segments' names before."""
    names = _segments(store_dir)
    victim = os.path.join(store_dir, "commitlog", names[3])
    if damage == "missing":
        os.remove(victim)
    else:
        with open(victim, "r+b") as f:
            f.truncate(0 if damage == "empty" else 1000)
    return names


@pytest.mark.parametrize("aborted", [False, True])
@pytest.mark.parametrize("damage", ["missing", "empty", "truncated"])
def test_a_hole_opens_degraded_serves_both_sides_and_never_overwrites(tmp_path: object, damage: str,
                                                                      aborted: bool) -> None:  # fmt: skip
    """Before: puts returned PUT_OK and were never readable, reput logged every 100 ms forever,
    close() took 5 s and returned False, and an emptied segment let puts overwrite later files.
    When the queue must be rebuilt across the hole (`aborted`: its files gone after a crash),
    dispatch stops at the hole (review 34: going on past it gave the hole's queue offsets
    filler units, so its messages stayed unreadable once the segment was back): what lies
    after it is served after `mqstore recover`, and the close leaves the abort marker."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill_small(store_dir, 400)  # ~ 10 segments of 8 KiB
    if aborted:  # re-dispatch from the start runs into the hole
        open(os.path.join(store_dir, "abort"), "w").close()
        for name in os.listdir(os.path.join(store_dir, "consumequeue", TOPIC, "0")):
            os.remove(os.path.join(store_dir, "consumequeue", TOPIC, "0", name))
    names = _make_hole(store_dir, damage)
    seg = SMALL["mapped_file_size_commitlog_bytes"]
    hole = (int(names[3]), int(names[3]) + seg)
    later = {n: open(os.path.join(store_dir, "commitlog", n), "rb").read() for n in names[4:]}
    import time

    started = time.monotonic()
    store = mqstore.open(store_dir, **SMALL)
    try:
        for _ in range(500):  # until re-dispatch caught up: bounded
            status = store.supervisor._ask("reput", _ping())
            if status.reput_offset >= status.max_offset or status.at_hole:  # (it waits there)
                break
            time.sleep(0.01)
        bodies = _all_bodies_skipping(store)
        for i, off in enumerate(offsets):
            if off < hole[0] or (not aborted and off >= hole[1]):
                assert bodies.get(i) == _body(i), (i, off)
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE, r
        assert "mqstore recover" in r.detail and str(hole[0]) in r.detail, r.detail
    finally:
        assert store.close() is not aborted
    assert time.monotonic() - started < 30
    for n, data in later.items():  # never written over
        assert open(os.path.join(store_dir, "commitlog", n), "rb").read() == data, n
    if aborted:
        assert os.path.exists(os.path.join(store_dir, "abort"))
        done = _mqstore("recover", "--no-progress", store_dir)
        assert done.returncode == 0, (done.stdout, done.stderr)
        with mqstore.open(store_dir, **SMALL) as store:
            bodies = _all_bodies_skipping(store)
        assert all(bodies.get(i) == _body(i) for i, off in enumerate(offsets) if not hole[0] <= off < hole[1])


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated"])
def test_a_get_across_a_hole_says_so(tmp_path: object, damage: str) -> None:
    """Review 116 L2: a get whose units ran across a hole in the log (a segment missing, empty
    or cut short, not expired) answered FOUND for what lay on either side with an empty
    `detail`, as for a file retention deleted: a consumer committed past the hole's messages unwarned (they come back once the
    segment is put back). The detail names the hole and `mqstore recover`; a file retention
    deleted (below every file left) stays unsaid."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill_small(store_dir, 400)
    names = _make_hole(store_dir, damage)
    seg = SMALL["mapped_file_size_commitlog_bytes"]
    start, end = int(names[3]), int(names[3]) + seg
    kept = start + (1000 if damage == "truncated" else 0)  # the hole's start: records ending past it are in it
    first_in_hole = next(i for i, off in enumerate(offsets) if off >= start and offsets[i + 1] > kept)
    first_past = next(i for i, off in enumerate(offsets) if off >= end)
    with mqstore.open(store_dir, **SMALL) as store:
        r = store.get(TOPIC, 0, first_in_hole - 2, first_past - first_in_hole + 4)
        assert r.status is GetMessageStatus.FOUND
        assert [m.queue_offset for m in r.messages][:4] == [first_in_hole - 2, first_in_hole - 1, first_past, first_past + 1]
        assert "hole" in r.detail and "mqstore recover" in r.detail and str(offsets[first_in_hole]) in r.detail, r.detail
        r = store.get(TOPIC, 0, first_in_hole, 1)  # (the units past the hole are read on to a message, as Java's)
        assert r.status is GetMessageStatus.FOUND and [m.queue_offset for m in r.messages] == [first_past]
        assert "hole" in r.detail and str(offsets[first_in_hole]) in r.detail, r.detail
        assert store.get(TOPIC, 0, 0, 4).detail == ""
        q = store.query(TOPIC, f"k{first_in_hole}", 8, 0, 2**62)
        assert not q.messages and "hole" in q.detail and str(offsets[first_in_hole]) in q.detail, q
        assert store.query(TOPIC, f"k{first_past}", 8, 0, 2**62).detail == ""
    # The oldest segment gone (retention's doing, or looks it): its units read as removed, unsaid.
    os.remove(os.path.join(store_dir, "commitlog", names[0]))
    with mqstore.open(store_dir, **SMALL) as store:
        r = store.get(TOPIC, 0, 0, 1)
        assert r.status in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.OFFSET_TOO_SMALL), r
        assert r.detail == "", r.detail


def _mqstore(*args: str) -> Any:
    """`python -m mqstore ARGS` in a child without the test's MQSTORE_* settings."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    return subprocess.run([sys.executable, "-m", "mqstore", *args], capture_output=True, text=True, timeout=120, env=env)


def _ping() -> Any:
    from mqstore.messages import GetReputStatus

    return GetReputStatus()


def _all_bodies_skipping(store: mqstore.MessageStore) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    for offset in range(store.max_offset(TOPIC, 0)):
        r = store.get(TOPIC, 0, offset, 1)
        if r.status is GetMessageStatus.FOUND and r.messages[0].queue_offset == offset:
            got[offset] = r.messages[0].body
    return got


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_recover_makes_a_hole_whole_and_verify_agrees(tmp_path: object, damage: str) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill_small(store_dir, 400)
    names = _make_hole(store_dir, damage)
    seg = SMALL["mapped_file_size_commitlog_bytes"]
    done = _mqstore("recover", "--no-progress", "--json", store_dir)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    import json

    out = json.loads(done.stdout)
    [(lost_from, lost_to)] = out["lost_ranges"]
    assert lost_to == int(names[3]) + seg and int(names[3]) <= lost_from < lost_to, out
    if damage == "truncated":
        assert os.path.exists(os.path.join(store_dir, "commitlog", names[3] + ".damaged"))
    done = _mqstore("verify", store_dir)
    assert done.returncode == 0, (done.stdout, done.stderr)
    with mqstore.open(store_dir, **SMALL) as store:
        bodies = _all_bodies_skipping(store)
        for i, off in enumerate(offsets):
            if not lost_from <= off < lost_to:
                assert bodies.get(i) == _body(i), (i, off)
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.queue_offset == 400, r
        assert r.commitlog_offset >= int(names[-1]), r


@pytest.mark.parametrize("aborted", [False, True])
@pytest.mark.parametrize("deleted", [1, 2])
def test_deleted_last_segments_are_a_hole_until_recover_and_their_offsets_are_not_reused(
    tmp_path: object, deleted: int, aborted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last segments deleted (by hand, a bad copy): the checkpoint's flushed offset lies in
    a segment that is gone, so the store opens degraded (reads served, puts refused naming the
    hole and `mqstore recover`) and stays so at the next open. Before: it opened as if the log
    ended there, and the next put took the lost records' commitlog offsets (and msgIds).
    `recover` fills the segments, reports them lost, and puts continue after them, at commitlog
    and queue offsets no lost record held."""
    import json

    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill_small(store_dir, 400)
    seg = SMALL["mapped_file_size_commitlog_bytes"]
    last = offsets[-1] - offsets[-1] % seg  # the allocator's next segment, if any, is after it
    gone = [n for n in _segments(store_dir) if int(n) >= last - (deleted - 1) * seg]
    for name in gone:
        os.remove(os.path.join(store_dir, "commitlog", name))
    hole = (last - (deleted - 1) * seg, last + seg)
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    for _ in range(2):  # the next open is degraded too: the evidence is kept
        with mqstore.open(store_dir, **SMALL) as store:
            bodies = _all_bodies_skipping(store)
            assert all(bodies.get(i) == _body(i) for i, off in enumerate(offsets) if off < hole[0])
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
            assert r.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE, r
            assert "mqstore recover" in r.detail and f"{hole[0]}..{hole[1]}" in r.detail, r.detail
    done = _mqstore("recover", "--no-progress", "--json", store_dir)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    lost = json.loads(done.stdout)["lost_ranges"]
    assert json.loads(done.stdout)["reserved_queue_offsets"] == {f"{TOPIC}-0": len(offsets)}, done.stdout
    assert f"queue {TOPIC}-0: the queue offsets of its lost records are not given again" in done.stderr
    assert [(a, b) for a, b in lost] == [(start, start + seg) for start in range(hole[0], hole[1], seg)], lost
    kept = sum(1 for off in offsets if off < hole[0])
    # More lost records than a gap the queue fills unasked (that is a damaged queue offset).
    monkeypatch.setattr(consume_queue, "MAX_FILLED_GAP_UNITS", (len(offsets) - kept) // 2)
    with mqstore.open(store_dir, **SMALL) as store:  # an open and close with no put keeps them taken
        assert store.get(TOPIC, 0, kept - 1, 1).messages[0].body == _body(kept - 1)
    with mqstore.open(store_dir, **SMALL) as store:
        bodies = _all_bodies_skipping(store)
        assert all(bodies.get(i) == _body(i) for i, off in enumerate(offsets) if off < hole[0])
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.commitlog_offset >= hole[1], r
        # Nor their queue offsets: a consumer that had read them would skip the new message.
        assert r.queue_offset == len(offsets), r
        assert store.get(TOPIC, 0, r.queue_offset, 1).messages[0].body == b"new"
        assert store.max_offset(TOPIC, 0) == len(offsets) + 1
        at, seen = kept, []  # a consumer at the lost offsets reads past their filler units to it
        for _ in range(len(offsets)):
            got = store.get(TOPIC, 0, at, 32)
            seen += [m.body for m in got.messages]
            if got.next_begin_offset == at or at > len(offsets):
                break
            at = got.next_begin_offset
        assert seen == [b"new"], (seen, got)
    assert verify_store(store_dir, config=mqstore.StoreConfig(**SMALL)).ok


def _roll_back_the_last_segment(store_dir: str, aborted: bool) -> tuple[list[int], list[int], bytes]:
    """200 messages in the first segment; then the segment replaced by a copy of itself taken
    after the first 100 (a restore of one file, a sync tool that went backwards). Returns the
    offsets of the first and of the second 100, and the segment's own bytes."""
    before = _fill(store_dir, 100)
    segment = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(segment, "rb") as f:
        older_copy = f.read()
    after = _fill_from(store_dir, 100, 200)
    with open(segment, "rb") as f:
        own = f.read()
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    with open(segment, "r+b") as f:
        f.write(older_copy)
    return before, after, own


def _fill_from(store_dir: str, lo: int, hi: int) -> list[int]:
    with mqstore.open(store_dir, **SETTINGS) as store:
        return [store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=_body(i), keys=[f"k{i}"])).commitlog_offset
                for i in range(lo, hi)]  # fmt: skip


@pytest.mark.parametrize("aborted", [False, True])
def test_a_segment_rolled_back_to_an_older_copy_is_a_hole_and_whole_again_once_put_back(
    tmp_path: object, aborted: bool
) -> None:
    """The records end below the checkpoint's flushed offset inside a whole segment. Before, the
    open took that for the log's end, after a clean stop as after a crash: the queues' units
    past it were cut and the next put was stored at the first lost record's commitlog offset
    (its msgId), silently. Now the store opens degraded: reads served, puts refused naming the
    cause, no byte changed; with the segment back, every acknowledged message is served."""
    store_dir = os.path.join(str(tmp_path), "s")
    before, after, own = _roll_back_the_last_segment(store_dir, aborted)
    segment = os.path.join(store_dir, "commitlog", "%020d" % 0)
    for _ in range(2):  # the next open is degraded too: nothing was cut
        with mqstore.open(store_dir, **SETTINGS) as store:
            assert _all_bodies_skipping(store) == {i: _body(i) for i in range(100)}
            # After a crash the queue is rebuilt from the log, which ends at the hole.
            assert store.max_offset(TOPIC, 0) == (100 if aborted else 200)
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
            assert r.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE, r
            assert f"records end at {after[0]}" in r.detail and "put that segment back" in r.detail, r.detail
    with open(segment, "r+b") as f:
        f.write(own)
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert _all_bodies_skipping(store) == {i: _body(i) for i in range(200)}
        assert [m.body for m in store.query(TOPIC, "k150").messages] == [_body(150)]
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.queue_offset == 200, r
        assert r.commitlog_offset > after[-1]
    assert verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS)).ok


def _lagging_flushed_offset(store_dir: str) -> tuple[list[int], str, bytes, bytes]:
    """1100 messages over segments 0..3, the checkpoint's flushed offset left in segment 1 (as a
    kill -9 leaves it: it is written at a thorough flush), and the abort marker. Returns the
    offsets, segment 1's path, its bytes and an older copy of it (taken at message 400)."""
    offsets = _fill(store_dir, 400)
    segment = os.path.join(store_dir, "commitlog", "%020d" % SEG)
    with open(segment, "rb") as f:
        older_copy = f.read()
    offsets += _fill_from(store_dir, 400, 1100)
    assert offsets[-1] > 3 * SEG
    flushed_only_to(store_dir, offsets[450])
    open(os.path.join(store_dir, "abort"), "w").close()
    with open(segment, "rb") as f:
        return offsets, segment, f.read(), older_copy


def test_after_a_crash_nothing_past_records_ending_below_the_flushed_offset_is_deleted(tmp_path: object) -> None:
    """Segment 1 rolled back to an older copy: crash recovery deleted segments 2 and 3 with
    their acknowledged records (review 40 F1). Now every file stays, the open and the next one
    refuse puts, and the segment put back serves every acknowledged message."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets, segment, own, older_copy = _lagging_flushed_offset(store_dir)
    with open(segment, "r+b") as f:
        f.write(older_copy)
    files = _segments(store_dir)
    # inspect names it (review 41 N4: the records in the segments after it hid the hole).
    from pathlib import Path

    from mqstore.tools.inspect_cli import inspect_store

    report = inspect_store(Path(store_dir), mqstore.StoreConfig(store_path_root_dir=store_dir, **SETTINGS))
    assert any(p["kind"] == "commitlog_below_flushed" for p in report["problems"]), report["problems"]
    for _ in range(2):
        with mqstore.open(store_dir, **SETTINGS) as store:
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
            assert r.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE, r
            assert "put that segment back" in r.detail, r.detail
        assert _segments(store_dir) == files
    with open(segment, "r+b") as f:
        f.write(own)
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert _all_bodies_skipping(store) == {i: _body(i) for i in range(1100)}
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.queue_offset == 1100, r
        assert r.commitlog_offset > offsets[-1]


def test_a_writer_restart_on_a_store_degraded_by_a_rolled_back_segment_keeps_refusing(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 41 N1: the restarted writer's recovery scanned only the last three files on disk,
    which lay past the hole (out of the log), so it took puts again over the lost records'
    queue offsets and closed clean. It scans from where the log was read now."""
    import time

    from mqstore.actors import commitlog_writer
    from mqstore.messages import Tick

    store_dir = os.path.join(str(tmp_path), "s")
    offsets, segment, own, older_copy = _lagging_flushed_offset(store_dir)
    with open(segment, "r+b") as f:
        f.write(older_copy)
    failures = [RuntimeError("a writer failure")]
    handle = commitlog_writer.CommitLogWriter._handle

    def failing_once_on_a_tick(self: Any, message: Any) -> Any:
        if isinstance(message, Tick) and failures:
            raise failures.pop()
        return handle(self, message)

    monkeypatch.setattr(commitlog_writer.CommitLogWriter, "_handle", failing_once_on_a_tick)
    with mqstore.open(store_dir, **SETTINGS) as store:
        deadline = time.monotonic() + 10
        while (not store.supervisor.restarts or store.supervisor.state.name != "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.supervisor.restarts and not failures
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and "put that segment back" in r.detail, r
    with open(segment, "r+b") as f:
        f.write(own)
    with mqstore.open(store_dir, **SETTINGS) as store:
        assert _all_bodies_skipping(store) == {i: _body(i) for i in range(1100)}


def test_a_sync_flush_store_records_how_far_it_flushed(tmp_path: object) -> None:
    """Review 41 N2: group commits never set the checkpoint's flushed offset (only a flush-all
    did), so after a kill -9 a SYNC_FLUSH store had none, and records ending below what it had
    forced were cut as a torn tail, the segments after them deleted."""
    import time

    from mqstore.storage.checkpoint import read_checkpoint
    from mqstore.storage.fs import RealFileSystem

    store_dir = os.path.join(str(tmp_path), "s")
    settings = dict(SETTINGS, flush_disk_type="SYNC_FLUSH", flush_commitlog_thorough_interval_ms=1)
    with mqstore.open(store_dir, **settings) as store:
        ends = [r.commitlog_offset + r.wrote_bytes for r in
                (store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=_body(i))) for i in range(50))]  # fmt: skip
        deadline = time.monotonic() + 10  # the flush actor's tick writes the checkpoint
        while time.monotonic() < deadline:
            flushed = read_checkpoint(RealFileSystem(), os.path.join(store_dir, "checkpoint")).physic_flushed_offset
            if flushed == ends[-1]:
                break
            time.sleep(0.02)
        assert flushed == ends[-1]


def test_after_a_crash_a_corrupt_record_below_the_flushed_offset_loses_only_itself(tmp_path: object) -> None:
    """One record below the (lagging) flushed offset damaged: recovery deleted segments 2 and 3
    (review 40 F2), then only the records up to the flushed offset were trusted, and `recover`
    gave up the intact rest of the segment (review 41 N3). Damage there is not a power loss's
    tear: every valid record after it is kept, the damaged one quarantined, puts go on."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets, _, _, _ = _lagging_flushed_offset(store_dir)
    _flip_body_byte(store_dir, offsets[449], _body(449))
    files = _segments(store_dir)
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and [(q.start, q.end) for q in rec.quarantined] == [(offsets[449], offsets[450])]
        assert _all_bodies_skipping(store) == {i: _body(i) for i in range(1100) if i != 449}
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.queue_offset == 1100, r
        assert r.commitlog_offset > offsets[-1]
    assert _segments(store_dir)[: len(files) - 1] == files[: len(files) - 1]


def test_recover_gives_up_the_rest_of_a_rolled_back_segment_and_reuses_no_offset(tmp_path: object) -> None:
    """`mqstore recover` accepts the loss: the segment is ended where its records end (the blank
    record that ends a segment), the lost range and the queue's taken offsets are reported, and
    the next put goes to the next segment, at the next queue offset: no lost record's commitlog
    offset (msgId) or queue offset is given to a new one."""
    import json

    store_dir = os.path.join(str(tmp_path), "s")
    before, after, _ = _roll_back_the_last_segment(store_dir, aborted=False)
    segment = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(segment, "rb") as f:
        rolled_back = f.read()
    done = _mqstore("recover", "--no-progress", "--json", store_dir)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["lost_ranges"] == [[after[0], SEG]], report
    with open(segment + ".damaged", "rb") as f:  # what the blank was written over is kept (review 63 F3)
        assert f.read() == rolled_back
    assert report["reserved_queue_offsets"] == {f"{TOPIC}-0": 200}, report
    for n in range(2):  # and so it stays
        with mqstore.open(store_dir, **SETTINGS) as store:
            assert _all_bodies_skipping(store) == {i: _body(i) for i in range(100)} | {200 + i: b"new" for i in range(n)}
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
            assert r.status is mqstore.PutMessageStatus.PUT_OK, r
            assert r.commitlog_offset >= SEG and r.queue_offset == 200 + n, r
    assert verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS)).ok


@pytest.mark.parametrize("aborted", [False, True])
def test_a_quarantined_record_is_never_served_even_without_crc_on_read(tmp_path: object, aborted: bool) -> None:
    """Recovery already knows the record is damaged: readers skip it and dispatch writes no
    unit for it (a filler keeps the queue dense), whatever `check_crc_on_read` says. Before:
    with the check off, get, lookup and query served the flipped body as good."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 50)
    _flip_body_byte(store_dir, offsets[3], _body(3))
    # The queues and the index are rebuilt by dispatch, which must not take the record in.
    for derived in ("consumequeue", "index"):
        for root, _, files in os.walk(os.path.join(store_dir, derived)):
            for name in files:
                os.remove(os.path.join(root, name))
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, check_crc_on_read=False, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        assert [(q.start, q.end) for q in rec.quarantined] == [(offsets[3], offsets[4])], rec.summary()
        assert store.max_offset(TOPIC, 0) == 50
        bodies = _all_bodies(store)
        assert 3 not in bodies, bodies.get(3)
        assert all(bodies.get(i) == _body(i) for i in range(50) if i != 3), sorted(set(range(50)) - set(bodies))
        r = store.get(TOPIC, 0, 3, 1)
        assert [m.queue_offset for m in r.messages] == [4], r
        assert store.lookup(offsets[3]) is None
        assert store.lookup(offsets[4]) is not None
        assert store.query(TOPIC, "k3").messages == ()
        assert len(store.query(TOPIC, "k4").messages) == 1


def test_a_unit_written_before_the_damage_is_not_served_without_crc_on_read(tmp_path: object) -> None:
    """The queue already held the record's unit when its body was damaged: get skips it."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 50)
    _flip_body_byte(store_dir, offsets[3], _body(3))
    with mqstore.open(store_dir, check_crc_on_read=False, **SETTINGS) as store:
        bodies = _all_bodies(store)
        assert 3 not in bodies and len(bodies) == 49, sorted(bodies)
        assert store.lookup(offsets[3]) is None
        assert store.query(TOPIC, "k3").messages == ()


@pytest.mark.parametrize("aborted", [False, True])
def test_a_truncated_segment_serves_its_valid_start_before_recover(tmp_path: object, aborted: bool) -> None:
    """A short segment's valid records from its start are readable after a plain open (get,
    lookup, query); the hole is only what lies past them, and the store stays degraded
    (puts refused, nothing written). Before: the whole segment was the hole until `recover`."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill_small(store_dir, 400)
    if aborted:  # re-dispatch rebuilds the queue through the short segment
        open(os.path.join(store_dir, "abort"), "w").close()
        for name in os.listdir(os.path.join(store_dir, "consumequeue", TOPIC, "0")):
            os.remove(os.path.join(store_dir, "consumequeue", TOPIC, "0", name))
    names = _segments(store_dir)
    victim = os.path.join(store_dir, "commitlog", names[3])
    start = int(names[3])
    with open(victim, "r+b") as f:
        f.truncate(1000)
    kept = [i for i in range(len(offsets) - 1) if start <= offsets[i] and offsets[i + 1] <= start + 1000]
    assert kept, "the truncation keeps some whole records"
    valid_end = offsets[kept[-1] + 1]
    before = {n: open(os.path.join(store_dir, "commitlog", n), "rb").read() for n in names}
    with mqstore.open(store_dir, **SMALL) as store:
        for _ in range(500):  # until re-dispatch caught up: bounded
            status = store.supervisor._ask("reput", _ping())
            if status.reput_offset >= status.max_offset or status.at_hole:  # (it waits there)
                break
            import time

            time.sleep(0.01)
        bodies = _all_bodies_skipping(store)
        for i in kept:
            assert bodies.get(i) == _body(i), (i, offsets[i])
            record = store.lookup(offsets[i])
            assert record is not None and record.body == _body(i), i
        assert len(store.query(TOPIC, f"k{kept[0]}").messages) == 1
        lost = [i for i, off in enumerate(offsets) if valid_end <= off < start + SMALL["mapped_file_size_commitlog_bytes"]]
        assert all(i not in bodies for i in lost)
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE, r
        assert f"{valid_end}..{start + SMALL['mapped_file_size_commitlog_bytes']}" in r.detail, r.detail
    for n, data in before.items():  # nothing written into or after the short file
        assert open(os.path.join(store_dir, "commitlog", n), "rb").read() == data, n


def _brokers_checkpoint(store_dir: str, physic_ms: int) -> None:
    """A RocketMQ checkpoint: its three timestamps, no flushed offset (mqstore's fields)."""
    import struct

    with open(os.path.join(store_dir, "checkpoint"), "wb") as f:
        f.write(struct.pack(">qqq", physic_ms, physic_ms, physic_ms).ljust(4096, b"\0"))


class _Ticking:
    """A store clock one millisecond further at each reading: every record its own store time."""

    def __init__(self) -> None:
        self.now_ms = 1_800_000_000_000

    def __call__(self) -> int:
        self.now_ms += 1
        return self.now_ms


def _crashed_with_a_zeroed_header(
    store_dir: str, clock_ms: Callable[[], int], body: Callable[[int], bytes], victim: Callable[[list[int]], int]
) -> list[int]:
    """200 puts to one queue, then the `victim`'s size and magic zeroed (its physical-offset
    field intact), a broker's checkpoint of the last record's time, and the abort file: their
    commitlog offsets."""
    with mqstore.open(store_dir, clock_ms=clock_ms, **SETTINGS) as store:
        offsets = [store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=body(i), keys=[f"k{i}"])).commitlog_offset
                   for i in range(200)]  # fmt: skip
        last_ms = store.get(TOPIC, 0, 199, 1).messages[0].store_timestamp
    at = offsets[victim(offsets)]
    with open(os.path.join(store_dir, "commitlog", "%020d" % (at - at % SEG)), "r+b") as f:
        f.seek(at % SEG)
        f.write(bytes(8))
    _brokers_checkpoint(store_dir, last_ms)
    open(os.path.join(store_dir, "abort"), "w").close()
    return offsets


@pytest.mark.parametrize("clock", ["ticking", "held"])
def test_a_zeroed_header_with_later_puts_after_it_is_damage_under_a_brokers_checkpoint(tmp_path: object, clock: str) -> None:
    """Review 99 N3: with a broker's checkpoint (its physic timestamp, no flushed offset), a
    record whose size and magic were zeroed was taken for "a put the writer did not finish",
    and the log was cut there with the 169 flushed records after it. The writer's last put is
    the log's last: later puts after it mean its header was written once. Damage, quarantined,
    what follows kept: later puts stored after it and before the checkpoint's time prove it.
    With the clock held (every record of the checkpoint's millisecond) nothing proves the later
    records flushed, nor the header written: cut, as before (review 100 M2, left)."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _crashed_with_a_zeroed_header(store_dir, _Ticking() if clock == "ticking" else lambda: 1_800_000_000_000,
                                            _body, lambda offsets: 30)  # fmt: skip
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        if clock == "held":
            assert rec.max_offset == offsets[30] and not rec.quarantined, rec.summary()
            return
        assert [q.start for q in rec.quarantined] == [offsets[30]], rec.summary()
        bodies = _all_bodies(store)
        assert all(bodies.get(i) == _body(i) for i in range(31, 200)), sorted(set(range(200)) - set(bodies))


def test_an_open_writes_mqstores_flushed_offset_before_any_put(tmp_path: object) -> None:
    """A broker's checkpoint (its timestamps only) stayed so until the flush actor's first
    flush: a crash before it was judged by timestamps alone, which cannot tell the writer's
    unfinished put from damage once the clock stepped back (review 102 H2). The open writes
    mqstore's flushed offset at once: the log's end, which recovery forced."""
    from mqstore.storage.checkpoint import CheckpointValues

    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 50)
    with open(os.path.join(store_dir, "checkpoint"), "rb") as f:
        physic_ms = CheckpointValues.unpack(f.read()).physic_msg_timestamp
    _brokers_checkpoint(store_dir, physic_ms)
    open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and rec.max_offset > offsets[-1]
        with open(os.path.join(store_dir, "checkpoint"), "rb") as f:
            values = CheckpointValues.unpack(f.read())
        assert values.physic_flushed_offset == rec.max_offset, values
        assert values.physic_msg_timestamp == rec.store_timestamp, values


def test_a_zeroed_header_last_in_its_segment_is_proven_by_the_next_segment(tmp_path: object) -> None:
    """Review 102 H1: with a broker's checkpoint, the search for a later record that proves a
    zeroed header written stopped at the END_OF_FILE blank that ends its segment: the last
    record of a segment damaged, the log was cut there and every later segment deleted with
    its flushed, acknowledged records. The search goes on in the next segment."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _crashed_with_a_zeroed_header(store_dir, _Ticking(), lambda i: _body(i) * 40,
                                            lambda offsets: max(i for i, off in enumerate(offsets) if off < SEG))  # fmt: skip
    last_in_first = max(i for i, off in enumerate(offsets) if off < SEG)
    assert last_in_first < 150, "the records span several segments"
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        assert [q.start for q in rec.quarantined] == [offsets[last_in_first]], rec.summary()
        assert not rec.removed_commitlog_files, rec.summary()
        bodies = _all_bodies(store)
        assert all(bodies.get(i) == _body(i) * 40 for i in range(200) if i != last_in_first), sorted(set(range(200)) - set(bodies))


@pytest.mark.parametrize("after", ["nothing", "its second record's store time not written yet", "stale records"])
@pytest.mark.parametrize("batch_clock", ["same millisecond", "stepped back 11 minutes"])
def test_a_batch_the_writer_died_in_is_cut_with_a_brokers_checkpoint(tmp_path: object, batch_clock: str,
                                                                      after: str) -> None:  # fmt: skip
    """The last put, a batch whose first header the writer had not written, is cut whole,
    whatever its store time says against the checkpoint's (review 100 H1: a rule by store times
    kept 3 of its 4 records when the clock had stepped back past the store's hold), with its
    second record's store time still 0 (review 101 H1: read as a later put), or with valid
    records of an older time past it (review 101 H2: a broker's truncation leaves its stale
    records in place; they were taken for later puts and came back)."""
    import struct

    store_dir = os.path.join(str(tmp_path), "s")
    clock = _Ticking()
    with mqstore.open(store_dir, clock_ms=clock, **SETTINGS) as store:
        for i in range(20):
            assert store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=_body(i))).ok
        flushed_ms = store.get(TOPIC, 0, 19, 1).messages[0].store_timestamp
        if batch_clock != "same millisecond":
            clock.now_ms -= 11 * 60_000
        batch = store.put_batch([mqstore.Message(topic=TOPIC, queue_id=0, body=_body(20 + i)) for i in range(4)])
        assert batch.ok
        batch_ms = store.get(TOPIC, 0, 20, 1).messages[0].store_timestamp
    assert (batch_ms < flushed_ms) == (batch_clock != "same millisecond")
    seg = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(seg, "r+b") as f:
        f.seek(batch.commitlog_offset)
        first = f.read(batch.wrote_bytes)
        f.seek(batch.commitlog_offset)
        f.write(bytes(8))  # its first header, which the writer writes last
        size = struct.unpack_from(">i", first)[0]
        if after == "its second record's store time not written yet":
            f.seek(batch.commitlog_offset + size + 56)
            f.write(bytes(8))
            f.seek(batch.commitlog_offset + 2 * size + 28)  # the third: not patched at all yet
            f.write(bytes(8))
        elif after == "stale records":
            end = batch.commitlog_offset + batch.wrote_bytes
            for k in range(3):  # its records as an older run left them: valid where they lie, stored before
                stale = bytearray(first[:size])
                struct.pack_into(">q", stale, 28, end + k * size)
                struct.pack_into(">q", stale, 56, batch_ms - 60_000)
                f.seek(end + k * size)
                f.write(stale)
    _brokers_checkpoint(store_dir, batch_ms if batch_clock == "same millisecond" else flushed_ms)
    open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and rec.max_offset == batch.commitlog_offset and not rec.quarantined, rec.summary()
        assert sorted(_all_bodies(store)) == list(range(20))
