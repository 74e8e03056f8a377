"""The Spark jobs: stats, export, lookup and reindex (against the store's own writers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from mqstore.storage.codec import TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from mqstore.storage.consume_queue import ConsumeQueue, list_consume_queues
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import IndexService, iter_index_entries, read_index_header

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py

pytestmark = pytest.mark.spark


def test_stats_of_broker_sample_a(spark: Any) -> None:
    from mqstore.pipeline.stats import compute_stats

    got = compute_stats(spark, [str(h.BROKER_SAMPLES[0])])
    records = [rec for _, _, rec in h.reference_records([h.BROKER_SAMPLES[0]])]
    assert got["messages"] == 47 and got["bytes"] == 47 * 172 and got["corrupt_records"] == 0
    (q,) = got["queues"]
    assert (q["topic"], q["queue_id"], q["messages"]) == ("abc", 0, 47)
    assert q["first_store_time_ms"] == min(r.store_timestamp for r in records)
    assert q["last_store_time_ms"] == max(r.store_timestamp for r in records)
    assert q["first_store_time"] == "2021-09-28T09:25:59.372Z"
    assert sum(q["hourly"].values()) == 47
    json.dumps(got)  # JSON out


def test_stats_per_queue_and_hour_of_a_generated_store(spark: Any, generated_store: Any) -> None:
    from mqstore.pipeline.stats import compute_stats

    records = [rec for _, _, rec in h.reference_records([generated_store.store])]
    got = compute_stats(spark, [str(generated_store.store)])
    expected: dict[tuple[str, int], list[int]] = {}
    for r in records:
        e = expected.setdefault((r.topic, r.queue_id), [0, 0])
        e[0] += 1
        e[1] += r.total_size
    assert {(q["topic"], q["queue_id"]): [q["messages"], q["bytes"]] for q in got["queues"]} == expected
    hours: dict[int, int] = {}
    for r in records:
        hours[r.store_timestamp // 3_600_000] = hours.get(r.store_timestamp // 3_600_000, 0) + 1
    assert sum(sum(q["hourly"].values()) for q in got["queues"]) == len(records)
    assert len({k for q in got["queues"] for k in q["hourly"]}) == len(hours)


def test_export_writes_parquet_by_topic_and_date(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from mqstore.pipeline.export import export

    out = tmp_path / "parquet"
    summary = export(spark, [str(p) for p in h.BROKER_SAMPLES], str(out))
    assert summary["corrupt_records"] == 0
    assert (out / "topic=abc" / "date=2021-09-28").is_dir() and (out / "topic=abc" / "date=2019-03-03").is_dir()
    back = spark.read.parquet(str(out)).select("commitlog_offset", "msg_id", "body", "properties", "segment_file",
                                               F.unix_millis("store_timestamp").alias("ts"))  # fmt: skip
    rows = sorted((r.asDict() for r in back.collect()), key=lambda r: (r["segment_file"], r["commitlog_offset"]))
    expected = [h.expected_row(p, rec) for p, _, rec in h.reference_records(h.BROKER_SAMPLES)]
    assert [(r["msg_id"], r["body"], r["properties"], r["ts"]) for r in rows] == [
        (e["msg_id"], e["body"], e["properties"], e["store_timestamp"]) for e in expected
    ]


def test_lookup_finds_by_uniq_key_and_by_keys_token(spark: Any, generated_store: Any) -> None:
    from mqstore.pipeline.lookup import lookup

    records = [rec for _, _, rec in h.reference_records([generated_store.store])]
    target = records[400]  # i % 4 == 0: has KEYS "k400 order-0  shared"
    by_uniq = lookup(spark, [str(generated_store.store)], target.uniq_key)
    assert [r["commitlog_offset"] for r in by_uniq] == [target.commitlog_offset]
    by_token = lookup(spark, [str(generated_store.store)], "order-0", topic=target.topic)
    want = [r.commitlog_offset for r in records if r.topic == target.topic and "order-0" in r.key_list]
    assert [r["commitlog_offset"] for r in by_token] == want and target.commitlog_offset in want
    assert lookup(spark, [str(generated_store.store)], "no-such-key") == []


# ---------------------------------------------------------------------------------------
# reindex

CQ_FILE_SIZE = 20 * 64
SLOTS, MAX_INDEX = 101, 400


def _reference_build(store: Path, out: Path) -> None:
    """What the store's dispatchers build (actors/consume_queue.py, actors/index.py), fed by a
    plain codec walk: the reference the Spark rebuild must equal."""
    fs = RealFileSystem()
    clock = iter(range(1_800_000_000_000, 1_900_000_000_000, 1000))
    queues: dict[tuple[str, int], ConsumeQueue] = {}
    index = IndexService(fs, str(out / "index"), clock_ms=lambda: next(clock), max_hash_slot_num=SLOTS,
                         max_index_num=MAX_INDEX)  # fmt: skip
    for _, _, rec in h.reference_records([store]):
        tx = rec.sys_flag & TRANSACTION_MASK
        if tx not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            cq = queues.get((rec.topic, rec.queue_id))
            if cq is None:
                cq = queues[(rec.topic, rec.queue_id)] = ConsumeQueue(
                    fs, rec.topic, rec.queue_id, str(out / "consumequeue"), mapped_file_size=CQ_FILE_SIZE,
                    clock_ms=lambda: 0,
                )  # fmt: skip
                cq.load()
            assert cq.put_message_position_info(rec.commitlog_offset, rec.total_size, rec.tags_code(), rec.queue_offset)
        keys = rec.keys if rec.properties_raw else ""
        assert index.build_index(topic=rec.topic, commitlog_offset=rec.commitlog_offset,
                                 store_timestamp=rec.store_timestamp, sys_flag=rec.sys_flag, keys=keys,
                                 uniq_key=rec.uniq_key)  # fmt: skip
    for cq in queues.values():
        cq.flush(0)
        cq.mapped_file_queue.shutdown(0)
    index.flush_all()
    index.close()


def _cq_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_reindex_equals_what_the_store_writers_build(spark: Any, generated_store: Any, tmp_path: Path) -> None:
    from mqstore.pipeline.reindex import reindex

    ref, out = tmp_path / "ref", tmp_path / "out"
    _reference_build(generated_store.store, ref)
    summary = reindex(spark, str(generated_store.store), str(out), cq_file_size=CQ_FILE_SIZE,
                      max_hash_slot_num=SLOTS, max_index_num=MAX_INDEX, split_size="256k")  # fmt: skip

    # ConsumeQueue: every file byte-identical, no file more or less.
    ref_cq, out_cq = _cq_files(ref / "consumequeue"), _cq_files(out / "consumequeue")
    assert sorted(out_cq) == sorted(ref_cq) and len(ref_cq) > 12
    assert all(out_cq[name] == ref_cq[name] for name in ref_cq)
    assert len(summary["consume_queues"]) == len(list_consume_queues(str(ref / "consumequeue"), RealFileSystem()))

    # Index: same number of files; per file, equal headers and entries equal as a set.
    fs = RealFileSystem()
    ref_files = sorted(os.listdir(ref / "index"))
    out_files = sorted(os.listdir(out / "index"))
    assert len(out_files) == len(ref_files) > 3
    for r, o in zip(ref_files, out_files):
        rh, oh = read_index_header(fs, str(ref / "index" / r)), read_index_header(fs, str(out / "index" / o))
        assert rh == oh, (r, o)
        re_ = set(iter_index_entries(fs, str(ref / "index" / r), max_hash_slot_num=SLOTS))
        oe = set(iter_index_entries(fs, str(out / "index" / o), max_hash_slot_num=SLOTS))
        assert oe == re_ and len(oe) > 0
        # In fact the whole file is identical: same writer, same order.
        assert (ref / "index" / r).read_bytes() == (out / "index" / o).read_bytes()


def test_cli_registers_the_spark_group_without_importing_pyspark() -> None:
    import argparse

    from mqstore.pipeline.cli import add_subcommands

    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="command"))
    for argv in (["spark", "stats", "a", "b", "--master", "local[1]"], ["spark", "export", "a", "out"],
                 ["spark", "reindex", "a", "out"], ["spark", "lookup", "a", "--key", "k", "--topic", "t"]):  # fmt: skip
        ns = parser.parse_args(argv)
        assert callable(ns.handler)


def test_cli_stats_prints_json(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from mqstore.cli import main

    assert main(["spark", "stats", str(h.BROKER_SAMPLES[0]), "--master", "local[2]"]) == 0
    assert json.loads(capsys.readouterr().out)["messages"] == 47


def _damaged_sample(tmp_path: Path) -> tuple[Path, int]:
    """broker-sample-a with the magic code of its 11th record flipped."""
    seg = tmp_path / "store" / "commitlog" / "00000000000000000000"
    seg.parent.mkdir(parents=True)
    data = bytearray((h.BROKER_SAMPLES[0] / "commitlog" / "00000000000000000000").read_bytes())
    data[10 * 172 + 4] ^= 0xFF
    seg.write_bytes(bytes(data))
    return tmp_path / "store", 10 * 172


def test_export_skips_and_counts_a_corrupt_record(spark: Any, tmp_path: Path) -> None:
    from mqstore.pipeline.export import export

    store, offset = _damaged_sample(tmp_path)
    summary = export(spark, [str(store)], str(tmp_path / "out"))
    assert summary["corrupt_records"] == 1
    (line,) = (tmp_path / "out" / "_corrupt").glob("*.jsonl")
    assert json.loads(line.read_text())["commitlog_offset"] == offset
    assert spark.read.parquet(str(tmp_path / "out")).count() == 46


def test_cli_strict_stats_exits_3_naming_the_record(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mqstore.cli import main

    store, offset = _damaged_sample(tmp_path)
    assert main(["spark", "stats", str(store), "--strict"]) == 3
    err = capsys.readouterr().err
    assert f"commitlog offset {offset}" in err and "00000000000000000000" in err
    assert main(["spark", "stats", str(store)]) == 3  # reported, not failed: exit says "corrupt found"
    assert json.loads(capsys.readouterr().out)["corrupt_records"] == 1


def test_stats_of_a_store_with_no_messages(spark: Any, tmp_path: Path) -> None:
    from mqstore.pipeline.stats import compute_stats

    (tmp_path / "commitlog").mkdir()
    with open(tmp_path / "commitlog" / "00000000000000000000", "wb") as f:
        f.truncate(64 * 1024)  # a freshly preallocated segment
    got = compute_stats(spark, [str(tmp_path)])
    assert (got["messages"], got["queues"], got["corrupt_records"]) == (0, [], 0)


def test_reindex_takes_its_geometry_from_the_settings_unless_the_command_line_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 126 F4: `mqstore --config store.toml spark reindex` ignored the file and wrote
    6,000,000-byte queue files for a store of 2,000-byte ones (which the store then refused)."""
    import argparse

    from mqstore.pipeline.reindex import settings_of

    def geometry_of(ns: argparse.Namespace) -> tuple[int, int, int]:
        cfg = settings_of(ns)
        return cfg.mapped_file_size_consume_queue_bytes, cfg.max_hash_slot_num, cfg.max_index_num

    config = tmp_path / "store.toml"
    config.write_text("mapped_file_size_consume_queue_bytes = 2000\nmax_hash_slot_num = 100\nmax_index_num = 400\n")
    ns = argparse.Namespace(config=config, cq_file_size=None, max_hash_slot_num=None, max_index_num=None)
    assert geometry_of(ns) == (2000, 100, 400)
    assert geometry_of(argparse.Namespace(**{**vars(ns), "max_index_num": 800})) == (2000, 100, 800)
    monkeypatch.setenv("MQSTORE_MAX_HASH_SLOT_NUM", "64")  # (a spark-submit script: no --config)
    assert geometry_of(argparse.Namespace(cq_file_size=None, max_hash_slot_num=None, max_index_num=None)) == (
        6_000_000, 64, 20_000_000)  # fmt: skip


@pytest.mark.parametrize("argv", [
    ["stats", "S", "--split-size", "0"],
    ["stats", "S", "--split-size", "abc"],
    ["lookup", "S", "--key", "k", "--limit", "-1"],
    ["reindex", "S", "OUT", "--max-index-num", "1"],
])  # fmt: skip
def test_bad_spark_job_arguments_are_usage_errors_before_spark_starts(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 126 F6: they reached Spark (exit 1 after 12-14 s, a DIVIDE_BY_ZERO, an empty
    lookup answer)."""
    from mqstore.cli import main
    from mqstore.pipeline import session

    monkeypatch.setattr(session, "get_spark", lambda *a, **k: pytest.fail("Spark was started"))
    store = tmp_path / "S"
    store.mkdir()
    code = main(["spark", *[str(store) if a == "S" else str(tmp_path / a) if a == "OUT" else a for a in argv]])
    assert code == 2, capsys.readouterr().err


def test_reindex_of_a_stores_commitlog_directory_reads_the_ledger_beside_it(tmp_path: Path) -> None:
    """Review 127 F2: `spark reindex STORE/commitlog` (the form its help gives) skipped the
    queue ledger's floors, and the removed queue's records came back at acknowledged offsets."""
    import mqstore
    from mqstore.pipeline.reindex import cleaned_floors

    root = tmp_path / "store"
    with mqstore.open(root) as store:
        assert store.put(mqstore.Message(topic="gone", body=b"old")).ok
        assert store.put(mqstore.Message(topic="other", body=b"x")).ok
        assert store.wait_for_messages("other", 0, 0, timeout_s=10)
        store.clean_unused_topic({"other"})
    floors = cleaned_floors(str(root))
    assert list(floors) == [("gone", 0)]
    assert cleaned_floors(str(root / "commitlog")) == cleaned_floors(str(root / "commitlog") + "/") == floors
    elsewhere = tmp_path / "segments"
    elsewhere.mkdir()
    assert cleaned_floors(str(elsewhere)) == {}


def test_reindex_of_a_store_whose_commitlog_lives_elsewhere_reads_its_log_and_its_ledger(tmp_path: Path) -> None:
    """Review 128 F2: with `store_path_commitlog`, the store root given to reindex read no
    segment (it failed after Spark started), and the commitlog directory given read no ledger:
    the removed queue's records came back at acknowledged offsets."""
    import mqstore
    from mqstore.config import StoreConfig
    from mqstore.pipeline.reindex import cleaned_floors, places_of

    root, commitlog = tmp_path / "root", tmp_path / "disk2" / "commitlog"
    settings = {"store_path_root_dir": str(root), "store_path_commitlog": str(commitlog)}
    with mqstore.open(root, store_path_commitlog=str(commitlog)) as store:
        assert store.put(mqstore.Message(topic="gone", body=b"old")).ok
        assert store.put(mqstore.Message(topic="other", body=b"x")).ok
        assert store.wait_for_messages("other", 0, 0, timeout_s=10)
        store.clean_unused_topic({"other"})
    cfg = StoreConfig.load(overrides=settings, env={})
    for given in (root, commitlog):
        source, ledger_root = places_of(str(given), cfg)
        assert (source, ledger_root) == (str(commitlog), str(root))
        assert list(cleaned_floors(source, ledger_root)) == [("gone", 0)]
    assert places_of(str(tmp_path / "other"), cfg) == (str(tmp_path / "other"), None)
