"""readStream.format("rocketmq") over a live store: per-queue offsets, checkpointed, bounded
per trigger; each message once across a restart of the query (0 duplicates, 0 misses)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MAX_PER_TRIGGER = 400
QUEUES = [("orders", 0), ("orders", 1), ("orders", 2), ("payments", 0)]


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 180, failures: Sequence[str] = ()) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline or failures:
            raise AssertionError(f"waiting for {what}: timed out, or the producer failed: {list(failures)}")
        time.sleep(0.2)  # Spark's micro-batch thread is not ours to signal


def test_a_stream_over_a_live_store_delivers_each_message_once_across_a_restart(spark: Any, tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()
    # (A put waiting over the default 1 s in the writer's inbox, on a loaded CI machine beside
    # Spark, is refused OS_PAGE_CACHE_BUSY, as RocketMQ refuses it, and ended the producer.)
    store = mqstore.open(tmp_path / "store", mapped_file_size_commitlog_bytes=256 * 1024,
                         os_page_cache_busy_timeout_ms=60_000)  # fmt: skip
    put: list[tuple[str, int, int]] = []
    stop = threading.Event()
    failures: list[str] = []

    def producer() -> None:
        i = 0
        while not stop.is_set():
            for _ in range(10):
                topic, queue_id = QUEUES[i % len(QUEUES)]
                r = store.put(mqstore.Message(topic=topic, queue_id=queue_id, body=b"%08d" % i * 16))
                if not r.ok:
                    failures.append(repr(r))
                    return
                put.append((topic, queue_id, r.queue_offset))
                i += 1
            stop.wait(0.1)  # about 100 a second: batches see a log that keeps growing

    def sink(df: Any, batch_id: int) -> None:
        rows = [[r.topic, r.queue_id, r.queue_offset] for r in df.select("topic", "queue_id", "queue_offset").collect()]
        # One file per batch id: Spark re-runs an uncommitted batch under the same id.
        (out / f"{batch_id:06d}.json").write_text(json.dumps(rows))

    def start() -> Any:
        return (
            spark.readStream.format("rocketmq")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(MAX_PER_TRIGGER))
            .option("topics", "orders,payments")
            .load(str(tmp_path / "store"))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    def batches_while_running(count: int) -> Callable[[], bool]:
        """`count` batch files, restarting the query (from its checkpoint) once if Spark's fixed
        10 s for a Python worker to connect back ran out as it started (a loaded CI run): a
        restart delivers each message once too, which is what this test checks."""
        restarted = False

        def check() -> bool:
            nonlocal query, restarted
            if not query.isActive and not restarted and "failed to connect back" in str(query.exception()):
                restarted = True
                query = start()
            return len(list(out.glob("*.json"))) >= count

        return check

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        # More than one trigger's worth before the first batch, so maxOffsetsPerTrigger must cap it.
        _wait_for("first puts", lambda: len(put) > MAX_PER_TRIGGER, failures=failures)
        at_start = len(put)
        query = start()
        # Two batches, and one after the restart: each costs seconds of a loaded CI machine.
        _wait_for("two batches", batches_while_running(2))
        query.stop()
        assert len(put) > at_start  # the store took puts while the query ran
        seen_before = len(list(out.glob("*.json")))
        at_stop = len(put)
        _wait_for("puts while the query is down", lambda: len(put) > at_stop + MAX_PER_TRIGGER, failures=failures)
        query = start()
        at_restart = len(put)
        _wait_for("a batch after the restart", batches_while_running(seen_before + 1))
        assert len(put) > at_restart
        # Enough puts for several capped batches, however fast the stream caught up.
        _wait_for("enough puts", lambda: len(put) > 3 * MAX_PER_TRIGGER, failures=failures)
        stop.set()
        thread.join(30)
        store.close()  # every put dispatched to its ConsumeQueue
        query.processAllAvailable()
        query.stop()
    finally:
        stop.set()
        store.close()
    assert not failures, failures
    delivered: list[tuple[str, int, int]] = []
    for f in sorted(out.glob("*.json")):
        rows = json.loads(f.read_text())
        assert len(rows) <= MAX_PER_TRIGGER, f.name
        delivered.extend(tuple(r) for r in rows)
    duplicates = len(delivered) - len(set(delivered))
    misses = set(put) - set(delivered)
    assert len(put) > 3 * MAX_PER_TRIGGER and len(delivered) == len(put)
    assert (duplicates, len(misses), len(set(delivered) - set(put))) == (0, 0, 0)


@pytest.mark.parametrize(("options", "message"), [
    ({"endingOffsets": "latest"}, "unknown option"),  # batch-only: a stream would ignore it
    ({"startingTimestamp": "0"}, "unknown option"),
    ({"topics": "a", "topicPattern": "b"}, "not both"),
    ({"maxOffsetsPerTrigger": "0"}, "must be positive"),
])  # fmt: skip
def test_a_stream_refuses_options_it_would_ignore(options: dict[str, str], message: str) -> None:
    from mqstore.pipeline.datasource import SCHEMA, RocketMQDataSource

    with pytest.raises(ValueError, match=message):
        RocketMQDataSource({"path": "/nonexistent", **options}).streamReader(SCHEMA)
