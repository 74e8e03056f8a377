"""The recovery scan's C walk (storage/scan.py, `_native.scan_records`) against the reference.

Three levels, each C against pure Python on the same bytes:
- `scan_run` against `scan_run_reference` on broker files and on generated, damaged segments;
- CommitLog recovery (normal and after a crash) with the extension and without it: the same
  end, quarantines, dispatched records, progress and file bytes, byte for byte;
- `recover_store` on damaged stores written through the API: the same report and bytes.
Then the progress bar's size: the bytes that hold data, not the allocated segments.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.storage import codec, scan, speedups
from mqstore.storage.codec import DispatchFields, HostAddress
from mqstore.storage.commitlog import CommitLog
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem

from .conftest import FIXTURES, ManualClock

native = speedups.native
needs_native = pytest.mark.skipif(
    native is None, reason="C extension not built, or MQSTORE_PURE_PYTHON=1 (the reference path is all there is)"
)
SEG = 8192
V4 = HostAddress("10.0.0.7", 10911)
V6 = HostAddress("fe80::1", 10911)
STOP_REASONS = set(scan.STOP_REASONS)


def _flag_combos() -> Iterator[tuple[bool, bool]]:
    for check_crc in (True, False):
        for check_offset in (True, False):
            yield check_crc, check_offset


def _both(buf: Any, pos: int, limit: int, file_from: int, **kw: Any) -> tuple[scan.ScanRun, scan.ScanRun]:
    assert native is not None
    end, records, ts, stop = native.scan_records(buf, pos, limit, file_from, kw["max_message_size"],
                                                 kw["check_crc"], kw["check_offset"], kw.get("max_bytes", 0))  # fmt: skip
    fast = scan.ScanRun(end, records, ts, scan.STOP_REASONS[stop])
    ref = scan.scan_run_reference(buf, pos, limit, file_from_offset=file_from, **kw)
    return fast, ref


def _record(rng: random.Random, offset: int, n: int) -> bytes:
    """One record of a mix a broker can write: IPv4/IPv6 hosts, the schedule topic, empty body
    or properties, keys and tags."""
    kind = rng.randrange(10)
    topic = codec.SCHEDULE_TOPIC if kind == 0 else f"t{rng.randrange(3)}"
    props: dict[str, str] = {} if kind == 1 else {"KEYS": f"k{n}", "TAGS": f"tag{n % 3}", "UNIQ_KEY": f"{n:032X}"}
    if kind == 0:
        props["DELAY"] = "3"
    body = b"" if kind == 2 else rng.randbytes(rng.choice((1, 17, 63, 64, 65, 200, 700)))
    born, store = (V6, V4) if kind == 3 else (V4, V6) if kind == 4 else (V4, V4)
    return codec.encode_message(
        topic=topic, queue_id=n % 4, body=body, properties=codec.properties_to_string(props) if props else "",
        sys_flag=codec.TRANSACTION_PREPARED_TYPE if kind == 5 else 0, born_host=born, store_host=store,
        born_timestamp=1_700_000_000_000 + n, store_timestamp=1_700_000_000_000 + n, queue_offset=n,
        commitlog_offset=offset,
    )  # fmt: skip


def _segments(rng: random.Random, count: int, fill_last: float) -> list[bytearray]:
    """`count` segments of SEG bytes of records with the right offsets, each but the last
    ended by the END_OF_FILE blank; the last filled to about `fill_last` of its size."""
    segs = []
    n = 0
    for s in range(count):
        seg = bytearray(SEG)
        pos = 0
        last = s == count - 1
        while True:
            rec = _record(rng, s * SEG + pos, n)
            if pos + len(rec) + codec.END_FILE_MIN_BLANK_LENGTH > SEG or (last and pos > fill_last * SEG):
                break
            seg[pos : pos + len(rec)] = rec
            pos += len(rec)
            n += 1
        if not last:
            seg[pos : pos + 8] = codec.blank_record_header(SEG - pos)
        segs.append(seg)
    return segs


def _record_starts(seg: bytes | bytearray) -> list[int]:
    starts, pos = [], 0
    while pos + 8 <= len(seg):
        total = int.from_bytes(seg[pos : pos + 4], "big", signed=True)
        magic = int.from_bytes(seg[pos + 4 : pos + 8], "big", signed=True)
        if magic != codec.MESSAGE_MAGIC_CODE or total <= 0:
            break
        starts.append(pos)
        pos += total
    return starts


def _damage(rng: random.Random, seg: bytearray, starts: list[int]) -> str:
    """One kind of damage at a random record: a body bit flip, a zeroed header, a wrong
    physical offset, a torn record (the tail of the data cut), a torn last property
    separator, a random byte anywhere, a too-large size, a zero topic length."""
    if not starts:
        return "none"
    at = rng.choice(starts)
    total = int.from_bytes(seg[at : at + 4], "big")
    what = rng.randrange(8)
    if what == 0:
        seg[at + 88 + rng.randrange(max(total - 120, 1))] ^= 1 << rng.randrange(8)
        return "bit flip"
    if what == 1:
        seg[at : at + 8] = bytes(8)
        return "zeroed header"
    if what == 2:
        seg[at + 28 : at + 36] = (int.from_bytes(seg[at + 28 : at + 36], "big") + SEG).to_bytes(8, "big")
        return "wrong offset"
    if what == 3:
        cut = at + rng.randrange(total)
        seg[cut:] = bytes(len(seg) - cut)
        return "torn tail"
    if what == 4:
        seg[at + total - 1] ^= 0x02
        return "torn separator"
    if what == 5:
        seg[rng.randrange(len(seg))] = rng.randrange(256)
        return "random byte"
    if what == 6:
        seg[at : at + 4] = (total + 4096).to_bytes(4, "big")
        return "too large"
    body_len = int.from_bytes(seg[at + 84 : at + 88], "big")
    seg[at + 88 + body_len] = 0
    return "zero topic length"


# ---- scan_run: C against the reference ----------------------------------------------------


@needs_native
@pytest.mark.parametrize("sample", ["broker-sample-a", "broker-sample-b"])
def test_scan_run_on_a_brokers_commitlog(sample: str) -> None:
    data = (FIXTURES / sample / "commitlog" / "00000000000000000000").read_bytes()
    rng = random.Random(sample)
    positions = _record_starts(data) + [rng.randrange(len(data)) for _ in range(100)] + [8084, 8090, 8191]
    for check_crc, check_offset in _flag_combos():
        for pos in positions:
            for limit in (len(data), 8084, rng.randrange(pos, len(data) + 1)):
                fast, ref = _both(data, pos, limit, 0, max_message_size=4 * 1024 * 1024, check_crc=check_crc,
                                  check_offset=check_offset)  # fmt: skip
                assert fast == ref, (pos, limit, check_crc, check_offset)
    whole = scan.scan_run(data, 0, len(data), file_from_offset=0, max_message_size=1 << 22, check_crc=True)
    assert whole == (8084, 47, whole.last_store_timestamp, "blank") and whole.last_store_timestamp > 0


@needs_native
@pytest.mark.parametrize("seed", range(60))
def test_scan_run_on_damaged_segments(seed: int) -> None:
    rng = random.Random(seed)
    seg = _segments(rng, 1, rng.choice((0.3, 1.0)))[0]
    starts = _record_starts(seg)
    damages = [_damage(rng, seg, starts) for _ in range(rng.randrange(1, 3))]
    positions = starts + [rng.randrange(SEG) for _ in range(20)]
    for check_crc, check_offset in _flag_combos():
        for pos in positions:
            for max_bytes in (0, rng.randrange(1, 3000)):
                fast, ref = _both(seg, pos, SEG, SEG * 3 if seed % 2 else 0, max_message_size=rng.choice((4096, 1 << 22)),
                                  check_crc=check_crc, check_offset=check_offset, max_bytes=max_bytes)  # fmt: skip
                assert fast == ref, (damages, pos, max_bytes, check_crc, check_offset)
                assert ref.stop in STOP_REASONS


@needs_native
def test_scan_run_stops_where_the_python_decoder_must_decide() -> None:
    """Each kind of stop, and the rule that a run holds only what the decoders accept."""
    seg = bytearray(SEG)
    pos = 0
    while pos < SEG - 1000:
        rec = codec.encode_message(topic="t", queue_id=0, body=b"%d" % pos * 40, properties="KEYS\x01k\x02",
                                   born_host=V4, store_host=V4, commitlog_offset=pos)  # fmt: skip
        seg[pos : pos + len(rec)] = rec
        pos += len(rec)
    seg[pos : pos + 8] = codec.blank_record_header(SEG - pos)
    plain = _record_starts(seg)

    def run(buf: bytes | bytearray, pos: int = 0, **kw: Any) -> scan.ScanRun:
        args: dict[str, Any] = dict(file_from_offset=0, max_message_size=1 << 22, check_crc=True, check_offset=True) | kw
        fast, ref = _both(buf, pos, len(buf), args.pop("file_from_offset"), **args)
        assert fast == ref
        return fast

    assert run(bytes(64)).stop == "zeroes"
    last = _record_starts(seg)[-1]
    assert run(seg, last + int.from_bytes(seg[last : last + 4], "big")).stop == "blank"
    assert run(seg[:100]).stop in ("past limit", "other")
    assert run(seg, file_from_offset=SEG).stop == "wrong offset"
    assert run(seg, file_from_offset=SEG, check_offset=False).stop == "blank"
    at = plain[3]
    bad = bytearray(seg)
    bad[at + 90] ^= 0xFF
    assert run(bad).end == at and run(bad).stop == "bad crc"
    assert run(bad, check_crc=False).stop == "blank"
    v6 = codec.encode_message(topic="t", queue_id=0, body=b"x", properties="", born_host=V6, store_host=V4)
    assert run(v6 + bytes(16)).stop == "other" and run(v6 + bytes(16)).records == 0
    budget = run(seg, max_bytes=1)
    assert budget.records == 1 and budget.stop == "budget"


def test_scan_run_without_the_extension_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    seg = _segments(random.Random(3), 1, 0.5)[0]
    monkeypatch.setattr(speedups, "native", None)
    assert not scan.fast_scan_available()
    got = scan.scan_run(seg, 0, SEG, file_from_offset=0, max_message_size=1 << 22, check_crc=True)
    assert got == scan.scan_run_reference(seg, 0, SEG, file_from_offset=0, max_message_size=1 << 22, check_crc=True)
    with pytest.raises(ValueError, match="pos"):
        scan.scan_run(seg, -1, SEG, file_from_offset=0, max_message_size=1 << 22, check_crc=True)


# ---- CommitLog recovery: with the extension and without it ---------------------------------


def _write_dir(path: Path, segs: list[bytearray]) -> None:
    path.mkdir(parents=True)
    for i, seg in enumerate(segs):
        (path / codec.segment_file_name(i * SEG)).write_bytes(bytes(seg))


def _recover(path: Path, mode: str, *, use_native: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(speedups, "native", native if use_native else None)
    cl = CommitLog(RealFileSystem(), str(path), mapped_file_size=SEG, clock_ms=ManualClock(), check_crc_on_recover=True)
    assert cl.load()
    dispatched: list[DispatchFields] = []
    progress: list[tuple[int, int]] = []
    try:
        if mode == "normal":
            end = cl.recover_normally(-1, lambda d, t: progress.append((d, t)), all_files=True)
        else:
            cl.unfinished_put_possible = True
            cl.trusted_after_damage_before_ms = 1_800_000_000_000
            end = cl.recover_abnormally(1_800_000_000_000, dispatched.append, lambda d, t: progress.append((d, t)))
        stamps = [cl.store_timestamp_before(o) for o in range(0, end + 1, 97)] + [cl.store_timestamp_before(end)]
        quarantined = list(cl.quarantined)
    finally:
        cl.shutdown()
    monkeypatch.setattr(speedups, "native", native)
    files = {n: (path / n).read_bytes() for n in sorted(os.listdir(path))}
    return dict(end=end, dispatched=dispatched, progress=progress[-1:], stamps=stamps, quarantined=quarantined,
                files=files)  # fmt: skip


@needs_native
@pytest.mark.parametrize("mode", ["normal", "crash"])
@pytest.mark.parametrize("seed", range(40))
def test_commitlog_recovery_is_the_same_with_and_without_the_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, mode: str
) -> None:
    rng = random.Random(seed)
    segs = _segments(rng, rng.randrange(1, 4), rng.choice((0.2, 0.6, 1.0)))
    for _ in range(rng.randrange(0, 3)):
        i = rng.randrange(len(segs))
        _damage(rng, segs[i], _record_starts(segs[i]))
    _write_dir(tmp_path / "c", segs)
    _write_dir(tmp_path / "py", segs)
    fast = _recover(tmp_path / "c", mode, use_native=True, monkeypatch=monkeypatch)
    ref = _recover(tmp_path / "py", mode, use_native=False, monkeypatch=monkeypatch)
    assert fast == ref
    if mode == "crash":
        assert fast["dispatched"] or fast["end"] == 0


@needs_native
@pytest.mark.parametrize("seed", range(30))
def test_a_record_tally_is_the_record_by_record_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Crash recovery's tally of runs (C) against the tally of one record at a time (Python),
    on segments with transactions, the schedule topic, IPv6 hosts, many queues and damage."""
    rng = random.Random(seed)
    segs = _segments(rng, rng.randrange(1, 4), rng.choice((0.2, 1.0)))
    for _ in range(rng.randrange(0, 3)):
        i = rng.randrange(len(segs))
        _damage(rng, segs[i], _record_starts(segs[i]))
    tallies = []
    for name, use_native in (("c", True), ("py", False)):
        _write_dir(tmp_path / name, segs)
        monkeypatch.setattr(speedups, "native", native if use_native else None)
        cl = CommitLog(RealFileSystem(), str(tmp_path / name), mapped_file_size=SEG, clock_ms=ManualClock())
        assert cl.load()
        tally = scan.RecordTally()
        try:
            end = cl.recover_abnormally(1_800_000_000_000, tally)
        finally:
            cl.shutdown()
        tallies.append((end, tally.count, tally.first_offset, tally.last_store_timestamp, tally.next_queue_offsets))
    monkeypatch.setattr(speedups, "native", native)
    assert tallies[0] == tallies[1]


@needs_native
def test_tally_records_over_many_queues_and_a_bad_run() -> None:
    """The C table grows past its first 64 slots; a run it was not given is refused."""
    assert native is not None
    seg = bytearray()
    expected: dict[tuple[bytes, int], int] = {}
    for n in range(3000):
        topic, queue_id, offset = f"q{n % 700}", n % 3, n // 7
        rec = codec.encode_message(topic=topic, queue_id=queue_id, body=b"b", properties="", born_host=V4,
                                   store_host=V4, queue_offset=offset, commitlog_offset=len(seg))  # fmt: skip
        seg += rec
        key = (topic.encode(), queue_id)
        expected[key] = max(expected.get(key, -1), offset)
    got = native.tally_records(seg, 0, len(seg), 3000)
    assert {(t, q): m for t, q, m in got} == expected and len(got) == len(expected)
    assert [(t, q) for t, q, _ in got] == list(expected)  # first-seen order
    with pytest.raises(ValueError, match="not a run"):
        native.tally_records(seg, 3, len(seg), 2)


@needs_native
def test_store_timestamp_before_on_a_brokers_commitlog(copy_commitlog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = copy_commitlog("broker-sample-a")
    cl = CommitLog(RealFileSystem(), path, mapped_file_size=SEG, clock_ms=ManualClock())
    assert cl.load()
    try:
        cl.recover_normally(-1)
        ends = [r.offset + r.size for r in cl.iter_records(0, 8084) if r.record is not None]
        fast = [cl.store_timestamp_before(e) for e in [0, *ends]]
        monkeypatch.setattr(speedups, "native", None)
        ref = [cl.store_timestamp_before(e) for e in [0, *ends]]
    finally:
        cl.shutdown()
    assert fast == ref and fast[0] == 0 and fast[-1] > 0 and len(set(fast)) > 1


@pytest.mark.parametrize("seed", range(10))
def test_store_timestamp_before_is_recoverys_walk(tmp_path: Path, seed: int) -> None:
    """CommitLog.store_timestamp_before (C runs) answers what recovery's record-by-record walk
    (`recovery._store_timestamp_before` before issue 18, copied here) answers, at every record
    end and in damage, so recovery can call it."""

    def walk(commitlog: CommitLog, end: int) -> int:
        last = 0
        start = max(end - end % commitlog.mapped_file_size, max(commitlog.get_min_offset(), 0))
        for read in commitlog.iter_records(start, end, read_body=False):
            if read.record is None:
                break
            last = read.record.store_timestamp
        return last

    rng = random.Random(seed)
    segs = _segments(rng, rng.randrange(1, 3), rng.choice((0.3, 1.0)))
    for _ in range(rng.randrange(0, 3)):
        i = rng.randrange(len(segs))
        _damage(rng, segs[i], _record_starts(segs[i]))
    _write_dir(tmp_path / "c", segs)
    cl = CommitLog(RealFileSystem(), str(tmp_path / "c"), mapped_file_size=SEG, clock_ms=ManualClock())
    assert cl.load()
    try:
        ends = sorted({i * SEG + p for i, seg in enumerate(segs) for p in _record_starts(seg)}
                      | {rng.randrange(len(segs) * SEG) for _ in range(20)} | {0, len(segs) * SEG})  # fmt: skip
        for end in ends:
            assert cl.store_timestamp_before(end) == walk(cl, end), end
    finally:
        cl.shutdown()


# ---- recover_store on damaged stores written through the API ----------------------------------

STORE = dict(mapped_file_size_commitlog_bytes=SEG, mapped_file_size_consume_queue_bytes=20 * 50,
             max_hash_slot_num=64, max_index_num=200)  # fmt: skip


@pytest.fixture(scope="module")
def api_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("scan") / "store")
    with mqstore.open(root, **STORE) as store:
        for i in range(120):
            r = store.put(mqstore.Message(topic="sc", queue_id=i % 3, body=(b"%04d" % i) * (5 + i % 40),
                                          keys=[f"k{i}"], tags=f"t{i % 2}"))  # fmt: skip
            assert r.ok
    return root


@needs_native
@pytest.mark.parametrize("seed", range(12))
def test_recover_store_is_the_same_with_and_without_the_extension(
    api_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    from mqstore.config import StoreConfig
    from mqstore.storage.recovery import recover_store

    rng = random.Random(seed)
    crashed = seed % 2 == 1
    roots = [tmp_path / "c", tmp_path / "py"]
    shutil.copytree(api_store, roots[0])
    cl_dir = roots[0] / "commitlog"
    names = sorted(os.listdir(cl_dir))
    name = rng.choice(names)
    seg = bytearray((cl_dir / name).read_bytes())
    _damage(rng, seg, _record_starts(seg))
    (cl_dir / name).write_bytes(bytes(seg))
    if crashed:
        (roots[0] / "abort").write_bytes(b"")
    if seed % 3 == 0:
        # One queue's files gone: dispatch starts at the log's beginning, below the crash
        # scan, so the queue offsets before the scan are tallied again (in C runs, or not).
        queue_dir = roots[0] / "consumequeue" / "sc" / "1"
        for f in os.listdir(queue_dir):
            (queue_dir / f).unlink()
    shutil.copytree(roots[0], roots[1])
    results = []
    for root, use_native in zip(roots, (True, False)):
        monkeypatch.setattr(speedups, "native", native if use_native else None)
        cfg = StoreConfig(store_path_root_dir=str(root), **STORE)  # type: ignore[arg-type]
        report = recover_store(cfg, RealFileSystem(), last_exit_ok=not crashed, clock_ms=lambda: 1_800_000_000_000)
        files = {}
        for dirpath, _dirs, filenames in os.walk(root):
            for f in filenames:
                full = os.path.join(dirpath, f)
                files[os.path.relpath(full, root)] = Path(full).read_bytes()
        results.append((report.summary(), report.topic_queue_table, report.store_timestamp, files))
    monkeypatch.setattr(speedups, "native", native)
    assert results[0] == results[1]


# ---- the progress bar's size ----------------------------------------------------------------


def test_data_end_is_where_the_data_ends_not_the_segment(tmp_path: Path) -> None:
    fs = RealFileSystem()
    path = str(tmp_path / "seg")
    size = 64 << 20
    region = fs.map_file(path, size, create=True)
    try:
        assert scan.data_end(fs, path, region.buf, 0, size) == 0  # a new sparse segment holds nothing
        region.buf[1000:1010] = b"x" * 10
        assert scan.data_end(fs, path, region.buf, 0, size) == 1010
        assert scan.data_end(fs, path, region.buf, 5000, size) == 5000  # nothing after the start
        region.buf[40 << 20] = 1
        assert scan.data_end(fs, path, region.buf, 0, size) == (40 << 20) + 1
    finally:
        region.close()
    # Blocks reserved ahead (fallocate: zeros that may read as data) do not count.
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, 48 << 20)
    region = fs.map_file(path, size, create=False)
    try:
        assert scan.data_end(fs, path, region.buf, 0, size) == (40 << 20) + 1
    finally:
        region.close()
    sim = SimulatedFileSystem(clock_ms=ManualClock())
    assert scan.data_end(sim, "/none", bytearray(b"ab\0\0"), 0, 4) == 2  # no extents known: trimmed zeros


def test_scan_progress_counts_data_bytes() -> None:
    calls: list[tuple[int, int]] = []
    bar = scan.ScanProgress(lambda d, t: calls.append((d, t)), [1000, 300], first_start=200, step_bytes=100)
    assert bar.total == 1300
    bar.at(0, 200)
    bar.at(0, 250)  # less than a step since the last report: quiet
    bar.at(0, 5000)  # past the data end of the file: capped at its data
    bar.at(1, 150)
    bar.at(1, 10_000)
    bar.finish()
    assert calls == [(0, 1300), (1000, 1300), (1150, 1300), (1300, 1300), (1300, 1300)]
    assert bar.done_at(2, 0) == 1300


def test_a_crashed_store_progress_is_sized_by_its_data(tmp_path: Path) -> None:
    """Issue 18: "98.0/2.15G ETA 617:07:57" on a crashed store. A store with 64 MiB segments
    holding about 1 MB: the bar's total is that megabyte, and the bar ends at its total."""
    from mqstore.config import StoreConfig
    from mqstore.storage.recovery import recover_store

    root = str(tmp_path / "store")
    settings = dict(mapped_file_size_commitlog_bytes=64 << 20)
    written = 0
    with mqstore.open(root, **settings) as store:
        for i in range(1000):
            r = store.put(mqstore.Message(topic="p", queue_id=0, body=b"b" * 900, keys=[f"k{i}"]))
            assert r.ok
        written = store.put(mqstore.Message(topic="p", queue_id=0, body=b"end")).commitlog_offset
    Path(root, "abort").write_bytes(b"")  # as a kill -9 leaves it
    calls: list[tuple[int, int]] = []
    cfg = StoreConfig(store_path_root_dir=root, **settings)  # type: ignore[arg-type]
    report = recover_store(cfg, RealFileSystem(), last_exit_ok=False, clock_ms=lambda: 1_800_000_000_000,
                           progress=lambda d, t: calls.append((d, t)))  # fmt: skip
    total = calls[-1][1]
    assert report.max_offset > written
    # Its last non-zero byte (a record without properties ends in its zero properties length).
    assert report.max_offset - 2 <= total < report.max_offset + 4096, (total, report.max_offset)
    assert calls[-1] == (total, total) and all(d <= t == total for d, t in calls)


# ---- ConsumeQueue recovery's unit walk ------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_cq_valid_prefix_is_the_unit_by_unit_walk(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(0, 400)
    offsets = sorted(rng.sample(range(1, 1 << 40), n))
    units = [codec.encode_cq_unit(offset, rng.randrange(1, 5000), rng.randrange(-(1 << 40), 1 << 40)) for offset in offsets]
    for _ in range(rng.randrange(3)):  # filler units point nowhere, wherever they are
        units.insert(rng.randrange(len(units) + 1), codec.encode_cq_unit(0, 0x7FFFFFFF, 0))
    if units and rng.random() < 0.7:  # an invalid unit: negative offset, zero or negative size, zeros, or out of order
        bad = rng.choice((codec.encode_cq_unit(-1, 10, 0), codec.encode_cq_unit(5, 0, 0), codec.encode_cq_unit(5, -3, 0),
                          bytes(20), codec.encode_cq_unit(0, 282, 0)))  # fmt: skip
        units.insert(rng.randrange(len(units) + 1), bad)
    data = b"".join(units) + bytes(20 * rng.randrange(3))
    after = rng.choice((-1, 0, offsets[0] if offsets else 5))
    expected = scan.cq_valid_prefix_reference(data, after)
    assert scan.cq_valid_prefix(data, after) == expected
    assert scan.cq_valid_prefix(bytearray(data), after) == expected
    if native is not None:
        assert native.cq_valid_prefix(memoryview(data), after) == expected


def test_cq_valid_prefix_stops_at_a_unit_not_past_the_one_before_it() -> None:
    """Review 122 F3: a torn unit (0, 282, 0) after units into the log's middle is no unit."""
    data = b"".join(codec.encode_cq_unit(o, 100, 0) for o in (100, 200)) + codec.encode_cq_unit(0, 0x7FFFFFFF, 0)
    assert scan.cq_valid_prefix(data + codec.encode_cq_unit(0, 282, 0)) == (3, 0, 200)
    assert scan.cq_valid_prefix(data + codec.encode_cq_unit(200, 100, 0)) == (3, 0, 200)
    assert scan.cq_valid_prefix(data + codec.encode_cq_unit(300, 100, 0)) == (4, 300, 300)
    assert scan.cq_valid_prefix(data, 150) == (0, -1, 150)
    # Review 123 F1: after fillers only (offsets held for lost records), a torn unit pointing at 0.
    fillers = codec.encode_cq_unit(0, 0x7FFFFFFF, 0) * 3
    assert scan.cq_valid_prefix(fillers + codec.encode_cq_unit(0, 272, 0)) == (3, 0, 0)
    assert scan.cq_valid_prefix(fillers + codec.encode_cq_unit(64, 272, 0)) == (4, 64, 64)
    assert scan.cq_valid_prefix(codec.encode_cq_unit(0, 272, 0)) == (1, 0, 0)  # the log's first record


def test_cq_valid_prefix_refuses_a_partial_unit() -> None:
    with pytest.raises(ValueError, match="20-byte units"):
        scan.cq_valid_prefix(bytes(30))
    assert scan.cq_valid_prefix(b"") == (0, -1, -1)


# ---- looking past damage: the magic-code search -----------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_find_magic_is_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    buf = bytearray(rng.choice((64, 300, 5000)))
    if seed % 3:
        buf[:] = rng.randbytes(len(buf))
    magics = [m.to_bytes(4, "big", signed=True)
              for m in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2, codec.BLANK_MAGIC_CODE)]  # fmt: skip
    for _ in range(rng.randrange(4)):
        at = rng.randrange(len(buf) - 4)
        buf[at : at + 4] = rng.choice(magics)
    for _ in range(30):
        start, stop, limit = (rng.randrange(-5, len(buf) + 5) for _ in range(3))
        expected = scan.find_magic_reference(buf, start, stop, limit)
        assert scan.find_magic(buf, start, stop, limit) == expected, (start, stop, limit)


@needs_native
@pytest.mark.parametrize("seed", range(40))
def test_find_next_valid_record_is_the_same_with_and_without_the_extension(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mqstore.storage.commitlog import find_next_valid_record

    rng = random.Random(seed)
    seg = _segments(rng, 1, rng.choice((0.3, 1.0)))[0]
    for _ in range(rng.randrange(1, 4)):
        _damage(rng, seg, _record_starts(seg))
    if seed % 4 == 0:
        cut = rng.randrange(SEG // 2)
        seg[cut:] = bytes(SEG - cut)  # a long zero run: the word-at-a-time skip
    for _ in range(15):
        start = rng.randrange(SEG)
        limit = rng.choice((SEG, rng.randrange(start, SEG + 1)))
        extents = rng.choice((None, [(0, SEG)], [(0, 100), (4096, SEG)], [(start + 13, min(SEG, start + 900))]))
        kw: dict[str, Any] = dict(file_from_offset=0, segment_size=SEG, max_message_size=1 << 22, extents=extents,
                                  stored_before_ms=rng.choice((None, 1_700_000_000_100)))  # fmt: skip
        monkeypatch.setattr(speedups, "native", native)
        fast = find_next_valid_record(seg, start, limit, **kw)
        monkeypatch.setattr(speedups, "native", None)
        ref = find_next_valid_record(seg, start, limit, **kw)
        assert fast == ref, (start, limit, extents)
