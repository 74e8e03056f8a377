"""A bench result (the JSON `mqstore bench` writes) as the Markdown table the README shows.

    python -m mqstore.bench.report bench/results/latest.json

One row per compared case with its headline metric, every system side by side, and ours
against the best alternative of the same durability class; then our cases that have no
counterpart, and the disk's own limits measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mqstore.bench.harness import pinned_note

__all__ = ["render_markdown"]

# (our case, their case, headline metric, how to print it)
ROWS = (
    ("put_batch", "append", "msgs_per_s", "append, msgs/s"),
    ("get", "read", "msgs_per_s", "read in order, msgs/s"),
    ("query", "lookup", "p50_us", "key lookup p50, µs"),
    ("query", "lookup", "p99_us", "key lookup p99, µs"),  # issue 18: the tail beside the median
    ("sync_put_16", "append_sync", "msgs_per_s", "sync append, 16 producers, msgs/s"),
    # Issue 16: one message per call, each answered before the thread's next; and pipelined.
    ("put_each_4", "put_each_4", "msgs_per_s", "put, 1 message per call, 4 threads, msgs/s"),
    ("put_each_16", "put_each_16", "msgs_per_s", "put, 1 message per call, 16 threads, msgs/s"),
    ("put_pipelined", "put_pipelined", "msgs_per_s", "put pipelined (put_async), 1 thread, 1024 in flight, msgs/s"),
)
OURS_ONLY = (
    ("lag", "p50_us", "put-to-visible lag p50, µs"),
    ("lag", "p99_us", "put-to-visible lag p99, µs"),
    ("recovery", "gb_per_s", "recovery scan, GB/s"),
    ("recovery", "floor_gb_per_s", "plain crc32 read of the same bytes, GB/s"),
    ("open_clean", "open_s", "open a clean store, s"),
    ("open_crash", "open_s", "open after kill -9, until it returns, s"),
    ("open_crash", "ready_s", "open after kill -9, until queues and index are rebuilt, s"),
    ("open_crash", "recover_s", "crash recovery alone (open after kill -9's floor), s"),
    ("open_clean", "open_cpu_s", "open a clean store, CPU s (all threads)"),
    ("open_crash", "open_cpu_s", "open after kill -9, CPU s (all threads)"),
    ("open_crash", "ready_cpu_s", "open after kill -9 until rebuilt, CPU s (all threads)"),
)
NAMES = {
    "ours": "mqstore",
    "sqlite": "SQLite WAL",
    "lmdb": "LMDB",
    "persistqueue": "persist-queue",
    "redis_streams": "Redis Streams",
    "floor_mmap": "Python floor",
}


def _median(case: dict[str, Any] | None, metric: str) -> float | None:
    if case is None or case.get("status") != "ok":
        return None
    m = case.get("metrics", {}).get(metric)
    return None if m is None else float(m["median"])


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"


def render_markdown(result: dict[str, Any]) -> str:
    cases = {(c["system"], c["case"], c["body_bytes"]): c for c in result["cases"]}
    systems = [s for s in NAMES if s != "ours" and any(k[0] == s for k in cases)]
    bodies = sorted({k[2] for k in cases if k[2] is not None})
    machine = result.get("machine", {})
    lines = [
        f"Measured {machine.get('date', '?')[:16].replace('T', ' ')} UTC on {machine.get('cpu_model', '?')}, "
        f"{machine.get('logical_cores', '?')} cores{pinned_note(machine)}, {machine.get('disk', {}).get('fstype', '?')}; "
        f"`mqstore bench` ({result.get('mode', '?')} mode, median of the repeats). Ratio: mqstore over "
        "the best alternative of the same durability class (above 1 is better for mqstore; for "
        "latency, the alternative's over ours).",
        "",
        "| case | body | mqstore | " + " | ".join(NAMES[s] for s in systems) + " | vs best |",
        "|---|---|---|" + "---|" * len(systems) + "---|",
    ]
    for ours_case, their_case, metric, label in ROWS:
        lower_is_better = metric.endswith("_us")
        for body in bodies:
            ours = _median(cases.get(("ours", ours_case, body)), metric)
            theirs = {s: _median(cases.get((s, their_case, body)), metric) for s in systems}
            real = {s: v for s, v in theirs.items() if v is not None and s != "floor_mmap"}
            if real:
                best = min(real.values()) if lower_is_better else max(real.values())
                ratio = None if ours is None else (best / ours if lower_is_better else ours / best)
            else:
                ratio = None
            cells = " | ".join(_fmt(theirs[s]) for s in systems)
            lines.append(f"| {label} | {body} B | {_fmt(ours)} | {cells} | {_fmt(ratio)} |")
    lines += ["", "| mqstore only | body | figure |", "|---|---|---|"]
    for case, metric, label in OURS_ONLY:
        for body in bodies:
            lines.append(f"| {label} | {body} B | {_fmt(_median(cases.get(('ours', case, body)), metric))} |")
    disk = result.get("disk", {})
    if disk:
        seq = disk.get("seq_write_fsync_mb_s", {}).get("median")
        p50 = disk.get("append_fdatasync_p50_us", {}).get("median")
        lines += [
            "",
            f"The disk itself, same run: sequential write with fsync {_fmt(seq)} MB/s; "
            f"1 KiB append + fdatasync p50 {_fmt(p50)} µs. The Python floor is plain length-prefixed "
            "records in a preallocated mmap (no index, no dispatch): the ceiling for pure Python.",
        ]
    lines += _spark_lines(result.get("spark"))
    return "\n".join(lines) + "\n"


def _spark_lines(spark: dict[str, Any] | None) -> list[str]:
    """The Spark case (bench/bench_spark.py) as its own table, or why it is not there."""
    if not spark:
        return []
    if spark.get("status") != "ok":
        return ["", f"Spark pipeline: {spark.get('status', '?')} ({spark.get('reason', '')})"]
    from mqstore.bench.bench_spark import render_table

    return ["", "Spark pipeline (`format(\"rocketmq\")`, default schema, beside its same-run floors):", "",
            render_table(spark)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqstore.bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a JSON result written by `mqstore bench`")
    args = parser.parse_args(argv)
    sys.stdout.write(render_markdown(json.loads(args.result.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
