"""Spark pipeline bench: the `rocketmq` data source over a generated commitlog, beside floors.

    .venv/bin/python -m mqstore.bench.bench_spark            # full: 1 GiB store, 3 repeats
    .venv/bin/python -m mqstore.bench.bench_spark --quick    # 64 MB, 1 repeat, a few minutes
    options: [--size-mb N] [--master local[2]] [--json out.json] [--repeat N] [--skip ...]

Generates a commitlog of ~1 KiB messages (RocketMQ layout: 1 GiB segments in full mode, an
END_OF_FILE blank at the end of each full segment, the last one preallocated), then times:
  python-codec    one process, `codec.read_record` per record (full decode, bodies read)
  python-arrow    one process, the data source's reader (all columns), no Spark
  spark-stats     `mqstore spark stats` (topic, queue_id, size, store_timestamp only)
  spark-export    `mqstore spark export` (all columns to snappy Parquet)
  rocketmq-*      format("rocketmq") with the default schema: count(), groupBy(topic).count(),
                  sum(length(body)) (issue 17's goal: >= 250 MB/s on 2 cores)
  parquet-*       floor: the same three queries over the Parquet `export` wrote
  binaryfile-sum  floor: Spark's binaryFile scan of the same segment files, sum(length(content)),
                  one job per file (a whole file is one array in the driver's heap)
The queries run `--repeat` times, interleaved (rocketmq, parquet, binaryFile, then again), so
the machine's noise falls on all alike; each reports its median and best wall time, and the
CPU seconds the Spark JVM and its Python workers spent (on a shared machine the wall time
depends on the other load, the CPU seconds much less). Ratios are rocketmq / floor from the
same run: time(floor) / time(rocketmq), so > 1 means faster than the floor.
MB/s is commitlog bytes (records only, not the preallocated tail) per wall-clock second.
Not run in CI (tests/bench covers the report's arithmetic).
"""

from __future__ import annotations

import argparse
import glob
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


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of this process's children (the Spark JVM) and of theirs (the
    Python workers Spark starts), from /proc; (0, 0) where there is no /proc."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    procs: dict[int, tuple[int, int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, ..., utime (14th field overall), stime (15th).
        procs[int(stat.split("/")[2])] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    jvm = {pid for pid, (ppid, _) in procs.items() if ppid == os.getpid()}
    workers = {pid for pid, (ppid, _) in procs.items() if ppid in jvm}
    workers |= {pid for pid, (ppid, _) in procs.items() if ppid in workers}
    return sum(procs[p][1] for p in jvm) / ticks, sum(procs[p][1] for p in workers) / ticks


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def query_floors(spark: Any, store: str, parquet: str, nbytes: int, rows: int, split_size: str | None, repeat: int,
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
    clog = os.path.join(store, "commitlog")
    jobs: dict[str, Callable[[], Any]] = {}
    def query_on(run: Callable[[Any], Any], frame: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: run(frame())

    for q, run in queries.items():
        jobs[f"rocketmq-{q}"] = query_on(run, lambda: read_commitlog(spark, [store], split_size=split_size))
        jobs[f"parquet-{q}"] = query_on(run, lambda: spark.read.parquet(parquet))
    # One job per segment file: binaryFile holds a whole file in one array and copies it into
    # its row, and two 1 GiB files at once ran the driver out of a 12g heap (humongous arrays).
    segment_files = sorted(glob.glob(os.path.join(clog, "*")))
    jobs["binaryfile-sum"] = lambda: sum(spark.read.format("binaryFile").load(f).select(F.sum(F.length("content")))
                                         .collect()[0][0] for f in segment_files)  # fmt: skip
    answers: dict[str, Any] = {}
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in jobs}
    for _ in range(repeat):
        for name, job in jobs.items():
            if name == "binaryfile-sum":
                # Each file is a 1 GiB array and a 2 GiB row buffer in the driver's heap: start
                # from a collected heap (untimed), as an 8g driver once died of the leftovers.
                spark.sparkContext._jvm.System.gc()
            jvm0, py0 = _cpu_seconds()
            t = time.perf_counter()
            answers[name] = job()
            dt = time.perf_counter() - t
            jvm1, py1 = _cpu_seconds()
            # A worker that exits during the job takes its CPU seconds out of /proc: a floor of 0.
            samples[name].append((dt, max(jvm1 - jvm0, 0.0), max(py1 - py0, 0.0)))
            print(f"  {name:<16} {dt:8.2f} s {nbytes / dt / 1e6:9.1f} MB/s", file=sys.stderr)
    # The same answers from both sources, or the timings compare different work.
    for q in queries:
        ours, theirs = answers[f"rocketmq-{q}"], answers[f"parquet-{q}"]
        if q == "groupby":
            ours, theirs = sorted(map(tuple, ours)), sorted(map(tuple, theirs))
        if ours != theirs:
            raise RuntimeError(f"{q}: rocketmq answered {ours!r}, parquet {theirs!r}")
    by_name: dict[str, dict[str, Any]] = {}
    for name, runs in samples.items():
        wall = _median([r[0] for r in runs])
        by_name[name] = {
            "name": name,
            "seconds": round(wall, 3),
            "best_seconds": round(min(r[0] for r in runs), 3),
            "samples": [round(r[0], 3) for r in runs],
            "rows_per_s": round(rows / wall),
            "mb_per_s": round(nbytes / wall / 1e6, 1),
            "best_mb_per_s": round(nbytes / min(r[0] for r in runs) / 1e6, 1),
            "jvm_cpu_s": round(_median([r[1] for r in runs]), 2),
            "python_cpu_s": round(_median([r[2] for r in runs]), 2),
        }
    for q in queries:
        ours = by_name[f"rocketmq-{q}"]
        ours["vs_parquet"] = round(by_name[f"parquet-{q}"]["seconds"] / ours["seconds"], 2)
        ours["vs_binaryfile"] = round(by_name["binaryfile-sum"]["seconds"] / ours["seconds"], 2)
    results.extend(by_name.values())


def _load() -> dict[str, Any]:
    load1, load5, load15 = os.getloadavg()
    return {"loadavg": [round(load1, 2), round(load5, 2), round(load15, 2)], "at": time.strftime("%H:%M:%S")}


def run(
    *,
    size_mb: int,
    segment_mb: int,
    msg_size: int = 1024,
    repeat: int,
    master: str | None = None,
    split_size: str | None = None,
    driver_memory: str = "12g",
    work_dir: str | None = None,
    skip: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Generates the store, runs every step not in `skip`, and returns the report (the JSON
    `main` writes and `mqstore bench` embeds). The store goes under `work_dir` (default: a
    temp dir), removed after."""
    work = tempfile.mkdtemp(prefix="mqstore-bench-spark-", dir=work_dir)
    store = os.path.join(work, "store")
    load_before = _load()
    try:
        t = time.perf_counter()
        rows, nbytes = generate(store, size_mb, segment_mb, msg_size)
        print(f"generated {rows:,} records, {nbytes / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        results: list[dict[str, Any]] = []
        if "python-codec" not in skip:
            if timed("python-codec", lambda: python_codec(store), nbytes, rows, results) != rows:
                raise RuntimeError("python-codec read a different number of records than were written")
        if "python-arrow" not in skip:
            import mqstore.pipeline.datasource  # noqa: F401  (pyarrow's import is not the reader's time)

            if timed("python-arrow", lambda: python_arrow(store), nbytes, rows, results) != rows:
                raise RuntimeError("python-arrow read a different number of records than were written")

        from mqstore.pipeline.datasource import DEFAULT_SPLIT_SIZE
        from mqstore.pipeline.export import export
        from mqstore.pipeline.session import get_spark
        from mqstore.pipeline.stats import compute_stats

        spark = get_spark(master, app_name="mqstore-bench", progress=False,
                          conf={"spark.driver.memory": driver_memory})  # fmt: skip
        try:
            cores = spark.sparkContext.defaultParallelism
            # Warm-up: one task per core over the first MB, so JVM start-up and the Python
            # workers' imports are not counted as throughput. The first timed run is still
            # reported separately ("#1"): it is what a one-shot spark-submit sees.
            warm = os.path.join(work, "warm")
            generate(warm, 1, 1, msg_size)
            compute_stats(spark, [warm], split_size="64k")
            for i in range(1, repeat + 1):
                if "spark-stats" not in skip:
                    stats = timed(f"spark-stats#{i}", lambda: compute_stats(spark, [store], split_size=split_size),
                                  nbytes, rows, results)  # fmt: skip
                    if stats["messages"] != rows:
                        raise RuntimeError(f"spark-stats counted {stats['messages']} messages of {rows}")
                if "spark-export" not in skip:
                    out = os.path.join(work, "parquet")
                    timed(f"spark-export#{i}", lambda: export(spark, [store], out, split_size=split_size), nbytes,
                          rows, results)  # fmt: skip
            if "queries" not in skip:
                query_floors(spark, store, os.path.join(work, "parquet"), nbytes, rows, split_size, repeat, results)
        finally:
            spark.stop()
        return {"size_mb": size_mb, "records": rows, "record_bytes": nbytes, "msg_size": msg_size,
                "segment_mb": segment_mb, "split_size": split_size or DEFAULT_SPLIT_SIZE, "repeat": repeat, "spark_cores": cores,
                "cpu_count": os.cpu_count(), "load_before": load_before, "load_after": _load(),
                "results": results}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="64 MB in 64 MB segments, one repeat")
    p.add_argument("--size-mb", type=int, default=None, help="store size (default 1024; 64 with --quick)")
    p.add_argument("--segment-mb", type=int, default=None, help="segment size (default 1024; 64 with --quick)")
    p.add_argument("--msg-size", type=int, default=1024, help="bytes per record")
    p.add_argument("--master", default=None)
    p.add_argument("--split-size", default=None, help="the data source's splitSize (default: its default)")
    p.add_argument("--driver-memory", default="12g", help="binaryFile holds a whole segment in an array, and again in its row")
    p.add_argument("--dir", default=None, help="where the store is generated (default: the temp dir); removed after")
    p.add_argument("--json", default="bench_spark.json", help="where to write the results")
    p.add_argument("--repeat", type=int, default=None, help="timed runs of each Spark job (default 3; 1 with --quick)")
    p.add_argument("--skip", default="", help="comma list of steps to skip (python-codec, python-arrow, spark-stats, "
                                              "spark-export, queries)")  # fmt: skip
    args = p.parse_args(argv)
    report = run(
        size_mb=args.size_mb or (64 if args.quick else 1024),
        segment_mb=args.segment_mb or (64 if args.quick else 1024),
        msg_size=args.msg_size,
        repeat=args.repeat or (1 if args.quick else 3),
        master=args.master,
        split_size=args.split_size,
        driver_memory=args.driver_memory,
        work_dir=args.dir,
        skip=frozenset(filter(None, args.skip.split(","))),
    )
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(render_table(report))
    return 0


def render_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table (the README's Spark rows are these)."""
    lines = [
        f"{report['size_mb']} MB store, {report['records']:,} records of {report['msg_size']} B, "
        f"{report['spark_cores']} Spark cores; load average {report['load_before']['loadavg']} before, "
        f"{report['load_after']['loadavg']} after",
        "",
        "| step | seconds (median) | MB/s (median) | MB/s (best) | vs Parquet | vs binaryFile | JVM CPU s | Python CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['name']} | {r['seconds']:.2f} | {r['mb_per_s']:.1f} | {r.get('best_mb_per_s', r['mb_per_s']):.1f} | "
            f"{r.get('vs_parquet', '')} | {r.get('vs_binaryfile', '')} | {r.get('jvm_cpu_s', '')} | {r.get('python_cpu_s', '')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
