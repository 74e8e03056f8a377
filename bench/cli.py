"""`mqstore bench [--quick] [--out DIR]`: the argument parsing and the files it writes."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from mqstore.bench.workload import BenchConfig

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: under 2 minutes")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, help="directory for <timestamp>.json and latest.json")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the stores and the disk probe write (default: a temp dir); keep it on the disk you care about",
    )
    p.add_argument(
        "--systems",
        default=None,
        help="comma-separated subset of: ours,sqlite,lmdb,persistqueue,redis_streams,floor_mmap (default: all)",
    )
    p.add_argument("--no-table", action="store_true", help="write the JSON only")
    p.add_argument("--no-spark", action="store_true", help="leave out the Spark case (full mode runs it: about 10 minutes)")


def add_subcommands(subparsers: Any) -> None:
    """Registers `bench` on the main CLI's subparsers; its handler returns an exit code."""
    p = subparsers.add_parser("bench", help="compare mqstore with SQLite, LMDB, persist-queue, Redis Streams")
    add_arguments(p)
    p.set_defaults(handler=handle)


def build_systems(names: Sequence[str] | None) -> list[Any]:
    from mqstore.bench.alternatives import ALTERNATIVES
    from mqstore.bench.ours import OursSystem

    factories: dict[str, Any] = {"ours": OursSystem, **ALTERNATIVES}
    chosen = list(factories) if names is None else list(names)
    unknown = [n for n in chosen if n not in factories]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {', '.join(factories)}")
    return [factories[n]() for n in chosen]


def write_results(result: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    path = out_dir / f"{stamp}.json"
    text = json.dumps(result, indent=1, sort_keys=False)
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    return path


SPARK_FULL: Final[dict[str, int]] = {"size_mb": 1024, "segment_mb": 1024, "repeat": 3}  # issue 17: a >= 1 GB store, 1 KiB bodies


def spark_unavailable_reason() -> str | None:
    import importlib.util
    import shutil

    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (the spark extra)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no JVM (java on PATH or JAVA_HOME)"
    return None


def spark_case(mode: str, data_dir: Path) -> dict[str, Any]:
    """The Spark pipeline's case (bench/bench_spark.py: the `rocketmq` source beside its
    binaryFile and Parquet floors) in full mode; in the other modes a skip with its reason, as
    the JVM, a 1 GiB store and its Parquet export do not fit their time."""
    reason: str | None
    if mode != "full":
        reason = (f"{mode} mode: the Spark case runs in full mode only (a 1 GiB store, a Parquet export and "
                  "a JVM); `python -m mqstore.bench.bench_spark --quick` runs a small one")  # fmt: skip
    else:
        reason = spark_unavailable_reason()
    if reason is not None:
        sys.stderr.write(f"mqstore bench: Spark case skipped: {reason}\n")
        return {"status": "skipped", "reason": reason}
    from mqstore.bench import bench_spark

    try:
        report = bench_spark.run(size_mb=SPARK_FULL["size_mb"], segment_mb=SPARK_FULL["segment_mb"],
                                 repeat=SPARK_FULL["repeat"], work_dir=str(data_dir))
    except Exception as exc:  # a failed case is reported with the rest, as the harness does
        sys.stderr.write(f"mqstore bench: Spark case FAILED: {exc!r}\n")
        return {"status": "failed", "reason": repr(exc)}
    return {"status": "ok", **report}


def run(
    cfg: BenchConfig,
    system_names: Sequence[str] | None,
    out_dir: Path,
    data_dir: Path | None = None,
    table: bool = True,
    spark: bool = True,
) -> tuple[int, dict[str, Any], Path]:
    """Runs the benchmark, writes the JSON (and prints the table); returns (exit code, result, path)."""
    from mqstore.bench.bench_spark import render_table
    from mqstore.bench.harness import run_benchmark, write_table

    systems = build_systems(system_names)
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)  # a place to put the stores, made if new
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-", dir=data_dir) as tmp:
        result = run_benchmark(cfg, systems, Path(tmp))
        if spark:
            result["spark"] = spark_case(cfg.mode, Path(tmp))
            if result["spark"]["status"] == "failed":
                result["failed"].append("spark")
    path = write_results(result, out_dir)
    if table:
        write_table(result, sys.stdout)
        if result.get("spark", {}).get("status") == "ok":
            sys.stdout.write("Spark pipeline (bench/bench_spark.py):\n" + render_table(result["spark"]) + "\n\n")
        sys.stdout.write(f"results: {path}\n")
    if result["failed"]:
        sys.stderr.write(f"mqstore bench: FAILED cases: {', '.join(result['failed'])}\n")
        return 1, result, path
    return 0, result, path


def handle(args: argparse.Namespace) -> int:
    cfg = BenchConfig.quick() if args.quick else BenchConfig.full()
    names = None if args.systems is None else [n.strip() for n in args.systems.split(",") if n.strip()]
    code, _, _ = run(cfg, names, args.out, args.data_dir, table=not args.no_table, spark=not args.no_spark)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    from mqstore.log import configure_logging

    p = argparse.ArgumentParser(prog="python -m mqstore.bench", description=__doc__)
    add_arguments(p)
    configure_logging("INFO")  # progress lines on stderr; the table goes to stdout
    return handle(p.parse_args(argv))
