"""CommitLog messages to Parquet, partitioned by topic and (UTC) store date.

    spark-submit pipeline/export.py STORE_DIR... OUT
    mqstore spark export STORE_DIR... OUT [--master URL]

Corrupt ranges are not exported: each task writes the ones it met as JSON lines under
OUT/_corrupt/ (Parquet readers skip "_" directories), and the summary counts them.

OUT is replaced whole, so it must be new, empty or an earlier export, and apart from every
input (`outputs.check_export_target`): anything else is refused, never deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mqstore.cli import CliError
from mqstore.log import get_logger
from mqstore.pipeline.args import export_args, parser_for
from mqstore.pipeline.datasource import count_corrupt_log, count_expired_log, read_commitlog
from mqstore.pipeline.outputs import check_export_target
from mqstore.pipeline.session import get_spark

log = get_logger(__name__)

EXPORT_COLUMNS = [
    "commitlog_offset", "size", "topic", "queue_id", "queue_offset", "sys_flag", "flag", "born_timestamp",
    "store_timestamp", "born_host", "store_host", "reconsume_times", "tags", "keys", "properties", "body",
    "msg_id", "segment_file", "error",
]  # fmt: skip


def export(
    spark: SparkSession,
    paths: Sequence[str],
    out: str,
    *,
    split_size: str | None = None,
    strict: bool = False,
    mode: str = "overwrite",
    compression: str = "snappy",
) -> dict[str, Any]:
    check_export_target(out, paths)  # before Spark's overwrite empties OUT
    out = os.path.abspath(out)
    corrupt_dir = os.path.join(out, "_corrupt")
    df = read_commitlog(spark, paths, columns=EXPORT_COLUMNS, split_size=split_size, strict=strict, corrupt_log=corrupt_dir)
    messages = df.where(F.col("error").isNull()).drop("error").withColumn("date", F.to_date("store_timestamp"))
    # The write recreates OUT (mode overwrite) before tasks run, then tasks add _corrupt/.
    messages.write.mode(mode).option("compression", compression).partitionBy("topic", "date").parquet(out)
    return {"out": out, "corrupt_records": count_corrupt_log(corrupt_dir), "corrupt_log": corrupt_dir,
            "expired_segments": count_expired_log(corrupt_dir)}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    return parser_for("export", __doc__, export_args)


def run(args: argparse.Namespace) -> int:
    check_export_target(args.out, args.paths)  # refused before the JVM starts
    spark = get_spark(args.master, app_name="mqstore-export")
    summary = export(spark, args.paths, args.out, split_size=args.split_size, strict=args.strict,
                     compression=args.compression)  # fmt: skip
    sys.stdout.write(json.dumps(summary) + "\n")
    if summary["expired_segments"]:
        sys.stderr.write(f"export: {summary['expired_segments']} segments were deleted by the store's retention while "
                         "the job ran and are not in the export (export a stopped store for a whole one)\n")  # fmt: skip
    return 3 if summary["corrupt_records"] else 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except CliError as exc:  # spark-submit: a refusal is a line and an exit code, as in `mqstore spark`
        sys.stderr.write(f"export: {exc.message}\n")
        return int(exc.code)


if __name__ == "__main__":
    sys.exit(main())
