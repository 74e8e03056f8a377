"""The supervision tree: start in dependency order, stop in reverse, restart what failed.

The tree is data (`TREE`). A failed child is restarted together with its dependents
(Erlang's rest_for_one, narrowed to the children that really read its output); the others
restart alone. More than `MAX_RESTARTS` restarts of the file owners within `RESTART_PERIOD_MS`
means the fault is not transient (a full disk, a broken file): the supervisor then stops every child
cleanly, keeps the abort file so the next start recovers, and tells the host through
`on_fatal`. The actor API (the gateway, `OWNS_NO_FILES`) is restarted for as long as the
store runs, with the same back-off. One thread does all of it and also drives the periodic services (the ticker):
each child's `Tick` at its interval, and every TICK_HOOK_INTERVAL_MS the store's tick hooks
(`ActorContext.on_tick_ms`: StoreStats sampling, the stats snapshot). A hook that raises is
logged (at most once a minute per hook) and never ends the thread.

It never stops pykka's global registry, never interrupts the main thread, and runs on a
daemon thread, so a host that forgets `close()` still exits (acknowledged data is already in
the page cache or on disk, so nothing acknowledged is lost).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import errno
import importlib
import importlib.util
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Final, TypeVar

import pykka

from .actors.allocator import AllocateMappedFileService
from .actors.base import ActorContext, ChildFailed, real_sleep_ms
from .actors.commit import CommitRealTimeService
from .actors.commitlog_writer import CommitLogWriter
from .actors.consume_queue import ConsumeQueueService
from .actors.flush import FlushCommitLogService
from .actors.gateway import StoreBackend, StoreGateway
from .actors.index import IndexActor
from .actors.reput import ReputMessageService
from .config import StoreConfig
from .errors import StoreDiskFullError
from .faults import NO_FAULTS, FaultPlan
from .log import RepeatedLog, error_repr, get_logger, suppressed_fields
from .messages import (
    AskFor,
    AwaitDispatched,
    GetCommitLogRecovery,
    GetIndexSnapshot,
    GetLogFacts,
    GetQueueSnapshot,
    GetReputStatus,
    ReputStatus,
    GetWriterStatus,
    FlushAll,
    Ping,
    Reply,
    ResumeQueues,
    SetWriteable,
    Tick,
    Waiter,
)
from .storage import codec, mapguard
from .waits import DoneFlag, StoreThread
from .storage.disk import DiskGauge, default_disk_gauge
from .storage.fs import (
    OUT_OF_RESOURCES_ERRNOS, FileSystem, FileWithoutRoomUnderMapError, RealFileSystem, no_room_cause,
    not_writable_cause,
)
from .storage.foreign import ForeignStoreError
from .storage.lockfiles import AbortFile, StoreDirectoryError, StoreLock, refuse_unless_regular_file
from .storage.checkpoint import CheckpointValues, create_checkpoint_file, read_checkpoint
from .storage.commitlog import store_copies, store_copy_problem
from .storage.mapped_file_queue import named_past_the_largest_offset
from .storage.recovery import (
    IndexRecovery,
    RecoveryMode,
    RecoveryReport,
    assemble_report,
    check_geometry,
    mode_at_open,
    recover_index,
)
from .read_view import INDEX, QUEUES, ReadView
from .runtime import StoreFuture, ask, send_unsent
from .stats import SNAPSHOT_FILE_NAME, store_files_cut_under_map
from .ticker import RealTicker, Ticker

R = TypeVar("R")

__all__ = ["Supervisor", "SupervisorState", "ChildSpec", "TREE", "MAX_RESTARTS", "RESTART_PERIOD_MS", "OWNS_NO_FILES"]

MAX_RESTARTS = 10
KEPT_RESTART_RECORDS: Final = 1000
RESTART_PERIOD_MS = 60_000
# The actor API owns no file and serves the host's own actors: requests that keep crashing it
# (a client's bug) restart it with back-off as long as the store runs, and never count
# against the budget of the actors that own the store's files (review 44 H1: eleven bad
# requests in a minute stopped the whole store).
OWNS_NO_FILES = frozenset({"gateway"})
BACKOFF_FIRST_MS = 10
BACKOFF_MAX_MS = 1_000
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# A wait that timed out is given this much more before it counts: a process paused (SIGSTOP,
# docker pause, a suspended VM) or a host thread holding the GIL for seconds runs the clock
# and not the actor, whose answer then comes a moment after the resume (review 78: a pause
# during a restart gave the store up as "did not stop within 10 s"; one during an open left
# it failed).
PAUSE_GRACE_S = 1.0
# A shortage of threads or descriptors is not counted against the restart budget for this long
# (review 76: a few seconds of it gave the store up); one that lasts longer is a broken actor or
# a limit below what the store needs, counted again (review 79: never counted, an open retried
# for ever and a running store restarted an owner for ever, unseen).
RESOURCE_SHORTAGE_MAX_MS = 60_000
DISPATCH_CATCH_UP_TIMEOUT_MS = 5_000
FAILURE_CHECK_S = 0.1  # how often the open's wait for re-dispatch looks for a crashed child
TICK_HOOK_INTERVAL_MS = 1_000  # StoreStatsService samples once a second (§16)
HOOK_FAILURE_LOG_INTERVAL_MS = 60_000  # a hook failing every second is logged once a minute (with a count)
_HOOKS = "\0hooks"  # the tick hooks' slot in the ticker's due table (no child has this name)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str
    dependents: tuple[str, ...]  # restarted with this child
    tick_interval_ms: Callable[[StoreConfig], int | None] = lambda _: None
    enabled: Callable[[StoreConfig], bool] = lambda _: True


def _flush_tick(cfg: StoreConfig) -> int:
    # Group commit checks deadlines often; async flush wakes at its interval.
    return 10 if cfg.flush_disk_type == "SYNC_FLUSH" else cfg.flush_interval_commitlog_ms


def _cleaner_available() -> bool:
    return importlib.util.find_spec("mqstore.actors.cleaner") is not None


def _transient_pool(cfg: StoreConfig) -> bool:
    return cfg.transient_store_pool_enable and cfg.flush_disk_type == "ASYNC_FLUSH" and cfg.broker_role != "SLAVE"


# Start order is tuple order: each child's facts come from those before it. Each owner
# recovers its own files in on_start, on the first start and on every restart alike: the
# writer its log (the others' recovery needs the log's end), the index its files, the
# ConsumeQueue actor its queues (the re-dispatch start counts what the index needs); then the
# writer, told the queues' offsets (ResumeQueues), takes puts, and reput dispatches the rest.
TREE: tuple[ChildSpec, ...] = (
    # Not restarted with the writer: its files made ahead have no name until the writer takes
    # one, so a restarted writer's recovery cannot delete them (it once did: the allocator then
    # restarted with it), and a new writer beside an allocator stalled in a file creation shares
    # nothing with it (review 80 F2: restarting it gave the store up when it did not stop).
    ChildSpec("allocator", ()),
    ChildSpec("writer", ("commit", "reput"), lambda c: c.flush_interval_commitlog_ms),
    ChildSpec("flush", (), _flush_tick),
    # Ticks retry dispatch that waits for disk space.
    ChildSpec("index", ("reput",), lambda c: c.flush_interval_consume_queue_ms, enabled=lambda c: c.message_index_enable),
    ChildSpec("consume_queue", ("reput",), lambda c: c.flush_interval_consume_queue_ms),
    ChildSpec("commit", (), lambda c: c.commit_interval_commitlog_ms, enabled=_transient_pool),
    ChildSpec("reput", (), lambda _: 100),
    ChildSpec("cleaner", (), lambda c: c.clean_resource_interval_ms, enabled=lambda _: _cleaner_available()),
    # The actor API (store.actor_ref), last: it reaches every other actor. Only with a store
    # behind it (a Supervisor run alone has no gateway).
    ChildSpec("gateway", ()),
)


def _disk_full_or(exc: OSError, path: str, what: str) -> OSError:
    """The open's one error for a full disk (StoreDiskFullError naming the file); any other
    OSError as it was."""
    if isinstance(exc, StoreDiskFullError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    return StoreDiskFullError(path, what)


def refuse_a_dangling_link(fs: FileSystem, path: str, what: str) -> None:
    """StoreDirectoryError for a symbolic link to nothing where a store directory belongs (the
    mount it points into not up): it passed the checks, which follow links, and the open or
    `recover` failed on a bare FileExistsError, `recover` after it had changed the queues
    (review 54 M1)."""
    if os.path.islink(path) and not fs.exists(path):
        raise StoreDirectoryError(f"{path}, the {what}, is a symbolic link to {os.readlink(path)}, which does not exist "
                                  "(a mount that is not up?): make it reachable, then open the store")  # fmt: skip


def refuse_what_is_in_the_way(fs: FileSystem, cfg: StoreConfig) -> None:
    """StoreDirectoryError, before anything is made, for a file where one of the store's
    directories belongs, or anything but a regular file where one of its files (or their
    temporary files) belongs (the store does not guess what they are; a bare FileExistsError
    or IsADirectoryError said less, and a FIFO hung the open), a file the store writes in
    place that is shared with another name, or a leftover copy of a replaced segment."""
    refuse_odd_files(fs, cfg)
    refuse_a_directory_inside_another_store(fs, cfg)
    for path in (cfg.checkpoint_path, cfg.lock_path):
        _refuse_if_shared(fs, path)
    # A marker first: a `.store-copy-none` may be a second name of the file it is about, and
    # the hard-link refusal's "move the link aside" would lose what it says.
    _refuse_an_unsettled_store_copy(fs, cfg)
    _refuse_what_is_in_the_way_of_segments(fs, cfg)


def _store_directories(cfg: StoreConfig) -> tuple[tuple[str, str], ...]:
    """(path, what it is) of the store's root, then of its data directories."""
    return ((cfg.store_path_root_dir, "store directory"), (cfg.commitlog_dir, "commitlog directory"),
            (cfg.consume_queue_dir, "consumequeue directory"), (cfg.index_dir, "index directory"),
            (cfg.config_dir, "config directory"))  # fmt: skip


def refuse_odd_files(fs: FileSystem, cfg: StoreConfig) -> None:
    """The first checks of `refuse_what_is_in_the_way` (also `mqstore inspect`'s): a commitlog
    directory inside another of the store's, a file where a directory belongs, anything but a
    regular file where a file belongs."""
    refuse_a_commitlog_inside_another_directory(cfg)
    for path, what in _store_directories(cfg):
        refuse_a_dangling_link(fs, path, what)
        if fs.exists(path) and not fs.isdir(path):
            raise StoreDirectoryError(f"{path} is a file where the {what} belongs; move it aside and start again")
    snapshot = os.path.join(cfg.store_path_root_dir, SNAPSHOT_FILE_NAME)
    for path, what in ((cfg.checkpoint_path, "checkpoint"), (cfg.lock_path, "lock file"), (cfg.abort_path, "abort marker"),
                       (cfg.queue_ledger_path, "queue ledger"), (cfg.index_progress_path, "index progress"),
                       (snapshot, "stats snapshot")):  # fmt: skip
        refuse_unless_regular_file(fs, path, what)
        refuse_unless_regular_file(fs, path + ".tmp", f"{what}'s temporary file")


def refuse_a_commitlog_inside_another_directory(cfg: StoreConfig) -> None:
    """StoreDirectoryError when `store_path_commitlog` is (or, through links, resolves to) a
    directory inside the store's consumequeue, index or config directory: each of those
    lists, names and deletes its own entries there (queue files have the 20-digit names of
    segments), so one took the log's segments for its files (review 116 F2: inside
    consumequeue/T/0 a queue's writer wrote over acknowledged records; inside consumequeue/U/0
    the next open set the segments aside, 0 of 600 served). Refused before anything is made;
    the same directory as one of them is refused when the directories are claimed."""
    commitlog = os.path.realpath(cfg.commitlog_dir)
    for what, path in (("consumequeue", cfg.consume_queue_dir), ("index", cfg.index_dir), ("config", cfg.config_dir)):
        other = os.path.realpath(path)
        if commitlog.startswith(other.rstrip(os.sep) + os.sep):
            raise StoreDirectoryError(
                f"the commitlog directory {cfg.commitlog_dir} (store_path_commitlog) is inside the store's {what} "
                f"directory {path}, which lists and deletes its own files there: give the commitlog a directory of "
                "its own, outside it"
            )


# The directories of a store's root that it lists, names and deletes its own files in.
_A_STORES_OWN_DIRECTORIES = ("commitlog", "consumequeue", "index", "config")


def _another_stores_root(fs: FileSystem, path: str) -> bool:
    """Whether `path` is the root of a store (its checkpoint and its log or queues there)."""
    return fs.isfile(os.path.join(path, "checkpoint")) and (
        fs.isdir(os.path.join(path, "commitlog")) or fs.isdir(os.path.join(path, "consumequeue"))
    )


def refuse_a_directory_inside_another_store(fs: FileSystem, cfg: StoreConfig) -> None:
    """StoreDirectoryError, before anything is made, when the store's root or one of its
    directories is another store's root or lies inside one of that store's own directories
    (its commitlog, consumequeue, index or config): this store's files would be written among
    that store's, which lists, rebuilds and deletes what it finds there (review 130 F2: a new
    store whose store_path_commitlog was another's consumequeue/t/0 opened, wrote its record
    over that queue's units, and recovery deleted two of its files; F3: a root inside another's
    consumequeue put a checkpoint there, and that store no longer opened). The lock claims only
    the other store's top directories, not what lies below them."""
    own = os.path.realpath(cfg.store_path_root_dir)
    for path, what in _store_directories(cfg):
        real = os.path.realpath(path)
        inside: list[str] = []
        at = real
        while True:
            if at != own and _another_stores_root(fs, at):
                if not inside:
                    raise StoreDirectoryError(f"the {what} {path} is another store's root ({at}): give this store "
                                              "directories of its own")  # fmt: skip
                if inside[-1] in _A_STORES_OWN_DIRECTORIES:
                    raise StoreDirectoryError(
                        f"the {what} {path} is inside the {inside[-1]} directory of another store ({at}), which "
                        "lists, rebuilds and deletes its own files there: give this store directories of its own, "
                        "outside it"
                    )
            parent = os.path.dirname(at)
            if parent == at:
                break
            inside.append(os.path.basename(at))
            at = parent
    if fs.isfile(cfg.checkpoint_path):
        return  # (a store that was opened before: what it holds is its own)
    # A new store made around another (review 133 F2): that store, inside one of this one's
    # directories, no longer opened, and this one's recovery and cleaning would walk its files.
    for path, what in _store_directories(cfg)[1:]:  # (the data directories, not the root)
        if (below := _a_store_below(fs, path, _STORE_BELOW_DEPTH)) is not None:
            raise StoreDirectoryError(f"another store's root ({below}) is inside the {what} {path} of this new store: "
                                      "give this store directories of its own")  # fmt: skip
    # A new root that is a commitlog directory, another store's store_path_commitlog (review
    # 133 F3): segments are there already.
    root = cfg.store_path_root_dir
    if os.path.realpath(cfg.commitlog_dir) != own and fs.isdir(root):
        segments = sorted(n for n in fs.listdir(root) if len(n) == 20 and n.isdigit())
        if segments:
            raise StoreDirectoryError(f"the store directory {root} of this new store holds files named as commitlog "
                                      f"segments ({segments[0]}, ...): it is a commitlog directory (another store's "
                                      "store_path_commitlog?); give this store a directory of its own")  # fmt: skip


# How deep below a new store's directories another store's root is looked for: a queue's
# directory is two levels down (consumequeue/<topic>/<queue>), a root inside it one more.
_STORE_BELOW_DEPTH = 3


def _a_store_below(fs: FileSystem, path: str, depth: int) -> str | None:
    """A store's root at most `depth` directories below `path` (`path` itself not counted)."""
    level = [path]
    for _ in range(depth):
        below: list[str] = []
        for directory in level:
            try:
                subdirectories = _subdirectories(fs, directory)
            except OSError:
                continue
            for child in subdirectories:
                if _another_stores_root(fs, child):
                    return child
                below.append(child)
        level = below
    return None


def _subdirectories(fs: FileSystem, directory: str) -> list[str]:
    """The directories in `directory`, links left out. On real files by the directory's own
    entry types, not a stat per name (review 134 F3: ~0.9 s for 64k queue files); by name
    never (review 135 M1: a store's root named as a segment, a date, was skipped)."""
    if isinstance(fs, RealFileSystem):
        with os.scandir(directory) as entries:
            return [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
    children = (os.path.join(directory, name) for name in fs.listdir(directory))
    return [child for child in children if fs.isdir(child) and not os.path.islink(child)]


def _refuse_an_unsettled_store_copy(fs: FileSystem, cfg: StoreConfig) -> None:
    """StoreDirectoryError while a segment's `.store-copy` is in the commitlog directory: the
    last run saved its own bytes of a segment another process replaced. Opened as it is, the
    store would give the acknowledged records only the copy holds' offsets to new puts; which
    file is the segment is the owner's choice, not the store's."""
    copies = store_copies(fs, cfg.commitlog_dir)
    if copies:
        raise StoreDirectoryError(f"{store_copy_problem(os.path.join(cfg.commitlog_dir, copies[0]))}, then open again")


def data_directories(cfg: StoreConfig) -> tuple[str, ...]:
    """The directories a store writes into beside its root (`StoreLock.claim_directories`)."""
    return (cfg.commitlog_dir, cfg.consume_queue_dir, cfg.index_dir, cfg.config_dir)


def _refuse_if_shared(fs: FileSystem, path: str) -> None:
    """StoreDirectoryError for a file the store writes in place (a commitlog segment, a
    ConsumeQueue or index file, the checkpoint, the lock) that is a symbolic link or has
    other hard links: its writes would land in the other name's file too. A hard-linked copy
    (`cp -al`, rsync --link-dest) shares every segment with its original, so the next put
    in either overwrote what the other had acknowledged; a `lock` linked to a segment had its
    first record overwritten by the lock's bytes. Files replaced whole (write_atomic: a link
    is replaced, not written through) are not refused."""
    if (why := fs.shared_with(path)) is not None:
        raise StoreDirectoryError(
            f"{path} is {why}: the store writes its files in place and would change the other file too "
            "(a hard-linked copy such as `cp -al` shares them); copy the store with `cp -a`, or move the "
            "link aside, and start again"
        )


def _refuse_what_is_in_the_way_of_segments(fs: FileSystem, cfg: StoreConfig) -> None:
    """The same for a directory named as a segment or index file, and a file where a topic's or
    a queue's ConsumeQueue directory belongs; and each segment, index and ConsumeQueue file
    that is a link (`_refuse_if_shared`). Before, they failed the open with a bare OSError,
    or after seconds of ConsumeQueue restarts, or (a later segment) only once the writer got
    there. Entries not named as the store names its files are left alone, as loading does."""

    def refuse(path: str, what: str) -> None:
        raise StoreDirectoryError(f"{path} is in the way: {what} belongs there; move it aside and start again")

    def segment_dirs(directory: str, width: int, what: str) -> None:
        for name in fs.listdir(directory):
            # A directory, or a FIFO, socket or device (reading a FIFO blocks for good).
            if len(name) == width and name.isdigit():
                if not fs.isfile(os.path.join(directory, name)):
                    refuse(os.path.join(directory, name), what)
                _refuse_if_shared(fs, os.path.join(directory, name))

    if fs.isdir(cfg.commitlog_dir):
        segment_dirs(cfg.commitlog_dir, 20, "a commitlog segment file")
        refuse_segments_named_past_the_largest_offset(fs, cfg.commitlog_dir)
    if fs.isdir(cfg.index_dir):
        segment_dirs(cfg.index_dir, 17, "an index file")
    if not fs.isdir(cfg.consume_queue_dir):
        return
    for topic in fs.listdir(cfg.consume_queue_dir):
        if not codec.is_topic_name(topic):
            continue  # not a topic's directory: loading leaves it alone (review 30)
        topic_dir = os.path.join(cfg.consume_queue_dir, topic)
        if not fs.isdir(topic_dir):
            refuse(topic_dir, f"the ConsumeQueue directory of topic {topic}")
        _refuse_linked_directory(fs, topic_dir, f"topic {topic}")
        for name in fs.listdir(topic_dir):
            if not name.isdigit() or name != str(int(name)) or int(name) > 0x7FFFFFFF:
                continue  # not a queue id's own spelling: skipped by loading too
            queue_dir = os.path.join(topic_dir, name)
            if not fs.isdir(queue_dir):
                refuse(queue_dir, f"the ConsumeQueue directory of {topic}-{name}")
            _refuse_linked_directory(fs, queue_dir, f"{topic}-{name}")
            segment_dirs(queue_dir, 20, "a ConsumeQueue segment file")


def refuse_segments_named_past_the_largest_offset(fs: FileSystem, commitlog_dir: str) -> None:
    """StoreDirectoryError for a file in the commitlog directory named as a segment past Java's
    Long.MAX_VALUE: no log reaches it, and read as one it made the geometry, the scan and the
    recovery fail with bare errors (review 52 L1). The open, `recover` and the read-only
    commands refuse it alike."""
    past = named_past_the_largest_offset(commitlog_dir, fs.listdir(commitlog_dir))
    if past is not None:
        raise StoreDirectoryError(past)


def _refuse_linked_directory(fs: FileSystem, path: str, queue: str) -> None:
    """StoreDirectoryError for a topic's or a queue's ConsumeQueue directory that is a symbolic
    link: linked into another store, this store's puts wrote that store's queue files over the
    units of its acknowledged messages (review 28). Too many to hold each with a lock as the
    store's top directories are (`StoreLock.claim_directories`); those may be links."""
    if (why := fs.shared_with(path)) is not None:
        raise StoreDirectoryError(
            f"{path} is {why}: the ConsumeQueue directory of {queue} must be the store's own (linked into "
            "another store, this store's puts would write that store's queue files); link the whole "
            "consumequeue directory instead, or move the link aside, and start again"
        )


def _missing_directories(fs: FileSystem, path: str) -> list[str]:
    """The directories a makedirs of `path` would create, outermost first."""
    missing: list[str] = []
    at = os.path.abspath(path)
    while not fs.isdir(at) and os.path.dirname(at) != at:
        missing.append(at)
        at = os.path.dirname(at)
    return missing[::-1]


def _put_uncut(events: queue.Queue[Any], event: object) -> None:
    """`events.put(event)` from a caller's thread (close()), whatever exception is raised into
    it meanwhile (a Ctrl-C, a timeout library's PyThreadState_SetAsyncExc). Queue.put takes
    the queue's mutex in Condition.__enter__, Python code: an exception landing just after
    that left the mutex held for good, and the supervisor's thread, every later close() and
    the process's exit hung on it (review 29; masking the main thread's signals, the fix
    then, left other threads and a handler already pending exposed). Here the mutex is
    taken by a plain `with` (in C); an exception before the notify leaves the event queued,
    and the supervisor's thread finds it at its next wake (it always waits with a timeout
    on a real ticker)."""
    with events.mutex:
        events.queue.append(event)
        events.unfinished_tasks += 1
        events.not_empty.notify()


def _finished(stopped: pykka.Future[bool], timeout: float | None = 0) -> bool:
    """Whether an actor's stop has finished (its on_stop returned); waits up to `timeout`."""
    try:
        stopped.get(timeout=timeout)
    except pykka.Timeout:
        return False
    except Exception:  # ended otherwise (dead before the stop): it runs no more
        pass
    return True


def _is_resource_shortage(error: BaseException) -> bool:
    """The process is short of what an actor needs to start, not the actor broken: a thread
    (Thread.start's error under RLIMIT_NPROC, a pids cgroup, no memory for a stack: CPython
    raises it with exactly this text), descriptors (EMFILE, ENFILE: a restarted owner's
    files cannot be opened now, review 77 M1: 4.6 s of it gave the store up for good), or
    memory and map areas (ENOMEM, MemoryError: RLIMIT_AS, vm.max_map_count, the store's map
    share; review 90 M3: a writer restarted under a tight RLIMIT_AS with the transient store
    pool failed each time, and the store was given up for good within seconds)."""
    if isinstance(error, OSError):
        return error.errno in OUT_OF_RESOURCES_ERRNOS
    return isinstance(error, MemoryError) or (isinstance(error, RuntimeError) and str(error) == "can't start new thread")


def _is_dead(exc: BaseException) -> bool:
    return isinstance(exc, pykka.ActorDeadError)


class SupervisorState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"  # gave up after too many restarts


@dataclass
class RestartRecord:
    failed: str
    restarted: tuple[str, ...]
    error: str
    at_ms: int  # on the supervisor's ticker
    backoff_ms: int  # slept before this restart


class _Wake:
    """The ticker's time jumped (a manual ticker): recompute what is due."""


_WAKE = _Wake()


class _Stop:
    """Asks the supervisor's thread to shut the store down (its end is `Supervisor._shut_down`)."""


class Supervisor:
    def __init__(
        self,
        config: StoreConfig,
        *,
        fs: FileSystem | None = None,
        clock_ms: Callable[[], int] | None = None,
        faults: FaultPlan = NO_FAULTS,
        on_fatal: Callable[[BaseException], None] | None = None,
        disk_gauge: DiskGauge | None = None,
        cleaner_sleep_ms: Callable[[int], None] | None = None,
        backend: StoreBackend | None = None,
        ticker: Ticker | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.fs = fs or RealFileSystem()
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.ticker: Ticker = ticker or RealTicker()
        self.faults = faults
        self.on_fatal = on_fatal
        # Run on the supervisor's thread just before the store's lock is released, at a stop
        # or when it gives up (see _before_unlock).
        self.before_unlock: list[Callable[[], object]] = []
        # Children that did not stop within STOP_TIMEOUT_S: they may still write the store's
        # files, so the lock is kept until their threads end (_release_lock).
        self._stragglers: list[tuple[str, pykka.Future[bool]]] = []  # their stop futures
        # Stops asked and not seen to the end yet: a wait for one cut short leaves it here.
        self._stopping: list[tuple[str, pykka.Future[bool]]] = []
        self.lock_released = threading.Event()
        self.state = SupervisorState.NEW
        self.restarts: list[RestartRecord] = []  # the newest KEPT_RESTART_RECORDS (review 76 L2: ~340 B each, for good)
        self.restart_count = 0  # every restart since the start
        self._shortage_since: int | None = None  # (ticker ms) restarts failing for want of threads or descriptors
        self.recovery: RecoveryReport | None = None
        self._mode = RecoveryMode.CLEAN  # how the first start trusts the files (restarts: RESTART)
        self._checkpoint: CheckpointValues | None = None
        self.store_host = codec.HostAddress.parse(config.store_host)
        self._specs = [spec for spec in TREE if spec.enabled(config) and (spec.name != "gateway" or backend is not None)]
        self._events: queue.Queue[Any] = queue.Queue()
        # Set once the thread ran its shutdown (stop); waited on by close() in the caller's
        # thread, so no threading.Event (waits.DoneFlag).
        self._shut_down = DoneFlag()
        self.ctx = ActorContext(
            config=config,
            fs=self.fs,
            clock_ms=self.clock_ms,
            ticker=self.ticker,
            faults=faults,
            report=self._events.put,
            disk_gauge=disk_gauge or default_disk_gauge(self.fs),
            cleaner_sleep_ms=cleaner_sleep_ms or real_sleep_ms,
        )
        self._hook_failures = RepeatedLog(self.ticker.now_ms, HOOK_FAILURE_LOG_INTERVAL_MS)
        # Store files another process cut under our maps (the SIGBUS guard, storage/mapguard.py).
        self.files_cut_under_map: set[str] = set()
        self._cut_mark = self.fs.cut_mark()  # cuts of maps closed before this store are not its
        self._map_faults_seen = (self.fs.map_faults(), self._cut_mark)
        self._cut_lock = threading.Lock()  # the supervisor's tick and stats() callers
        self._lock: StoreLock | None = None
        self._abort: AbortFile | None = None
        self._thread: threading.Thread | None = None
        self._recent_failures: collections.deque[int] = collections.deque()
        self._recent_api_failures: collections.deque[int] = collections.deque()  # OWNS_NO_FILES
        self.fatal_error: BaseException | None = None
        self.log = get_logger("mqstore.supervisor", store=config.store_path_root_dir)

    # ---------------------------------------------------------------------------------------
    @property
    def peers(self) -> dict[str, pykka.ActorRef[Any]]:
        return self.ctx.peers

    @property
    def specs(self) -> tuple[ChildSpec, ...]:
        """The children this store runs (the tree, less what its settings leave out), in start
        order: a name missing from `peers` but here is being restarted."""
        return tuple(self._specs)

    def start(self) -> None:
        assert self.state is SupervisorState.NEW
        cfg = self.config
        refuse_what_is_in_the_way(self.fs, cfg)
        # The directories this open made, the root and its new parents too: a refused one
        # removes them, left empty (review 133 F3: one refused for its commitlog's content left
        # its new root behind; review 134 F4: `p/x` of a refused new `p/x/y` stayed).
        made_here = _missing_directories(self.fs, cfg.store_path_root_dir)
        try:
            self.fs.makedirs(cfg.store_path_root_dir)  # a directory takes a block on ext4
        except OSError as exc:
            # The parents made before the failure too (review 138 F2: a full disk at `p/x/y/z`
            # left `p`, `p/x` and `p/x/y`).
            self._remove_made(made_here)
            raise _disk_full_or(exc, cfg.store_path_root_dir, "the store directory") from exc
        self._lock = StoreLock(self.fs, cfg.lock_path)
        created_abort = False
        try:
            # Inside the try whose cleanup releases it: an exception raised into this thread
            # between the two left the lock held for the process's life (review 85 F4).
            try:
                self._lock.acquire()  # raises StoreLockedError if another process holds the store
            except OSError as exc:
                raise _disk_full_or(exc, cfg.lock_path, "the store's lock file") from exc
            self._abort = AbortFile(self.fs, cfg.abort_path)
            last_exit_ok = not self._abort.exists()
            self._mode = mode_at_open(last_exit_ok)
            try:  # a new store's directories take blocks on ext4
                made_now = (cfg.commitlog_dir, cfg.consume_queue_dir, cfg.index_dir)
                for path in made_now:
                    made_here.extend(_missing_directories(self.fs, path))
                    self.fs.makedirs(path)
                self._lock.claim_directories(made_now, made=True)
                self._lock.claim_directories([cfg.config_dir])
                # Refused before any owner changes a byte (settings that disagree with the files).
                check_geometry(cfg, self.fs)
                if self.fs.exists(cfg.checkpoint_path):
                    self._checkpoint = read_checkpoint(self.fs, cfg.checkpoint_path)
                # config/ once nothing refuses the open (a refused one leaves none behind), held
                # from here: claimed only where it existed, it was unheld for the session in
                # which a new store wrote its first consumer offsets (reviews 30, 32).
                if not self.fs.isdir(cfg.config_dir):
                    made_here.extend(_missing_directories(self.fs, cfg.config_dir))
                    self.fs.makedirs(cfg.config_dir)
                    self._lock.claim_directories([cfg.config_dir], made=True)
            except OSError as exc:
                raise _disk_full_or(exc, str(exc.filename or cfg.store_path_root_dir), "the store's files") from exc
            # Before the abort marker and the actors: a new store with no room for its
            # checkpoint is refused here, once, not by the flush actor failing to start
            # until the supervisor gives up.
            try:
                create_checkpoint_file(self.fs, cfg.checkpoint_path)
            except OSError as exc:
                raise _disk_full_or(exc, cfg.checkpoint_path, "the store's checkpoint") from exc
            try:
                self._abort.create()
            except OSError as exc:
                raise _disk_full_or(exc, cfg.abort_path, "the store's abort marker") from exc
            created_abort = last_exit_ok
            # Each owner recovers its files in on_start, in tree order (see TREE).
            for spec in self._specs:
                self._start_child(spec.name, first=True)
            self._await_rebuilt_restarting()
            self.recovery = self._recovery_report()
        except BaseException:
            try:
                all_stopped = self._stop_children(clean=False)
                if created_abort and self._abort is not None and all_stopped:
                    # Nothing ran: the marker would only make the next open recover a crash
                    # that did not happen. (One that was there before this open stays.)
                    try:
                        self._abort.remove()
                    except OSError as exc:
                        self.log.warning("abort marker not removed after a failed start", error=repr(exc))
                if all_stopped and self._lock is not None:
                    self._lock.drop_created_file()  # a refused open leaves no lock file of its own (review 61 L1)
                if all_stopped:
                    # Nor the directories it made, left empty (review 116 L1: an open refused for a
                    # commitlog kept elsewhere left an empty commitlog/ beside the store's files).
                    self._remove_made(made_here)
            finally:
                # Cut short too (a second exception raised into this thread): else the lock
                # stayed held for the process's life (review 85 F4). Children still running
                # keep it, through the lock keeper.
                self._release_lock()
            raise
        thread: StoreThread | None = None
        try:  # the rest of the start, guarded too: a store nobody can close keeps the lock (review 86 F2)
            self.state = SupervisorState.RUNNING
            self.ticker.on_advance(lambda: self._events.put(_WAKE))
            # Said before the thread starts: said after, an exception raised into this thread
            # in the log call left a running store the host had no object to close.
            self.log.info("store started", recovery=self.recovery.summary() if self.recovery else None)
            thread = StoreThread(self._run, "mqstore-supervisor")
            self._thread = thread
            thread.start()
        except BaseException as exc:
            if thread is not None and not thread.cancel_unless_running():
                # Its start cut short after it began (an exception raised into this thread):
                # it watches the store; it is asked to stop it, as a close does (review 85 F3:
                # it ran on, STOPPED, ticking and writing stats.msgpack after the lock went).
                self.stop()
                raise
            # No thread to watch the store (can't start new thread: a pids limit, no memory):
            # it stops here, as a close would, and its lock goes. Before, its actors ran on and
            # kept the lock, and the host had no store to close: every open of it in this
            # process was StoreLockedError (review 76 M1).
            self._thread = None
            self.log.error("the supervisor's thread could not be started; the store stops", error=repr(exc))
            self._shutdown()
            self._shut_down.set()
            raise

    def _remove_made(self, made_here: list[str]) -> None:
        """Remove the directories a refused open made (outermost first in `made_here`), each
        with rmdir: never a listing then a removal, or another process that opened the same new
        root in between had its whole store removed (review 134 F2). A data directory only while
        this open holds its flock: another store's new commitlog directory is empty until its
        first put, and one made there between this open's check and its makedirs was removed
        under that store (review 138 F1). The root and its parents hold another store's lock
        file or directories when in use, so rmdir leaves them."""
        claimed = set(data_directories(self.config))
        for path in reversed(made_here):
            if path in claimed and not (self._lock is not None and self._lock.claim_for_removal(path)):
                continue
            with contextlib.suppress(OSError):
                self.fs.rmdir(path)

    def stop(self) -> bool:
        """Stop cleanly; True if the stop was clean (abort file removed)."""
        if self.state in (SupervisorState.STOPPED, SupervisorState.NEW):
            return self.state is SupervisorState.STOPPED
        if self.state is SupervisorState.FAILED:
            return False
        # Each stop() asks, and waits for the thread's shutdown, not for its own request: a
        # stop() again after one cut short (a Ctrl-C in the store's close, before or after its
        # request was queued) waits for whichever request the thread took first; the others
        # are never taken, harmlessly.
        _put_uncut(self._events, _Stop())
        if threading.current_thread() is not self._thread:
            self._shut_down.wait(STOP_TIMEOUT_S * 3)
        return self.clean_stop

    clean_stop = False

    # ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._watch()
        finally:
            # However it ends (a stop, a give-up): a close() waiting for the shutdown returns
            # now (review 81 M1: one racing a give-up waited out 3 x STOP_TIMEOUT_S).
            self._shut_down.set()

    def _watch(self) -> None:
        due = {spec.name: 0 for spec in self._specs if spec.tick_interval_ms(self.config)}
        due[_HOOKS] = 0
        ticker = self.ticker
        while self.state is not SupervisorState.FAILED:  # (given up from another thread too: no more ticks)
            now = ticker.now_ms()
            wait_ms = min((t - now for t in due.values()), default=1000)
            try:
                event = self._events.get(timeout=ticker.wait_s(wait_ms) if wait_ms > 0 else 0)
            except queue.Empty:
                event = None
            if isinstance(event, _Stop):
                self._shutdown()
                return
            if isinstance(event, ChildFailed):
                if not self._handle_failure(event):
                    return
                continue
            now = ticker.now_ms()
            wall = self.clock_ms()
            for spec in self._specs:
                interval = spec.tick_interval_ms(self.config)
                if interval and due.get(spec.name, 0) <= now:
                    due[spec.name] = now + interval
                    self.ctx.tell(spec.name, Tick(now_ms=wall))
            if due[_HOOKS] <= now:
                due[_HOOKS] = now + TICK_HOOK_INTERVAL_MS
                send_unsent()  # reply callbacks that waited for a listener thread (a thread shortage)
                self.note_files_cut_under_map()
                self._expire_group_commits()
                self._run_tick_hooks(wall)

    def note_files_cut_under_map(self) -> list[str]:
        """Say which of the store's files another process cut while they were mapped, or whose
        pages the disk could not read (their lost pages read zeros now, and what was written
        there is in memory only). A cut
        commitlog segment fails the writer at its next pass (storage/mapped_file_queue.py);
        queue, index and checkpoint files are rebuilt by the next open, which the close
        leaves marked as after a crash."""
        mapguard.reinstall()  # a SIGBUS handler the host set since goes behind the guard
        with self._cut_lock:
            faults = (self.fs.map_faults(), self.fs.cut_mark())
            if faults == self._map_faults_seen:
                return sorted(self.files_cut_under_map)
            self._map_faults_seen = faults
            new = store_files_cut_under_map(self.fs, self.config, self._cut_mark) - self.files_cut_under_map
            self.files_cut_under_map |= new
        for path in sorted(new):
            # A fault on a file still there that may not be written (chattr +i on the checkpoint
            # or a segment) is no cut (review 65 F3): said as what it is.
            cause = not_writable_cause(path) if isinstance(self.fs, RealFileSystem) else None
            if cause is not None:
                self.log.error("a store file may not be written any more while mapped: not cut, not writable",
                               path=path, cause=str(cause), effect="what the store wrote there since is in memory "
                               "only; make it writable: a commitlog segment takes puts again by itself, and the "
                               "next open rebuilds queues and index from the commitlog")  # fmt: skip
                continue
            room = no_room_cause(path) if isinstance(self.fs, RealFileSystem) and os.path.exists(path) else None
            if room is not None:
                # (A page the disk could not read looks the same here: the owner that met the
                # fault names it exactly, no room only for a write's.)
                self.log.error("a page of a store file, still whole, faulted through its map on a (nearly) full "
                               "disk: most likely no room for it, not a cut", path=path, cause=room.strerror,
                               effect="what the store wrote there since is in memory only; free space: a commitlog "
                               "segment's writer restarts, and the next open rebuilds queues and index from the "
                               "commitlog")  # fmt: skip
                continue
            # (An I/O error on a page looks the same to the guard: the file whole, a page unread.)
            self.log.error("a page of a store file was gone while mapped: the file was cut short, replaced or deleted "
                           "by another process, or the disk could not read it (an I/O error)",
                           path=path, effect="what the store wrote there since is in memory only, and what it read "
                           "there is not taken for the file's bytes (its readers map it again); the next open "
                           "rebuilds queues and index from the commitlog; a cut commitlog segment is a hole until "
                           "`mqstore recover`, a replaced one was saved beside it as .store-copy")  # fmt: skip
        return sorted(self.files_cut_under_map)

    def _expire_group_commits(self) -> None:
        """Answer the sync flush's group commits stuck a grace past their deadline (an msync
        that hangs holds the flush actor, which expires its own): group_commits.py."""
        try:
            self.ctx.group_commits.expire()
        except Exception as exc:  # never the supervisor's thread
            self.log.error("stalled group commits could not be answered", error=repr(exc))

    def _wait_expiring_group_commits(self, future: StoreFuture[Any], timeout_s: float) -> Any:
        """`future.get(timeout_s)`, expiring stalled group commits meanwhile: a close waits
        for the flush actor, which an msync that hangs holds, and the ticks wait for the close
        (review 140 F2: a put's caller timed out on a stored put first, "not stored")."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return future.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except pykka.Timeout:
                if time.monotonic() >= deadline:
                    raise
                self._expire_group_commits()

    def _answer_group_commits_left(self) -> None:
        """The store stops (its flush done, or stuck), or is given up: the group commits no
        flush answered are stored, not known to be on disk (answered "store closed", or never
        by a flush actor stuck in an msync, a retrying producer stored them twice: review 140
        F1/F2)."""
        try:
            self.ctx.group_commits.answer_all("stored, not known to be on disk: the store stopped before its flush")
        except Exception as exc:
            self.log.error("group commits left at the stop could not be answered", error=repr(exc))

    def _run_tick_hooks(self, wall_ms: int) -> None:
        """Call each tick hook; one that raises is logged, never ends the supervisor's thread
        (it is the host's code, and the supervisor must go on restarting children)."""
        for hook in list(self.ctx.on_tick_ms):
            try:
                hook(wall_ms)
            except Exception as exc:
                if (suppressed := self._hook_failures.admit(id(hook))) is not None:
                    self.log.error("tick hook failed", hook=getattr(hook, "__qualname__", repr(hook)), error=error_repr(exc),
                                   **suppressed_fields(suppressed))  # fmt: skip

    def _handle_failure(self, event: ChildFailed) -> bool:
        if event.retry and all(self._running(name) for name in self._restart_group(event.name)):
            # Another group's restart, which covered this one, started it meanwhile (review
            # 117 F3: a stale retry restarted it once more, and counted against the budget).
            # The whole group: this restart may have started its first actor before a later
            # one failed to start (review 136 F2: the writer up, reput and the queues' owner
            # down for good, the store RUNNING, every put refused).
            return True
        now = self.ticker.now_ms()
        owns_files = event.name not in OWNS_NO_FILES
        recent = self._recent_failures if owns_files else self._recent_api_failures
        # A store through a map that faulted for want of a block (a full btrfs allocates at
        # every one) is a full disk, not a broken actor: restarted at the slowest pace, never
        # given up on (review 70 M1: the store stopped, and stayed stopped once space was back).
        full_disk = isinstance(event.error, FileWithoutRoomUnderMapError) or (
            # (also a restart whose start found no room: review 74)
            isinstance(event.error, OSError) and event.error.errno in (errno.ENOSPC, errno.EDQUOT)
        )
        # Likewise a restart that could not start its actor's thread: the process is short of
        # threads (a pids limit), not the actor broken (review 76: ~4.5 s of "can't start new
        # thread" used the budget up, and the store stayed stopped once threads were back).
        # Only a failure to start: a running actor that crashed with MemoryError (a bug
        # allocating a corrupt length) crashed again at once after each successful restart,
        # which reset the shortage's clock, so it was restarted for ever (review 91 E1).
        if event.at_start and _is_resource_shortage(event.error) and self.state is SupervisorState.RUNNING:
            # (During the open it counts: the open fails fast, and the host may try again.)
            if self._shortage_since is None:
                self._shortage_since = now
            full_disk = full_disk or now - self._shortage_since <= RESOURCE_SHORTAGE_MAX_MS
        else:
            self._shortage_since = None
        if not full_disk:
            recent.append(now)
        while recent and recent[0] < now - RESTART_PERIOD_MS:
            recent.popleft()
        if owns_files and len(recent) > MAX_RESTARTS:
            self._give_up(event.error)
            return False
        # Back-off: a fault such as a full disk hits the same wall if retried at once.
        backoff = BACKOFF_MAX_MS if full_disk else min(BACKOFF_FIRST_MS * 2 ** (len(recent) - 1), BACKOFF_MAX_MS)
        self.ticker.sleep_ms(backoff)
        group = self._restart_group(event.name)
        self.log.warning("restarting", failed=event.name, group=group, error=repr(event.error))
        try:
            stuck = [name for name in reversed(group) if not self._stop_child(name)]
            if not stuck:  # (given up either way otherwise: no wait for the stragglers too)
                stuck = self._earlier_still_running(group)
            if stuck:
                # A second owner of its files beside one that still runs would write over it.
                self._give_up(RuntimeError(f"{', '.join(stuck)} did not stop within {STOP_TIMEOUT_S} s to be "
                                           f"restarted (after {event.name} failed: {event.error!r})"))  # fmt: skip
                return False
            for name in group:
                self._start_child(name, first=False)
        except Exception as exc:  # a child that cannot start counts as another failure...
            # ...once: a child that crashed (rather than failed in on_start) has reported
            # itself already, and counting it twice would halve the restart budget.
            # Nor when a failure waits whose restart starts this group again (a peer it needs
            # died meanwhile: review 117 F3, each retry behind a dead ConsumeQueue actor failed,
            # counted, and doubled the back-off, and two faults under load used up the budget).
            if not self._restart_pending_for(group):
                self._events.put(ChildFailed(name=event.name, error=event.error if _is_dead(exc) else exc,
                                             at_start=not _is_dead(exc), retry=True))  # fmt: skip
            return True
        self.restarts.append(RestartRecord(event.name, tuple(group), repr(event.error), self.ticker.now_ms(), backoff))
        self.restart_count += 1
        self._shortage_since = None
        if len(self.restarts) > KEPT_RESTART_RECORDS:  # a gateway, or a full btrfs, may restart for as long as it runs
            del self.restarts[: len(self.restarts) - KEPT_RESTART_RECORDS]
        return True

    def _earlier_still_running(self, names: list[str]) -> list[str]:
        """Those of `names` with an earlier incarnation that still runs: a
        straggler (a start that timed out, then a stop that did). Each is given the stop's
        wait to end. Starting one beside it would make two owners of its files (review 79's
        note: a restart whose start timed out restarted the group again, 9 index actors
        recovering at once in the test)."""
        self._stragglers = [(name, stopped) for name, stopped in self._stragglers if not _finished(stopped)]
        running = []
        for name, stopped in self._stragglers:
            if name in names and name not in running:
                if not _finished(stopped, timeout=STOP_TIMEOUT_S + PAUSE_GRACE_S):
                    running.append(name)
        return running

    def _failure_pending(self, names: list[str]) -> bool:
        with self._events.mutex:  # a peek; only this thread takes events out
            return any(isinstance(e, ChildFailed) and e.name in names for e in self._events.queue)

    def _restart_pending_for(self, group: list[str]) -> bool:
        """Whether a failure waits whose restart starts all of `group`'s actors again. One of a
        member alone is not enough: reput's restart does not start the index (review 136 F2:
        the index's retry was dropped behind a pending reput failure, and the index stayed
        down for good while the store said RUNNING)."""
        with self._events.mutex:  # a peek; only this thread takes events out
            pending = [e.name for e in self._events.queue if isinstance(e, ChildFailed)]
        return any(set(group) <= set(self._restart_group(name)) for name in pending)

    def _running(self, name: str) -> bool:
        ref = self.ctx.peers.get(name)
        return ref is not None and ref.is_alive()

    def _restart_group(self, name: str) -> list[str]:
        wanted = {name}
        changed = True
        while changed:
            changed = False
            for spec in self._specs:
                if spec.name in wanted:
                    for dep in spec.dependents:
                        if dep not in wanted and any(s.name == dep for s in self._specs):
                            wanted.add(dep)
                            changed = True
        return [spec.name for spec in self._specs if spec.name in wanted]

    def _before_unlock(self) -> None:
        """The owner's last writes under the store's lock (`before_unlock`: the consumer
        offsets): once it is released another process may hold the store and write its own."""
        for hook in list(self.before_unlock):
            try:
                hook()
            except Exception as exc:  # the lock is released whatever a hook does
                self.log.error("a last write before the store's lock is released failed", error=repr(exc))

    def _give_up(self, error: BaseException) -> None:
        self.log.error("too many restarts, stopping the store", error=repr(error))
        self.state = SupervisorState.FAILED
        self.fatal_error = error
        self._answer_group_commits_left()  # now: the stops may wait out a flush actor stuck in an msync
        self._stop_children(clean=False)
        self._answer_group_commits_left()  # any a writer still running added meanwhile
        # Nothing will publish again: a reader waiting on the view (wait_for_messages, even
        # with no timeout) returns now instead of at its timeout, or never.
        self.ctx.read_view.close()
        self._before_unlock()
        self._release_lock()
        if self.on_fatal is not None:
            try:
                self.on_fatal(error)
            except Exception as exc:  # the host's callback must not kill the supervisor
                self.log.error("on_fatal callback failed", error=repr(exc))

    # children ----------------------------------------------------------------------------
    def _ask(self, name: str, message: AskFor[R], timeout: float = START_TIMEOUT_S) -> R:
        return ask(self.ctx.peers[name], message, timeout_s=timeout)

    def _start_child(self, name: str, *, first: bool) -> None:
        """Start one child and wait for its ready handshake (an actor that failed in on_start
        answers the ping with ActorDeadError, so nobody talks to a half-started actor). An
        owner's on_start recovers its files: on the first start as the open found them
        (`self._mode`), on a restart as a live process left them."""
        ctx = self.ctx
        ctx.made.pop(name, None)
        try:
            ref = self._made_child(name, first=first)
            ctx.peers[name] = ref  # in the try: cut short before this, it is `made` (review 86 F1)
        except BaseException:
            # A start cut short after the actor's thread began (an exception raised into an
            # open's thread): its ref never came back, and it ran on, recovering the files
            # beside the next open's owners once the lock went (review 85 F3). It is a child
            # to stop now, unless it never runs.
            made = ctx.made.pop(name, None)
            thread = getattr(made, "loop_thread", None)
            if made is not None and thread is not None and not thread.cancel_unless_running() and name not in ctx.peers:
                ctx.peers[name] = made.actor_ref
            raise
        ctx.made.pop(name, None)
        try:
            self._await_started(name, ref)
        except Exception as exc:
            # Stopped, or, still recovering its files (a start that timed out), kept as a
            # straggler: the lock stays until it ends. Dropped from the peers only, it went on
            # recovering after the failed open released the lock, and a retried open's own
            # recovery read a segment it deleted (review 78 M2: two owners of the files).
            self._stop_child(name)
            failed = self._start_failure(name)
            if failed is not None:
                # An open raises the owner's own error (a refusal reads as it); a restart
                # counts it, not the failure that led to the restart (review 72 H2: a no-room
                # fault, never counted, hid an I/O error at every restart after it).
                if not isinstance(failed, Exception):
                    # SystemExit or KeyboardInterrupt out of an actor's start: it would end the
                    # supervisor's thread (a restart), or the host's program (an open), as if
                    # raised there (review 136 F3).
                    failed = RuntimeError(f"{name} failed to start: {failed!r}")
                raise failed from exc
            raise
        # Step two of the writer's start, once both it and the queues recovered: after the
        # ConsumeQueue actor's start, on a writer's restart at once (the queues live). Its
        # restart too: a writer restarted while that actor was dead could not be resumed, and
        # took no put for good, the store RUNNING (review 123 F2); a resumed one ignores it.
        if (name == "consume_queue" and "writer" in ctx.peers) or (name == "writer" and "consume_queue" in ctx.peers):
            self._resume_writer()

    def _made_child(self, name: str, *, first: bool) -> pykka.ActorRef[Any]:
        """The child `name`, its actor started (its on_start not awaited: `_start_child`)."""
        ctx = self.ctx
        ref: pykka.ActorRef[Any]
        mode = self._mode if first else RecoveryMode.RESTART
        match name:
            case "allocator":
                ref = AllocateMappedFileService.start(ctx)
            case "writer":
                ref = CommitLogWriter.start(ctx, mode=mode, checkpoint=self._checkpoint, store_host=self.store_host)
            case "flush":
                ready = self._ask("writer", GetWriterStatus())
                seg = self.config.mapped_file_size_commitlog_bytes
                # At the open recovery has forced the whole log; at a restart, what the dead
                # actor had not forced is not known: from the log's start, or from the flushed
                # offset the checkpoint recorded (review 42 G2: from the last segment's start,
                # earlier segments' unforced bytes were never forced, yet flush() and the
                # checkpoint covered them).
                flushed = max(ready.max_offset - ready.max_offset % seg, ready.min_offset, 0) if first else max(ready.min_offset, 0)
                # A degraded store (a missing or wrong-sized segment: puts refused until `mqstore
                # recover`) changes no byte: its flush actor writes no checkpoint (a restarted one
                # neither).
                degraded = ready.degraded
                newest_ms = ready.store_timestamp  # (0 before the first append since the open:
                if first and not newest_ms and not degraded:  # then the newest record recovery found)
                    newest_ms = self._ask("writer", GetCommitLogRecovery()).store_timestamp
                ref = FlushCommitLogService.start(
                    ctx, flushed_offset=flushed, max_offset=ready.max_offset, store_timestamp=newest_ms,
                    restarted=not first, degraded=degraded,
                )
            case "index":
                facts = self._ask("writer", GetLogFacts())
                ref = IndexActor.start(ctx, mode=mode, checkpoint=self._checkpoint, log_facts=facts)
            case "consume_queue":
                facts = self._ask("writer", GetLogFacts())
                if first and not self.config.message_index_enable:
                    # No index actor to own it this time: its recovery runs here, once, so its
                    # progress says what its files lack for the next open with it on.
                    recover_index(self.config, ctx.fs, mode=mode, checkpoint=self._checkpoint, log_facts=facts,
                                  clock_ms=ctx.clock_ms)  # fmt: skip
                index_from = None
                if first and "index" in ctx.peers:
                    recovered = self._ask("index", GetIndexSnapshot()).recovered
                    index_from = recovered.dispatch_from if recovered is not None else None
                ref = ConsumeQueueService.start(ctx, mode=mode, log_facts=facts, index_dispatch_from=index_from)
            case "commit":
                ref = CommitRealTimeService.start(ctx)
            case "gateway":
                if self.backend is None:
                    raise RuntimeError("the gateway needs a store behind it")
                ref = StoreGateway.start(ctx, self.backend)
            case "cleaner":
                cleaner = importlib.import_module("mqstore.actors.cleaner")
                ref = cleaner.CleanerActor.start(ctx)
            case "reput":
                ready = self._ask("writer", GetWriterStatus())
                reput_offset = self._ask("consume_queue", GetQueueSnapshot()).resume_offset
                if "index" in ctx.peers:
                    reput_offset = min(reput_offset, self._ask("index", GetIndexSnapshot()).resume_offset)
                reput_offset = max(reput_offset, ready.min_offset, 0)
                ref = ReputMessageService.start(ctx, reput_offset=reput_offset, max_offset=ready.max_offset)
            case _:
                raise AssertionError(f"unknown child {name}")
        return ref

    def _await_started(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """The ready handshake (answered once on_start returned), waited START_TIMEOUT_S at a
        time for as long as the child's on_start reports progress (`ctx.starting_moves`)."""
        seen = self.ctx.start_progress.get(name, 0)
        while True:
            try:
                try:
                    ref.ask(Ping(), timeout=START_TIMEOUT_S)
                except pykka.Timeout:
                    ref.ask(Ping(), timeout=PAUSE_GRACE_S)
                return
            except pykka.Timeout as exc:
                now = self.ctx.start_progress.get(name, 0)
                if now == seen:
                    raise TimeoutError(f"the {name} actor did not start: its recovery made no progress in "
                                       f"{START_TIMEOUT_S:.0f} s") from exc  # fmt: skip
                self.log.info("still starting", actor=name, steps=now - seen)
                seen = now

    def _await_rebuilt_restarting(self) -> None:
        """`_await_rebuilt`, restarting a child that crashes meanwhile as the running store
        would (same groups, same budget). Before, a crash during the open's re-dispatch left
        the open waiting for a dead actor and then failing with pykka's ActorDeadError."""
        while True:
            self._await_rebuilt()
            failed = self._take_failure()
            if failed is None:
                return
            if isinstance(failed.error, ForeignStoreError):
                # Re-dispatch met a record of a feature mqstore does not implement: a refusal,
                # which no restart changes (raised as the open's own error).
                raise failed.error
            if not self._handle_failure(failed):
                raise RuntimeError(f"the {failed.name} actor kept failing while the open rebuilt the queues") from failed.error

    def _take_failure(self) -> ChildFailed | None:
        """The oldest child failure reported and not handled yet (start's thread only)."""
        with self._events.mutex:
            for event in list(self._events.queue):
                if isinstance(event, ChildFailed):
                    self._events.queue.remove(event)
                    return event
        return None

    def _await_rebuilt(self) -> None:
        """An open returns once re-dispatch has rebuilt the queues (and the index) up to the
        log's end, as RocketMQ's recovery dispatches before its store serves: every message
        acknowledged before a crash is readable when open returns. Reput does it in bounded
        passes after its start handshake (a big store's re-dispatch outlasts START_TIMEOUT_S);
        this waits while it moves. A re-dispatch that stops moving for
        DISPATCH_CATCH_UP_TIMEOUT_MS (a full disk holding the queues' writes) is left to finish
        in the background, and the open returns with a warning."""
        end = self._ask("writer", GetWriterStatus()).max_offset
        indexed = "index" in self.ctx.peers

        def written(view: ReadView) -> int:
            return min(view.queues_written, view.indexed_end) if indexed else view.queues_written

        names = [spec.name for spec in self._specs]

        last = [-1]

        def covered_within(timeout_s: float) -> bool:
            # In slices, so that a child's crash ends the wait at once (the caller restarts it
            # and waits again) instead of after a whole stuck interval.
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                view = self.ctx.read_view.await_view(lambda v: written(v) >= end, min(left, FAILURE_CHECK_S),
                                                     QUEUES | INDEX)  # fmt: skip
                if view is not None:
                    return True
                if self._failure_pending(names):
                    return True
                now = written(self.ctx.read_view.view)
                if now == last[0]:  # not moving: waiting at a hole? (asked briefly: it may be busy)
                    try:
                        reput: ReputStatus = self._ask("reput", GetReputStatus(), timeout=FAILURE_CHECK_S)
                    except pykka.Timeout:
                        pass
                    else:
                        if reput.at_hole:
                            # It goes no further until the segments are back, and what it handed
                            # on before the hole is written (the view stood still a slice).
                            return True
                last[0] = now
                if left <= FAILURE_CHECK_S:
                    return False

        stuck = self._wait_while_moving(covered_within, lambda: written(self.ctx.read_view.view))
        if stuck is not None:
            self.log.warning("re-dispatch is not moving; the store opens with its queues behind the log",
                             rebuilt_to=stuck, log_end=end)  # fmt: skip

    @staticmethod
    def _wait_while_moving(arrived_within: Callable[[float], bool], position: Callable[[], int]) -> int | None:
        """Wait for `arrived_within(timeout_s)` in slices of DISPATCH_CATCH_UP_TIMEOUT_MS for as
        long as `position()` advances from one slice to the next (the open's and the close's
        wait for dispatch: a long one is fine, a stuck one is not). None once arrived, else the
        position it stopped moving at."""
        reached = -1
        while not arrived_within(DISPATCH_CATCH_UP_TIMEOUT_MS / 1000):
            now = position()
            if now <= reached:
                return now
            reached = now
        return None

    def _resume_writer(self) -> None:
        snapshot = self._ask("consume_queue", GetQueueSnapshot())
        self._ask("writer", ResumeQueues(topic_queue_table=snapshot.topic_queue_table,
                                         dispatch_from=snapshot.resume_offset, cleaned=snapshot.cleaned))  # fmt: skip

    def _start_failure(self, name: str) -> BaseException | None:
        """Why `name` failed in on_start (its report, taken out of the events: an open raises
        it, so a refusal reads as the owner's own error; a restart counts the failure once,
        for the group it restarts)."""
        with self._events.mutex:
            for event in list(self._events.queue):
                if isinstance(event, ChildFailed) and event.name == name:
                    self._events.queue.remove(event)
                    return event.error
        return None

    def _recovery_report(self) -> RecoveryReport:
        """The owners' recovery at this open, as one report."""
        recovered = self._ask("writer", GetCommitLogRecovery())
        snapshot = self._ask("consume_queue", GetQueueSnapshot())
        queues = snapshot.recovered
        assert queues is not None
        index = self._ask("index", GetIndexSnapshot()).recovered if "index" in self.ctx.peers else None
        table = self._ask("writer", GetWriterStatus()).topic_queue_table
        # After `_await_rebuilt`: re-dispatch gave back what the log still holds.
        return assemble_report(self._mode, self._checkpoint, recovered, index or IndexRecovery(), queues, table,
                               snapshot.lost_queue_offsets)  # fmt: skip

    def _stop_child(self, name: str) -> bool:
        """Stop `name`; False if it did not stop within STOP_TIMEOUT_S (stuck in a stalled
        write, a held fault point). It still owns its files then, and may write them yet."""
        ref = self.ctx.peers.get(name)
        if ref is None:
            return True
        # The stop's future, not `actor_stopped`: pykka sets that flag before on_stop runs, and
        # on_stop still touches files (the writer and the queues' owners flush theirs).
        stopped = ref.stop(block=False)
        # Kept until it has stopped: a wait cut short (an exception raised into an open's
        # thread as it cleaned up) leaves it to the lock keeper, not running unseen while the
        # lock went (review 85 F4).
        stopping = (name, stopped)
        self._stopping.append(stopping)
        self.ctx.peers.pop(name, None)
        try:
            try:
                stopped.get(timeout=STOP_TIMEOUT_S)
            except pykka.Timeout:
                stopped.get(timeout=PAUSE_GRACE_S)
        except pykka.ActorDeadError:
            pass
        except pykka.Timeout:
            self.log.error("an actor did not stop in time: the store's lock is kept until it does",
                           actor=name, timeout_s=STOP_TIMEOUT_S)  # fmt: skip
            self._stragglers.append(stopping)
            self._stopping.remove(stopping)
            return False
        self._stopping.remove(stopping)
        return True

    def _stop_children(self, *, clean: bool) -> bool:
        """Stop every child, last started first; False if one did not stop in time. Cut short,
        every child not stopped yet is told to stop and left to the lock keeper."""
        stopped = True
        try:
            for spec in reversed(self._specs):
                stopped = self._stop_child(spec.name) and stopped
        except BaseException:
            for name in list(self.ctx.peers):
                ref = self.ctx.peers.pop(name, None)
                if ref is not None:
                    with contextlib.suppress(pykka.ActorDeadError):
                        self._stopping.append((name, ref.stop(block=False)))
            raise
        return stopped

    def _release_lock(self) -> None:
        """Release the store's lock once no child of ours runs. A child still running (it did
        not stop in time) may yet write the files: had the lock gone with it running, another
        process could open the store and have its acknowledged records overwritten by ours.
        So a thread waits for those children to end, then releases it (or the process exits)."""
        lock = self._lock
        running = [(name, stopped) for name, stopped in self._stragglers + self._stopping if not _finished(stopped)]
        if lock is None or not running:
            self._release(lock)
            return

        def release_if_stopped() -> bool:
            if not all(_finished(stopped) for _, stopped in running):
                return False
            self._release(lock)
            self.log.info("store lock released: the actors that had not stopped in time have ended",
                          actors=[name for name, _ in running])  # fmt: skip
            return True

        def release_once_stopped() -> None:
            for _, stopped in running:
                _finished(stopped, timeout=None)
            release_if_stopped()

        try:
            StoreThread(release_once_stopped, "mqstore-lock-keeper").start()
        except RuntimeError as exc:  # no thread to be had (RLIMIT_NPROC, a pids cgroup)
            # Kept, not released with them running; the stop or give-up goes on (review 144 F1:
            # the supervisor's thread died here, the store stayed STOPPING and locked for good,
            # and a failed open raised this instead of its own error).
            lock.release_later(release_if_stopped)
            self.log.error("no thread could be started to release the store's lock once the actors that have not "
                           "stopped end: it is released at this process's next open of the store after they have, "
                           "or at its exit", actors=[name for name, _ in running], error=repr(exc))  # fmt: skip

    def _release(self, lock: StoreLock | None) -> None:
        try:
            if lock is not None:
                lock.release()
        except OSError as exc:  # closing its descriptor dropped it all the same
            self.log.error("releasing the store's lock failed", error=repr(exc))
        finally:
            self.lock_released.set()

    def _shutdown(self) -> None:
        """RocketMQ's shutdown (§11.9): refuse puts, let dispatch catch up, flush, stop in
        reverse order, and remove the abort file only if all of that went well."""
        self.state = SupervisorState.STOPPING
        clean = True
        try:
            writer = self._ask("writer", SetWriteable(writeable=True, closing=True), timeout=STOP_TIMEOUT_S)
            # Woken by reput when dispatch passes the writer's end (no polling); waited for while
            # it moves (a store held back by a full disk, or re-dispatch after a restart).
            caught_up = Waiter()
            self.ctx.tell("reput", AwaitDispatched(up_to=writer.max_offset, reply=Reply(future=caught_up)))

            def caught_up_within(timeout_s: float) -> bool:
                try:
                    status: ReputStatus = caught_up.get(timeout=timeout_s)
                except pykka.Timeout:
                    return False
                if status.at_hole:
                    # Records past a hole were never dispatched (reput): the next open, with
                    # the segments back or after `mqstore recover`, must re-dispatch them.
                    self.log.warning("dispatch waits at a commitlog hole; the next open re-dispatches",
                                     at=status.reput_offset, log_end=writer.max_offset)  # fmt: skip
                    nonlocal clean
                    clean = False
                return True

            stuck = self._wait_while_moving(
                caught_up_within, lambda: self._ask("reput", GetReputStatus(), timeout=STOP_TIMEOUT_S).reput_offset
            )
            if stuck is not None:
                self.log.warning("dispatch did not catch up before shutdown", behind=writer.max_offset - stuck)
                clean = False
            if self._mode is RecoveryMode.CRASH and self._ask("writer", GetLogFacts(), timeout=STOP_TIMEOUT_S).holes:
                # Crash recovery rebuilt the queues only as far as the hole: the records past
                # it (a segment put back) are re-dispatched by the next open only if it too
                # recovers as after a crash. Kept until `mqstore recover` or the segments back.
                self.log.warning("opened after a crash on a commitlog with holes; the next open recovers as after a crash")
                clean = False
            for name in ("consume_queue", "index", "flush"):
                if name not in self.ctx.peers and any(spec.name == name for spec in self._specs):
                    # Down, its restart pending (a crash just before the close, or no thread to
                    # restart it with): nothing forced its files, so this stop is no clean one
                    # (review 90 M1: the log stayed in the page cache only, and the close said
                    # clean, so the next open would have trusted it).
                    self.log.warning("an actor is down at shutdown, its files not forced: the next open recovers "
                                     "as after a crash", actor=name)  # fmt: skip
                    clean = False
                    continue
                if name in self.ctx.peers:
                    future: StoreFuture[Any] = StoreFuture()  # (a close's own thread may wait: waits.py)
                    # The writer's own end and time: its notices to flush are sparse.
                    flush_all = FlushAll(
                        reply=Reply(future=future, store_internal_callback=True), up_to=writer.max_offset,
                        store_timestamp=writer.store_timestamp,
                    )
                    self.ctx.peers[name].tell(flush_all)
                    reached = self._wait_expiring_group_commits(future, STOP_TIMEOUT_S)
                    if name == "flush" and isinstance(reached, int) and reached < writer.max_offset:
                        # The log is not on disk to its end (a failed msync, review 46 H1): the
                        # next open must recover as after a crash, not trust a clean stop.
                        self.log.warning("the commitlog is forced to disk below its end at shutdown",
                                         flushed=reached, end=writer.max_offset)  # fmt: skip
                        clean = False
            # Batches still waiting (for blocks on a full disk, or for a queue or index file
            # that cannot be made: a directory not writable) are acknowledged puts that the
            # queues and the index do not hold: the next open must recover as after a crash.
            # The holding actors logged the cause; this line does not guess it (review 65 F5).
            waiting = 0
            if "consume_queue" in self.ctx.peers:
                waiting += self._ask("consume_queue", GetQueueSnapshot(), timeout=STOP_TIMEOUT_S).waiting_batches
            if "index" in self.ctx.peers:
                waiting += self._ask("index", GetIndexSnapshot(), timeout=STOP_TIMEOUT_S).waiting_batches
            if waiting:
                self.log.warning("dispatch batches still wait at shutdown, for disk space or a queue or index file "
                                 "that cannot be made (see the log)", batches=waiting)  # fmt: skip
                clean = False
        except Exception as exc:
            self.log.error("unclean shutdown", error=repr(exc))
            clean = False
        # The flush is done, or it is stuck: a stuck flush actor's stop is waited out first.
        self._answer_group_commits_left()
        if not self._stop_children(clean=clean):
            clean = False  # a child still runs: what it writes is not the clean stop's
        self._answer_group_commits_left()  # any added since: a writer the close could not set unwriteable
        if self.ctx.derived_flush_failed:
            self.log.warning("a ConsumeQueue or index flush failed in this run: the next open rebuilds them as after a crash")
            clean = False
        self.note_files_cut_under_map()
        if self.files_cut_under_map:
            # What the actors wrote into those files went to memory: the next open must check
            # and rebuild them as after a crash, not trust them as a clean stop's.
            self.log.warning("files cut short or replaced under the store's maps: the next open recovers as after a crash",
                             files=sorted(self.files_cut_under_map))  # fmt: skip
            clean = False
        if clean and self._abort is not None:
            try:
                self._abort.remove()
            except OSError as exc:  # (review 46 L2) the lock is released whatever the disk does
                self.log.error("the abort file could not be removed: the next open recovers as after a crash",
                               error=repr(exc))  # fmt: skip
                clean = False
        self._before_unlock()
        self._release_lock()
        self.clean_stop = clean
        self.state = SupervisorState.STOPPED
        self.log.info("store stopped", clean=clean)
