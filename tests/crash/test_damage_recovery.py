"""Damaged stores recover to the last valid state, say so in the RecoveryReport, and never crash
or loop (every open runs under a timeout). Each test damages one thing on purpose, reopens,
checks what survived and what the report says, and runs `verify`; CLI tests check `mqstore
recover` and `mqstore verify` on a running, a healthy and a damaged store."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from typing import Any

import pytest

import mqstore
from mqstore.storage.checkpoint import read_checkpoint
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.recovery import RecoveryReport
from mqstore.storage.status import GetMessageStatus
from mqstore.tools.verify import verify_store

SEG = 64 * 1024
CQ_FILE = 20 * 200  # 200 units per ConsumeQueue file
SETTINGS: dict[str, Any] = dict(mapped_file_size_commitlog_bytes=SEG, mapped_file_size_consume_queue_bytes=CQ_FILE)
OPEN_TIMEOUT_S = 60.0
TOPIC = "d"


def _fill(store_dir: str, n: int, queues: int = 1) -> None:
    with mqstore.open(store_dir, **SETTINGS) as store:
        for i in range(n):
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=i % queues, body=b"%06d" % i * 40, keys=[f"k{i}"]))
            assert r.status is mqstore.PutMessageStatus.PUT_OK


def _crashed(store_dir: str) -> None:
    open(os.path.join(store_dir, "abort"), "w").close()


def _open_checked(store_dir: str) -> tuple[RecoveryReport, dict[int, list[int]]]:
    """Open under a timeout, read every queue, close; (the recovery report, bodies' numbers per queue)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            with mqstore.open(store_dir, **SETTINGS) as store:
                rec = store.supervisor.recovery
                assert rec is not None
                out["rec"] = rec
                queues: dict[int, list[int]] = {}
                for q in range(4):
                    got: list[int] = []
                    offset = 0
                    # Wait for re-dispatch: bounded polls of the queue's max offset.
                    for _ in range(500):  # until re-dispatch caught up: bounded
                        if store.supervisor._ask("reput", _ping()).reput_offset >= rec.max_offset:
                            break
                        threading.Event().wait(0.01)
                    end = store.max_offset(TOPIC, q)
                    while offset < end:
                        r = store.get(TOPIC, q, offset, 64)
                        if not r.messages and r.next_begin_offset > offset:
                            # Only filler units (queue offsets of records a cut lost, never
                            # given again): written once re-dispatch passed the log's end, so
                            # seen or not depending on when `end` was read.
                            offset = r.next_begin_offset
                            continue
                        assert r.status is GetMessageStatus.FOUND, (q, offset, r.status)
                        got.extend(int(m.body[:6]) for m in r.messages)
                        offset = r.next_begin_offset
                    queues[q] = got
                out["queues"] = queues
        except BaseException as exc:  # reported to the test thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(OPEN_TIMEOUT_S)
    assert not t.is_alive(), f"open/read of {store_dir} did not finish in {OPEN_TIMEOUT_S} s (a loop?)"
    if "error" in out:
        raise out["error"]
    return out["rec"], out["queues"]


def _ping() -> Any:
    from mqstore.messages import GetReputStatus

    return GetReputStatus()


def _verified(store_dir: str) -> None:
    report = verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS))
    assert report.ok, [str(p) for p in report.problems[:10]]


def _cq(store_dir: str, queue_id: int = 0) -> str:
    return os.path.join(store_dir, "consumequeue", TOPIC, str(queue_id))


# -------------------------------------------------------------------------------------------
# ConsumeQueue


@pytest.mark.parametrize("aborted", [False, True])
def test_consume_queue_tail_cut_mid_unit_is_rebuilt(tmp_path: object, aborted: bool) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 300)  # queue 0: a full file of 200 units, then 100 units
    last = os.path.join(_cq(store_dir), "%020d" % CQ_FILE)
    with open(last, "r+b") as f:
        f.truncate(57 * 20 + 7)  # the file now ends inside unit 257
    if aborted:
        _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(300)), rec.summary()
    _verified(store_dir)


@pytest.mark.parametrize("aborted", [False, True])
def test_a_consume_queue_file_cut_short_is_rebuilt(tmp_path: object, aborted: bool) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 500)  # queue 0: files at 0, 4000, 8000 (units 0..499)
    with open(os.path.join(_cq(store_dir), "%020d" % CQ_FILE), "r+b") as f:
        f.truncate(1000)  # the middle file loses 150 units
    if aborted:
        _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(500)), rec.summary()
    assert any("%020d" % CQ_FILE in d for d in rec.damaged_consume_queue_files), rec.summary()
    _verified(store_dir)


def test_a_consume_queue_hole_after_power_loss_is_rebuilt(tmp_path: object) -> None:
    """Regression (power-loss seeds 7 and 10): a queue whose middle file never reached the disk
    (zeros) while later files did; recovery started at the third-last file and never saw the
    hole, and the duplicate guard skipped the missing units on re-dispatch for ever."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 900)  # queue 0: files 0, 4000, 8000, 12000, 16000 (units 0..899)
    for name, start, end in (("%020d" % CQ_FILE, 0, CQ_FILE), ("%020d" % 0, 520, 1024)):
        with open(os.path.join(_cq(store_dir), name), "r+b") as f:
            f.seek(start)
            f.write(bytes(end - start))  # a whole file, and a torn sector, unwritten
    os.remove(os.path.join(store_dir, "checkpoint"))
    _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(900)), rec.summary()
    assert rec.truncated_consume_queues == 1, rec.summary()
    _verified(store_dir)


def test_an_empty_consume_queue_file_at_a_boundary_leaves_no_phantom_unit(tmp_path: object) -> None:
    """Regression (get at queue offset 200 answered NO_MATCHED_MESSAGE): a queue's newest file,
    created at the boundary, holds only zeros after a crash while the log was cut below units
    of the previous file. Truncation kept the zero file with one phantom unit and stopped."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 210)
    cq_dir = _cq(store_dir)
    with open(os.path.join(cq_dir, "%020d" % CQ_FILE), "r+b") as f:
        f.write(bytes(CQ_FILE))
    # Cut the commitlog inside the first file's last units: records from number 190 on go.
    seg = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(os.path.join(cq_dir, "%020d" % 0), "rb") as f:
        f.seek(190 * 20)
        cut = struct.unpack(">q", f.read(8))[0]
    with open(seg, "r+b") as f:
        f.seek(cut)
        f.write(bytes(SEG - cut))
    for name in os.listdir(os.path.join(store_dir, "commitlog")):
        if int(name) > 0:
            os.remove(os.path.join(store_dir, "commitlog", name))
    # A checkpoint without mqstore's flushed offset (a broker's): with it, segments deleted
    # below that offset are a hole the store stays degraded on (test_quarantine.py).
    with open(os.path.join(store_dir, "checkpoint"), "r+b") as f:
        f.seek(4096 - 24)
        f.write(bytes(24))
    _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(190)), rec.summary()
    assert rec.max_offset == cut, rec.summary()
    with mqstore.open(store_dir, **SETTINGS) as store:
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"%06d" % 190 * 40, keys=["k190"]))
        # Queue offsets 190..209 were handed out to records the cut lost: never given again
        # (test_lost_queue_offsets.py); filler units hold them.
        assert r.queue_offset == 210, r
        assert store.wait_for_messages(TOPIC, 0, 210, timeout_s=10)
        first = store.get(TOPIC, 0, 190, 32)  # the fillers to the file's end, then the new record
        assert not first.messages and first.next_begin_offset == 200, first
        assert [m.body for m in store.get(TOPIC, 0, 200, 32).messages] == [b"%06d" % 190 * 40]
    _verified(store_dir)


# -------------------------------------------------------------------------------------------
# index, checkpoint, commitlog


@pytest.mark.parametrize("aborted", [False, True])
def test_a_corrupt_index_header_drops_the_file_and_rebuilds_it(tmp_path: object, aborted: bool) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 300)
    index_dir = os.path.join(store_dir, "index")
    (name,) = os.listdir(index_dir)
    with open(os.path.join(index_dir, name), "r+b") as f:
        f.seek(36)
        f.write(struct.pack(">i", -7))  # indexCount
        f.seek(16)
        f.write(struct.pack(">q", 1 << 40))  # beginPhyOffset
    if aborted:
        _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(300))
    # After a crash it goes anyway (not full), else for its header.
    assert any(name in r and ("corrupt header" in r or aborted) for r in rec.dropped_index_reasons), rec.summary()
    assert rec.dispatch_from == 0, rec.summary()
    with mqstore.open(store_dir, **SETTINGS) as store:
        for i in (0, 150, 299):
            assert [m.key_list[0] for m in store.query(TOPIC, f"k{i}").messages] == [f"k{i}"]
    _verified(store_dir)


def test_a_checkpoint_ahead_of_the_data_is_reported_and_nothing_is_lost(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 600)
    path = os.path.join(store_dir, "checkpoint")
    cp = read_checkpoint(RealFileSystem(), path)
    future = cp.physic_msg_timestamp + 10 * 24 * 3600 * 1000
    with open(path, "r+b") as f:
        f.write(struct.pack(">qqq", future, future, future))
    _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert rec.checkpoint_ahead_of_data, rec.summary()
    assert queues[0] == list(range(600))
    _verified(store_dir)


@pytest.mark.parametrize("length", [SEG, 0, 100])
def test_a_stray_empty_segment_after_the_last_is_removed(tmp_path: object, length: int) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 300)
    names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    stray = os.path.join(store_dir, "commitlog", "%020d" % (int(names[-1]) + SEG))
    with open(stray, "wb") as f:
        f.truncate(length)  # pre-allocated (full, zeros) or being created at the crash (short)
    _crashed(store_dir)
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(300))
    assert not os.path.exists(stray) or os.path.getsize(stray) == SEG, rec.summary()
    if length != SEG:
        assert any(os.path.basename(stray) in r for r in rec.removed_commitlog_files), rec.summary()
    _verified(store_dir)


@pytest.mark.parametrize("garbage", [False, True])
def test_removing_an_unwritten_next_segment_is_not_a_warning(
    tmp_path: object, garbage: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """After a crash the allocator's next segment (created ahead, zeros) is removed on every
    open: said at INFO. A removed segment holding any non-zero byte is still a WARNING."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 300)
    names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    stray = os.path.join(store_dir, "commitlog", "%020d" % (int(names[-1]) + SEG))
    with open(stray, "wb") as f:
        f.truncate(SEG)
        if garbage:
            f.seek(SEG // 2)
            f.write(b"\xab" * 100)  # past a zero first record: the scan ends before this file
    _crashed(store_dir)
    caplog.set_level("INFO", logger="mqstore")
    rec, queues = _open_checked(store_dir)
    assert queues[0] == list(range(300))
    assert any(os.path.basename(stray) in r for r in rec.removed_commitlog_files), rec.summary()
    warned = [r for r in caplog.records if r.getMessage() == "recovery truncated the commitlog"]
    told = [r for r in caplog.records if r.getMessage() == "recovery removed unwritten commitlog segments past the end"]
    if garbage:
        assert len(warned) == 1 and warned[0].levelname == "WARNING" and not told
        assert warned[0].mqstore_event["removed_files_with_data"] == [os.path.basename(stray)]
    else:
        assert not warned and len(told) == 1 and told[0].levelname == "INFO"
    _verified(store_dir)


@pytest.mark.parametrize("aborted", [False, True])
def test_damage_in_the_middle_of_the_commitlog_is_quarantined_not_cut(tmp_path: object, aborted: bool) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 1000, queues=2)  # ~ 5 segments
    names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    assert len(names) >= 4
    middle = os.path.join(store_dir, "commitlog", names[-2])  # within the last three: both scans see it
    with open(middle, "r+b") as f:
        f.seek(20000)
        f.write(b"\xab" * 3000)
    if aborted:
        _crashed(store_dir)
    rec, queues = _open_checked_skipping(store_dir)
    start = int(names[-2])
    assert len(rec.quarantined) == 1, rec.summary()
    damaged = rec.quarantined[0]
    assert start <= damaged.start <= start + 20000 and start + 23000 <= damaged.end, rec.summary()
    assert rec.damaged_at == -1 and not rec.removed_commitlog_files, rec.summary()
    kept = sorted(queues[0] + queues[1])
    lost = set(range(1000)) - set(kept)
    assert 0 < len(lost) < 30 and kept == sorted(set(kept)), rec.summary()  # only the damaged records
    report = verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS))
    assert {p.kind for p in report.problems} == {"commitlog_damaged"}, [str(p) for p in report.problems[:10]]


@pytest.mark.parametrize("checkpoint", ["missing", "zero-filled", "empty"])
def test_after_a_crash_with_no_checkpoint_to_tell_damage_is_still_quarantined_not_cut(
    tmp_path: object, checkpoint: str
) -> None:
    """Review 54 H2: after a crash, a checkpoint that says nothing (removed, zeroed, cut to
    nothing) made recovery trust no record after the first damage, so one damaged record cut
    and zeroed every flushed, acknowledged record after it (mqstore recover did too, exit 0).
    With no evidence of what was unflushed, the damage is quarantined and the rest kept."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 1000, queues=2)
    names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    middle = os.path.join(store_dir, "commitlog", names[-2])
    with open(middle, "r+b") as f:
        f.seek(20000)
        f.write(b"\xab" * 3000)
    _crashed(store_dir)
    path = os.path.join(store_dir, "checkpoint")
    if checkpoint == "missing":
        os.remove(path)
    elif checkpoint == "zero-filled":
        with open(path, "r+b") as f:
            f.write(bytes(4096))
    else:
        os.truncate(path, 0)
    rec, queues = _open_checked_skipping(store_dir)
    assert len(rec.quarantined) == 1 and rec.damaged_at == -1 and not rec.removed_commitlog_files, rec.summary()
    kept = sorted(queues[0] + queues[1])
    lost = set(range(1000)) - set(kept)
    assert 0 < len(lost) < 30 and kept == sorted(set(kept)), rec.summary()  # only the damaged records


def _open_checked_skipping(store_dir: str) -> tuple[RecoveryReport, dict[int, list[int]]]:
    """As _open_checked, reading past queue offsets whose record is damaged."""
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        for _ in range(500):  # until re-dispatch caught up: bounded
            if store.supervisor._ask("reput", _ping()).reput_offset >= rec.max_offset:
                break
            threading.Event().wait(0.01)
        queues: dict[int, list[int]] = {}
        for q in range(2):
            got: list[int] = []
            for offset in range(store.max_offset(TOPIC, q)):
                r = store.get(TOPIC, q, offset, 1)
                if r.status is not GetMessageStatus.FOUND or r.messages[0].queue_offset != offset:
                    continue  # the damaged record is skipped
                if r.messages[0].body == b"%06d" % int(r.messages[0].body[:6]) * 40:
                    got.append(int(r.messages[0].body[:6]))
            queues[q] = got
    return rec, queues


# -------------------------------------------------------------------------------------------
# CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mqstore", *args], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")})  # fmt: skip


def test_cli_recover_and_verify_refuse_a_running_store(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 20)
    with mqstore.open(store_dir, **SETTINGS):
        for command in ("recover", "verify"):
            done = _cli(command, store_dir)
            assert done.returncode == 4, (command, done.returncode, done.stdout, done.stderr)
            assert "running" in done.stderr and store_dir in done.stderr, (command, done.stderr)


def test_cli_recover_and_verify_on_a_healthy_and_a_damaged_store(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 300)
    for command in ("verify", "recover"):
        done = _cli(command, store_dir)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    # Damage: a unit of queue 0 points at the wrong record.
    with open(os.path.join(_cq(store_dir), "%020d" % 0), "r+b") as f:
        f.seek(5 * 20)
        f.write(struct.pack(">q", 7))
    done = _cli("verify", store_dir)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "cq_" in done.stdout, done.stdout
    _crashed(store_dir)
    # A torn commitlog tail as well: recover truncates it and says so, then verify passes.
    names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    last = os.path.join(store_dir, "commitlog", names[-1])
    with open(last, "r+b") as f:
        end = len(f.read().rstrip(b"\0"))
        f.seek(end)
        f.write(struct.pack(">ii", 300, -626843481) + b"\xff" * 50)  # a record cut short
    done = _cli("recover", store_dir)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "damaged_at" in done.stdout and "stop_reason" in done.stdout, done.stdout
    done = _cli("verify", store_dir)
    assert done.returncode == 0, (done.stdout, done.stderr)
    # Damage with valid records after it cannot be repaired: recover and verify both exit 3.
    with open(last, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 50)
    done = _cli("recover", store_dir)
    assert done.returncode == 3 and "quarantined" in done.stderr, (done.stdout, done.stderr)
    done = _cli("verify", store_dir)
    assert done.returncode == 3 and "commitlog_damaged" in done.stdout, (done.stdout, done.stderr)


class _Interrupted(Exception):
    pass


def test_an_interrupted_recovery_is_resumed_by_the_next_start(tmp_path: object) -> None:
    """Recovery only ever moves the store to a state recovery accepts again (truncation and
    zeroing are idempotent, the re-dispatch point is recomputed from disk), so dying half way
    through it (a kill during start-up) costs nothing: the next start finishes the job and
    ends exactly where an uninterrupted recovery of the same crash does."""
    import shutil

    from mqstore.storage.recovery import recover_store

    crashed = os.path.join(str(tmp_path), "crashed")
    _fill(crashed, 600, queues=2)
    _crashed(crashed)
    # A torn tail, as a crash mid-append leaves it.
    segments = sorted(os.listdir(os.path.join(crashed, "commitlog")))
    last = os.path.join(crashed, "commitlog", segments[-1])
    with open(last, "r+b") as f:
        data = f.read()
        end = len(data.rstrip(b"\0"))
        f.seek(end)
        f.write(struct.pack(">ii", 300, -626843481) + b"\x07" * 40)  # a record cut short
    reference = os.path.join(str(tmp_path), "reference")
    shutil.copytree(crashed, reference)

    cfg = mqstore.StoreConfig(store_path_root_dir=crashed, **SETTINGS)
    calls = []

    def die_half_way(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise _Interrupted(f"killed at {done} of {total} bytes")

    with pytest.raises(_Interrupted):
        recover_store(cfg, RealFileSystem(), last_exit_ok=False, clock_ms=lambda: 0, progress=die_half_way)
    assert os.path.exists(os.path.join(crashed, "abort")), "the next start must know recovery did not finish"

    resumed_report, resumed = _open_checked(crashed)
    reference_report, expected = _open_checked(reference)
    assert resumed == expected and sum(len(v) for v in expected.values()) == 600
    assert resumed_report.max_offset == reference_report.max_offset
    _verified(crashed)


# -------------------------------------------------------------------------------------------
# Review 63 F3: a clean store's damaged last record and `mqstore recover`

_FLIPS = {"body": lambda size: size - 20, "magic": lambda size: 4, "size": lambda size: 1}


def _damage_last_record(store_dir: str, field: str) -> tuple[str, int, int, bytes]:
    """Flip one byte (`field`) of the last record of a closed store: (its segment's path, the
    record's offset in it, its size, the segment's bytes after the flip)."""
    from mqstore.storage import codec

    path = os.path.join(store_dir, "commitlog", sorted(os.listdir(os.path.join(store_dir, "commitlog")))[-1])
    with open(path, "rb") as f:
        data = f.read()
    pos, last = 0, None
    while True:
        read = codec.read_record(data, pos, len(data), check_crc=False, max_message_size=SEG)
        if read.kind is not codec.RecordKind.MESSAGE:
            break
        last, pos = (pos, read.size), pos + read.size
    assert last is not None
    at = last[0] + _FLIPS[field](last[1])
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0xFF]))
        f.seek(0)
        return path, last[0], last[1], f.read()


def _recover_in_process(store_dir: str, *, clean: bool, repair: bool = True) -> RecoveryReport:
    from mqstore.storage.recovery import recover_store

    cfg = mqstore.StoreConfig(store_path_root_dir=store_dir, **SETTINGS)
    return recover_store(cfg, RealFileSystem(), last_exit_ok=clean, clock_ms=lambda: 0, repair_holes=repair)


@pytest.mark.parametrize("field", sorted(_FLIPS))
def test_recover_keeps_a_clean_stores_damaged_last_record_and_reports_it_as_damage(tmp_path: object, field: str) -> None:
    """`recover` wrote the blank that ends a segment over the damaged record's first bytes,
    kept no copy, and called it "end of data" (exit 0). After a clean stop every put had
    finished: the record is damage, reported as such (quarantined), and the segment as it was
    is kept as NAME.damaged before a byte of it changes."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 150)
    path, pos, _size, damaged = _damage_last_record(store_dir, field)
    start = int(os.path.basename(path))
    report = _recover_in_process(store_dir, clean=True)
    assert [(q.start, q.end) for q in report.quarantined] == [(start + pos, start + SEG)], report.summary()
    assert report.damaged_at == start + pos and report.stop_reason != "end of data", report.summary()
    assert report.lost_ranges == [(start + pos, start + SEG)], report.summary()
    with open(path + ".damaged", "rb") as f:
        assert f.read() == damaged  # the segment as it was, whole
    with open(path, "rb") as f:
        now = f.read()
    assert now[:pos] == damaged[:pos] and now[pos + 8 :] == damaged[pos + 8 :]  # only the blank's header written
    with mqstore.open(store_dir, **SETTINGS) as store:  # the log goes on in the next segment
        r = store.put(mqstore.Message(topic=TOPIC, body=b"after"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.commitlog_offset >= start + SEG, r
        assert r.queue_offset == 150, r  # the damaged record's queue offset is not given again
        assert store.get(TOPIC, 0, 148, 1).messages[0].body == b"%06d" % 148 * 40


def test_cli_recover_exits_3_on_a_clean_stores_damaged_last_record(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 150)
    path, _pos, _size, damaged = _damage_last_record(store_dir, "body")
    done = _cli("recover", "--no-progress", store_dir)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "damaged commitlog bytes" in done.stderr and "00000000000000000000.damaged" in done.stderr, done.stderr
    with open(path + ".damaged", "rb") as f:
        assert f.read() == damaged


def test_recover_changes_no_byte_when_it_cannot_keep_a_copy_first(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy is written before the blank: a copy that fails (a full disk, here half
    written) leaves the segment as it was and no partial copy behind."""
    from mqstore.storage import fs as fs_module

    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 150)
    path, _pos, _size, damaged = _damage_last_record(store_dir, "magic")

    def full_disk(self: Any, copy: str, length: int) -> None:
        with open(copy, "xb") as f:
            f.write(b"\1" * (length // 2))
        raise OSError(28, "No space left on device", copy)

    monkeypatch.setattr(fs_module.RealMappedRegion, "save_copy", full_disk)
    with pytest.raises(OSError, match="no disk space to keep a copy"):
        _recover_in_process(store_dir, clean=True)
    with open(path, "rb") as f:
        assert f.read() == damaged
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crashed"])
def test_recovery_without_repair_changes_no_byte_of_a_damaged_last_record(tmp_path: object, clean: bool) -> None:
    """recover_store's second commitlog (which places the write positions) ran without the
    flushed-offset guard: after a clean stop it zeroed the damaged record's bytes that the
    first pass had kept as a hole. After a crash the record is quarantined in place, as before."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir, 150)
    path, pos, size, damaged = _damage_last_record(store_dir, "magic")
    if not clean:
        _crashed(store_dir)
    report = _recover_in_process(store_dir, clean=clean, repair=False)
    with open(path, "rb") as f:
        assert f.read() == damaged
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]
    if not clean:
        start = int(os.path.basename(path))
        assert [(q.start, q.end) for q in report.quarantined] == [(start + pos, start + pos + size)], report.summary()
