"""Bounded reads the Kafka way, and filter pushdown: exactly the rows asked for, checked
against the store's own `get`, with the pruning shown by the byte ranges planned."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402
from mqstore.pipeline.datasource import SCHEMA, RocketMQPushdownReader, RocketMQReader, read_commitlog  # noqa: E402

pytestmark = pytest.mark.spark

T0_MS = 1_700_000_000_000
QUEUES = {"orders": 3, "payments": 2, "audit": 1}
N = 420
SEGMENT = 64 * 1024
KEY_COLUMNS = ["topic", "queue_id", "queue_offset", "commitlog_offset", "body"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with ConsumeQueues: N messages over 6 queues, store_timestamp T0 + i seconds."""
    path = tmp_path_factory.mktemp("bounded") / "store"
    ticks = itertools.count()
    now = {"ms": T0_MS}

    def clock() -> int:
        return now["ms"]

    names = [(t, q) for t, n in QUEUES.items() for q in range(n)]
    with mqstore.open(path, clock_ms=clock, mapped_file_size_commitlog_bytes=SEGMENT) as s:
        for i in range(N):
            now["ms"] = T0_MS + 1000 * next(ticks)
            topic, queue_id = names[i % len(names)]
            assert s.put(mqstore.Message(topic=topic, body=f"m{i:04d}".encode() * 40, queue_id=queue_id)).ok
    return path


def by_get(store: Path, ranges: dict[tuple[str, int], tuple[int, int]]) -> list[tuple[Any, ...]]:
    """The rows of [start, end) per queue, from the store's `get`."""
    out = []
    with mqstore.open(store, mapped_file_size_commitlog_bytes=SEGMENT) as s:
        for (topic, queue_id), (start, end) in ranges.items():
            offset = start
            while offset < end:
                got = s.get(topic, queue_id, offset, min(32, end - offset))
                if not got.messages:
                    break
                for m in got.messages:
                    if m.queue_offset < end:
                        out.append((m.topic, m.queue_id, m.queue_offset, m.commitlog_offset, m.body))
                offset = got.next_begin_offset
    return sorted(out)


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in KEY_COLUMNS) for r in df.select(*KEY_COLUMNS).collect())


def queue_len(topic: str, queue_id: int) -> int:
    n_queues = sum(QUEUES.values())
    index = [(t, q) for t, n in QUEUES.items() for q in range(n)].index((topic, queue_id))
    return len(range(index, N, n_queues))


def test_starting_and_ending_offsets_per_queue_match_get(spark: Any, store: Path) -> None:
    starting = {"orders": {"0": 12, "1": -2}, "payments": {"1": 60}}
    ending = {"orders": {"0": 40, "2": 5}, "payments": {"0": -1}}
    df = read_commitlog(spark, str(store), options={"topics": "orders,payments",
                        "startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending)})  # fmt: skip
    expected = by_get(store, {
        ("orders", 0): (12, 40), ("orders", 1): (0, queue_len("orders", 1)), ("orders", 2): (0, 5),
        ("payments", 0): (0, queue_len("payments", 0)), ("payments", 1): (60, queue_len("payments", 1)),
    })  # fmt: skip
    got = rows(df)
    assert len(got) == len(expected) > 100
    assert got == expected
    # The scan without ConsumeQueues gives the same rows.
    no_cq = read_commitlog(spark, str(store), options={"topics": "orders,payments", "useConsumeQueue": "false",
                           "startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending)})  # fmt: skip
    assert rows(no_cq) == expected


def test_offsets_on_a_store_without_consume_queues_fall_back_to_a_scan(spark: Any, store: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(store / "commitlog", bare / "commitlog")
    opts = {"topics": "audit", "startingOffsets": '{"audit":{"0":50}}', "endingOffsets": '{"audit":{"0":55}}'}
    assert rows(read_commitlog(spark, str(bare), options=opts)) == by_get(store, {("audit", 0): (50, 55)})


def test_timestamps_and_topic_pattern(spark: Any, store: Path) -> None:
    start, end = T0_MS + 100_000, T0_MS + 130_000  # messages 100..129
    df = read_commitlog(spark, str(store), options={"topicPattern": "or.*|aud.t",
                        "startingTimestamp": str(start), "endingTimestamp": str(end)})  # fmt: skip
    got = df.select("topic", "store_timestamp").collect()
    stamps = sorted(int(r["store_timestamp"].replace(tzinfo=timezone.utc).timestamp() * 1000) for r in got)
    names = [(t, q) for t, n in QUEUES.items() for q in range(n)]
    wanted = [i for i in range(100, 130) if names[i % len(names)][0] in ("orders", "audit")]
    assert stamps == [T0_MS + 1000 * i for i in wanted]
    assert {r["topic"] for r in got} == {"orders", "audit"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "orders"}, "unknown option(s) subscribe; known options: path, paths, splitSize"),
        ({"startingOffsets": "{not json"}, "startingOffsets: not 'earliest', 'latest' or JSON"),
        ({"startingOffsets": '{"orders":{"0":-1}}'}, "-1 (latest) cannot start a batch read"),
        ({"endingOffsets": "earliest"}, "-2 (earliest) cannot end a read"),
        ({"topics": "a", "topicPattern": "b"}, "topics or topicPattern, not both"),
    ],
)
def test_a_bad_or_unknown_option_is_an_error_naming_it(spark: Any, store: Path, options: dict[str, str], message: str) -> None:
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_commitlog(spark, str(store), options=options).count()


def planned_bytes(reader: RocketMQReader) -> int:
    return sum(s.end - s.start for p in reader.partitions() for s in p.splits)  # type: ignore[attr-defined]


def queues_pushed(options: dict[str, str], queue_ids: tuple[int, ...]) -> RocketMQReader:
    """A reader told `queue_id IN queue_ids`, as Spark pushes it."""
    from pyspark.sql.datasource import In

    reader = RocketMQPushdownReader(options, SCHEMA)
    assert not list(reader.pushFilters([In(("queue_id",), queue_ids)]))
    return reader


def test_consume_queues_narrow_the_bytes_planned(store: Path) -> None:
    base = {"paths": json.dumps([str(store)]), "splitsize": "8k"}
    everything = planned_bytes(RocketMQReader(base, SCHEMA))
    # Every orders queue from offset 60 of 70: only the log's last part can hold those records.
    late_opts = {**base, "topics": "orders", "startingoffsets": '{"orders":{"0":60,"1":60,"2":60}}'}
    late = planned_bytes(queues_pushed(late_opts, (0, 1, 2)))
    assert 0 < late < everything / 4
    # Without a queue filter a queue no JSON names (its ConsumeQueue directory maybe missing)
    # is read whole, so nothing is cut; nor when a queue is left at earliest.
    assert planned_bytes(RocketMQReader(late_opts, SCHEMA)) == everything
    assert planned_bytes(queues_pushed({**late_opts, "startingoffsets": '{"orders":{"0":60,"1":60}}'}, (0, 1, 2))) == everything
    scan = planned_bytes(RocketMQReader({**late_opts, "useconsumequeue": "false"}, SCHEMA))
    assert scan == everything


def test_pushed_filters_narrow_planning_and_decoding(store: Path) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThan

    base = {"paths": json.dumps([str(store)]), "splitsize": "8k"}
    reader = RocketMQPushdownReader(base, SCHEMA)
    everything = planned_bytes(reader)
    after = datetime.fromtimestamp((T0_MS + 50_000) / 1000, timezone.utc)
    filters = [EqualTo(("topic",), "orders"), In(("queue_id",), (1, 2)), GreaterThan(("store_timestamp",), after),
               LessThan(("commitlog_offset",), 40_000), EqualTo(("body",), b"x")]  # fmt: skip
    unsupported = list(reader.pushFilters(filters))
    assert unsupported == [filters[-1]]  # body: Spark applies that one
    assert planned_bytes(reader) < everything / 2  # the commitlog_offset range prunes splits
    got = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    assert got and all(r["topic"] == "orders" and r["queue_id"] in (1, 2) for r in got)
    assert all(r["commitlog_offset"] < 40_000 and r["store_timestamp"] > after for r in got)
    assert len(got) == sum(1 for r in full_rows(store) if r["topic"] == "orders" and r["queue_id"] in (1, 2)
                           and r["commitlog_offset"] < 40_000 and r["store_timestamp"] > after)  # fmt: skip


def full_rows(store: Path) -> list[dict[str, Any]]:
    reader = RocketMQReader({"paths": json.dumps([str(store)])}, SCHEMA)
    return [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]


def test_a_where_clause_is_pushed_in_a_spark_query(spark: Any, store: Path) -> None:
    from pyspark.sql import functions as F

    after = datetime.fromtimestamp((T0_MS + 200_000) / 1000, timezone.utc)
    df = spark.read.format("rocketmq").load(str(store))
    q = df.where((F.col("topic") == "orders") & (F.col("queue_id") == 1) & (F.col("store_timestamp") > F.lit(after))
                 & (F.col("commitlog_offset") >= 1000))  # fmt: skip
    plan = q._jdf.queryExecution().executedPlan().toString()
    # Spark keeps no Filter node for filters the source took.
    assert "Filter (" not in plan and "BatchScan rocketmq" in plan, plan
    expected = by_get(store, {("orders", 1): (0, queue_len("orders", 1))})
    expected = [r for r in expected if r[3] >= 1000]
    got = rows(q)
    stamps = {r["commitlog_offset"]: r["store_timestamp"] for r in full_rows(store)}
    assert got == [r for r in expected if stamps[r[3]] > after]
    assert got


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_a_corrupt_log_in_a_store_directory_is_refused(store: Path, tmp_path: Path) -> None:
    """Review 108 F7: `corruptLog` wrote its JSON lines wherever it pointed, into the read
    store's consumequeue/ too (no job writes inside the stores it reads)."""
    paths = json.dumps([str(store)])
    for inside in (store / "consumequeue", store, store / "commitlog" / "log"):
        with pytest.raises(ValueError, match="overlaps the input"):
            RocketMQReader({"paths": paths, "corruptLog": str(inside)}, SCHEMA)
    assert RocketMQReader({"paths": paths, "corruptLog": str(tmp_path / "log")}, SCHEMA).corrupt_log == str(tmp_path / "log")
