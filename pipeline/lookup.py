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
from mqstore.pipeline.datasource import SegmentSplit, read_commitlog, read_split
from mqstore.pipeline.segments import Segment, discover_segments, expired_by_retention, header_ok, open_segment
from mqstore.pipeline.session import get_spark
from mqstore.storage.codec import (
    DEFAULT_MAX_MESSAGE_SIZE,
    PHYSICAL_OFFSET_POSITION,
    RecordKind,
    body_crc_mismatch,
    read_record,
)
from mqstore.storage.commitlog import max_record_size
from mqstore.storage.fs import RealFileSystem, UnreadPageError
from mqstore.storage.index import (
    DEFAULT_MAX_HASH_SLOT_NUM,
    INVALID_INDEX,
    IndexFile,
    build_key,
    key_hash_and_slot,
)

LOOKUP_COLUMNS = [
    "commitlog_offset", "size", "topic", "queue_id", "queue_offset", "store_timestamp", "tags", "keys",
    "uniq_key", "msg_id", "segment_file",
]  # fmt: skip
EXIT_CORRUPT = 3  # mqstore's "corrupt data found" (mqstore.cli.ExitCode.CORRUPT)
# What a corrupt record or a damaged index entry is reported by.
CORRUPT_FIELDS = ("commitlog_offset", "size", "segment_file", "error")
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


def _record_bound(segment_size: int) -> int:
    """The largest plausible TOTALSIZE in a segment of this size: what the store's recovery
    reads as one record (a broker may allow messages past 4 MiB; a damaged size is still
    caught by the field lengths and the CRC)."""
    return max_record_size(segment_size, DEFAULT_MAX_MESSAGE_SIZE)


def _crc_failure(buf: Any, pos: int, limit: int, bound: int) -> str:
    """`body_crc_mismatch`, for a record that may be larger than the put limit: its reference
    check (the C kernel declines V2 and IPv6 records) bounds a size by the default
    maxMessageSize, so a record past that is checked again within `bound`."""
    why = body_crc_mismatch(buf, pos, limit)
    if why and int.from_bytes(buf[pos : pos + 4], "big") > DEFAULT_MAX_MESSAGE_SIZE:
        got = read_record(buf, pos, limit, check_crc=True, max_message_size=bound)
        why = "" if got.kind is RecordKind.MESSAGE else got.reason or got.kind.value
    return why


def _damaged_index(seg: Segment, pos: int, key: str, what: str) -> dict[str, Any]:
    offset = (seg.base_offset or 0) + pos
    return {"commitlog_offset": offset, "size": 0, "segment_file": seg.path,
            "error": f"damaged index: an entry for key {key!r} names commitlog offset {offset}, {what}"}  # fmt: skip


def _index_hits(
    seg: Segment, positions: list[int], key: str, schema: Any, bound: int, bad: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The records at `positions` (named by the index) that pass the data source's checks, as
    rows; the others go to `bad`. An index entry is not a walk step: it may point anywhere.
    A segment deleted since the listing holds no hit: by retention, its records expired (the
    broker skips such entries); from anywhere else, each entry is reported (review 53 M1)."""
    try:
        buf = open_segment(seg.path)
    except FileNotFoundError:
        if not expired_by_retention(seg.path):
            bad.extend({"commitlog_offset": (seg.base_offset or 0) + p, "size": 0, "segment_file": seg.path,
                        "error": f"no segment file holds commitlog offset {(seg.base_offset or 0) + p} "
                                 f"({os.path.basename(seg.path)} was deleted after this job listed it, and not "
                                 "as the log's oldest segment: a segment file is missing)"}
                       for p in positions)  # fmt: skip
        return []
    limit = min(seg.file_size, len(buf))
    good: list[int] = []
    for p in positions:
        if not header_ok(buf, p, limit, bound):
            bad.append(_damaged_index(seg, p, key, "where no record starts"))
        elif why := _crc_failure(buf, p, limit, bound):
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
    rows = decode_batch(buf, seg, good, schema, max_message_size=bound).to_pylist()
    bad.extend({c: r[c] for c in CORRUPT_FIELDS} for r in rows if r["error"] is not None)
    return [r for r in rows if r["error"] is None]


def _snapshot_offsets(files: Sequence[IndexFile], counts: Sequence[int], full_key: str) -> list[int]:
    """The commitlog offsets named by the entries of `full_key` (topic#key) that each file held
    when its header was read at the open (`counts`: its index_count then), as the store's
    query walks them (`IndexFile.select_phy_offset`, every time). The files are mapped with
    `follows_owner`: a slot may name an entry the owner wrote since, and the key's chain runs
    from it through its older entries. Those newer entries are passed over, not reported: the
    scan of what follows the headers' last offset reads their records, and one being written
    may be torn. Only the newest file is written to: the others are walked in C."""
    out: list[int] = []
    for f in files[:-1]:
        f.select_phy_offset(full_key, 1 << 30, 0, (1 << 63) - 1, out)
    f, count = files[-1], counts[-1]
    key_hash, slot = key_hash_and_slot(full_key, f.max_hash_slot_num)
    last = f.max_index_num - 1
    n = f.slot_value(slot)
    for _ in range(f.max_index_num):  # bounded: a damaged chain may cycle
        if n <= INVALID_INDEX or n > last:
            break
        e = f.entry(n)
        if e.time_diff < 0:
            break
        if n < count and e.key_hash == key_hash:
            out.append(e.phy_offset)
        if e.prev_index <= INVALID_INDEX or e.prev_index > last or e.prev_index == n:
            break
        n = e.prev_index
    return out


def _starts_record(seg: Segment, pos: int, bound: int) -> bool:
    """Whether a record the walk takes starts at `pos` (the last record the index header names):
    a plausible header whose own physical-offset field says it lies there. A walk is
    memoryless, so one from there reads what the walk from the segment's start reads."""
    if seg.base_offset is None or not 0 <= pos < seg.file_size:
        return False
    try:
        buf = open_segment(seg.path)
    except FileNotFoundError:  # deleted since the listing: the scan from its start says how
        return False
    at = pos + PHYSICAL_OFFSET_POSITION
    if not header_ok(buf, pos, min(seg.file_size, len(buf)), bound):
        return False
    return int.from_bytes(buf[at : at + 8], "big", signed=True) == seg.base_offset + pos


def _split(seg: Segment, start: int, end: int) -> SegmentSplit:
    """Bytes [start, end) of seg, walked from start (a record start, or 0): records starting
    before end are read, as a plan's split reads them. No plan: its walk of the whole log is
    what the index saves."""
    return SegmentSplit(path=seg.path, base_offset=seg.base_offset, file_size=seg.file_size, start=start, end=end)


def _log_topics(segments: Sequence[Segment], lo: int, hi: int, bound: int, bad: list[dict[str, Any]]) -> set[str]:
    """The topics of the records at commitlog offsets [lo, hi]: the index's keys are hashed
    with their topic, so these are the topics to ask it for (a topic whose ConsumeQueue was
    removed keeps its records and index entries). The topic column only (about as cheap as
    the planner's walk); bodies are not CRC-checked here (the hits are, and a body does not
    hide a topic): what goes to `bad` is damage that may hide one."""
    bounds = ReadBounds(commitlog_from=lo, commitlog_until=hi + 1)
    topics: set[str] = set()
    for seg in segments:
        base = seg.base_offset or 0
        if base <= hi and lo < base + seg.file_size:
            # The walk ends after the record at hi; a segment wholly after lo needs no row filter.
            split = _split(seg, 0, min(seg.file_size, hi - base + 1))
            inside = seg.base_offset is not None and lo <= base
            for batch in read_split(split, _TOPIC_COLUMNS, bounds=None if inside else bounds, check_crc=False,
                                    max_message_size=bound):  # fmt: skip
                if batch.column("error").null_count < batch.num_rows:
                    bad.extend({c: r[c] for c in CORRUPT_FIELDS} for r in batch.to_pylist() if r["error"] is not None)
                topics.update(t for t in pc.unique(batch.column("topic")).to_pylist() if t is not None)
    return topics


def _uncovered(
    segments: Sequence[Segment], first_indexed: int, last_indexed: int, bound: int
) -> list[tuple[SegmentSplit, ReadBounds]]:
    """What to scan for the records the index does not cover: after its last entry (from that
    record on when a record starts there, else from its segment's start), and before its first
    one (nothing when that is offset 0, as for every store whose head was not cleaned)."""
    out: list[tuple[SegmentSplit, ReadBounds]] = []
    after = ReadBounds(commitlog_from=last_indexed + 1)
    before = ReadBounds(commitlog_until=first_indexed)
    for seg in segments:
        base = seg.base_offset or 0
        if base < first_indexed:
            out.append((_split(seg, 0, min(seg.file_size, first_indexed - base)), before))
        if last_indexed < base + seg.file_size:
            pos = last_indexed - base
            out.append((_split(seg, pos if _starts_record(seg, pos, bound) else 0, seg.file_size), after))
    return out


def _scan(
    parts: Sequence[tuple[SegmentSplit, ReadBounds]], columns: list[str], bound: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of `parts` read as the data source reads them: (records, corrupt rows)."""
    rows: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for split, bounds in parts:
        for batch in read_split(split, columns, bounds=bounds, max_message_size=bound):
            for r in batch.to_pylist():
                (rows if r["error"] is None else bad).append(r)
    return rows, bad


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
                # follows_owner, as the store's own IndexReader maps a file its owner may be
                # writing: every put of a key moves the key's slot to the new entry, and a
                # reader bounded by the header it read at open skips a slot naming an entry
                # past that count whole, the key's older entries with it.
                files.append(IndexFile.open_readonly(fs, os.path.join(store, "index", n), follows_owner=True))
        except (ValueError, OSError):
            return None
        files = [f for f in files if f.index_count > 1]
        if not files:
            return None
        # The headers as read at the open (never reloaded): what the index answers for.
        # Everything after `last_indexed` is scanned, from segments listed after this point.
        first_indexed, last_indexed = files[0].begin_phy_offset, files[-1].end_phy_offset
        counts = [f.index_count for f in files]
        # Segments after the index headers: a segment an entry names existed before its entry.
        try:
            segments = discover_segments([store])
        except (ValueError, OSError):  # SegmentError too
            return None
        bound = _record_bound(max((s.file_size for s in segments), default=0))
        if topic is not None:
            topics = [topic]
        else:
            topics = sorted(_log_topics(segments, first_indexed, last_indexed, bound, bad))
        named: dict[int, set[str]] = {}  # commitlog offset -> the topics whose key's entries name it
        for t in topics:
            for o in _snapshot_offsets(files, counts, build_key(t, key)):
                named.setdefault(o, set()).add(t)
        unread = next((f for f in files if f.cut_short()), None)
        if unread is not None:
            # The store's guarded maps: a page that could not be read read as empty slots, a
            # key "not found" (review 68 F4). Not an answer: said as the I/O error it is.
            raise UnreadPageError(unread.path, "the lookup answered nothing")
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
        for r in _index_hits(seg, here, key, schema, bound, bad) if here else []:
            if not _matches(r, key, topic) and not _indexed_under(r, key, named[r["commitlog_offset"]]):
                # A good record none of whose keys the entry's hash is: the entry is wrong, and
                # the record it was written for is not found through it.
                bad.append(_damaged_index(seg, r["commitlog_offset"] - base, key, "a record not indexed under it"))
            rows.append(r)
    for o in sorted(set(named) - placed):
        if o >= (segments[0].base_offset or 0):  # below: a segment expired and deleted, as the broker skips
            bad.append({"commitlog_offset": o, "size": 0, "segment_file": None,
                        "error": f"damaged index: an entry for key {key!r} names commitlog offset {o}, which no segment holds"})  # fmt: skip
    uncovered = _uncovered(segments, first_indexed, last_indexed, bound)
    scanned, damage = _scan(uncovered, columns, bound)
    if damage:
        # The scan runs to the end of the log. In a live store it may read the header of the
        # record being written half done (its TOTALSIZE, not yet its MAGIC, which the writer
        # puts last): damage that is gone a moment later. Damage stays where it is: read again,
        # and report only what both reads found.
        again, damage_again = _scan(uncovered, columns, bound)
        first = {(b["segment_file"], b["commitlog_offset"]) for b in damage}
        scanned += again
        damage = [b for b in damage_again if (b["segment_file"], b["commitlog_offset"]) in first]
    rows += scanned
    bad += damage
    # One report per place (the passes overlap: a segment may be read twice), one row per record.
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
