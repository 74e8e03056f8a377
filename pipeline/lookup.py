"""Find messages by key (UNIQ_KEY or any KEYS token).

    spark-submit pipeline/lookup.py STORE_DIR... --key K [--topic T]
    mqstore spark lookup STORE_DIR... --key K [--topic T] [--scan]

With one store whose index/ files are there (and fit the default max_hash_slot_num), the
index answers, as the broker's queryMessage does, and no Spark starts: the topics are --topic,
or those of the records the index covers (the log's topic column, no bodies: a topic whose
ConsumeQueue was removed is still searched), each hit is checked as the data source checks a
record (header, body CRC, physical-offset field), decoded and its keys compared (hash
collisions), and records the index does not cover yet (after its last indexed offset, or
before its first) are scanned. Like the broker, rolled-back transaction records are not
indexed. Otherwise (or with --scan) a Spark scan that decodes topic, properties-derived keys
and the position columns only, never bodies (ask for them with --with-body). One JSON
object per hit.

A corrupt record met in the ranges read (it may be the one sought: its keys cannot be
trusted), or an index entry that names no record of its key, is never a hit: it is reported
on stderr and the exit code is 3 ("corrupt data found"), hits or not; 1 is "not found".
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any, Sequence

import os

import numpy as np
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mqstore.pipeline.args import lookup_args, parser_for
from mqstore.pipeline.bounds import ReadBounds
from mqstore.pipeline.columnar import _be64, arrow_schema, decode_batch
from mqstore.pipeline.datasource import SegmentSplit, plan_splits, read_commitlog, read_split
from mqstore.pipeline.segments import Segment, discover_segments, header_ok, open_segment
from mqstore.pipeline.session import get_spark
from mqstore.storage.codec import PHYSICAL_OFFSET_POSITION, body_crc_mismatch
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import (
    DEFAULT_MAX_HASH_SLOT_NUM,
    IndexFile,
    build_key,
    key_hash_and_slot,
    query_offset_in_files,
)

LOOKUP_COLUMNS = [
    "commitlog_offset", "size", "topic", "queue_id", "queue_offset", "store_timestamp", "tags", "keys",
    "uniq_key", "msg_id", "segment_file",
]  # fmt: skip
EXIT_CORRUPT = 3  # mqstore's "corrupt data found" (mqstore.cli.ExitCode.CORRUPT)
# What a corrupt record or a damaged index entry is reported by.
CORRUPT_FIELDS = ("commitlog_offset", "size", "segment_file", "error")
_MAX_MESSAGE_SIZE = 4 << 20  # the planner's bound on a plausible TOTALSIZE (RocketMQ's maxMessageSize)
_TOPIC_COLUMNS = ["commitlog_offset", "size", "topic", "segment_file", "error"]


def lookup(
    spark: SparkSession,
    paths: Sequence[str],
    key: str,
    *,
    topic: str | None = None,
    with_body: bool = False,
    split_size: str | None = None,
    limit: int | None = None,
    strict: bool = False,
    corrupt: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The hits of a Spark scan; the corrupt records it met are appended to `corrupt`."""
    columns = LOOKUP_COLUMNS + ["error"] + (["body"] if with_body else [])
    # With a topic, the reader decodes other topics' records no further than their topic.
    df = read_commitlog(spark, paths, columns=columns, split_size=split_size, topics=[topic] if topic else None,
                        strict=strict)  # fmt: skip
    # KEYS is split like Java's String.split(" "): a token equal to the key matches (§10.8).
    hit = (F.col("uniq_key") == key) | F.array_contains(F.split(F.coalesce(F.col("keys"), F.lit("")), " "), key)
    if topic is not None:
        hit = hit & (F.col("topic") == topic)
    # A corrupt row has null keys, so the key filter alone would drop it and a damaged record
    # of this key would read as "not found": keep those rows, to report them.
    rows = df.where(hit | F.col("error").isNotNull()).withColumn("store_timestamp", F.unix_millis("store_timestamp"))
    out = []
    # Hits are few: sort on the driver rather than pay a distributed sort's sampling job; the
    # limit applies to hits (a Spark-side limit would count the corrupt rows too).
    for r in sorted(rows.collect(), key=lambda r: (r["segment_file"], r["commitlog_offset"])):
        d = r.asDict()
        if d["error"] is not None:
            if corrupt is not None:
                corrupt.append({c: d[c] for c in CORRUPT_FIELDS})
            continue
        del d["error"]
        if with_body:
            d["body"] = base64.b64encode(d["body"]).decode("ascii") if d["body"] is not None else None
        out.append(d)
    return out[:limit] if limit is not None else out


def _matches(row: dict[str, Any], key: str, topic: str | None) -> bool:
    if row.get("error") is not None or (topic is not None and row["topic"] != topic):
        return False
    return bool(row["uniq_key"] == key or key in (row["keys"] or "").split(" "))


def _indexed_under(row: dict[str, Any], key: str, topics: set[str]) -> bool:
    """Whether one of the record's index keys hashes as `key` does under one of `topics`: an
    index entry naming the record is then a hash collision, not damage."""
    wanted = {key_hash_and_slot(build_key(t, key), DEFAULT_MAX_HASH_SLOT_NUM)[0] for t in topics}
    own = [row["uniq_key"], *(row["keys"] or "").split(" ")]
    return any(key_hash_and_slot(build_key(row["topic"], k), DEFAULT_MAX_HASH_SLOT_NUM)[0] in wanted for k in own if k)


def _out_row(row: dict[str, Any], with_body: bool) -> dict[str, Any]:
    d = {c: row[c] for c in LOOKUP_COLUMNS}
    d["store_timestamp"] = int(row["store_timestamp"].timestamp() * 1000) if row["store_timestamp"] is not None else None
    if with_body:
        d["body"] = base64.b64encode(row["body"]).decode("ascii") if row["body"] is not None else None
    return d


def _damaged_index(seg: Segment, pos: int, key: str, what: str) -> dict[str, Any]:
    offset = (seg.base_offset or 0) + pos
    return {"commitlog_offset": offset, "size": 0, "segment_file": seg.path,
            "error": f"damaged index: an entry for key {key!r} names commitlog offset {offset}, {what}"}  # fmt: skip


def _index_hits(
    seg: Segment, positions: list[int], key: str, schema: Any, bad: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The records at `positions` (named by the index) that pass the data source's checks, as
    rows; the others go to `bad`. An index entry is not a walk step: it may point anywhere."""
    buf = open_segment(seg.path)
    limit = min(seg.file_size, len(buf))
    good: list[int] = []
    for p in positions:
        if not header_ok(buf, p, limit, _MAX_MESSAGE_SIZE):
            bad.append(_damaged_index(seg, p, key, "where no record starts"))
        elif why := body_crc_mismatch(buf, p, limit):
            bad.append({"commitlog_offset": (seg.base_offset or 0) + p, "size": int.from_bytes(buf[p : p + 4], "big"),
                        "segment_file": seg.path, "error": why})  # fmt: skip
        else:
            good.append(p)
    if seg.base_offset is not None and good:
        # Recovery's other check (the CRC covers the body only), as read_split applies it.
        phys = _be64(np.frombuffer(buf, dtype=np.uint8), np.asarray(good, dtype=np.int64) + PHYSICAL_OFFSET_POSITION)
        lying = {p: int(v) for p, v in zip(good, phys.tolist()) if v != seg.base_offset + p}
        for p, v in lying.items():
            bad.append({"commitlog_offset": seg.base_offset + p, "size": int.from_bytes(buf[p : p + 4], "big"),
                        "segment_file": seg.path, "error": f"record says it is at commitlog offset {v}"})  # fmt: skip
        good = [p for p in good if p not in lying]
    if not good:
        return []
    rows = decode_batch(buf, seg, good, schema).to_pylist()
    bad.extend({c: r[c] for c in CORRUPT_FIELDS} for r in rows if r["error"] is not None)
    return [r for r in rows if r["error"] is None]


def _log_topics(splits: Sequence[SegmentSplit], lo: int, hi: int, bad: list[dict[str, Any]]) -> set[str]:
    """The topics of the records at commitlog offsets [lo, hi]: the index's keys are hashed
    with their topic, so these are the topics to ask it for (a topic whose ConsumeQueue was
    removed keeps its records and index entries). The topic column only (about as cheap as
    the planner's walk); bodies are not CRC-checked here (the hits are, and a body does not
    hide a topic): what goes to `bad` is damage that may hide one."""
    bounds = ReadBounds(commitlog_from=lo, commitlog_until=hi + 1)
    topics: set[str] = set()
    for split in splits:
        base = split.base_offset or 0
        if base + split.start <= hi and lo < base + split.end:
            for batch in read_split(split, _TOPIC_COLUMNS, bounds=bounds, check_crc=False):
                if batch.column("error").null_count < batch.num_rows:
                    bad.extend({c: r[c] for c in CORRUPT_FIELDS} for r in batch.to_pylist() if r["error"] is not None)
                topics.update(t for t in pc.unique(batch.column("topic")).to_pylist() if t is not None)
    return topics


def lookup_by_index(
    paths: Sequence[str],
    key: str,
    *,
    topic: str | None = None,
    with_body: bool = False,
    limit: int | None = None,
    corrupt: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """The hits from the store's index files plus a scan of what they do not cover; None when
    the index cannot answer (not one store dir, no index files, a size that does not fit).
    Corrupt records met in the ranges read, and index entries naming no record of the key,
    are appended to `corrupt` (one per commitlog offset), never returned as hits."""
    if len(paths) != 1 or not os.path.isdir(os.path.join(paths[0], "index")):
        return None
    store = paths[0]
    fs = RealFileSystem()
    names = sorted(n for n in os.listdir(os.path.join(store, "index")) if n.isdigit())
    files: list[IndexFile] = []
    bad: list[dict[str, Any]] = []
    try:
        try:
            for n in names:
                files.append(IndexFile.open_readonly(fs, os.path.join(store, "index", n)))
        except (ValueError, OSError):
            return None
        files = [f for f in files if f.index_count > 1]
        if not files:
            return None
        first_indexed, last_indexed = files[0].begin_phy_offset, files[-1].end_phy_offset
        # Segments after the index headers: a segment an entry names existed before its entry.
        try:
            segments = discover_segments([store])
            splits = plan_splits([store], 64 << 20, _MAX_MESSAGE_SIZE)
        except (ValueError, OSError):  # SegmentError too
            return None
        topics = [topic] if topic is not None else sorted(_log_topics(splits, first_indexed, last_indexed, bad))
        named: dict[int, set[str]] = {}  # commitlog offset -> the topics whose key's entries name it
        for t in topics:
            for o in query_offset_in_files(files, t, key, 1 << 30, 0, (1 << 63) - 1).phy_offsets:
                named.setdefault(o, set()).add(t)
    finally:
        for f in files:
            f.close()
    columns = LOOKUP_COLUMNS + ["error"] + (["body"] if with_body else [])
    schema = arrow_schema(columns)
    rows: list[dict[str, Any]] = []
    placed: set[int] = set()
    for seg in segments:
        base = seg.base_offset or 0
        here = sorted(o - base for o in named if base <= o < base + seg.file_size)
        placed.update(base + p for p in here)
        for r in _index_hits(seg, here, key, schema, bad) if here else []:
            if not _matches(r, key, topic) and not _indexed_under(r, key, named[r["commitlog_offset"]]):
                # A good record none of whose keys the entry's hash is: the entry is wrong, and
                # the record it was written for is not found through it.
                bad.append(_damaged_index(seg, r["commitlog_offset"] - base, key, "a record not indexed under it"))
            rows.append(r)
    for o in sorted(set(named) - placed):
        if o >= (segments[0].base_offset or 0):  # below: a segment expired and deleted, as the broker skips
            bad.append({"commitlog_offset": o, "size": 0, "segment_file": None,
                        "error": f"damaged index: an entry for key {key!r} names commitlog offset {o}, which no segment holds"})  # fmt: skip
    # What the index does not cover: before its first entry and after its last one.
    uncovered = ReadBounds(commitlog_until=first_indexed), ReadBounds(commitlog_from=last_indexed + 1)
    for split in splits:
        lo, hi = (split.base_offset or 0) + split.start, (split.base_offset or 0) + split.end
        for bounds in uncovered:
            if (bounds.commitlog_from or 0) < hi and lo < (bounds.commitlog_until or (1 << 63)):
                for batch in read_split(split, columns, bounds=bounds):
                    for r in batch.to_pylist():
                        (rows if r["error"] is None else bad).append(r)
    # One report per place (the passes overlap: a split is read whole), one row per record.
    seen: dict[tuple[str | None, int], dict[str, Any]] = {}
    for b in bad:
        seen.setdefault((b["segment_file"], b["commitlog_offset"]), {c: b[c] for c in CORRUPT_FIELDS})
    if corrupt is not None:
        corrupt.extend(sorted(seen.values(), key=lambda b: b["commitlog_offset"]))
    unique = {(r["segment_file"], r["commitlog_offset"]): r for r in rows}
    hits = sorted((r for r in unique.values() if _matches(r, key, topic)), key=lambda r: (r["segment_file"], r["commitlog_offset"]))
    out = [_out_row(r, with_body) for r in hits]
    return out[:limit] if limit is not None else out


def build_parser() -> argparse.ArgumentParser:
    return parser_for("lookup", __doc__, lookup_args)


def _report(c: dict[str, Any]) -> str:
    where = f" in {c['segment_file']}" if c["segment_file"] else ""
    return f"lookup: corrupt data{where} at commitlog offset {c['commitlog_offset']}: {c['error']}\n"


def run(args: argparse.Namespace) -> int:
    """Exit 0: hits; 1: not found; 3: corrupt data met (hits or not: the answer may lack one)."""
    corrupt: list[dict[str, Any]] = []
    hits = None
    if not args.scan:
        hits = lookup_by_index(args.paths, args.key, topic=args.topic, with_body=args.with_body, limit=args.limit,
                               corrupt=corrupt)  # fmt: skip
    if hits is None:
        spark = get_spark(args.master, app_name="mqstore-lookup")
        hits = lookup(spark, args.paths, args.key, topic=args.topic, with_body=args.with_body,
                      split_size=args.split_size, limit=args.limit, strict=args.strict, corrupt=corrupt)  # fmt: skip
    if corrupt and args.strict:
        sys.stderr.write(_report(corrupt[0]))  # --strict: fail at the first, print no hits
        return EXIT_CORRUPT
    for h in hits:
        sys.stdout.write(json.dumps(h) + "\n")
    for c in corrupt:
        sys.stderr.write(_report(c))
    if corrupt:
        sys.stderr.write(f"lookup: {len(corrupt)} corrupt record(s) or damaged index entries met; "
                         "a hit may be missing (exit 3)\n")  # fmt: skip
        return EXIT_CORRUPT
    return 0 if hits else 1


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
