"""`mqstore spark ...`: the Spark jobs as subcommands of the mqstore CLI.

The CLI imports this module to build its parser, so nothing here imports pyspark: each
handler imports its job module when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Any

from . import args

# subcommand -> (job module, one-line help)
JOBS: dict[str, tuple[str, str]] = {
    "stats": ("mqstore.pipeline.stats", "per topic/queue counts, bytes, first/last store time, hourly histogram (JSON)"),
    "export": ("mqstore.pipeline.export", "messages to Parquet partitioned by topic and date"),
    "reindex": ("mqstore.pipeline.reindex", "rebuild consumequeue/ and index/ from the commitlog alone"),
    "lookup": ("mqstore.pipeline.lookup", "find messages by UNIQ_KEY or KEYS token (index files when present, else a scan)"),
}


EXIT_CORRUPT = 3  # mqstore's "corrupt data found" (mqstore.cli.ExitCode.CORRUPT)
EXIT_FAILURE = 1
_TRACEBACK = "Traceback (most recent call last):"
_QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*:)")


def error_cause(text: str) -> str:
    """The line of a Spark error that names its cause: the exception line ending the last
    Python traceback inside it (Spark's first line is often only "...: Traceback (most
    recent call last):"), without its module path; else the first line."""
    lines = text.splitlines()
    cause = ""
    for i, line in enumerate(lines):
        if line.rstrip().endswith(_TRACEBACK):
            # Frames are indented; the exception line that ends the traceback is not.
            after = (x.strip() for x in lines[i + 1 :] if x.strip() and not x[:1].isspace())
            cause = next(after, cause)
    if not cause:
        cause = next((x.strip() for x in lines if x.strip()), "")
    return _QUALIFIED.sub("", cause)


def _handler(module_name: str) -> Any:
    def handle(ns: argparse.Namespace) -> int:
        module = importlib.import_module(module_name)
        try:
            return int(module.run(ns))
        except Exception as exc:  # noqa: BLE001 - a failed Spark job becomes an exit code
            # Spark wraps the task's exception (strict mode's CorruptRecordError) in its own;
            # the first line naming the record is what a person needs, not a JVM trace.
            text = str(exc)
            for line in text.splitlines():
                if "CorruptRecordError: corrupt record in" in line:
                    reason = line.split("CorruptRecordError: ", 1)[1].strip()
                    sys.stderr.write(f"mqstore spark {ns.spark_command}: {reason}\n")
                    return EXIT_CORRUPT
            if type(exc).__module__.startswith(("pyspark", "py4j")):
                sys.stderr.write(f"mqstore spark {ns.spark_command}: job failed: {error_cause(text) or repr(exc)}\n")
                return EXIT_FAILURE
            raise

    return handle


def _no_subcommand(parser: argparse.ArgumentParser) -> Any:
    def handle(ns: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return handle


def add_subcommands(subparsers: Any) -> None:
    """Register `spark` with one sub-subcommand per job; handlers return exit codes."""
    spark = subparsers.add_parser("spark", help="batch jobs over commitlog segments on Spark (needs pyspark)")
    spark.set_defaults(handler=_no_subcommand(spark))
    sub = spark.add_subparsers(dest="spark_command", metavar="JOB")
    for name, (module_name, help_text) in JOBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # The job modules import pyspark, so their arguments live in the light args module.
        _ARGUMENTS[name](p)
        p.set_defaults(handler=_handler(module_name))


_ARGUMENTS = {"stats": args.stats_args, "export": args.export_args, "reindex": args.reindex_args,
              "lookup": args.lookup_args}  # fmt: skip
