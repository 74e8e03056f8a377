"""`lookup` answers from the index files when a store has them (no Spark start-up), and
scans what the index does not cover yet; the same hits as the Spark scan."""

from __future__ import annotations

import os
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402
from mqstore.pipeline.lookup import lookup, lookup_by_index  # noqa: E402

pytestmark = pytest.mark.spark

SEGMENT = 64 * 1024


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """47 messages: 40 indexed, then 7 put with the index off (the tail an index lags behind)."""
    path = tmp_path_factory.mktemp("lookup") / "store"
    with mqstore.open(path, mapped_file_size_commitlog_bytes=SEGMENT) as s:
        for i in range(40):
            keys = [f"order-{i % 5}", f"k{i}"]
            assert s.put(mqstore.Message(topic=("abc", "xyz")[i % 2], body=b"b%d" % i, keys=keys)).ok
    with mqstore.open(path, mapped_file_size_commitlog_bytes=SEGMENT, message_index_enable=False) as s:
        for i in range(40, 47):
            assert s.put(mqstore.Message(topic="abc", body=b"b%d" % i, keys=[f"order-{i % 5}", f"k{i}"])).ok
    return path


@pytest.mark.parametrize(("key", "topic"), [("order-2", None), ("order-1", "abc"), ("k3", None), ("k45", None), ("nope", None)])
def test_the_index_gives_the_hits_of_the_scan(spark: Any, store: Path, key: str, topic: str | None) -> None:
    by_index = lookup_by_index([str(store)], key, topic=topic)
    assert by_index is not None
    assert by_index == lookup(spark, [str(store)], key, topic=topic)


def test_a_store_without_index_files_is_left_to_the_scan(store: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(store / "commitlog", tmp_path / "bare" / "commitlog")
    assert lookup_by_index([str(tmp_path / "bare")], "k3") is None


def test_the_lookup_command_on_a_47_message_store_takes_under_15_s(store: Path) -> None:
    mqstore_bin = Path(sys.executable).with_name("mqstore")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    started = time.monotonic()
    result = subprocess.run([str(mqstore_bin), "spark", "lookup", str(store), "--key", "order-3"], env=env,
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    hits = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(h["commitlog_offset"] for h in hits) == sorted(
        h["commitlog_offset"] for h in lookup_by_index([str(store)], "order-3") or []
    )
    assert len(hits) == 9  # 3, 8, ..., 38 from the index; 43 from the tail it does not cover
    assert elapsed < 15, elapsed
