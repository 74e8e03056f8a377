"""Per topic and queue: messages, bytes, first/last store time and a per-hour histogram.

    spark-submit pipeline/stats.py STORE_DIR... [--out FILE]
    mqstore spark stats STORE_DIR... [--master URL]

One pass over the commitlog, decoding only topic, queue_id, size and store_timestamp (plus
the error column): hourly buckets are aggregated in Spark and rolled up on the driver, since
counts, sums, minima and maxima compose. Hours are UTC.
Times in the JSON are ISO-8601 UTC with milliseconds; `*_ms` fields carry the epoch ms.

On a running store, the cleaner may delete the oldest segments while the job runs: those
the store's retention expired after the job listed them are skipped and counted in
`expired_segments` (the messages of its splits read before it went are counted too: the
job is no snapshot); a segment deleted from anywhere else is a hole, counted in
`corrupt_records`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mqstore.cli import CliError, ExitCode
from mqstore.log import get_logger
from mqstore.pipeline.args import stats_args, parser_for
from mqstore.pipeline.datasource import read_commitlog
from mqstore.pipeline.outputs import refuse_foreign_file, refuse_overlap, refuse_store_around
from mqstore.pipeline.session import get_spark

log = get_logger(__name__)

STATS_COLUMNS = ["topic", "queue_id", "size", "store_timestamp", "segment_file", "commitlog_offset", "error"]
MAX_CORRUPT_LISTED = 100  # per distinct reason; the count is always exact
STATS_OUTPUT_HEAD = b'{\n  "paths": ['  # how every --out file this job writes begins (run: indent=2)


def _iso(ms: int | None) -> str | None:
    """Epoch ms as ISO-8601 UTC. Spark hands back naive datetimes in the *Python* process's
    zone, so the job moves epoch milliseconds instead of datetimes."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def compute_stats(
    spark: SparkSession, paths: Sequence[str], *, split_size: str | None = None, strict: bool = False
) -> dict[str, Any]:
    # markExpired: a split whose segment retention deleted before its task read it is one row
    # with null topic and error (review 53 M1), counted here, never a failed job.
    df = read_commitlog(spark, paths, columns=STATS_COLUMNS, split_size=split_size, strict=strict,
                        options={"markExpired": "true"})  # fmt: skip
    return summarize(df, paths)


def summarize(df: DataFrame, paths: Sequence[str]) -> dict[str, Any]:
    """The stats of the rows of `df` (the STATS_COLUMNS, expired splits marked)."""
    expired = F.col("topic").isNull() & F.col("error").isNull()
    hourly = (
        df.groupBy("topic", "queue_id", F.unix_millis(F.date_trunc("hour", "store_timestamp")).alias("hour"), "error")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("size").alias("bytes"),
            F.unix_millis(F.min("store_timestamp")).alias("first"),
            F.unix_millis(F.max("store_timestamp")).alias("last"),
            # only corrupt rows have a non-null struct; collect_list skips nulls
            F.slice(
                F.collect_list(F.when(F.col("error").isNotNull(), F.struct("segment_file", "commitlog_offset", "size"))),
                1,
                MAX_CORRUPT_LISTED,
            ).alias("where"),
            F.collect_set(F.when(expired, F.col("segment_file"))).alias("expired"),
        )
        .collect()
    )
    queues: dict[tuple[str, int], dict[str, Any]] = {}
    corrupt_count = 0
    corrupt_bytes = 0
    corrupt: list[dict[str, Any]] = []
    expired_segments: set[str] = set()
    for row in hourly:
        if row["error"] is None and row["topic"] is None:  # only expired splits' markers
            expired_segments.update(row["expired"])
            continue
        if row["error"] is not None:
            corrupt_count += row["messages"]
            corrupt_bytes += row["bytes"] or 0
            corrupt.extend({"reason": row["error"], **w.asDict()} for w in row["where"])
            continue
        q = queues.setdefault(
            (row["topic"], row["queue_id"]),
            {"topic": row["topic"], "queue_id": row["queue_id"], "messages": 0, "bytes": 0, "first": None, "last": None, "hourly": {}},
        )
        q["messages"] += row["messages"]
        q["bytes"] += row["bytes"]
        q["first"] = row["first"] if q["first"] is None else min(q["first"], row["first"])
        q["last"] = row["last"] if q["last"] is None else max(q["last"], row["last"])
        q["hourly"][_iso(row["hour"])] = row["messages"]
    out_queues = []
    for key in sorted(queues):
        q = queues[key]
        out_queues.append(
            {
                "topic": q["topic"],
                "queue_id": q["queue_id"],
                "messages": q["messages"],
                "bytes": q["bytes"],
                "first_store_time": _iso(q["first"]),
                "last_store_time": _iso(q["last"]),
                "first_store_time_ms": q["first"],
                "last_store_time_ms": q["last"],
                "hourly": dict(sorted(q["hourly"].items())),
            }
        )
    corrupt.sort(key=lambda c: (c["segment_file"], c["commitlog_offset"]))
    return {
        "paths": list(paths),
        "messages": sum(q["messages"] for q in out_queues),
        "bytes": sum(q["bytes"] for q in out_queues),
        "queues": out_queues,
        "corrupt_records": corrupt_count,
        "corrupt_bytes": corrupt_bytes,
        "corrupt": corrupt,
        "expired_segments": len(expired_segments),
    }


def build_parser() -> argparse.ArgumentParser:
    return parser_for("stats", __doc__, stats_args)


def _stores_of(paths: Sequence[str]) -> list[str]:
    """The inputs (globs expanded) and the store directories they lie in: a commitlog
    directory's parent, a segment's store (its commitlog directory's parent)."""
    found: list[str] = []
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]:
            real = os.path.realpath(path)
            found.append(real)
            parent = real if os.path.isdir(real) else os.path.dirname(real)
            if os.path.basename(parent) == "commitlog":
                found.append(os.path.dirname(parent))
    return found


def _earlier_stats(head: bytes) -> bool:
    """Whether a file starting with `head` is what `write_out` wrote: json.dumps(indent=2)
    of `summarize`'s dict, whose first key is "paths"."""
    return head.startswith(STATS_OUTPUT_HEAD)


def check_out(out: str, paths: Sequence[str]) -> None:
    """CliError (exit 2) when --out would write over a store's own file (STORE/checkpoint, a
    segment) or into an input store: the result replaces whatever is there. Any store is
    kept out, not only the inputs', and known by its own files (a root whose commitlog lives
    elsewhere too, review 63 F1): its checkpoint or a segment replaced by JSON loses what it
    recorded, and a file of ours in its directories is in its owner's way. An existing file
    is replaced only when it is an earlier stats output."""
    refuse_overlap(out, _stores_of(paths), "--out")
    refuse_store_around(out, "--out")
    refuse_foreign_file(out, "--out", _earlier_stats, "stats output")
    try:
        links = os.stat(out).st_nlink
    except OSError:
        return  # a new file
    if links > 1:  # another name of the same file, maybe a store's own (STORE/checkpoint)
        raise CliError(ExitCode.USAGE, f"--out {out} is a file with {links} names (hard links), one of which may be "
                       "a store's own file; give another file")  # fmt: skip


def write_out(out: str, text: str) -> None:
    """Write text to `out` without touching the file that was there: a new file (O_EXCL) beside
    it, renamed over it. A hard link to a store's file made after `check_out` then keeps the
    store's bytes; `out` through a symbolic link is written where the link points."""
    target = os.path.realpath(out)
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_out(args.out, args.paths)  # before the job: a refusal costs no Spark start-up
    spark = get_spark(args.master, app_name="mqstore-stats")
    result = compute_stats(spark, args.paths, split_size=args.split_size, strict=args.strict)
    text = json.dumps(result, indent=2, sort_keys=False)
    if args.out:
        write_out(args.out, text + "\n")
    else:
        sys.stdout.write(text + "\n")
    log.info("stats done", messages=result["messages"], corrupt=result["corrupt_records"])
    return 3 if result["corrupt_records"] else 0  # 3 = mqstore's "corrupt data found"


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except CliError as exc:  # spark-submit: a refusal is a line and an exit code, as in `mqstore spark`
        sys.stderr.write(f"stats: {exc.message}\n")
        return int(exc.code)


if __name__ == "__main__":
    sys.exit(main())
