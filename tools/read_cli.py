"""`mqstore get STORE_DIR ...` and `mqstore query STORE_DIR ...`: read through the store's API.

Both open the store (so a store that another process runs is refused with exit 4, and one
that crashed is recovered first), print one JSON object per message on stdout with the
fields of `mqstore dump`'s commitlog rows, print a one-line JSON summary (status, next begin
offset, ...) on stderr, and close the store cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..cli import CliError, ExitCode, commitlog_row, load_config
from ..log import get_logger
from ..storage.lockfiles import StoreLockedError

__all__ = ["add_subcommands", "run_get", "run_query"]

log = get_logger(__name__)

JAVA_LONG_MAX = 2**63 - 1


def add_subcommands(subparsers: Any) -> None:
    g = subparsers.add_parser(
        "get",
        help="read messages of one queue from an offset (getMessage), as JSON lines",
        description="Open the store and read up to --max messages of TOPIC/QUEUE from queue offset "
        "--offset, as RocketMQ's getMessage does (tag filter, batch limits). Messages go to stdout "
        "as JSON lines; the status and next begin offset go to stderr as one JSON object. "
        "Exit 4 if a running store holds the lock, 5 if STORE_DIR is not a store.",
    )
    g.add_argument("store_dir", metavar="STORE_DIR", type=Path)
    g.add_argument("--topic", required=True)
    g.add_argument("--queue", type=_non_negative, required=True, help="queue id")
    g.add_argument("--offset", type=_non_negative, required=True, help="queue offset to read from")
    g.add_argument("--max", type=_positive, default=32, help="at most this many messages (default 32)")
    g.add_argument("--tags", default=None, help='subscription expression, e.g. "TagA||TagB" (default: all)')
    g.set_defaults(handler=run_get)

    q = subparsers.add_parser(
        "query",
        help="find messages by key or unique key through the index (queryMessage), as JSON lines",
        description="Open the store and look KEY up in the index files (a KEYS token or the UNIQ_KEY "
        "of TOPIC's messages) for messages stored within [--begin, --end] (ms since the epoch). "
        "Exit 4 if a running store holds the lock, 5 if STORE_DIR is not a store.",
    )
    q.add_argument("store_dir", metavar="STORE_DIR", type=Path)
    q.add_argument("--topic", required=True)
    q.add_argument("--key", required=True)
    q.add_argument("--begin", type=_non_negative, default=0, help="earliest store time, ms (default 0)")
    q.add_argument("--end", type=_non_negative, default=JAVA_LONG_MAX, help="latest store time, ms (default: no limit)")
    q.add_argument("--max", type=_positive, default=32, help="at most this many messages (default 32)")
    q.set_defaults(handler=run_query)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


@contextlib.contextmanager
def _opened(args: argparse.Namespace) -> Iterator[Any]:
    from ..store import open_store  # the actors only when a read command runs

    root: Path = args.store_dir
    if not root.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} is not a directory")
    if not (root / "commitlog").is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} has no commitlog/ directory")
    config = load_config(args, store_path_root_dir=str(root))
    try:
        store = open_store(config=config)
    except StoreLockedError:
        raise CliError(ExitCode.LOCKED, f"{root} is locked by a running store; stop it first") from None
    try:
        yield store
    finally:
        store.close()


def _summary(summary: dict[str, Any]) -> None:
    sys.stdout.flush()
    print(json.dumps(summary), file=sys.stderr)


def run_get(args: argparse.Namespace) -> int:
    with _opened(args) as store:
        result = store.get(args.topic, args.queue, args.offset, args.max, tags=args.tags)
        for record in result.messages:
            sys.stdout.write(json.dumps(commitlog_row(record), ensure_ascii=False) + "\n")
        _summary({
            "status": result.status.name,
            "next_begin_offset": result.next_begin_offset,
            "min_offset": result.min_offset,
            "max_offset": result.max_offset,
            "messages": len(result.messages),
        })  # fmt: skip
    return ExitCode.OK


def run_query(args: argparse.Namespace) -> int:
    if args.begin > args.end:
        raise CliError(ExitCode.USAGE, f"--begin {args.begin} is after --end {args.end}")
    with _opened(args) as store:
        result = store.query(args.topic, args.key, args.max, args.begin, args.end)
        for record in result.messages:
            sys.stdout.write(json.dumps(commitlog_row(record), ensure_ascii=False) + "\n")
        _summary({
            "messages": len(result.messages),
            "index_last_update_timestamp": result.index_last_update_timestamp,
            "index_last_update_phy_offset": result.index_last_update_phy_offset,
        })  # fmt: skip
    return ExitCode.OK
