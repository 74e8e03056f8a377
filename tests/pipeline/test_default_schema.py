"""The default schema is Kafka-like and small; every other field is opt-in (issue 17).

Spark's Kafka source reads key, value, topic, partition, offset and timestamp by default and
headers only with `includeHeaders`. Ours reads the fields a data engineer uses by default; the
rest come with `includeAllFields=true` or a user schema, and only the columns of the schema
are decoded (the Python data source API has no column pruning: the schema is the pruning).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402

from mqstore.pipeline.columnar import COLUMNS  # noqa: E402
from mqstore.pipeline.datasource import (  # noqa: E402
    DEFAULT_COLUMNS,
    DEFAULT_SCHEMA,
    SCHEMA,
    RocketMQDataSource,
    RocketMQReader,
)

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)

pytestmark = pytest.mark.spark

SAMPLE = h.BROKER_SAMPLES[0]
KAFKA_LIKE = ["topic", "queue_id", "queue_offset", "commitlog_offset", "size", "born_timestamp",
              "store_timestamp", "tags", "keys", "properties", "body", "error"]  # fmt: skip


def expected(columns: list[str]) -> list[dict[str, Any]]:
    rows = [h.expected_row(p, rec) for p, _, rec in h.reference_records([SAMPLE])]
    return sorted(({c: r[c] for c in columns} for r in rows), key=lambda r: r["commitlog_offset"])


def collected(df: Any) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    # Epoch ms, not datetimes: collect() would convert to the Python process's time zone.
    ts = ("born_timestamp", "store_timestamp")
    df = df.select(*[F.unix_millis(c).alias(c) if c in ts else F.col(c) for c in df.columns])
    return sorted((r.asDict() for r in df.collect()), key=lambda r: r["commitlog_offset"])


def test_the_default_schema_is_kafka_like_and_include_all_fields_gives_every_column() -> None:
    assert list(DEFAULT_COLUMNS) == KAFKA_LIKE and DEFAULT_SCHEMA.names == KAFKA_LIKE
    assert RocketMQDataSource({"path": "/x"}).schema() == DEFAULT_SCHEMA
    assert RocketMQDataSource({"path": "/x", "includeAllFields": "false"}).schema() == DEFAULT_SCHEMA
    assert RocketMQDataSource({"path": "/x", "includeAllFields": "true"}).schema() == SCHEMA
    assert SCHEMA.names == list(COLUMNS)
    # A column has one type whichever schema it comes in.
    assert all(SCHEMA[f.name] == f for f in DEFAULT_SCHEMA.fields)
    with pytest.raises(ValueError, match="includeAllFields.*'maybe'"):
        RocketMQDataSource({"path": "/x", "includeAllFields": "maybe"}).schema()


def test_a_plain_read_has_the_default_columns_and_include_all_fields_every_one(spark: Any) -> None:
    df = spark.read.format("rocketmq").load(str(SAMPLE))
    assert df.columns == KAFKA_LIKE
    assert collected(df) == expected(KAFKA_LIKE)
    everything = spark.read.format("rocketmq").option("includeAllFields", "true").load(str(SAMPLE))
    assert everything.columns == list(COLUMNS)
    assert collected(everything) == expected(list(COLUMNS))


def test_a_user_schema_reads_fields_outside_the_default(spark: Any) -> None:
    df = spark.read.format("rocketmq").schema("commitlog_offset bigint, msg_id string, born_host string").load(str(SAMPLE))
    assert collected(df) == expected(["commitlog_offset", "msg_id", "born_host"])


def test_only_the_columns_of_the_schema_are_decoded() -> None:
    schema = StructType([SCHEMA["topic"], SCHEMA["msg_id"]])
    reader = RocketMQReader({"paths": json.dumps([str(SAMPLE)])}, schema)
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert batches and all(b.schema.names == ["topic", "msg_id"] for b in batches)
    assert sum(b.num_rows for b in batches) == len(expected(["commitlog_offset"]))


@pytest.mark.parametrize("ddl", ["topic string, no_such_field string", "topic string, queue_id string"])
def test_an_unknown_column_or_type_in_a_user_schema_is_an_error_naming_the_known_ones(spark: Any, ddl: str) -> None:
    with pytest.raises(Exception) as caught:
        spark.read.format("rocketmq").schema(ddl).load(str(SAMPLE)).count()
    message = str(caught.value)
    bad = ddl.split(", ")[1].replace(" ", ":")
    assert f"unknown column or type {bad}" in message, message
    assert "known columns:" in message and "msg_id bigint" not in message and "msg_id string" in message, message


def test_include_all_fields_with_a_narrower_user_schema_is_refused() -> None:
    schema = StructType([StructField("topic", StringType(), True)])
    with pytest.raises(ValueError, match="includeAllFields.*schema"):
        RocketMQReader({"path": "/x", "includeallfields": "true"}, schema)
    # With the whole schema it says the same thing twice, which is fine.
    assert RocketMQReader({"path": "/x", "includeallfields": "true"}, SCHEMA).columns == list(COLUMNS)


def test_a_stream_has_the_default_schema_and_takes_include_all_fields(tmp_path: Path) -> None:
    ds = RocketMQDataSource({"path": str(tmp_path), "includeAllFields": "true"})
    assert ds.streamReader(ds.schema()).columns == list(COLUMNS)
    plain = RocketMQDataSource({"path": str(tmp_path)})
    assert plain.streamReader(plain.schema()).columns == KAFKA_LIKE


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
