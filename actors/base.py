"""What every store actor shares: its context, crash reporting, and peer lookup.

An actor crashes on a broken invariant or an injected fault (STYLE habit 6): before its
thread ends it fails every `Reply` still waiting in its inbox, so no caller hangs, and tells
the supervisor, which restarts it (and its dependents) from disk.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Final, Generic, TypeVar, get_args

import pykka

from ..config import StoreConfig
from ..faults import FaultPlan
from ..log import get_logger, prepare_loggers, retrying
from ..messages import Asked, Reply
from ..read_view import ReadViewPublisher
from ..runtime import FastInbox, RuntimeActor
from ..storage.disk import DiskGauge, PsutilDiskGauge
from ..storage.fs import FileSystem
from ..ticker import RealTicker, Ticker
from .group_commits import GroupCommitWatch

__all__ = ["ActorContext", "FastInbox", "StoreActor", "ServiceUnavailable", "StoppedBeforeHandling", "ChildFailed", "real_sleep_ms",
           "HELD_REMINDER_INTERVAL_MS", "HeldWait", "Periodic"]  # fmt: skip

# An actor whose work waits (a full disk, a queue file that cannot be made) and is retried each
# tick logs the wait when it starts and when it ends, and in between this often.
HELD_REMINDER_INTERVAL_MS: Final = 300_000


class Periodic:
    """A duty due every `interval_ms` of the monotonic ticker (due at once the first time).

    Not by the wall clock a Tick carries: stepped back, or put right after running ahead,
    it stopped the thorough flushes, and with them every checkpoint write, until it caught up
    again, hours or days later (review 57 F3, F4)."""

    def __init__(self, ticker: Ticker, interval_ms: int) -> None:
        self._ticker = ticker
        self.interval_ms = interval_ms
        self._last_ms: int | None = None

    def due(self) -> bool:
        """Whether the duty is due now; if so, it counts as done now."""
        now = self._ticker.now_ms()
        if self._last_ms is not None and now - self._last_ms < self.interval_ms:
            return False
        self._last_ms = now
        return True


class HeldWait:
    """An actor's work held by a full disk or a file that cannot be made, retried on its ticks
    (not per batch: a failed file creation and the storage layer's ERRORs for each). Logged
    when it starts, at once when its cause changes, every HELD_REMINDER_INTERVAL_MS, and when
    it ends; the retries in between run quietly (`quiet`)."""

    def __init__(self, log: Any, what: str) -> None:
        self._log = log
        self._what = what  # "consume queue dispatch", "indexing"
        self.since_ms = 0  # 0: not held
        self._reported_ms = 0
        self._error = ""

    def __bool__(self) -> bool:
        return self.since_ms != 0

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        """Around a retry: the storage layer's lines for a failure reported already are dropped."""
        return retrying() if self.since_ms else contextlib.nullcontext()

    def failed(self, now_ms: int, why: str, error: str, **fields: Any) -> None:
        if not self.since_ms:
            self.since_ms = now_ms or 1
            self._reported_ms, self._error = now_ms, error
            self._log.error(f"{why}: {self._what} waits, retried every tick", error=error, **fields)
        elif error != self._error or now_ms - self._reported_ms >= HELD_REMINDER_INTERVAL_MS:
            self._reported_ms, self._error = now_ms, error
            self._log.error(f"{why}: {self._what} still waits", error=error, waited_ms=now_ms - self.since_ms, **fields)

    def ended(self, now_ms: int) -> None:
        if self.since_ms:
            self._log.info(f"{self._what} resumed", waited_ms=now_ms - self.since_ms)
            self.since_ms = 0


def real_sleep_ms(ms: int) -> None:
    """The production pause: the calling actor's thread sleeps `ms` milliseconds."""
    time.sleep(ms / 1000)


class ServiceUnavailable(RuntimeError):
    """The actor that held this request crashed or stopped before answering it."""


class StoppedBeforeHandling(ServiceUnavailable):
    """The actor stopped (or crashed on another request) before it took this one: the request
    did nothing, and its next incarnation may be asked again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildFailed:
    name: str
    error: BaseException
    # Failed to start (its thread, or its on_start), not crashed while running: only such a
    # failure may be a shortage of the process's threads, descriptors or memory (supervisor).
    at_start: bool = False
    # Put back by the supervisor: the restart it stands for did not get its group started.
    retry: bool = False


@dataclass(kw_only=True)
class ActorContext:
    """What the supervisor hands every child. `peers` always holds the live refs."""

    config: StoreConfig
    fs: FileSystem
    clock_ms: Callable[[], int]
    faults: FaultPlan
    report: Callable[[ChildFailed], None]
    peers: dict[str, pykka.ActorRef[Any]] = field(default_factory=dict)
    # Each child as it is made, before its start returns (`StoreActor.__init__`): a start cut
    # short after its thread began leaves the supervisor the actor to stop (review 85 F3).
    made: dict[str, Any] = field(default_factory=dict)
    # Monotonic time to pace by (linger, back-off): a ManualTicker in tests.
    ticker: Ticker = field(default_factory=RealTicker)
    # Where the reput actor hands arrival notices (the store's long polling and subscribers
    # live outside the actors, so they survive a reput restart).
    on_arrivals: Callable[[list[Any], int], None] = lambda _events, _end_offset: None
    # Where owners publish what readers need (read_view.py): the writer its readable end, reput
    # the dispatched end, the ConsumeQueue actor the queue bounds, the index actor its files
    # and indexed end. One frozen view swapped per publication; cheap, never blocks long.
    read_view: ReadViewPublisher = field(default_factory=ReadViewPublisher)
    # The cleaner's view of the disk (§12.3) and its pause between two deletions, per store
    # (passed in like `clock_ms`, habit 9): a test gives a FixedDiskGauge and a recording sleep
    # and never fills a disk nor waits. The supervisor's default gauge is psutil over the store
    # paths (the simulated disk's own report when the store runs on one).
    disk_gauge: DiskGauge = field(default_factory=PsutilDiskGauge)
    cleaner_sleep_ms: Callable[[int], None] = real_sleep_ms
    # Called on the supervisor's thread every TICK_HOOK_INTERVAL_MS with the store clock's ms
    # (StoreStats sampling, the stats snapshot). Each must be cheap; one that raises is logged
    # and called again next time.
    on_tick_ms: list[Callable[[int], None]] = field(default_factory=list)
    # Where an msync of the commitlog failed, published by the flush actor for the rest of
    # the store's run (None: never): its next incarnation keeps counting nothing past it as
    # flushed, and the writer refuses puts (review 46 H1/M1; FlushCommitLogService).
    commitlog_flush_failed_at: int | None = None
    # SYNC_FLUSH's group commits handed to the flush actor and not answered yet: the
    # supervisor answers one stuck behind an msync that hangs (group_commits.py).
    group_commits: GroupCommitWatch = field(default_factory=GroupCommitWatch)
    # An msync of a ConsumeQueue or index file failed (set by their owners for the rest of
    # the run): the checkpoint's logics and index timestamps stop there and the close is
    # unclean, so the next open rebuilds from the log what may not be on disk (review 48 H3).
    derived_flush_failed: bool = False
    # Queues clean_unused_topic removed in this run, with the end of what was dispatched then
    # (set by the ConsumeQueue actor, kept for its next incarnations): their records below it
    # are not dispatched again, so a restart's re-dispatch does not bring back a queue the
    # writer has forgotten (review 109 K2: the next put took offset 0 of the rebuilt queue).
    cleaned_queues: dict[tuple[str, int], int] = field(default_factory=dict)
    # While clean_unused_topic removes queues: the topics the writer still takes puts for,
    # until a time of the ticker (set by the writer on RefusePutsOutside, kept for its next
    # incarnations: review 122 F1, a writer restarted mid-clean took puts to the topics
    # being removed again, and they were lost; lapses by itself: 122 F2, a clean interrupted
    # or timed out left every other topic refused for good).
    puts_refused_outside: tuple[frozenset[str], int] | None = None
    # How far each child's on_start has got, a count it raises as it goes (the ConsumeQueue
    # actor: queues recovered). The supervisor waits for the ready handshake START_TIMEOUT_S at a
    # time while it moves (review 71 F3: an open of 5,000 queues outlasted one fixed wait).
    start_progress: dict[str, int] = field(default_factory=dict)

    def starting_moves(self, name: str) -> None:
        """`name`'s on_start got one step further (one thread writes each key)."""
        self.start_progress[name] = self.start_progress.get(name, 0) + 1

    def tell(self, peer: str, message: Any) -> bool:
        """Tell a peer; False if it is down (it is being restarted and will recover from disk)."""
        ref = self.peers.get(peer)
        if ref is None:
            return False
        try:
            ref.tell(message)
            return True
        except pykka.ActorDeadError:
            return False


RequestT = TypeVar("RequestT")


class StoreActor(RuntimeActor, Generic[RequestT]):
    """Base of every store actor: daemon thread (a host that forgets close() still exits),
    the fast inbox, typed `handle`, and crash reporting.

    `RequestT` is the union of the requests the actor takes; its `handle` matches each and
    ends in `assert_never`. Anything else is refused before `handle`: an error for an asker,
    a crash (a broken invariant: only the store's own code tells its actors) for a tell."""

    name: ClassVar[str] = "actor"
    accepts: ClassVar[tuple[type, ...]] = ()
    # The supervised child a crash is reported as (an actor its child started: the child).
    supervised_as: ClassVar[str | None] = None

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.config = ctx.config
        self.log = get_logger(f"mqstore.actors.{self.name}", actor=self.name, store=ctx.config.store_path_root_dir)
        if self.supervised_as in (None, self.name):  # a child of the supervisor's (the gateway's
            ctx.made[self.name] = self  # own name is what its readers report as: review 86 F3)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("name"), str):
            prepare_loggers(f"mqstore.actors.{cls.name}")  # at import, not in an open (mqstore.log)
        for base in getattr(cls, "__orig_bases__", ()):
            args = get_args(base)
            if args and not isinstance(args[0], TypeVar):
                union = args[0]
                cls.accepts = get_args(union) or (union,)

    def handle(self, message: RequestT) -> object:
        raise NotImplementedError

    def _checked(self, message: object) -> RequestT:
        if not isinstance(message, self.accepts):
            raise AssertionError(f"{self.name} cannot handle {message!r}")
        return message  # type: ignore[return-value]  # isinstance over the union's members

    def on_receive(self, message: Any) -> Any:
        if type(message) is Asked:
            return self._answer(message)
        try:
            return self.handle(self._checked(message))
        except BaseException as exc:  # (SystemExit too: a crash, restarted, see RuntimeActor)
            self.fail_request(message, ServiceUnavailable(f"{self.name} failed: {exc}"))
            raise

    def _answer(self, asked: Asked) -> None:
        """An ask as pykka treats one: the handler's exception goes to the asker (a bad
        request is the asker's error) and the actor carries on."""
        try:
            answer = self.handle(self._checked(asked.message))
        except BaseException as exc:  # (SystemExit too: the asker's answer, not left to its timeout)
            self.log.info("exception returned to the asker", request=type(asked.message).__name__, error=repr(exc))
            asked.reply.fail(exc)
            return None
        asked.reply.send(answer, hand_over=True)
        return None

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        try:  # reported whatever happens before it (review 139 F1)
            self.log.error("actor crashed", error=repr(exception_value))
            self._fail_queued()
            self.release()
        finally:
            self.ctx.report(ChildFailed(name=self.supervised_as or self.name, error=exception_value))

    def on_start_failed(self, error: BaseException) -> None:
        # Reported like a crash, so the supervisor learns why (an open raises the owner's
        # own error, e.g. a refusal of its files), and what it had opened is closed.
        try:
            self.release()
        finally:
            self.ctx.report(ChildFailed(name=self.supervised_as or self.name, error=error, at_start=True))

    def on_stop(self) -> None:
        self._fail_queued()
        self.release()

    def release(self) -> None:
        """Close what the actor owns (mappings); called on stop and after a crash."""

    def _fail_queued(self) -> None:
        for queued in self.drain_queued(f"{self.name} stopped"):
            self.fail_told_after_stop(queued.message)

    def fail_told_after_stop(self, message: object) -> None:
        """A told request that never reached `handle`: answered, so that its asker does not
        wait out its timeout (also for one that came after the drain above: the teardown)."""
        self.fail_request(message, StoppedBeforeHandling(f"{self.name} stopped before handling the request"))

    def fail_request(self, message: object, error: Exception) -> None:
        """Answer a told request this actor failed on (it crashed handling it) or never
        handled (stopped first). An owner whose requests carry what is already done (the
        flush actor's group commits: stored puts) answers them as that, not as refused."""
        reply = getattr(message, "reply", None)
        if isinstance(reply, Reply):
            reply.fail(error)
