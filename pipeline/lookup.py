"""Find messages by key (UNIQ_KEY or any KEYS token).

    spark-submit pipeline/lookup.py STORE_DIR... --key K [--topic T]
    mqstore spark lookup STORE_DIR... --key K [--topic T] [--scan]

With one store whose index/ files are there (and fit the default max_hash_slot_num), the
index answers, as the broker's queryMessage does, and no Spark starts: the topics are the
store's ConsumeQueue topics (or --topic), each hit is decoded and its keys compared (hash
collisions), and records the index does not cover yet (after its last indexed offset, or
before its first) are scanned. Like the broker, rolled-back transaction records are not
indexed. Otherwise (or with --scan) a Spark scan that decodes topic, properties-derived keys
and the position columns only, never bodies (ask for them with --with-body). One JSON
object per hit.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any, Sequence

import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mqstore.pipeline.args import lookup_args, parser_for
from mqstore.pipeline.bounds import ReadBounds
from mqstore.pipeline.columnar import arrow_schema, decode_batch
from mqstore.pipeline.datasource import plan_splits, read_commitlog, read_split
from mqstore.pipeline.segments import SegmentError, discover_segments, open_segment
from mqstore.pipeline.session import get_spark
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import IndexFile, query_offset_in_files

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


def _matches(row: dict[str, Any], key: str, topic: str | None) -> bool:
    if row.get("error") is not None or (topic is not None and row["topic"] != topic):
        return False
    return bool(row["uniq_key"] == key or key in (row["keys"] or "").split(" "))


def _out_row(row: dict[str, Any], with_body: bool) -> dict[str, Any]:
    d = {c: row[c] for c in LOOKUP_COLUMNS}
    d["store_timestamp"] = int(row["store_timestamp"].timestamp() * 1000) if row["store_timestamp"] is not None else None
    if with_body:
        d["body"] = base64.b64encode(row["body"]).decode("ascii") if row["body"] is not None else None
    return d


def lookup_by_index(
    paths: Sequence[str], key: str, *, topic: str | None = None, with_body: bool = False, limit: int | None = None
) -> list[dict[str, Any]] | None:
    """The hits from the store's index files plus a scan of what they do not cover; None when
    the index cannot answer (not one store dir, no index files, a size that does not fit)."""
    if len(paths) != 1 or not os.path.isdir(os.path.join(paths[0], "index")):
        return None
    store = paths[0]
    fs = RealFileSystem()
    names = sorted(n for n in os.listdir(os.path.join(store, "index")) if n.isdigit())
    try:
        segments = discover_segments([store])
        files = [IndexFile.open_readonly(fs, os.path.join(store, "index", n)) for n in names]
    except (ValueError, OSError, SegmentError):
        return None
    try:
        files = [f for f in files if f.index_count > 1]
        if not files or not segments:
            return None
        first_indexed, last_indexed = files[0].begin_phy_offset, files[-1].end_phy_offset
        cq_root = os.path.join(store, "consumequeue")
        topics = [topic] if topic is not None else sorted(os.listdir(cq_root)) if os.path.isdir(cq_root) else []
        offsets: set[int] = set()
        for t in topics:
            offsets.update(query_offset_in_files(files, t, key, 1 << 30, 0, (1 << 63) - 1).phy_offsets)
    finally:
        for f in files:
            f.close()
    columns = LOOKUP_COLUMNS + ["error"] + (["body"] if with_body else [])
    schema = arrow_schema(columns)
    rows: list[dict[str, Any]] = []
    for seg in segments:
        base = seg.base_offset or 0
        here = sorted(o - base for o in offsets if base <= o < base + seg.file_size)
        if here:
            rows.extend(decode_batch(open_segment(seg.path), seg, here, schema).to_pylist())
    # What the index does not cover: before its first entry and after its last one.
    uncovered = ReadBounds(commitlog_until=first_indexed), ReadBounds(commitlog_from=last_indexed + 1)
    for split in plan_splits([store], 64 << 20, 4 << 20):
        lo, hi = (split.base_offset or 0) + split.start, (split.base_offset or 0) + split.end
        for bounds in uncovered:
            if (bounds.commitlog_from or 0) < hi and lo < (bounds.commitlog_until or (1 << 63)):
                for batch in read_split(split, columns, bounds=bounds):
                    rows.extend(batch.to_pylist())
    hits = sorted((r for r in rows if _matches(r, key, topic)), key=lambda r: (r["segment_file"], r["commitlog_offset"]))
    out = [_out_row(r, with_body) for r in hits]
    return out[:limit] if limit is not None else out


def build_parser() -> argparse.ArgumentParser:
    return parser_for("lookup", __doc__, lookup_args)


def run(args: argparse.Namespace) -> int:
    hits = None
    if not args.scan:
        hits = lookup_by_index(args.paths, args.key, topic=args.topic, with_body=args.with_body, limit=args.limit)
    if hits is None:
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
