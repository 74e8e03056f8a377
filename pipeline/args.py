"""Arguments of the Spark jobs, shared by the scripts (spark-submit) and `mqstore spark ...`.

No pyspark import here: the mqstore CLI builds its parser from these.
"""

from __future__ import annotations

import argparse
from typing import Callable


def split_size(text: str) -> str:
    """An argparse type: a positive size ("256m", "1g", "4096"), checked before Spark starts
    (review 126 F6: 0 or "abc" failed the job after Spark's start, exit 1)."""
    from .segments import parse_size  # (no pyspark in it)

    try:
        parse_size(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size such as 128m, 1g or 4096") from None
    return text


def positive_int(text: str) -> int:
    """An argparse type: an int > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default=None, help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument("--split-size", default=None, type=split_size, metavar="SIZE",
                   help="bytes per read partition (default 128m), e.g. 256m")  # fmt: skip
    p.add_argument("--strict", action="store_true", help="fail on the first corrupt record instead of reporting it")


def stats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="STORE_DIR", help="store dirs, commitlog dirs or segment files")
    p.add_argument("--out", default=None, metavar="FILE", help="write the JSON here instead of stdout")
    add_common_args(p)


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="STORE_DIR")
    p.add_argument("out", metavar="OUT", help="output directory (replaced)")
    p.add_argument("--compression", default="snappy", help="Parquet codec (snappy, zstd, none, ...)")
    add_common_args(p)


def lookup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="STORE_DIR")
    p.add_argument("--key", required=True, help="a UNIQ_KEY or one KEYS token")
    p.add_argument("--topic", default=None)
    p.add_argument("--with-body", action="store_true", help="include bodies (base64)")
    p.add_argument("--limit", type=positive_int, default=None)
    p.add_argument("--scan", action="store_true", help="scan with Spark even where index files could answer")
    add_common_args(p)


def reindex_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE_DIR", help="a store dir (or its commitlog dir)")
    p.add_argument("out", metavar="OUT_DIR", help="where consumequeue/ and index/ are written")
    # Unset: the store's settings (mqstore --config FILE, MQSTORE_* variables, else the defaults
    # 6,000,000 / 5,000,000 / 20,000,000), as the store's own commands read them (review 126 F4).
    p.add_argument("--cq-file-size", type=int, default=None,
                   help="mapped_file_size_consume_queue_bytes (rounded up to a multiple of 20; default: the settings')")  # fmt: skip
    p.add_argument("--max-hash-slot-num", type=int, default=None, help="default: the settings'")
    p.add_argument("--max-index-num", type=int, default=None, help="default: the settings'")
    p.add_argument("--no-index", action="store_true", help="rebuild the consume queues only")
    add_common_args(p)


def parser_for(name: str, doc: str | None, add: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=name, description=(doc or "").strip().splitlines()[0] if doc else None)
    add(p)
    return p
