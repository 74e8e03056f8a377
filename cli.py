"""The `mqstore` command line.

Subcommands are argparse subparsers whose defaults carry `handler=<function(args) -> int>`.
Built-in ones are added by the `_add_*` functions listed in `_BUILTIN_COMMANDS`; optional groups
live in other packages and plug in through a module-level function
`add_subcommands(subparsers) -> None` (see `PLUGIN_MODULES`). A group whose module, or one of
its dependencies such as pyspark, cannot be imported is left out, so the rest still works.

Exit codes (also in README.md) are `ExitCode`; handlers return them, and raise `CliError` to
stop with a message on stderr.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import dataclasses
import enum
import errno
import importlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final, TypeGuard

from . import __version__
from .config import ConfigError, StoreConfig, StoreGeometryAmbiguous
from .log import configure_logging, get_logger, logging_restored
from .storage.codec import MessageRecord, RecordKind
from .storage.checkpoint import read_checkpoint
from .storage.commitlog import being_created, scan_commitlog_dir, segment_size_in
from .storage.consume_queue import iter_cq_units, list_consume_queues
from .storage.fs import NotARegularFileError, RealFileSystem, fill_stdio_with_dev_null
from .storage.index import IndexFile, index_file_size
from .storage.lockfiles import StoreDirectoryError
from .storage.mapped_file_queue import named_past_the_largest_offset

__all__ = ["CliError", "ExitCode", "PLUGIN_MODULES", "build_parser", "json_line", "load_config", "main",
           "non_negative", "positive", "store_path", "unreadable_file"]

log = get_logger(__name__)


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2  # bad arguments or configuration (argparse also exits with 2)
    CORRUPT = 3  # corrupt data found; everything valid before it was still processed
    LOCKED = 4  # the store is locked by a running process
    NOT_A_STORE = 5  # the directory is missing or is not a store


class CliError(Exception):
    """Stops a command: `message` goes to stderr, `code` becomes the exit status."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Optional subcommand groups, each a module with `add_subcommands(subparsers)`. Such a module
# should import heavy dependencies (pyspark) inside its handlers, to keep `mqstore --help` fast.
PLUGIN_MODULES: Final = (
    "mqstore.tools.demo",  # demo: the main job
    "mqstore.tools.recovery_cli",  # recover, verify
    "mqstore.tools.read_cli",  # get, query
    "mqstore.tools.inspect_cli",  # inspect, stats
    "mqstore.tools.clean_cli",  # clean
    "mqstore.pipeline.cli",
    "mqstore.bench.cli",
)

Handler = Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------------------------------------
# Entry point


# Commands that only print what they read stop at the first write their reader did not take
# (`mqstore dump | head`). The others change the store, or their exit status is a verdict
# (verify, recover, demo, the Spark jobs): a reader gone, stdout on a full disk or a closed
# stderr must neither cut them short (review 94 H1: recover stopped before its re-dispatch,
# the lock held) nor change that status (M1: `verify DAMAGED | head` exited 0).
STOP_AT_A_LOST_READER: Final = frozenset({"dump", "get", "query", "inspect", "stats"})
# Commands that only read the store: a file of it they may not read now is said as such.
READ_ONLY_COMMANDS: Final = STOP_AT_A_LOST_READER | {"verify"}
_UNREADABLE_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EIO})
SIGPIPE_EXIT: Final = 128 + 13  # the status of a command a shell's pipe stopped: `cat f | head`


class StdoutLost(Exception):
    """A command that only prints what it reads stops: stdout refused a write (`error`)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror)
        self.error = error


class _Output:
    """sys.stdout or sys.stderr for one command. The first write or flush the stream refuses
    (EPIPE, EIO, ENOSPC) is kept in `lost`; then it raises StdoutLost (`stop`) or takes every
    later write as written."""

    def __init__(self, stream: IO[str], name: str, *, stop: bool) -> None:
        self._stream, self.name, self.stop = stream, name, stop
        self.lost: OSError | None = None

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._lose(exc)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._lose(exc)

    def _lose(self, exc: OSError) -> None:
        self.lost = exc
        if self.stop:
            raise StdoutLost(exc) from exc

    def silence(self) -> None:
        """Once lost, the descriptor points at /dev/null: the interpreter's last flush of what
        the stream still buffers then fails no more. Only where this process is the command (a
        host calling main() keeps its stdout: a full disk passes, review 95 L1)."""
        if self.lost is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._stream.fileno())
                os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...: the stream's
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    # Closed stdio (`>&-`, a daemon): /dev/null there, so output goes nowhere rather than
    # raising, and no store file is opened as descriptor 1 or 2 (review 94 M2).
    fill_stdio_with_dev_null()
    if sys.stdout is None:  # (closed when the interpreter started): for the process's life
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    saved = sys.stdout, sys.stderr
    out = _Output(sys.stdout, "stdout", stop=False)
    err = _Output(sys.stderr, "stderr", stop=False)  # diagnostics never stop a command
    sys.stdout, sys.stderr = out, err
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0) or a usage error (2): return, never raise
            code = exc.code if isinstance(exc.code, int) else ExitCode.USAGE
            args = argparse.Namespace(command=None)  # (`--help >/dev/full` said 0, nothing written: review 95 L6)
        else:
            out.stop = args.command in STOP_AT_A_LOST_READER
            with logging_restored():  # (configured for the command, on the guard of stderr)
                code = _run(parser, args)
        with contextlib.suppress(StdoutLost):
            out.flush()
    finally:
        sys.stdout, sys.stderr = saved
        if argv is None:  # this process is the command
            out.silence()
            err.silence()
    if out.lost is not None and code in (ExitCode.OK, SIGPIPE_EXIT):
        if out.lost.errno == errno.EPIPE:
            return SIGPIPE_EXIT  # the reader left: not a success a script may build on
        command = f"mqstore {args.command}" if args.command else "mqstore"
        print(f"{command}: could not write to stdout: {out.lost.strerror}", file=err)
        return ExitCode.FAILURE
    return code


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    level = {0: "WARNING", 1: "INFO"}.get(args.verbose, "DEBUG")
    configure_logging(level, json=args.log_json)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return int(handler(args))
    except CliError as exc:
        sys.stdout.flush()  # the valid records first, then the reason we stopped
        print(f"mqstore {args.command}: {exc.message}", file=sys.stderr)
        return exc.code
    except ConfigError as exc:  # StoreConfigMismatch from a store a command opened
        print(f"mqstore {args.command}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except StoreDirectoryError as exc:  # something in the way of the store's own files
        print(f"mqstore {args.command}: {exc}", file=sys.stderr)
        if args.command in READ_ONLY_COMMANDS and _unreadable(exc.__cause__):
            return ExitCode.FAILURE  # a file there that this user may not read: not "not a store"
        return ExitCode.NOT_A_STORE
    except StdoutLost:  # a command that only prints what it reads: `mqstore dump ... | head`
        return SIGPIPE_EXIT  # (main says why, unless the reader left)
    except BrokenPipeError:  # a pipe of the command's own (Spark's; stdout's is StdoutLost): the failure it is
        print(f"mqstore {args.command}: BrokenPipeError: a pipe's reader is gone", file=sys.stderr)
        return ExitCode.FAILURE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an unexpected OS error: a clear line, exit 1
        if (in_the_way := _in_the_way(exc)) is not None:  # as StoreDirectoryError is, from an open
            print(f"mqstore {args.command}: {in_the_way}", file=sys.stderr)
            return ExitCode.NOT_A_STORE
        if args.command in READ_ONLY_COMMANDS and isinstance(exc, OSError) and _unreadable(exc):
            # One place for every file a read tool opens (review 122 F6: a bare PermissionError).
            sys.stdout.flush()
            print(f"mqstore {args.command}: {unreadable_file(exc.filename, exc)}", file=sys.stderr)
            return ExitCode.FAILURE
        # The traceback only with -vv: no traceback leaves a command otherwise (issue 19).
        if args.verbose >= 2:
            log.exception("command failed", command=args.command)
        print(f"mqstore {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ExitCode.FAILURE


def _unreadable(exc: BaseException | None) -> TypeGuard[OSError]:
    """A file of the store that is there and that this process may not read now."""
    return isinstance(exc, OSError) and exc.errno in _UNREADABLE_ERRNOS and isinstance(exc.filename, str)


def _in_the_way(exc: BaseException) -> str | None:
    """What a command met where one of the store's files belongs (a directory, a FIFO, socket
    or device, a dangling symbolic link), said as an open's refusal says it; None for another
    error. Read-only commands read files as they find them and fail at the first such one."""
    path = getattr(exc, "filename", None)
    if not isinstance(path, str):
        return None
    if isinstance(exc, IsADirectoryError):
        kind = "a directory"
    elif isinstance(exc, NotARegularFileError):
        kind = "not a regular file (a FIFO, socket or device)"
    elif isinstance(exc, FileNotFoundError) and os.path.islink(path):
        kind = f"a symbolic link to {os.readlink(path)}, which does not exist"
    else:
        return None
    return f"{path} is {kind} where the store keeps one of its files; move it aside and start again"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqstore",
        description="An embedded message store byte-compatible with Apache RocketMQ 4.x.",
        epilog="Exit codes: 0 ok, 1 failure, 2 usage, 3 corrupt data found, "
        "4 store locked by a running process, 5 not a store or missing directory.",
    )
    parser.add_argument("--version", action="version", version=f"mqstore {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line on stderr")
    parser.add_argument(
        "--config", metavar="FILE", type=Path, help="a TOML or RocketMQ .properties file of store settings"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _BUILTIN_COMMANDS:
        add(subparsers)
    _add_plugin_groups(subparsers)
    return parser


_JAVA_LONG_MAX: Final = 2**63 - 1  # offsets, times and counts are Java longs on disk


def non_negative(text: str) -> int:
    """An argparse type: an int >= 0 that a Java long holds."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    if value > _JAVA_LONG_MAX:  # (an OverflowError at the first C call: review 96 L5)
        raise argparse.ArgumentTypeError(f"{text} is past the largest offset or time, {_JAVA_LONG_MAX}")
    return value


def positive(text: str) -> int:
    """An argparse type: an int > 0 that a Java long holds."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


def store_path(text: str) -> Path:
    """A STORE_DIR argument: `~` expanded, as the settings' store_path_root_dir is (a quoted
    '~/dd' opened $HOME/dd in demo and was "does not exist" to inspect, review 94 L4)."""
    return Path(os.path.expanduser(text))


def load_config(args: argparse.Namespace, **overrides: Any) -> StoreConfig:
    """The store settings for a command: --config, MQSTORE_* variables, then `overrides`."""
    try:
        return StoreConfig.load(getattr(args, "config", None), overrides=overrides)
    except ConfigError as exc:
        raise CliError(ExitCode.USAGE, str(exc)) from None


def store_config(
    args: argparse.Namespace,
    root: Path,
    *,
    require_commitlog: bool = True,
    read_only: bool = True,
    diagnosing: bool = False,
    refuse_running_with: str | None = None,
    **overrides: Any,
) -> StoreConfig:
    """The settings of the store at `root` (--config, MQSTORE_* variables, `overrides`), with
    the geometry its files have: adopted where not given, exit 2 where contradicted. Exit 5
    if `root` or its commitlog directory (store_path_commitlog, else root/commitlog) is missing.
    Reads only. A `read_only` command on a store that did not stop cleanly says so on stderr
    and names `mqstore recover`: it reads what is valid and repairs nothing. One that reads only
    a stopped store gives `refuse_running_with`, its advice: exit 4 on a running one, before
    anything is said of it (review 94 L4: "reading what is valid now", then the refusal)."""
    from .storage.foreign import refuse_foreign_layout
    from .storage.fs import RealFileSystem
    from .storage.geometry import adopt_geometry
    from .storage.recovery import commitlog_gone, commitlog_not_this_stores, refuse_files_of_a_newer_mqstore
    from .supervisor import refuse_segments_named_past_the_largest_offset

    if not root.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} is not a directory")
    config = load_config(args, store_path_root_dir=str(root), **overrides)
    if config.store_path_commitlog and not os.path.isdir(config.commitlog_dir):
        # Every command alike (review 94 L4: inspect said damaged, stats 0, the others 5).
        raise CliError(ExitCode.NOT_A_STORE, f"the commitlog directory the settings name, {config.commitlog_dir}, "
                                             "is not a directory: is store_path_commitlog set right?")  # fmt: skip
    if not diagnosing and (require_commitlog or not read_only):
        # get, query, verify, recover, clean (not dump, stats or inspect, which show the files as
        # they are): a store written with a RocketMQ feature mqstore does not implement would be
        # misread (a tag filter over ConsumeQueueExt addresses, LMQ queues called damaged) or
        # changed. Exit 5 naming it (review 61).
        refuse_foreign_layout(config, RealFileSystem())
    if require_commitlog and not os.path.isdir(config.commitlog_dir):
        raise CliError(ExitCode.NOT_A_STORE, f"{root} has no commitlog directory ({config.commitlog_dir})")
    if os.path.isdir(config.commitlog_dir):  # before its names are read for the geometry
        refuse_segments_named_past_the_largest_offset(RealFileSystem(), config.commitlog_dir)
    # A newer mqstore's ledger or index progress: read without it, a command says nothing of
    # what it keeps (exit 5, as an open refuses it; review 62 H2, M1).
    refuse_files_of_a_newer_mqstore(config, RealFileSystem())
    if require_commitlog and read_only and not diagnosing:
        # A commitlog directory with no segment beside files that say the store held messages
        # (a mount not up, another store_path_commitlog): the open refuses it, and a read would
        # answer "no message" for every message the store holds (review 35 F6).
        gone = commitlog_gone(config, RealFileSystem())
        if gone is not None:
            raise CliError(ExitCode.NOT_A_STORE, f"the commitlog directory {config.commitlog_dir} holds no segment, "
                                                 f"but {gone}: is it the store's (store_path_commitlog)?")  # fmt: skip
        # Another log there (review 45 F3/F6): every read would answer "no message".
        foreign = commitlog_not_this_stores(config, RealFileSystem())
        if foreign is not None:
            raise CliError(ExitCode.NOT_A_STORE, f"the commitlog directory {config.commitlog_dir} is not this "
                                                 f"store's: {foreign}; is store_path_commitlog set right?")  # fmt: skip
    if refuse_running_with is not None:
        refuse_running(root, config.commitlog_dir, refuse_running_with)
    running = store_running(root, config.commitlog_dir)
    try:
        config, _ = adopt_geometry(RealFileSystem(), config, live=running)
    except StoreGeometryAmbiguous as exc:
        if not diagnosing:
            raise CliError(ExitCode.USAGE, str(exc)) from None
        # inspect reads the segments by their own layout and reports the damage: what the
        # refusal of every other command points to.
        print(f"mqstore {getattr(args, 'command', '')}: {exc}", file=sys.stderr)
    except ConfigError as exc:
        raise CliError(ExitCode.USAGE, str(exc)) from None
    if read_only and os.path.exists(config.abort_path):
        if running:  # its abort file says only that (review 45 F4)
            print(f"mqstore {getattr(args, 'command', '')}: {root} is open in a running process: reading what is "
                  "valid now, changing nothing", file=sys.stderr)  # fmt: skip
        else:
            print(f"mqstore {getattr(args, 'command', '')}: {root} did not stop cleanly (abort file present): "
                  f"reading what is valid, changing nothing; run `mqstore recover {root}` to recover it",
                  file=sys.stderr)  # fmt: skip
    return config


def store_running(root: Path, commitlog_dir: str | os.PathLike[str]) -> bool:
    """Whether a live process holds the store at `root` (tools.inspect_cli.lock_state: only asks)."""
    from .tools.inspect_cli import lock_state  # (the tools import this module)

    return bool(lock_state(root, commitlog_dir)["held"])


def refuse_running(root: Path, commitlog_dir: str | os.PathLike[str], advice: str = "stop it first") -> None:
    """CliError(LOCKED) if a live process holds the store at `root`, asked as the read-only
    commands ask (lock_state: F_GETLK and a shared flock, both on read-only opens). A command
    that takes the lock asks first: a store running under another user has a lock file this
    one may not open to write, and that said only "PermissionError: …/lock" (review 65 F6)."""
    from .tools.inspect_cli import lock_state  # (the tools import this module)

    state = lock_state(root, commitlog_dir)
    if not state["held"]:
        return
    holder = f" (pid {state['holder_pid']})" if state.get("holder_pid") else ""
    if state.get("held_through"):  # the directory's flock, not the lock file's: as claim_directories says it
        directory = state["held_through"]
        raise CliError(ExitCode.LOCKED, f"{directory} is held by another store{holder} (its lock file was deleted, or "
                       f"the same directory, {os.path.realpath(directory)}, is reached through a link from another "
                       f"store's root); {advice}")  # fmt: skip
    raise CliError(ExitCode.LOCKED, f"the store is running{holder}: {root} is locked; {advice}")


def unreadable_file(path: str | os.PathLike[str], error: OSError, *, named: bool = True) -> str:
    """What a command says of a store file that is there but that this process cannot open or
    map now: not damage, and nothing `mqstore recover` repairs (review 65 F1: a segment the
    user may not read was called corrupt, or its messages absent). `named`: the text begins
    with the path (else with "cannot be read now", for a report that names it already)."""
    from .reads import retry_hint

    code = errno.errorcode.get(error.errno, f"errno {error.errno}") if error.errno is not None else type(error).__name__
    hint = retry_hint(error, who="the user running this command")
    text = f"cannot be read now ({code}: {error.strerror or error}): {hint}"
    return f"{os.fspath(path)} {text}" if named else text


def _add_plugin_groups(subparsers: Any) -> None:
    for name in PLUGIN_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                continue
            module = importlib.import_module(name)
        except ImportError as exc:  # e.g. pyspark is not installed: leave that group out
            log.debug("subcommand group unavailable", module=name, error=str(exc))
            continue
        module.add_subcommands(subparsers)


# ---------------------------------------------------------------------------------------------
# dump


def _add_dump(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dump",
        help="print a store's records as JSON lines (no running store needed)",
        description="Print the records of a store directory, ours or a RocketMQ broker's, one JSON "
        "object per line. Reads only; safe while a store is running. Stops at the first corrupt "
        "record with exit code 3, after printing every valid record before it, and at a segment it "
        "cannot read (no access, an I/O error: not damage) with exit code 1.",
    )
    p.add_argument("store_dir", metavar="STORE_DIR", type=store_path, help="the store root (holding commitlog/ ...)")
    p.add_argument(
        "--what",
        choices=("commitlog", "consumequeue", "index", "checkpoint"),
        default="commitlog",
        help="which files to dump (default: commitlog)",
    )
    p.add_argument("--commitlog-dir", type=Path, help="the commitlog directory if not STORE_DIR/commitlog")
    p.add_argument("--topic", help="consumequeue: only this topic")
    p.add_argument("--queue-id", type=non_negative, help="consumequeue: only this queue")
    p.add_argument(
        "--max-hash-slot-num", type=positive, default=None, help="index: slots per file (default: the configured value)"
    )
    p.add_argument(
        "--max-message-size-bytes",
        type=positive,
        default=None,
        help="commitlog: records larger than this and than a segment are corrupt (default: the configured value)",
    )
    p.set_defaults(handler=_run_dump)


def _run_dump(args: argparse.Namespace) -> int:
    root: Path = args.store_dir
    if not root.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{root} is not a directory")
    out = sys.stdout
    config = store_config(args, root, require_commitlog=False)
    # A running store's newest files may be ones it is making (review 53 L1): not damage.
    live = store_running(root, config.commitlog_dir)
    if args.what == "commitlog":
        # The settings' commitlog where they name one (review 94 L4: ROOT/commitlog was read).
        named = Path(config.commitlog_dir) if config.store_path_commitlog else None
        if named is not None and args.commitlog_dir is None and not named.is_dir():
            raise CliError(ExitCode.NOT_A_STORE, f"{root} has no commitlog directory ({named})")
        directory = args.commitlog_dir or named or _commitlog_dir_of(root)
        live = live if args.commitlog_dir is None else store_running(root, directory)
        rows = dump_commitlog(directory, max_message_size_bytes=args.max_message_size_bytes or config.max_message_size_bytes,
                              segment_size=config.mapped_file_size_commitlog_bytes, live=live)  # fmt: skip
    elif args.what == "consumequeue":
        rows = dump_consume_queues(root / "consumequeue", topic=args.topic, queue_id=args.queue_id)
    elif args.what == "index":
        rows = dump_index(root / "index", max_hash_slot_num=args.max_hash_slot_num or config.max_hash_slot_num,
                          max_index_num=config.max_index_num, live=live)  # fmt: skip
    else:
        rows = dump_checkpoint(root / "checkpoint")
    count = _write_json_lines(rows, out)
    log.info("dump finished", what=args.what, records=count)
    return ExitCode.OK


def _commitlog_dir_of(root: Path) -> Path:
    if (root / "commitlog").is_dir():
        return root / "commitlog"
    if any(_SEGMENT_NAME.match(p.name) for p in root.iterdir()):
        return root  # given the commitlog directory itself
    raise CliError(ExitCode.NOT_A_STORE, f"{root} has no commitlog/ directory")


def json_line(row: dict[str, Any]) -> str:
    """One JSON line for stdout: non-ASCII as is where stdout is UTF-8, else escaped (`\\u043a`,
    valid JSON whatever the encoding: a latin-1 or ASCII stdout failed at the first such key,
    review 94 L2)."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return json.dumps(row, ensure_ascii=encoding != "utf8") + "\n"


def _write_json_lines(rows: Iterator[dict[str, Any]], out: IO[str]) -> int:
    count = 0
    for row in rows:
        out.write(json_line(row))
        count += 1
    out.flush()
    return count


_SEGMENT_NAME: Final = re.compile(r"\A\d{20}\Z")


def segment_layout(directory: Path, prefer: int | None = None) -> tuple[list[Path], int]:
    """Every entry of a commitlog directory named as a segment, in offset order, regular file
    or not (the scan lists them all: a tool that left one out met its offsets with no file to
    name), and the segment size (`storage.commitlog.segment_size_of`: from the names, so one
    damaged file does not redefine it; `prefer`, the store's own, where the files allow it as
    well as any other)."""
    entries = sorted((p for p in directory.iterdir() if _SEGMENT_NAME.match(p.name)), key=lambda p: p.name)
    past = named_past_the_largest_offset(str(directory), [p.name for p in entries])
    if past is not None:  # (dump --commitlog-dir: a directory store_config did not look at)
        raise StoreDirectoryError(past)
    return entries, segment_size_in(RealFileSystem(), str(directory), [p.name for p in entries], prefer)


def commitlog_row(rec: MessageRecord) -> dict[str, Any]:
    """The dump's view of one message; the field set is part of the CLI's contract."""
    return {
        "topic": rec.topic,
        "queue_id": rec.queue_id,
        "queue_offset": rec.queue_offset,
        "commitlog_offset": rec.commitlog_offset,
        "size": rec.total_size,
        "store_timestamp": rec.store_timestamp,
        "born_timestamp": rec.born_timestamp,
        "born_host": str(rec.born_host),
        "store_host": str(rec.store_host),
        "sys_flag": rec.sys_flag,
        "flag": rec.flag,
        "reconsume_times": rec.reconsume_times,
        "tags": rec.tags,
        "keys": rec.keys,
        "properties": rec.properties,
        "body_base64": base64.b64encode(rec.body).decode("ascii"),
        "msg_id": rec.msg_id,
        "tags_code": rec.tags_code(),
    }


def dump_commitlog(
    directory: Path, *, max_message_size_bytes: int, segment_size: int | None = None, live: bool = False
) -> Iterator[dict[str, Any]]:
    """Every message of a commitlog directory, in offset order; CliError(CORRUPT) at bad data.

    The segment size is the segments' own length (`segment_layout`), so a broker's directory
    with any segment size reads as well as ours. A blank END_OF_FILE record moves on to the next file; unwritten
    (zero) space ends the log, and later files (pre-allocated ones) must then be unwritten too.
    `live`: a running store writes the directory (see `scan_commitlog_dir`).
    """
    if not directory.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{directory} is not a directory")
    files, segment_size = segment_layout(directory, segment_size)
    # (one removed since the listing, by a running store's cleaner, is no longer the log's: review 53 M3)
    files = [path for path in files if os.path.lexists(path)]
    if not files:
        return
    for path in files:
        if not path.is_file() and os.path.lexists(path):
            raise CliError(ExitCode.NOT_A_STORE, f"{path} is in the way: a commitlog segment file belongs there")
    if segment_size == 0 and live and len(files) == 1:
        return  # a new store's first segment, being made (see scan_commitlog_dir)
    if segment_size == 0:  # a lone segment, emptied: no RocketMQ store has one
        raise CliError(ExitCode.CORRUPT, f"{files[0]} is 0 bytes: a commitlog segment is never empty")
    starts = [int(p.name) for p in files]
    for k, start in enumerate(starts):
        if start != starts[0] + k * segment_size:
            raise CliError(ExitCode.CORRUPT, f"{files[k]}: expected a segment starting at {starts[0] + k * segment_size}")

    def file_of(offset: int) -> Path:
        return files[bisect.bisect_right(starts, offset) - 1]

    def unreadable(path: str, error: OSError) -> None:
        raise CliError(ExitCode.FAILURE, f"{unreadable_file(path, error)}; nothing after it was printed")

    ended_in: Path | None = None
    scan = scan_commitlog_dir(
        str(directory), check_crc=True, segment_size=segment_size, max_message_size=max_message_size_bytes, live=live,
        on_unreadable=unreadable,
    )  # fmt: skip
    with contextlib.closing(scan):
        for found in scan:
            path = file_of(found.offset)
            if ended_in is not None and found.kind is not RecordKind.END_OF_DATA:
                raise CliError(ExitCode.CORRUPT, f"{path} holds data although the log ended in {ended_in}")
            if found.kind is RecordKind.MESSAGE:
                assert found.record is not None
                yield commitlog_row(found.record)
            elif found.kind is RecordKind.END_OF_DATA:
                ended_in = path
            elif found.kind is RecordKind.CORRUPT:
                position = found.offset - int(path.name)
                raise CliError(
                    ExitCode.CORRUPT,
                    f"corrupt record in {path} at file position {position} "
                    f"(commitlog offset {found.offset}): {found.reason}",
                )


def dump_consume_queues(
    directory: Path, *, topic: str | None = None, queue_id: int | None = None
) -> Iterator[dict[str, Any]]:
    """Every valid 20-byte unit of every (or the chosen) consume queue (§9.1)."""
    if not directory.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{directory} is not a directory")
    fs = RealFileSystem()
    for queue_topic, queue_no in list_consume_queues(str(directory), fs):
        if (topic is not None and queue_topic != topic) or (queue_id is not None and queue_no != queue_id):
            continue
        for queue_offset, commitlog_offset, size, tags in iter_cq_units(str(directory / queue_topic / str(queue_no)), fs):
            yield {
                "topic": queue_topic,
                "queue_id": queue_no,
                "queue_offset": queue_offset,
                "commitlog_offset": commitlog_offset,
                "size": size,
                "tags_code": tags,
            }


_INDEX_NAME: Final = re.compile(r"\A\d{17}\Z")


def dump_index(
    directory: Path, *, max_hash_slot_num: int, max_index_num: int | None = None, live: bool = False
) -> Iterator[dict[str, Any]]:
    """Each index file's header, then its entries 1 .. indexCount-1 (§10.2, §10.4). `live`: a
    running store writes the directory; its newest file, shorter than the geometry's
    (`max_index_num` given), is one being made and holds nothing yet."""
    if not directory.is_dir():
        raise CliError(ExitCode.NOT_A_STORE, f"{directory} is not a directory")
    fs = RealFileSystem()
    paths = sorted(p for p in directory.iterdir() if _INDEX_NAME.match(p.name))
    for path in paths:
        if live and max_index_num is not None and _being_made(path, paths[-1], index_file_size(max_hash_slot_num, max_index_num)):
            continue
        try:
            index_file = IndexFile.open_readonly(fs, str(path), max_hash_slot_num=max_hash_slot_num)
        except ValueError as exc:
            raise CliError(ExitCode.CORRUPT, f"{exc} (is --max-hash-slot-num right?)") from None
        try:
            header = index_file.header()
            yield {"file": path.name, "kind": "header", **dataclasses.asdict(header)}
            if header.index_count > index_file.max_index_num:
                raise CliError(
                    ExitCode.CORRUPT,
                    f"{path}: index_count {header.index_count} exceeds the file's {index_file.max_index_num} entries",
                )
            for entry in index_file.iter_entries():
                yield {
                    "file": path.name,
                    "kind": "entry",
                    "index": entry.entry_no,
                    "key_hash": entry.key_hash,
                    "commitlog_offset": entry.phy_offset,
                    "time_diff_s": entry.time_diff,
                    "prev_index": entry.prev_index,
                }
        finally:
            index_file.close()


def _being_made(path: Path, newest: Path, file_size: int) -> bool:
    """`storage.commitlog.being_created` for a listed file (one gone since: not)."""
    try:
        return being_created(path.name, newest.name, path.stat().st_size, file_size)
    except FileNotFoundError:
        return False


_CHECKPOINT_LONGS_BYTES: Final = 24


def dump_checkpoint(path: Path) -> Iterator[dict[str, Any]]:
    """The timestamps of the checkpoint file (§11.1) and the values derived from them."""
    if not path.exists():
        raise CliError(ExitCode.NOT_A_STORE, f"{path} does not exist")
    if not path.is_file():  # read without blocking: a FIFO would hold the command for good
        raise CliError(ExitCode.CORRUPT, f"{path} is not a regular file (a directory, FIFO, socket or device?)")
    file_size = path.stat().st_size
    if file_size < _CHECKPOINT_LONGS_BYTES:
        raise CliError(ExitCode.CORRUPT, f"{path} is {file_size} bytes, shorter than the 3 longs of a checkpoint")
    values = read_checkpoint(RealFileSystem(), str(path))
    yield {
        **dataclasses.asdict(values),
        "min_timestamp": values.min_timestamp(),
        "min_timestamp_index": values.min_timestamp_index(),
        "file_size": file_size,
    }


# ---------------------------------------------------------------------------------------------
# Built-in commands, in the order `mqstore --help` lists them. The lead adds demo, recover,
# verify, inspect, stats, get and query here, each as an `_add_<name>(subparsers)` function that
# sets `handler=`; handlers raise CliError with ExitCode.LOCKED / NOT_A_STORE / CORRUPT.

_BUILTIN_COMMANDS: Final[list[Callable[[Any], None]]] = [
    _add_dump,
]


if __name__ == "__main__":
    sys.exit(main())
