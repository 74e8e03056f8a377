"""Spark pipeline bench: stats and export over a generated commitlog, against plain Python.

    /work/venv/bin/python bench/bench_spark.py --size-mb 1024 [--master local[*]] [--json out.json]

Generates a commitlog of ~1 KiB messages (RocketMQ layout: 1 GiB segments by default, an
END_OF_FILE blank at the end of each full segment, the last one preallocated), then times:
  python-codec    one process, `codec.read_record` per record (full decode, bodies read)
  python-arrow    one process, the pipeline's columnar decoder (all columns), no Spark
  spark-stats     `mqstore spark stats` (topic, queue_id, size, store_timestamp only)
  spark-export    `mqstore spark export` (all columns to snappy Parquet)
  rocketmq-*      format("rocketmq") with the default schema: count(), groupBy(topic).count(),
                  sum(length(body)) (issue 17's goal: >= 250 MB/s on 2 cores)
  binaryfile-*    floor: Spark's binaryFile scan of the same segment files, sum(length(content))
  parquet-*       floor: the same three queries over the Parquet `export` wrote
The report gives each rocketmq query's ratio to the two same-run floors.
MB/s is commitlog bytes (records only, not the preallocated tail) per wall-clock second.
Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from mqstore.storage.codec import (
    HostAddress,
    RecordKind,
    blank_record_header,
    encode_message,
    patch_record,
    properties_to_string,
    read_record,
    segment_file_name,
)

TOPICS = ["orders", "payments", "audit-log", "clicks"]
QUEUES = 4


def generate(store: str, size_mb: int, segment_mb: int, msg_size: int) -> tuple[int, int]:
    """Write the commitlog; returns (messages, record bytes)."""
    clog = os.path.join(store, "commitlog")
    os.makedirs(clog, exist_ok=True)
    seg_size = segment_mb << 20
    target = size_mb << 20
    born, host = HostAddress("10.0.0.7", 54321), HostAddress("192.168.1.10", 10911)
    templates = []
    for t in TOPICS:
        for q in range(QUEUES):
            props = properties_to_string({"TAGS": f"Tag{q}", "KEYS": "k1 k2", "UNIQ_KEY": "0" * 32, "WAIT": "true"})
            probe = encode_message(topic=t, queue_id=q, body=b"", properties=props, born_host=born, store_host=host)
            body = os.urandom(max(msg_size - len(probe), 0))
            templates.append((t, q, encode_message(topic=t, queue_id=q, body=body, properties=props, born_timestamp=1,
                                                   born_host=born, store_host=host)))  # fmt: skip
    counters = [0] * len(templates)
    seg_start, pos, written, n = 0, 0, 0, 0
    buf = bytearray(seg_size)
    t0 = 1_700_000_000_000
    while written < target:
        k = n % len(templates)
        rec = templates[k][2]
        if len(rec) + 8 > seg_size - pos:
            buf[pos : pos + 8] = blank_record_header(seg_size - pos)
            with open(os.path.join(clog, segment_file_name(seg_start)), "wb") as f:
                f.write(buf)
            seg_start, pos = seg_start + seg_size, 0
            buf = bytearray(seg_size)
        buf[pos : pos + len(rec)] = rec
        patch_record(buf, pos, queue_offset=counters[k], commitlog_offset=seg_start + pos, store_timestamp=t0 + n)
        counters[k] += 1
        pos += len(rec)
        written += len(rec)
        n += 1
    # The active segment is preallocated full size but sparse, as a broker creates it.
    with open(os.path.join(clog, segment_file_name(seg_start)), "wb") as f:
        f.write(memoryview(buf)[:pos])
        f.truncate(seg_size)
    return n, written


def python_codec(store: str) -> int:
    from mqstore.pipeline.segments import discover_segments, open_segment

    rows = 0
    for seg in discover_segments([store]):
        buf = open_segment(seg.path)
        pos = 0
        while True:
            got = read_record(buf, pos, read_body=True)
            if got.kind is not RecordKind.MESSAGE:
                break
            rows += 1
            pos += got.size
    return rows


def python_arrow(store: str) -> int:
    from mqstore.pipeline.columnar import COLUMNS
    from mqstore.pipeline.datasource import plan_splits, read_split

    rows = 0
    for split in plan_splits([store], 64 << 20, 4 << 20):
        for batch in read_split(split, list(COLUMNS)):
            rows += batch.num_rows
    return rows


def timed(name: str, fn: Callable[[], Any], nbytes: int, rows: int, results: list[dict[str, Any]]) -> Any:
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    results.append({"name": name, "seconds": round(dt, 3), "rows_per_s": round(rows / dt), "mb_per_s": round(nbytes / dt / 1e6, 1)})
    print(f"  {name:<14} {dt:8.2f} s {rows / dt:12,.0f} rows/s {nbytes / dt / 1e6:9.1f} MB/s", file=sys.stderr)
    return out


def query_floors(spark: Any, store: str, parquet: str, nbytes: int, rows: int, split_size: str,
                 results: list[dict[str, Any]]) -> None:  # fmt: skip
    """Issue 17's three queries on the default schema, beside binaryFile and Parquet floors."""
    from pyspark.sql import functions as F

    from mqstore.pipeline.datasource import read_commitlog
    from mqstore.pipeline.export import export

    if not os.path.isdir(parquet):
        export(spark, [store], parquet, split_size=split_size)
    queries: dict[str, Callable[[Any], Any]] = {
        "count": lambda df: df.count(),
        "groupby": lambda df: df.groupBy("topic").count().collect(),
        "sumbody": lambda df: df.select(F.sum(F.length("body"))).collect()[0][0],
    }
    sources: dict[str, Callable[[], Any]] = {
        "rocketmq": lambda: read_commitlog(spark, [store], split_size=split_size),
        "parquet": lambda: spark.read.parquet(parquet),
    }
    for src, make in sources.items():
        for q, run in queries.items():
            timed(f"{src}-{q}", lambda: run(make()), nbytes, rows, results)
    clog = os.path.join(store, "commitlog")
    timed("binaryfile-sum", lambda: spark.read.format("binaryFile").load(clog)
          .select(F.sum(F.length("content"))).collect()[0][0], nbytes, rows, results)  # fmt: skip
    by_name = {r["name"]: r for r in results}
    for q in queries:
        ours = by_name[f"rocketmq-{q}"]
        ours["vs_parquet"] = round(by_name[f"parquet-{q}"]["seconds"] / ours["seconds"], 2)
        ours["vs_binaryfile"] = round(by_name["binaryfile-sum"]["seconds"] / ours["seconds"], 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--segment-mb", type=int, default=1024)
    p.add_argument("--msg-size", type=int, default=1024, help="bytes per record")
    p.add_argument("--master", default=None)
    p.add_argument("--split-size", default="64m")
    p.add_argument("--dir", default=None, help="work dir (default: a temp dir, removed after)")
    p.add_argument("--json", default="bench_spark.json", help="where to write the results")
    p.add_argument("--repeat", type=int, default=2, help="timed runs of each Spark job")
    p.add_argument("--skip", default="", help="comma list of steps to skip (python-codec, ...)")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    work = args.dir or tempfile.mkdtemp(prefix="mqstore-bench-spark-")
    store = os.path.join(work, "store")
    try:
        t = time.perf_counter()
        rows, nbytes = generate(store, args.size_mb, args.segment_mb, args.msg_size)
        print(f"generated {rows:,} records, {nbytes / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        results: list[dict[str, Any]] = []
        if "python-codec" not in skip:
            assert timed("python-codec", lambda: python_codec(store), nbytes, rows, results) == rows
        if "python-arrow" not in skip:
            assert timed("python-arrow", lambda: python_arrow(store), nbytes, rows, results) == rows

        from mqstore.pipeline.export import export
        from mqstore.pipeline.session import get_spark
        from mqstore.pipeline.stats import compute_stats

        spark = get_spark(args.master, app_name="mqstore-bench", progress=False)
        cores = spark.sparkContext.defaultParallelism
        # Warm-up: one task per core over the first MB, so JVM start-up and the Python
        # workers' imports are not counted as throughput. The first timed run is still
        # reported separately ("#1"): it is what a one-shot spark-submit sees.
        warm = os.path.join(work, "warm")
        generate(warm, 1, 1, args.msg_size)
        compute_stats(spark, [warm], split_size="64k")
        for i in range(1, args.repeat + 1):
            if "spark-stats" not in skip:
                stats = timed(f"spark-stats#{i}", lambda: compute_stats(spark, [store], split_size=args.split_size),
                              nbytes, rows, results)  # fmt: skip
                assert stats["messages"] == rows, (stats["messages"], rows)
            if "spark-export" not in skip:
                out = os.path.join(work, "parquet")
                timed(f"spark-export#{i}", lambda: export(spark, [store], out, split_size=args.split_size), nbytes, rows,
                      results)  # fmt: skip
        if "queries" not in skip:
            query_floors(spark, store, os.path.join(work, "parquet"), nbytes, rows, args.split_size, results)
        spark.stop()
        report = {"size_mb": args.size_mb, "records": rows, "record_bytes": nbytes, "msg_size": args.msg_size,
                  "segment_mb": args.segment_mb, "split_size": args.split_size, "spark_cores": cores,
                  "cpu_count": os.cpu_count(), "results": results}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"\n{'step':<14} {'seconds':>8} {'rows/s':>12} {'MB/s':>8}")
        for r in results:
            ratios = f"  x{r['vs_parquet']} of parquet, x{r['vs_binaryfile']} of binaryFile" if "vs_parquet" in r else ""
            print(f"{r['name']:<14} {r['seconds']:>8.2f} {r['rows_per_s']:>12,} {r['mb_per_s']:>8.1f}{ratios}")
        return 0
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
