"""Find messages by key (UNIQ_KEY or any KEYS token) in segments that have no index.

    spark-submit pipeline/lookup.py STORE_DIR... --key K [--topic T]
    mqstore spark lookup STORE_DIR... --key K [--topic T]

A scan, not an index query: it decodes topic, properties-derived keys and the position
columns only, never bodies (ask for them with --with-body). One JSON object per hit.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any, Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mqstore.pipeline.args import lookup_args, parser_for
from mqstore.pipeline.datasource import read_commitlog
from mqstore.pipeline.session import get_spark

LOOKUP_COLUMNS = [
    "commitlog_offset", "size", "topic", "queue_id", "queue_offset", "store_timestamp", "tags", "keys",
    "uniq_key", "msg_id", "segment_file",
]  # fmt: skip


def lookup(
    spark: SparkSession,
    paths: Sequence[str],
    key: str,
    *,
    topic: str | None = None,
    with_body: bool = False,
    split_size: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    columns = LOOKUP_COLUMNS + (["body"] if with_body else [])
    # With a topic, the reader decodes other topics' records no further than their topic.
    df = read_commitlog(spark, paths, columns=columns, split_size=split_size, topics=[topic] if topic else None)
    # KEYS is split like Java's String.split(" "): a token equal to the key matches (§10.8).
    hit = (F.col("uniq_key") == key) | F.array_contains(F.split(F.coalesce(F.col("keys"), F.lit("")), " "), key)
    if topic is not None:
        hit = hit & (F.col("topic") == topic)
    rows = df.where(hit).withColumn("store_timestamp", F.unix_millis("store_timestamp"))  # epoch ms: zone-free
    if limit is not None:
        rows = rows.limit(limit)
    out = []
    # Hits are few: sort on the driver rather than pay a distributed sort's sampling job.
    for r in sorted(rows.collect(), key=lambda r: (r["segment_file"], r["commitlog_offset"])):
        d = r.asDict()
        if with_body:
            d["body"] = base64.b64encode(d["body"]).decode("ascii") if d["body"] is not None else None
        out.append(d)
    return out


def build_parser() -> argparse.ArgumentParser:
    return parser_for("lookup", __doc__, lookup_args)


def run(args: argparse.Namespace) -> int:
    spark = get_spark(args.master, app_name="mqstore-lookup")
    hits = lookup(spark, args.paths, args.key, topic=args.topic, with_body=args.with_body,
                  split_size=args.split_size, limit=args.limit)  # fmt: skip
    for h in hits:
        sys.stdout.write(json.dumps(h) + "\n")
    return 0 if hits else 1


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
