"""`mqstore clean STORE_DIR [--now]`: delete a closed store's expired files from the command line.

It opens the store (so its actors, each the only writer of its files, do the deleting: STYLE
habit 1) and runs RocketMQ's manual deletion, `executeDeleteFilesManually` (spec §12.5), through
`MessageStore.delete_expired_files_now()`, with the configured rules:

* a commitlog segment goes when it is older than `file_reserved_time_hours` (its modification
  time), oldest first, stopping at the first younger one; the newest segment always stays;
* above `disk_space_clean_forcibly_ratio` (with `clean_file_forcibly_enable`) age does not
  matter, as in the store's own rounds;
* the consume queue and index files below the new commitlog start go with them (§12.6).

Without `--now` the command keeps the schedule: it deletes only at one of the `delete_when`
hours or when a store partition is above `disk_max_used_space_ratio_percent` (the two triggers
of a periodic round, §12.2-§12.3) and otherwise says why it did nothing. `--now` deletes at any
hour, which is what the broker's admin command does. One round deletes at most
DELETE_FILES_BATCH_MAX segments; the command runs rounds until one deletes nothing, at most
MANUAL_DELETE_ROUNDS (the broker's 20 manual rounds).

It prints what it deleted (a JSON document with --json). Exit codes: 0 (also when nothing was
expired), 1 when the store did not stop cleanly, 2 when the configuration disagrees with the
files (a segment size other than the configured one), 4 when a running process holds the
store, 5 when STORE_DIR is not a store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

from ..actors.cleaner import MANUAL_DELETE_ROUNDS, check_space, is_time_to_delete
from ..cli import CliError, ExitCode, refuse_running, store_config, store_path
from ..config import StoreConfig
from ..storage.lockfiles import StoreLockedError

__all__ = ["add_subcommands", "clean_store"]

_SEGMENT_NAME_DIGITS: Final = 20


def add_subcommands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "clean",
        help="delete expired commitlog, consume queue and index files of a closed store",
        description="Open a closed store and delete its expired files by its configured rules (RocketMQ's "
        "manual deletion): commitlog segments older than file_reserved_time_hours, oldest first, never the "
        "newest; at any age above the forced-clean disk ratio; then the consume queue and index files below "
        "the new start of the log. Without --now only at a delete_when hour or when the disk is above its "
        "maximum ratio. Exit 4 if a running process holds the store.",
    )
    p.add_argument("store_dir", metavar="STORE_DIR", type=store_path)
    p.add_argument("--now", action="store_true", help="delete expired files at any hour, not only at delete_when")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_run_clean)


def _run_clean(args: argparse.Namespace) -> int:
    root: Path = args.store_dir
    report = clean_store(root, store_config(args, root, require_commitlog=False, read_only=False), now=args.now)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_report(report, sys.stdout)
    sys.stdout.flush()
    if report["interrupted"]:
        print("mqstore clean: interrupted: no more deletion rounds; the report lists what was deleted", file=sys.stderr)
        return 130
    if not report["clean_stop"]:
        print("mqstore clean: the store did not stop cleanly; the next start recovers it", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


def clean_store(root: Path, config: StoreConfig, *, now: bool) -> dict[str, Any]:
    """Open the store at `root`, delete what the rules allow, close; what was deleted."""
    from ..store import open_store  # the actors only when the command runs

    _check_store(root, config)
    # Asked before the open takes the lock: a store running under another user's account has a
    # lock file this one may not open to write, which said only "PermissionError" (review 65 F6).
    advice = "stop it first (a running store cleans itself at its delete_when hours)"
    refuse_running(root, config.commitlog_dir, advice)
    try:
        store = open_store(config=config)
    except StoreLockedError:  # started since it was asked
        raise CliError(ExitCode.LOCKED, f"{root} is locked by a running store; {advice}") from None
    clean_stop = False
    try:
        before = _store_files(config)
        at_ms = store.clock_ms()
        timeup = is_time_to_delete(config.delete_when, at_ms)
        space = check_space(
            (os.fspath(config.commitlog_dir), os.fspath(config.consume_queue_dir)),
            store.supervisor.ctx.disk_gauge,
            disk_full=False,
            max_used_ratio=config.disk_max_used_space_ratio_percent / 100.0,
            warning_ratio=config.disk_space_warning_level_ratio,
            forced_ratio=config.disk_space_clean_forcibly_ratio,
        )
        rounds = commitlog_deleted = 0
        interrupted = False
        if now or timeup or space.spacefull:
            try:
                while rounds < MANUAL_DELETE_ROUNDS:
                    rounds += 1
                    deleted = store.delete_expired_files_now()
                    commitlog_deleted += deleted
                    if deleted == 0:
                        break
            except KeyboardInterrupt:  # no more rounds; what went is reported (review 94 L1: nothing was)
                interrupted = True
        after = _store_files(config)
    finally:
        clean_stop = store.close()
    gone = sorted(before - after)
    return {
        "store_dir": str(root),
        "mode": "now" if now else "scheduled",
        "hour": time.localtime(at_ms / 1000).tm_hour,
        "delete_when": config.delete_when,
        "timeup": timeup,
        "file_reserved_time_hours": config.file_reserved_time_hours,
        "disk_ratios": list(space.ratios),
        "disk_max_used_ratio": config.disk_max_used_space_ratio_percent / 100.0,
        "spacefull": space.spacefull,
        "clean_immediately": config.clean_file_forcibly_enable and space.clean_immediately,
        "ran": bool(rounds),
        "rounds": rounds,
        "commitlog_deleted": commitlog_deleted,
        "deleted": {
            kind: [path for k, path in gone if k == kind] for kind in ("commitlog", "consumequeue", "index")
        },
        "commitlog_segments_left": sum(1 for k, _ in after if k == "commitlog"),
        "clean_stop": clean_stop,
        "interrupted": interrupted,
    }


def _check_store(root: Path, config: StoreConfig) -> None:
    if not root.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} is not a directory")
    commitlog = Path(config.commitlog_dir)
    if not commitlog.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} has no commitlog directory ({commitlog})")
    segments = sorted(p for p in commitlog.iterdir() if len(p.name) == _SEGMENT_NAME_DIGITS and p.name.isdigit())
    if segments:
        size = segments[0].stat().st_size
        if size != config.mapped_file_size_commitlog_bytes:
            # Opening with the wrong size would make recovery misread the log: refuse.
            raise CliError(ExitCode.USAGE, f"{segments[0]} is {size} bytes but mapped_file_size_commitlog_bytes is "
                           f"{config.mapped_file_size_commitlog_bytes}; pass the store's settings with --config")  # fmt: skip


def _store_files(config: StoreConfig) -> set[tuple[str, str]]:
    """(kind, path) of every commitlog segment, consume queue file and index file."""
    found: set[tuple[str, str]] = set()
    for kind, directory in (("commitlog", config.commitlog_dir), ("consumequeue", config.consume_queue_dir),
                            ("index", config.index_dir)):  # fmt: skip
        base = os.fspath(directory)
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.isdigit():
                    found.add((kind, os.path.relpath(os.path.join(dirpath, name), os.path.dirname(base))))
    return found


def _print_report(report: dict[str, Any], out: Any) -> None:
    w = out.write
    deleted = report["deleted"]
    ratios = ", ".join(f"{r:.1%}" if r >= 0 else "unknown" for r in report["disk_ratios"])
    w(f"store {report['store_dir']}\n")
    w(f"  rules: delete at hours {report['delete_when']!r} (now {report['hour']:02d} h), files older than "
      f"{report['file_reserved_time_hours']} h, disk {ratios} (clean above {report['disk_max_used_ratio']:.0%})\n")  # fmt: skip
    if not report["ran"]:
        w("  nothing deleted: not a deletion hour and the disk is below its maximum ratio "
          "(--now deletes expired files at any hour)\n")  # fmt: skip
        return
    if report["clean_immediately"]:
        w("  the disk is above the forced-clean ratio: segments went regardless of age\n")
    total = sum(len(v) for v in deleted.values())
    if total == 0:
        w(f"  nothing deleted: no commitlog segment is older than {report['file_reserved_time_hours']} h "
          "(the newest one always stays)\n")  # fmt: skip
    for kind, label in (("commitlog", "commitlog segments"), ("consumequeue", "consume queue files"),
                        ("index", "index files")):  # fmt: skip
        if deleted[kind]:
            w(f"  deleted {len(deleted[kind])} {label}:\n")
            for path in deleted[kind]:
                w(f"    {path}\n")
    w(f"  {report['commitlog_segments_left']} commitlog segments left\n")
