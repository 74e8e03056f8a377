"""`mqstore recover STORE_DIR` and `mqstore verify STORE_DIR`.

recover: takes the store's lock (a running store: exit 4), runs start-up recovery (§11) with a
progress bar on stderr for the CommitLog scan, then, after a crash, opens the store once so the
reput actor re-dispatches the ConsumeQueues and index from the recovery point and the store
stops cleanly (abort file removed). Prints what was found and fixed.

verify: read-only consistency check (`mqstore.tools.verify`) of a stopped store (a running
one: exit 4; the lock is only tested, never taken); exit 0 if consistent, else the problems on
stdout and exit 3, or 1 where a segment could not be read (no access, an I/O error: not damage,
and not for `recover`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..cli import CliError, ExitCode, non_negative, refuse_running, store_config, store_path
from ..log import get_logger
from ..storage.fs import RealFileSystem
from ..storage.lockfiles import AbortFile, StoreDirectoryError, StoreLock, StoreLockedError
from ..storage.recovery import recover_store
from ..supervisor import data_directories, refuse_what_is_in_the_way
from .verify import iter_problem_lines, verify_store

__all__ = ["add_subcommands", "run_recover", "run_verify"]

log = get_logger(__name__)

DISPATCH_WAIT_S = 600.0
STALL_S = 10.0  # re-dispatch that stands still this long will not finish: stop, do not wait it out


def add_subcommands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "recover",
        help="recover a store that is not running (truncate a torn tail, rebuild queues and index)",
        description="Run the store's start-up recovery on a store that is not running and report what "
        "was found and fixed. Exit 4 if a running store holds the lock (one of another user's too).",
    )
    p.add_argument("store_dir", metavar="STORE_DIR", type=store_path)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run_recover)

    v = subparsers.add_parser(
        "verify",
        help="check that ConsumeQueues and index agree with the CommitLog (read-only)",
        description="Check every ConsumeQueue unit and index entry against the CommitLog record it "
        "points to, and that no record lacks its unit or index entry. Read-only. Exit 0 if "
        "consistent, 3 if not (the problems are printed), 1 if a commitlog segment cannot be read (no access, "
        "an I/O error: not damage), 4 if a running store holds the lock.",
    )
    v.add_argument("store_dir", metavar="STORE_DIR", type=store_path)
    v.add_argument("--json", action="store_true", help="print the report as one JSON object")
    v.add_argument("--max-problems", type=non_negative, default=1000, help="list at most this many problems (default 1000)")
    v.set_defaults(handler=run_verify)


def _progress_bar(enabled: bool) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="B", unit_scale=True, desc="scanning commitlog", file=sys.stderr, leave=False)

    def progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    return progress, bar.close


def run_recover(args: argparse.Namespace) -> int:
    root: Path = args.store_dir
    # The store's geometry from its files (recovery with another size would ignore them all).
    cfg = store_config(args, root, read_only=False)
    # Asked before the lock is taken: taking it opens the lock file to write, which a store
    # running under another user's account refuses with a bare PermissionError (review 65 F6).
    refuse_running(root, cfg.commitlog_dir)
    fs = RealFileSystem()
    # As an open does: recover writes the same files in place (never through a link into
    # another store's), and does not guess what stands where they belong.
    refuse_what_is_in_the_way(fs, cfg)
    lock = StoreLock(fs, str(cfg.lock_path))
    try:
        lock.acquire()
    except StoreLockedError as exc:
        raise CliError(ExitCode.LOCKED, f"the store is running: {exc}") from None
    try:
        lock.claim_directories(data_directories(cfg))
    except StoreLockedError as exc:
        lock.release()
        raise CliError(ExitCode.LOCKED, str(exc)) from None
    except BaseException:
        lock.release()
        raise
    started = time.monotonic()
    progress, close_bar = _progress_bar(not args.no_progress)
    try:
        last_exit_ok = not AbortFile(fs, str(cfg.abort_path)).exists()
        report = recover_store(cfg, fs, last_exit_ok=last_exit_ok, clock_ms=lambda: time.time_ns() // 1_000_000,
                               progress=progress, repair_holes=True)  # fmt: skip
    except StoreDirectoryError:
        lock.drop_created_file()  # refused: the root as it was found (review 61 L1)
        raise
    finally:
        try:
            close_bar()  # (a terminal gone: never keep the lock for it, review 94 H1)
        finally:
            lock.release()
    result: dict[str, Any] = {"store_dir": str(root), **report.summary()}
    result["scan_seconds"] = round(time.monotonic() - started, 3)
    for start, end in report.lost_ranges:
        print(f"commitlog bytes {start}..{end} were lost (a missing or cut segment); the log continues "
              "after them", file=sys.stderr)  # fmt: skip
    for queue, next_offset in report.reserved_queue_offsets.items():
        print(f"queue {queue}: the queue offsets of its lost records are not given again; its next put gets "
              f"queue offset {next_offset}", file=sys.stderr)  # fmt: skip
    if (not last_exit_ok or report.truncated_consume_queues or report.dropped_index_files or report.lost_ranges
            or report.damaged_consume_queue_files or report.dispatch_from < report.max_offset):  # fmt: skip
        result["redispatch"] = _redispatch(cfg)
    _print(result, args.json)
    redispatch = result.get("redispatch")
    if redispatch is not None and not (redispatch["caught_up"] and redispatch["clean_stop"]):
        print("re-dispatch did not finish: queues or index may still lag the commitlog; run recover again",
              file=sys.stderr)  # fmt: skip
        return ExitCode.FAILURE
    for damaged in report.quarantined:
        # Damaged records with valid ones after them cannot be repaired (their bytes are gone);
        # they stay in place, skipped, and `verify` reports them too.
        print(f"damaged commitlog bytes {damaged.start}..{damaged.end}: {damaged.reason} "
              "(quarantined: left in place and skipped; the records after them are kept)", file=sys.stderr)  # fmt: skip
    # What recovery could not repair is what `verify` still finds: recover exits 0 only when
    # verify would, and lists the rest (e.g. a changed key the 4.x body CRC cannot see).
    check = verify_store(os.fspath(root), config=cfg, max_problems=50)
    for line in iter_problem_lines(check):
        print(f"not repaired: {line}", file=sys.stderr)
    return ExitCode.OK if check.ok and not report.quarantined else ExitCode.CORRUPT


def _redispatch(cfg: Any) -> dict[str, Any]:
    """Open the store so reput rebuilds the queues and index from the recovery point, wait until
    it caught up, and stop cleanly (which removes the abort file)."""
    from .. import open_store

    started = time.monotonic()
    try:
        store = open_store(config=cfg)
    except StoreLockedError as exc:  # someone started the store between our two steps
        raise CliError(ExitCode.LOCKED, f"the store was started meanwhile: {exc}") from None
    try:
        sup = store.supervisor
        rec = sup.recovery
        deadline = time.monotonic() + DISPATCH_WAIT_S
        last_progress, last_offset = time.monotonic(), -1
        caught_up = False
        while True:
            status = sup._ask("reput", _ping())
            caught_up = status.reput_offset >= status.max_offset
            if caught_up or time.monotonic() > deadline:
                break
            if status.reput_offset != last_offset:
                last_progress, last_offset = time.monotonic(), status.reput_offset
            elif time.monotonic() - last_progress > STALL_S:
                log.error("re-dispatch made no progress; stopping", reput_offset=status.reput_offset,
                          max_offset=status.max_offset)  # fmt: skip
                break
            time.sleep(0.01)
    finally:
        clean = store.close()
    return {
        "from_offset": rec.dispatch_from if rec else None,
        "to_offset": rec.max_offset if rec else None,
        "caught_up": caught_up,
        "clean_stop": clean,
        "seconds": round(time.monotonic() - started, 3),
    }


def _ping() -> Any:
    from ..messages import GetReputStatus

    return GetReputStatus()


def run_verify(args: argparse.Namespace) -> int:
    root: Path = args.store_dir
    # (F_GETLK and a shared flock only ask: verify stays read-only)
    cfg = store_config(args, root, refuse_running_with="verify checks a stopped store (its files are in flux while "
                       "it runs), stop it first")  # fmt: skip
    report = verify_store(os.fspath(root), config=cfg, max_problems=args.max_problems)
    if args.json:
        out = report.summary()
        out["problems"] = [{"kind": p.kind, "where": p.where, "detail": p.detail} for p in report.problems]
        print(json.dumps(out))
    else:
        for line in iter_problem_lines(report):
            print(line)
        _print(report.summary(), False)
    if report.unreadable:
        sys.stdout.flush()
        what = [f"{len(report.unreadable_ranges)} commitlog segments"] if report.unreadable_ranges else []
        what += [os.path.basename(path) for path in report.unreadable_files]
        print(f"mqstore verify: {', '.join(what)} could not be read (listed as ..._unreadable): the check is "
              "incomplete; make them readable and verify again", file=sys.stderr)  # fmt: skip
        return ExitCode.FAILURE
    return ExitCode.OK if report.ok else ExitCode.CORRUPT


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {json.dumps(value) if isinstance(value, (dict, list)) else value}")
