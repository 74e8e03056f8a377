"""This session's fixes to the Spark jobs (reviews 126 and 127, and the demo's borrowed
session), in a file of their own: the xdist workers take whole files, and these Spark runs
beside test_jobs.py's kept one worker busy while the other waited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

CQ_FILE_SIZE = 20 * 64
SLOTS, MAX_INDEX = 101, 400


def _cq_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_demo_run_in_the_hosts_process_leaves_the_hosts_spark_session_running(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo borrows a running session (getOrCreate) and must not stop it: it did, and the
    host's next `format("rocketmq")` load failed with DATA_SOURCE_NOT_FOUND (CI, twice)."""
    from mqstore.cli import main

    code = main(["demo", "--json", "--no-progress", "--store-dir", str(tmp_path / "d"), "--messages", "300",
                 "--query", "none"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["spark"]["messages"] == 300
    assert spark.read.format("rocketmq").load(str(tmp_path / "d")).count() == 300


def test_reindex_gives_no_unit_to_a_record_whose_topic_cannot_name_a_queue(spark: Any, tmp_path: Path) -> None:
    """Review 126 F2: a record's topic became a path under OUT_DIR/consumequeue: "../../x"
    wrote queue files outside it (into another store), a flipped bit ("/rders") at the root.
    The store's dispatch gives such a record no unit; so does the reindex."""
    from mqstore.pipeline.reindex import reindex
    from mqstore.storage.codec import HostAddress, encode_message

    store, out, outside = tmp_path / "evil", tmp_path / "out", tmp_path / "pwned"
    (store / "commitlog").mkdir(parents=True)
    host = HostAddress("127.0.0.1", 10911)
    records = [("ok", 0, 0), (f"../../{outside.name}", 0, 0), ("..", 0, 0), ("a/b", 2, 0), ("ok\n", 0, 0),
               ("ok", 0, 1)]  # fmt: skip
    log, offset = bytearray(), 0
    for topic, queue_id, queue_offset in records:
        record = encode_message(topic=topic, queue_id=queue_id, body=b"x", properties="", born_host=host,
                                store_host=host, store_timestamp=1796129000000, born_timestamp=1796129000000,
                                queue_offset=queue_offset, commitlog_offset=offset)  # fmt: skip
        log += record
        offset += len(record)
    (store / "commitlog" / f"{0:020d}").write_bytes(bytes(log) + bytes(64 * 1024 - len(log)))
    summary = reindex(spark, str(store), str(out), cq_file_size=CQ_FILE_SIZE, max_hash_slot_num=SLOTS,
                      max_index_num=MAX_INDEX)  # fmt: skip
    assert [(q["topic"], q["queue_id"], q["units"]) for q in summary["consume_queues"]] == [("ok", 0, 2)]
    assert not outside.exists() and sorted(p.name for p in (out / "consumequeue").iterdir()) == ["ok"]


def test_reindex_rebuilds_a_stopped_stores_files_in_place_as_the_store_builds_them(spark: Any, tmp_path: Path) -> None:
    """Review 126 F3: the README's rebuild in place (OUT_DIR the store, its queue and index
    files moved aside) always failed after Spark started: the job's read log inside OUT_DIR
    lay inside the store read, which the data source refuses. Review 126 F1: the rebuild gave
    the records of a queue clean_unused_topic removed their old units, so the puts acknowledged
    after the clean, at queue offsets from 0 again, were skipped as "already written" and the
    removed messages served at their offsets; the queue ledger's floor says which are whose."""
    import shutil

    import mqstore
    from mqstore.pipeline.reindex import reindex

    root = tmp_path / "store"
    geometry = {"mapped_file_size_consume_queue_bytes": CQ_FILE_SIZE, "max_hash_slot_num": SLOTS,
                "max_index_num": MAX_INDEX}  # fmt: skip
    with mqstore.open(root, **geometry) as store:
        for i in range(5):
            assert store.put(mqstore.Message(topic="gone", body=b"OLD-%d" % i)).ok
        for i in range(300):
            assert store.put(mqstore.Message(topic=f"T{i % 3}", queue_id=i % 2, body=b"m%d" % i, keys=[f"k{i}"])).ok
        assert store.wait_for_messages("T2", 1, 49, timeout_s=10)
        store.clean_unused_topic({"T0", "T1", "T2"})
        for i in range(3):
            assert store.put(mqstore.Message(topic="gone", body=b"NEW-%d" % i)).queue_offset == i
    own = _cq_files(root / "consumequeue")
    for name in ("consumequeue", "index"):
        shutil.move(str(root / name), str(tmp_path / f"aside-{name}"))
    summary = reindex(spark, str(root), str(root), cq_file_size=CQ_FILE_SIZE, max_hash_slot_num=SLOTS,
                      max_index_num=MAX_INDEX)  # fmt: skip
    assert sum(q["units"] for q in summary["consume_queues"]) == 303
    assert {(q["topic"], q["queue_id"]): q["units"] for q in summary["consume_queues"]}[("gone", 0)] == 3
    rebuilt = _cq_files(root / "consumequeue")
    assert sorted(rebuilt) == sorted(own) and all(rebuilt[name] == own[name] for name in own)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aside-consumequeue", "aside-index", "store"]  # (no read log left)
    with mqstore.open(root, **geometry) as store:
        assert [m.body for m in store.query("T1", "k4").messages] == [b"m4"]
        assert [m.body for m in store.get("gone", 0, 0, 10).messages] == [b"NEW-0", b"NEW-1", b"NEW-2"]
