"""Issue 14: a store's geometry comes from its files; settings that disagree are refused, and no
file is ever resized, truncated or deleted because it disagrees with a setting."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import mqstore
from mqstore import config as config_module
from mqstore.cli import ExitCode, main
from mqstore.config import ConfigError, StoreConfig
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.geometry import IndexGeometry, _SlotsRead, detect_geometry
from mqstore.storage.index import IndexFile, key_hash_and_slot

MiB = 1 << 20
FAST = {"allocate_wait_timeout_ms": 200}


def _files(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("lock", "abort", "stats.msgpack")
    }


def _all_messages(store: mqstore.MessageStore, topic: str) -> list[mqstore.MessageRecord]:
    out: list[mqstore.MessageRecord] = []
    for queue_id in range(8):
        offset = 0
        while True:
            got = store.get(topic, queue_id, offset, 32)
            if not got.messages:
                break
            out.extend(got.messages)
            offset = got.next_begin_offset
    return out


def test_a_1_mib_store_reopened_with_defaults_keeps_every_message_and_appends_after_them(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        for i in range(1000):
            assert store.put(mqstore.Message(topic="orders", body=b"x" * 100, keys=[f"order-{i}"])).ok
        segment = root / "commitlog" / "00000000000000000000"
    with mqstore.open(root, **FAST) as store:
        assert store.config.mapped_file_size_commitlog_bytes == MiB  # adopted from the files
        found = _all_messages(store, "orders")
        assert len(found) == 1000
        end = max(r.commitlog_offset + r.total_size for r in found)
        assert store.query("orders", "order-999").messages
        result = store.put(mqstore.Message(topic="orders", body=b"after"))
        assert result.ok and result.commitlog_offset == end  # after the old records, not over them
    assert segment.stat().st_size == MiB  # never grown to the default 1 GiB
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        assert len(_all_messages(store, "orders")) == 1001


def test_an_explicit_setting_against_the_files_is_refused_and_nothing_is_touched(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        for i in range(100):
            assert store.put(mqstore.Message(topic="orders", body=b"x" * 100, keys=[f"order-{i}"])).ok
    before = _files(root)
    with pytest.raises(mqstore.StoreConfigMismatch) as caught:
        mqstore.open(root, mapped_file_size_commitlog_bytes=4 * MiB, **FAST)
    err = caught.value
    assert (err.key, err.value, err.on_disk) == ("mapped_file_size_commitlog_bytes", 4 * MiB, MiB)
    assert "mapped_file_size_commitlog_bytes=4194304" in str(err) and "1048576" in str(err)
    assert isinstance(err, mqstore.ConfigError)
    assert _files(root) == before
    assert not (root / "abort").exists()


def test_the_cli_refuses_a_contradicting_setting_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        assert store.put(mqstore.Message(topic="orders", body=b"x", keys=["k"])).ok
    capsys.readouterr()
    before = _files(root)
    monkeypatch.setenv("MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES", str(4 * MiB))
    for argv in (["verify", str(root)], ["recover", str(root), "--no-progress"], ["get", str(root), "--topic", "orders",
                 "--queue", "0", "--offset", "0"], ["inspect", str(root)], ["dump", str(root)]):  # fmt: skip
        assert main(argv) == ExitCode.USAGE, argv
        err = capsys.readouterr().err
        assert "mapped_file_size_commitlog_bytes=4194304" in err and "1048576" in err, argv
    assert _files(root) == before


def test_consume_queue_and_index_geometry_are_adopted_too(tmp_path: Path) -> None:
    root = tmp_path / "store"
    custom = {"mapped_file_size_consume_queue_bytes": 20 * 50, "max_hash_slot_num": 7, "max_index_num": 40}
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, **custom, **FAST) as store:
        for i in range(120):  # more than one CQ file and more than one index file
            assert store.put(mqstore.Message(topic="t", body=b"b", keys=[f"k{i}"]), ).ok
    geometry = detect_geometry(RealFileSystem(), StoreConfig(store_path_root_dir=str(root)))
    assert geometry.settings() == {"mapped_file_size_commitlog_bytes": MiB, **custom}
    assert geometry.odd_files == ()
    with mqstore.open(root, **FAST) as store:
        assert {k: getattr(store.config, k) for k in custom} == custom
        assert len(_all_messages(store, "t")) == 120
        assert [r.keys for r in store.query("t", "k7").messages] == ["k7"]
        assert [r.keys for r in store.query("t", "k119").messages] == ["k119"]
    with pytest.raises(mqstore.StoreConfigMismatch, match="max_hash_slot_num"):
        mqstore.open(root, max_hash_slot_num=8, max_index_num=39, **FAST)


def test_the_default_index_ratio_is_read_from_the_size_alone(tmp_path: Path) -> None:
    fs = RealFileSystem()
    (tmp_path / "index").mkdir()
    f = IndexFile.create(fs, str(tmp_path / "index" / "20261123000000000"), max_hash_slot_num=100, max_index_num=400)
    f.close()
    assert (tmp_path / "index" / "20261123000000000").stat().st_size == 40 + 84 * 100
    geometry = detect_geometry(fs, StoreConfig(store_path_root_dir=str(tmp_path)))
    assert geometry.index is not None
    assert (geometry.index.max_hash_slot_num, geometry.index.max_index_num) == (100, 400)


def test_absurdly_small_segments_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="mapped_file_size_commitlog_bytes"):
        StoreConfig(mapped_file_size_commitlog_bytes=100)
    with pytest.raises(ConfigError, match="mapped_file_size_consume_queue_bytes"):
        StoreConfig(mapped_file_size_consume_queue_bytes=20)


def test_a_host_mqstore_variable_does_not_break_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQSTORE_DATA_URL", "postgres://somewhere")
    monkeypatch.setenv("MQSTORE_PURE_PYTHON", "0")
    with mqstore.open(tmp_path / "store", mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        assert store.put(mqstore.Message(topic="t", body=b"b")).ok


STOCK_BROKER_CONF = """\
brokerClusterName = DefaultCluster
brokerName = broker-a
brokerId = 0
namesrvAddr = 127.0.0.1:9876
deleteWhen = 04
fileReservedTime = 48
brokerRole = ASYNC_MASTER
flushDiskType = ASYNC_FLUSH
storePathRootDir = {root}
storePathCommitLog = {root}/commitlog
mapedFileSizeCommitLog = 1048576
autoCreateTopicEnable = true
listenPort = 10911
"""


def test_a_stock_broker_conf_is_taken_store_keys_applied_broker_keys_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warnings: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def warning(self, event: str, **kw: Any) -> None:
            warnings.append((event, kw))

        def debug(self, event: str, **kw: Any) -> None:
            pass

    monkeypatch.setattr(config_module, "log", Recorder())
    conf = tmp_path / "broker.conf"
    conf.write_text(STOCK_BROKER_CONF.format(root=tmp_path / "store"))
    cfg = StoreConfig.load(conf, env={})
    assert cfg.mapped_file_size_commitlog_bytes == MiB
    assert cfg.file_reserved_time_hours == 48 and cfg.delete_when == "04"
    assert cfg.commitlog_dir == f"{tmp_path / 'store'}/commitlog"
    assert len(warnings) == 1
    assert warnings[0][1]["keys"] == ["autoCreateTopicEnable", "brokerClusterName", "brokerName", "listenPort",
                                      "namesrvAddr"]  # fmt: skip
    assert "mapped_file_size_commitlog_bytes" in cfg.explicit


def test_the_cli_takes_a_stock_broker_conf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        assert store.put(mqstore.Message(topic="t", body=b"b", keys=["k"])).ok
    conf = tmp_path / "broker.conf"
    conf.write_text(STOCK_BROKER_CONF.format(root=root))
    assert main(["--config", str(conf), "verify", str(root), "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["ok"] is True


@pytest.mark.parametrize("source", ["config", "env"])
def test_verify_recover_inspect_honour_store_path_commitlog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    root, elsewhere = tmp_path / "store", tmp_path / "disk2" / "log"
    with mqstore.open(root, store_path_commitlog=str(elsewhere), mapped_file_size_commitlog_bytes=MiB, **FAST) as store:
        for i in range(10):
            assert store.put(mqstore.Message(topic="t", body=b"b", keys=[f"k{i}"])).ok
    assert not (root / "commitlog").exists()
    prefix: list[str] = []
    if source == "config":
        conf = tmp_path / "store.toml"
        conf.write_text(f'store_path_commitlog = "{elsewhere}"\n')
        prefix = ["--config", str(conf)]
    else:
        monkeypatch.setenv("MQSTORE_STORE_PATH_COMMITLOG", str(elsewhere))
    capsys.readouterr()
    assert main([*prefix, "verify", str(root), "--json"]) == ExitCode.OK
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["ok"] is True
    assert main([*prefix, "inspect", str(root), "--json"]) == ExitCode.OK
    inspected = json.loads(capsys.readouterr().out)
    assert inspected["verdict"] == "healthy" and inspected["commitlog"]["messages"] == 10
    assert main([*prefix, "recover", str(root), "--json", "--no-progress"]) == ExitCode.OK
    capsys.readouterr()
    assert main([*prefix, "query", str(root), "--topic", "t", "--key", "k3"]) == ExitCode.OK
    assert [json.loads(line)["keys"] for line in capsys.readouterr().out.splitlines()] == ["k3"]


def test_inspect_calls_a_full_4_4_0_index_file_healthy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 14 item 4: 4.4.0 writes hashSlotCount = indexCount - 1 (every put counts), so the
    # header's slot count says nothing about the file's capacity; the geometry does.
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=MiB, max_hash_slot_num=64, max_index_num=256,
                      **FAST) as store:  # fmt: skip
        for i in range(300):
            assert store.put(mqstore.Message(topic="t", body=b"b", keys=[f"k{i}"])).ok
    capsys.readouterr()
    assert main(["inspect", str(root), "--json"]) == ExitCode.OK
    report = json.loads(capsys.readouterr().out)
    full = [f for f in report["index"] if f["full"]]
    assert len(full) == 1 and full[0]["entries"] == 255 and full[0]["hash_slot_count"] == 255
    assert report["verdict"] == "healthy", report["problems"]


def test_a_segment_of_another_size_is_damage_reported_not_a_geometry(tmp_path: Path) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    for start in (0, MiB, 2 * MiB):
        (commitlog / f"{start:020d}").write_bytes(b"\1" * (MiB if start < 2 * MiB else 4096))
    before = _files(tmp_path)
    geometry = detect_geometry(RealFileSystem(), StoreConfig(store_path_root_dir=str(tmp_path)))
    assert geometry.commitlog_segment_bytes == MiB
    assert geometry.odd_files == (str(commitlog / f"{2 * MiB:020d}"),)
    assert _files(tmp_path) == before  # detection reads only


@pytest.mark.parametrize(
    "lengths",
    [(4096, 8192), (8192, 4096, 4096), (12288, 8192)],
    ids=["first-cut-tie", "cut-files-outnumber", "first-grown-tie"],
)
def test_the_segment_size_comes_from_the_names_not_the_commonest_length(
    tmp_path: Path, lengths: tuple[int, ...]
) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    for i, length in enumerate(lengths):
        (commitlog / f"{i * 8192:020d}").write_bytes(b"\1" * length)
    geometry = detect_geometry(RealFileSystem(), StoreConfig(store_path_root_dir=str(tmp_path)))
    assert geometry.commitlog_segment_bytes == 8192
    assert geometry.odd_files == tuple(
        str(commitlog / f"{i * 8192:020d}") for i, length in enumerate(lengths) if length != 8192
    )


def test_a_cut_first_segment_does_not_hide_the_intact_one_after_it(tmp_path: Path) -> None:
    """Review 29 F6: the commonest length (a tie: the first file's) made the cut first segment
    the geometry and the intact second one damage; its acknowledged messages went unserved."""
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=8192, **FAST) as store:
        while store.max_offset("T", 0) < 75:
            assert store.put(mqstore.Message("T", b"b" * 100)).ok
        in_second = [r for r in _all_messages(store, "T") if 8192 <= r.commitlog_offset < 16384]
    segments = sorted((root / "commitlog").iterdir())
    for extra in segments[2:]:
        extra.unlink()
    with segments[0].open("r+b") as f:
        f.truncate(4096)
    before = _files(root)
    with mqstore.open(root, **FAST) as store:
        assert store.config.mapped_file_size_commitlog_bytes == 8192
        served = {r.commitlog_offset: r.body for r in _all_messages(store, "T")}
        assert in_second and all(served.get(r.commitlog_offset) == r.body for r in in_second)
        refused = store.put(mqstore.Message("T", b"after"))
        assert not refused.ok and segments[0].name in (refused.detail or "")  # degraded: says why
    assert _files(root) == before


@pytest.mark.parametrize(
    ("segments", "size", "odd"),
    [
        ({0: 8192, 8192: 8192, 100: 10}, 8192, [100]),  # a stray name off the grid (the gcd was 4)
        ({0: 8192, 16384: 4096, 24576: 8192}, 8192, [16384]),  # a hole beside a cut segment (the gcd was 8192)
        ({0: 4096, 8192: 8192}, 8192, [0]),  # review 29's cut first segment
    ],
    ids=["stray-name", "hole-beside-cut", "first-cut"],
)
def test_the_segment_size_is_one_a_file_has_and_the_names_allow(
    tmp_path: Path, segments: dict[int, int], size: int, odd: list[int]
) -> None:
    """Review 30: the names' gcd alone was adopted though no file had that length: one stray
    name made every file damage and the store ran at the default 1 GiB; a hole beside a cut
    file doubled the size. Under either, the open deleted the index and rewrote the queues."""
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    for start, length in segments.items():
        (commitlog / f"{start:020d}").write_bytes(b"\1" * length)
    geometry = detect_geometry(RealFileSystem(), StoreConfig(store_path_root_dir=str(tmp_path)))
    assert geometry.commitlog_segment_bytes == size
    assert sorted(geometry.odd_files) == sorted(str(commitlog / f"{start:020d}") for start in odd)


def test_a_stray_segment_name_changes_nothing_and_hides_no_message(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=8192, **FAST) as store:
        while store.max_offset("T", 0) < 150:
            assert store.put(mqstore.Message("T", b"b" * 100)).ok
    stray = root / "commitlog" / f"{100:020d}"
    stray.write_bytes(b"x" * 10)
    before = _files(root)
    with mqstore.open(root, **FAST) as store:
        assert store.config.mapped_file_size_commitlog_bytes == 8192
        assert len(_all_messages(store, "T")) == 150
        refused = store.put(mqstore.Message("T", b"after"))
        assert not refused.ok and stray.name in (refused.detail or "")  # degraded: says why
    assert _files(root) == before
    stray.unlink()
    with mqstore.open(root, **FAST) as store:
        assert len(_all_messages(store, "T")) == 150 and store.put(mqstore.Message("T", b"after")).ok


def test_files_that_fit_two_segment_sizes_equally_are_refused_unless_the_caller_names_one(tmp_path: Path) -> None:
    """Two intact 8 KiB segments, two 16 KiB files and a hole: 8192 explains them with two
    grown files and a hole, 16384 with a cut file and a name off its grid. The store does
    not guess; the caller's word decides, and detection reads only."""
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    for start, length in {0: 8192, 8192: 8192, 16384: 16384, 32768: 16384}.items():
        (commitlog / f"{start:020d}").write_bytes(b"\0" * length)
    before = _files(tmp_path)
    with pytest.raises(mqstore.StoreGeometryAmbiguous) as refused:
        mqstore.open(tmp_path, **FAST)
    assert refused.value.candidates == (16384, 8192)
    assert "mapped_file_size_commitlog_bytes=16384 and mapped_file_size_commitlog_bytes=8192" in str(refused.value)
    assert main(["verify", str(tmp_path)]) == ExitCode.USAGE  # as the open
    assert main(["inspect", str(tmp_path)]) == ExitCode.CORRUPT  # what the refusal points to: the damage shown
    assert _files(tmp_path) == before
    for size in (8192, 16384):  # either, set by the caller
        config = StoreConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commitlog_bytes=size)
        assert detect_geometry(RealFileSystem(), config).commitlog_segment_bytes == size
    with pytest.raises(mqstore.StoreGeometryAmbiguous):  # a size that is neither
        mqstore.open(tmp_path, mapped_file_size_commitlog_bytes=4096, **FAST)
    assert _files(tmp_path) == before


def test_two_queues_whose_files_fit_two_sizes_equally_are_refused_unless_the_caller_names_one(tmp_path: Path) -> None:
    """Review 54 M2: one queue's file cut to 1000 bytes (an interrupted copy) beside another
    queue's whole 6,000,000-byte file: the tie went to the first file, so the cut length became
    the store's, the whole file was set aside and every queue rebuilt in files RocketMQ 4.4.0
    cannot load. Now the store refuses to guess, changing nothing; named, the size decides."""
    path = tmp_path / "s"
    # The ConsumeQueue's size is the subject: the commitlog and the index are small, named in
    # every open, so that hashing the store before and after stays cheap.
    others = {"mapped_file_size_commitlog_bytes": MiB, "max_hash_slot_num": 100, "max_index_num": 400}
    with mqstore.open(path, **others) as store:
        for queue_id in (0, 1):
            assert store.put(mqstore.Message("T", b"m%d" % queue_id, queue_id=queue_id)).ok
    cut = path / "consumequeue" / "T" / "0" / ("%020d" % 0)
    with open(cut, "r+b") as f:
        f.truncate(1000)
    before = _files(path)
    with pytest.raises(mqstore.StoreGeometryAmbiguous) as refused:
        mqstore.open(path, **others, **FAST)
    assert refused.value.candidates == (1000, 6_000_000)
    assert _files(path) == before
    with mqstore.open(path, mapped_file_size_consume_queue_bytes=6_000_000, **others, **FAST) as store:
        assert [m.body for m in _all_messages(store, "T")] == [b"m0", b"m1"]
    assert (path / "consumequeue" / "T" / "1" / ("%020d" % 0)).stat().st_size == 6_000_000


@pytest.mark.parametrize(
    ("segments", "candidates"),
    [
        ({0: 32768, 65536: 16384, 131072: 49152, 196608: 8192}, (65536,)),  # an interrupted copy: every one cut
        ({0: 4096, 8192: 0}, (4096, 8192)),  # cut and emptied: 4 KiB segments and a hole, or 8 KiB ones both damaged
        ({0: 8192, 16384: 4096}, (8192, 16384)),  # a hole beside a cut segment, or two 16 KiB ones cut
    ],
    ids=["every-segment-cut", "cut-and-emptied", "hole-or-two-cut"],
)
def test_a_segment_size_no_file_proves_is_refused_until_the_caller_sets_it(
    tmp_path: Path, segments: dict[int, int], candidates: tuple[int, ...]
) -> None:
    """Review 32: where every file was cut, a cut file's length won, and the open at it zeroed
    a record it took for a torn tail and rewrote the queues; set to the true size, the store
    was refused with a message naming the wrong one. A size no file has, or one of two that
    explain the files alike, is not guessed: the open changes nothing and names them."""
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    for start, length in segments.items():
        (commitlog / f"{start:020d}").write_bytes(b"\1" * length)
    before = _files(tmp_path)
    with pytest.raises(mqstore.StoreGeometryAmbiguous) as refused:
        mqstore.open(tmp_path, **FAST)
    assert refused.value.candidates == candidates
    assert _files(tmp_path) == before
    for size in candidates:
        config = StoreConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commitlog_bytes=size)
        assert detect_geometry(RealFileSystem(), config).commitlog_segment_bytes == size


def test_an_open_that_meets_a_wrong_sized_segment_zeroes_no_byte_even_after_a_crash(tmp_path: Path) -> None:
    """Degraded by a wrong-sized segment, the store may be reading by a size the damage left
    in doubt, and a torn tail under a wrong size is an intact record: after a crash too, the
    open changes no byte of the log (review 32); `mqstore recover` is what repairs."""
    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=8192, **FAST) as store:
        while store.max_offset("T", 0) < 150:
            assert store.put(mqstore.Message("T", b"b" * 100)).ok
        end = store.put(mqstore.Message("T", b"last")).commitlog_offset + 200
    segments = sorted((root / "commitlog").iterdir())
    with segments[0].open("r+b") as f:
        f.truncate(4096)  # damage: a wrong-sized segment
    last = segments[-1]
    with last.open("r+b") as f:  # a put torn by the crash: bytes after the log's end
        f.seek(end % 8192 + 64)
        f.write(b"\x00\x00\x01\x00torn")
    (root / "abort").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in segments}
    with mqstore.open(root, **FAST) as store:
        assert not store.put(mqstore.Message("T", b"after")).ok  # degraded
    assert {p.name: p.read_bytes() for p in segments} == before


# Review 103 M3: 1000 slots and 3160 entries make a 67,240-byte index file, which 800 slots and
# 3200 entries (RocketMQ's 4:1 ratio) fill exactly too.
_ODD_INDEX = {"max_hash_slot_num": 1000, "max_index_num": 3160}
_SMALL = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 2000}


def _index_files(root: Path) -> dict[str, tuple[int, str]]:
    return {k: v for k, v in _files(root).items() if k.startswith("index/")}


def test_an_index_that_also_fits_the_4_to_1_ratio_is_not_reread_under_it(tmp_path: Path) -> None:
    """Review 103 M3: one message, five keys, in a store of 1000 slots and 3160 entries. Opened
    with the index settings left at their defaults, the store took 800/3200 (the ratio fits the
    size, and a nearly empty index walked cleanly under it), wrote its new entries under that
    layout (verify: 9 problems) and then refused the geometry it was created with. The files
    read consistently under 1000/3160 only: that is adopted, and the store stays whole."""
    root = tmp_path / "store"
    with mqstore.open(root, **_SMALL, **_ODD_INDEX, **FAST) as store:
        assert store.put(mqstore.Message(topic="t", body=b"hello", keys=[f"key{i}" for i in range(5)])).ok
    assert [s for s, _ in _index_files(root).values()] == [40 + 4 * 1000 + 20 * 3160]
    geometry = detect_geometry(RealFileSystem(), StoreConfig(store_path_root_dir=str(root)))
    assert geometry.index is not None
    assert (geometry.index.max_hash_slot_num, geometry.index.max_index_num) == (1000, 3160)
    with mqstore.open(root, **FAST) as store:
        assert (store.config.max_hash_slot_num, store.config.max_index_num) == (1000, 3160)
        assert all(len(store.query("t", f"key{i}").messages) == 1 for i in range(5))
        for i in range(30):
            assert store.put(mqstore.Message(topic="t", body=b"more", keys=[f"new{i}"])).ok
        assert len(store.query("t", "new7").messages) == 1
    assert main(["verify", str(root)]) == ExitCode.OK
    for settings in (_ODD_INDEX, {"max_hash_slot_num": 1000}, {"max_index_num": 3160}):
        with mqstore.open(root, **settings, **FAST) as store:
            assert len(store.query("t", "key3").messages) == 1
            assert len(store.query("t", "new29").messages) == 1


def _key_in_slot_0(topic: str, slots: int) -> str:
    """A key whose hash is a multiple of `slots` (slot 0), large enough to show in the file."""
    return next(k for k in (f"k{i}" for i in range(1_000_000))
                if key_hash_and_slot(f"{topic}#{k}", slots)[1] == 0
                and key_hash_and_slot(f"{topic}#{k}", slots)[0] >= 1 << 24)  # fmt: skip


def test_index_files_that_read_alike_under_two_geometries_are_refused_unless_the_settings_name_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key, in slot 0 of 1000, of the message at offset 0: under 800 slots the file reads
    just as consistently (slot 0 names entry 1; entry 1, read from the real slots, is zeros of
    the record at offset 0). The store does not pick one: it refuses, naming both, changing
    nothing, until the settings name the one the files were written with."""
    root = tmp_path / "store"
    key = _key_in_slot_0("t", 1000)
    with mqstore.open(root, **_SMALL, **_ODD_INDEX, **FAST) as store:
        assert store.put(mqstore.Message(topic="t", body=b"hello", keys=[key])).commitlog_offset == 0
    before = _files(root)
    with pytest.raises(mqstore.StoreGeometryAmbiguous) as refused:
        mqstore.open(root, **FAST)
    err = refused.value
    assert isinstance(err, mqstore.ConfigError)
    assert {(800, 3200), (1000, 3160)} <= set(err.candidates)  # (and others: one entry tells little)
    assert err.keys == ("max_hash_slot_num", "max_index_num")
    assert "max_hash_slot_num=800" in str(err) and "max_index_num=3200" in str(err)
    assert "max_hash_slot_num=1000" in str(err) and "max_index_num=3160" in str(err)
    assert _files(root) == before
    capsys.readouterr()
    for argv in (["verify", str(root)], ["query", str(root), "--topic", "t", "--key", key],
                 ["get", str(root), "--topic", "t", "--queue", "0", "--offset", "0"]):  # fmt: skip
        assert main(argv) == ExitCode.USAGE, argv
        assert "max_hash_slot_num=800" in capsys.readouterr().err, argv
    assert _files(root) == before
    for settings in (_ODD_INDEX, {"max_hash_slot_num": 1000}, {"max_index_num": 3160}):
        config = StoreConfig(store_path_root_dir=str(root), **settings)
        assert detect_geometry(RealFileSystem(), config).index == IndexGeometry(1000, 3160), settings
        with mqstore.open(root, **settings, **FAST) as store:
            assert len(store.query("t", key).messages) == 1
    monkeypatch.setenv("MQSTORE_MAX_HASH_SLOT_NUM", "1000")
    assert main(["verify", str(root)]) == ExitCode.OK  # the tools alike
    monkeypatch.delenv("MQSTORE_MAX_HASH_SLOT_NUM")
    before = _files(root)
    with pytest.raises(mqstore.StoreGeometryAmbiguous):  # a setting that names none of them
        mqstore.open(root, max_hash_slot_num=1003, **FAST)
    assert _files(root) == before


@pytest.mark.parametrize("index", [{"max_hash_slot_num": 250, "max_index_num": 1000},
                                   {"max_hash_slot_num": 7, "max_index_num": 40}])  # fmt: skip
def test_an_index_of_the_ratio_or_not_with_many_keys_is_adopted_as_written(
    tmp_path: Path, index: dict[str, int]
) -> None:
    root = tmp_path / "store"
    with mqstore.open(root, **_SMALL, **index, **FAST) as store:
        for i in range(60):
            assert store.put(mqstore.Message(topic="t", body=b"b", keys=[f"k{i}", f"j{i}"])).ok
    with mqstore.open(root, **FAST) as store:
        assert {k: getattr(store.config, k) for k in index} == index
        assert len(store.query("t", "k59").messages) == 1
        assert len(store.query("t", "j0").messages) == 1
    assert main(["verify", str(root)]) == ExitCode.OK


def test_a_running_stores_index_that_fits_no_geometry_is_not_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review 119 F4: `dump` of a running store warned that no index geometry fits: its newest
    index file, mid-write, may fit none for an instant, and the store's own open checked
    them. A stopped store's is still said."""
    from mqstore.storage.geometry import adopt_geometry

    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "20250101000000000").write_bytes(bytes(1000))  # a header of 0 entries, no ratio
    config = StoreConfig(store_path_root_dir=str(tmp_path))
    caplog.set_level("WARNING", logger="mqstore")
    adopt_geometry(RealFileSystem(), config, live=True)
    assert not [r for r in caplog.records if "geometry fits" in r.getMessage() or "pair fits" in r.getMessage()]
    adopt_geometry(RealFileSystem(), config)
    assert [r for r in caplog.records if "pair fits" in r.getMessage()]


@hypothesis_settings(max_examples=150, deadline=None)
@given(
    slot_count=st.integers(min_value=1, max_value=3 * (64 << 10) // 4 + 7),
    named=st.dictionaries(st.integers(min_value=0, max_value=3 * (64 << 10) // 4 + 6),
                          st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=40),  # fmt: skip
)
# Three chunks and a part: a zero chunk between named ones, a negative slot, the last one.
@example(slot_count=3 * (64 << 10) // 4 + 7, named={0: 5, 2 * (64 << 10) // 4 + 3: -1, 3 * (64 << 10) // 4 + 6: 2**31 - 1})
def test_the_slot_read_skips_zero_chunks_and_reads_every_other_slot_as_written(
    slot_count: int, named: dict[int, int]
) -> None:
    """The walk's slot read compares a chunk of zeros instead of turning it into ints: its
    lowest, highest and named-slot count, and each slot's value, are those of the plain read."""
    header = bytes(range(40))  # (not zeros: the read starts past it)
    slots = [0] * slot_count
    for slot, value in named.items():
        if slot < slot_count:
            slots[slot] = value
    data = bytearray(header + b"".join(v.to_bytes(4, "big", signed=True) for v in slots) + b"\xff" * 8)
    read = _SlotsRead(data, 40, 40 + 4 * slot_count)
    assert (read.slots, read.lowest, read.highest, read.named) == (
        slot_count, min(slots + [0]), max(slots + [0]), sum(1 for v in slots if v)
    )
    for slot in {0, slot_count - 1, *(s for s in named if s < slot_count)}:
        assert read.value(slot) == slots[slot]
