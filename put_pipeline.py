"""Pipelined puts: `put_async` futures for threads, and the actor client for pykka actors.

A put is encoded in the caller's thread and told to the writer, which drains every put
waiting in one pass (actors.commitlog_writer); the caller does not wait for the answer. A
single plain message is encoded, given its in-flight slot and told in one C call
(storage._native.PutSubmitter, `_submit_one`); whatever that call declines, and every refusal,
goes the Python way (`_submit`), which stays the reference and the path without the extension. A
thread gets a `concurrent.futures.Future[PutResult]`, completed on this store's completion
thread (never the writer's: a done-callback is host code, and the writer must not run it);
an actor gets `Replied(correlation_id, PutResult)` in its inbox, or nothing (fire and forget:
failures go to the stats and the log).

At most `max_puts_in_flight` puts per store are told and not yet answered; beyond it a put
blocks until one is answered, or with `put_fail_fast_when_in_flight_full` is answered
OS_PAGE_CACHE_BUSY at once. Failures are statuses (SERVICE_NOT_AVAILABLE when the writer
crashed or the store closed), never exceptions set on the future.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
import time
import weakref
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import _base as _futures_base
from typing import TYPE_CHECKING, Any, Callable, Final, Iterator, Sequence, cast

import pykka

from .actors.commitlog_writer import PassReply
from . import log as _log_module
from .log import error_repr, get_logger, suppressed_fields
from .messages import STORED_STATUSES, EncodedPut, Message, PutResult, Replied, Reply, checked_message
from .runtime import INBOX_ENVELOPE, native_inbox, take_back_told, tell_all_keeping_gil, tell_from_store
from .storage import speedups
from .storage.status import PutMessageStatus
from .supervisor import SupervisorState
from .waits import DoneFlag, Sleepers, StoreThread

if TYPE_CHECKING:
    from .store import MessageStore

__all__ = ["PutPipeline", "ActorClient"]

_WRITER_STOPPED = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="writer stopped")
IN_FLIGHT_FULL = PutResult(status=PutMessageStatus.OS_PAGE_CACHE_BUSY, detail="max_puts_in_flight reached")
BYTES_IN_FLIGHT_FULL = PutResult(status=PutMessageStatus.OS_PAGE_CACHE_BUSY, detail="max_put_bytes_in_flight reached")
NO_COMPLETION_THREAD = PutResult(
    status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
    detail="no thread could be started to complete the futures (the process is short of threads or memory): "
    "not stored; the next put_async tries again",
)
# A put this large (its encoded records) or larger also takes its bytes from
# max_put_bytes_in_flight; the C submitter leaves it to the Python path, which counts them.
LARGE_PUT_BYTES: Final = 16 * 1024
_RUNNING = SupervisorState.RUNNING
_monotonic_ns = time.monotonic_ns


def as_put_result(answer: Any) -> PutResult:
    """The writer's answer as a PutResult: a failure (the writer crashed or stopped holding
    the put) is SERVICE_NOT_AVAILABLE, an operating error like any other."""
    if isinstance(answer, PutResult):
        return answer
    return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=str(answer) or type(answer).__name__)


class _PutFuture(Future[PutResult]):
    """A put's future: a real concurrent.futures.Future (add_done_callback, result, wait and
    as_completed work as on any, except inside a done-callback, which runs on the completion
    thread: there `result()` on another put's future works, but `wait` and `as_completed`
    would wait on the thread they run on, and stall every future of the store until its
    close), made cheaper for the one use most get, completed once and polled.

    - Its threading.Condition is made on first use, not in __init__: building one was ~2.5 us
      of put_async's caller (Future() 2.9 us, this 0.3). Anything that waits or registers a
      callback goes through `_condition` and makes it; a completion that finds none made
      completes the future without it (nobody can be waiting). Both happen under one
      module lock, so a waiter arriving at the same time sees either the completed future or
      a completion that goes the Condition's way and wakes it.
    - Its lists of waiters (concurrent.futures.wait, as_completed) and done-callbacks too:
      two lists a put were a fifth of the caller's allocations, and so of its garbage
      collector passes. Each is only added to under the Condition, so it is made there.
    - The put is handed to the writer at once, so it can never be cancelled and is running
      from the start: said by cancel/running rather than by set_running_or_notify_cancel.
    - It is only ever completed with a result (failures are statuses), never an exception.
    """

    # Set once its waiters (concurrent.futures.wait, as_completed) were given it, or it was
    # completed with none: a child made by fork() while the completion thread was between the
    # two gives them it (review 127 F1); one completed with none, whose waiter came after (an
    # as_completed yields it from the futures done when it began), must not be given again
    # (review 128 F4: KeyError in the child's as_completed).
    _waiters_told: bool = False
    _told: list[Any] = []  # the waiters given it so far (`_tell_waiters`); never appended to here

    def __init__(self) -> None:  # Future.__init__'s fields, without its Condition
        self._cond: threading.Condition | None = None
        self._state = _PENDING
        self._result: PutResult | None = None
        self._exception: BaseException | None = None
        self._waiter_list: list[Any] | None = None
        self._callback_list: list[Any] | None = None
        self._sleepers: Sleepers | None = None  # threads in result()/exception(), made by the first
        # The end of the furthest record stored by the writer pass that answered this put:
        # a pass appends queue by queue, so an older put of the caller's may end after this
        # one; its reads after this future is done cover the pass (read-your-writes).
        self.pass_end = 0
        # The store's thread-local read-your-writes state (None: refused before the writer).
        self.seen_by: threading.local | None = None

    @property  # Future's attribute, made on first use
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        condition = self._cond
        if condition is None:
            with _CONDITION_MADE:
                condition = self._cond
                if condition is None:
                    condition = self._cond = threading.Condition()
                    _WITH_CONDITION.add(self)
        return condition

    @property  # Future's attribute, made on first use
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        waiters = self._waiter_list
        if waiters is None:
            waiters = self._waiter_list = []
        return waiters

    @property  # Future's attribute, made on first use
    def _done_callbacks(self) -> list[Any]:
        callbacks = self._callback_list
        if callbacks is None:
            callbacks = self._callback_list = []
        return callbacks

    def set_result(self, result: PutResult) -> None:
        if self._cond is None:
            with _CONDITION_MADE:
                if self._cond is None:  # no waiter, no callback, and none can come in between
                    if self._state is _FINISHED:  # (not repr(self): it takes this lock)
                        raise InvalidStateError(f"{self._state}: the put's future is already done")
                    self._result = result
                    self._state = _FINISHED
                    self._waiters_told = True  # (none: a waiter makes the Condition)
                    self._wake_sleepers()
                    return
        super().set_result(result)
        self._wake_sleepers()

    # Done once its result is set: a future whose Condition a host thread held gets its result
    # before its state says FINISHED (_complete_futures); concurrent.futures.wait, as_completed
    # and add_done_callback, which read the state under the Condition, see it done when they
    # are told (_notify_held).
    def done(self) -> bool:
        return self._result is not None

    def result(self, timeout: float | None = None) -> PutResult:
        if self._result is None and not self._sleep_until_done(_complete_while_waiting(self, timeout)):
            raise TimeoutError()  # (concurrent.futures.TimeoutError)
        result = self._result
        assert result is not None  # only ever completed with a result
        if self.seen_by is not None and result.status in STORED_STATUSES:
            # This thread has seen it stored: its reads cover it (and its pass), whatever its
            # newest put does (refused, or still in flight: review 69 F4).
            seen = self.seen_by.__dict__
            end = max(result.commitlog_offset + result.wrote_bytes, self.pass_end)
            if end > seen.get("seen_put_end", 0):
                seen["seen_put_end"] = end
        return result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._result is None and not self._sleep_until_done(_complete_while_waiting(self, timeout)):
            raise TimeoutError()
        return None  # only ever completed with a result

    def _sleep_until_done(self, timeout: float | None) -> bool:
        """Whether it is done, sleeping at most `timeout` on a raw lock of this thread's, which
        the completion releases (waits.Sleepers). Not the Future's Condition (waits.py): a
        Ctrl-C in result() as its lock was taken left it held (another thread's result(timeout)
        never returned), or gave the host RuntimeError instead of its KeyboardInterrupt
        (review 85 F5/F7)."""
        sleepers = self._sleepers
        if sleepers is None:
            with _CONDITION_MADE:
                sleepers = self._sleepers
                if sleepers is None:
                    sleepers = self._sleepers = Sleepers(_CONDITION_MADE)
        return sleepers.sleep_until(self.done, timeout)

    def _wake_sleepers(self) -> None:
        """(Once the state says FINISHED.) Every thread sleeping in result()/exception()."""
        sleepers = self._sleepers
        if sleepers:
            sleepers.wake_all()

    def cancel(self) -> bool:
        return False

    def running(self) -> bool:
        return self._result is None


def _tell_waiters(future: _PutFuture) -> None:
    """Give a completed future to its waiters (concurrent.futures.wait, as_completed), noting
    each as it is told: a fork's child gives it to the others only (review 129 F2: a fork
    between two waiters gave the first one the future twice, KeyError in its as_completed)."""
    waiters = future._waiters
    if waiters:
        told: list[Any] = []
        future._told = told
        with _TELLING:
            for waiter in waiters:
                waiter.add_result(future)
                told.append(waiter)
    future._waiters_told = True


# Held while a future is given to its waiters and noted as told, and by fork() (its `before`
# hook): a child made then never holds a waiter given it and not noted (it gave it again:
# KeyError in its as_completed; seen once in a loaded run). Reentrant, and released
# after the fork only by the thread that took it: a signal that interrupts the hook's wait
# (Ctrl-C) lets the fork go on without it, and a release then killed the completion thread
# (review 150 F1); a handler that forks on a thread mid-telling takes it again.
_TELLING = threading.RLock()


def _fork_between_tellings() -> None:
    _TELLING.acquire()


def _tellings_go_on() -> None:
    if _TELLING._is_owned():  # type: ignore[attr-defined]  # (the C RLock's, as Condition uses it)
        _TELLING.release()


os.register_at_fork(before=_fork_between_tellings, after_in_parent=_tellings_go_on, after_in_child=_tellings_go_on)


# The pipeline whose completion thread this is (unset elsewhere): see _complete_while_waiting.
_COMPLETING = threading.local()
# How often such a wait looks again at a future that nothing in this queue completes.
_WAIT_POLL_S = 0.01


def _complete_while_waiting(future: _PutFuture, timeout: float | None) -> float | None:
    """A done-callback (on the completion thread, the only one that completes futures) that
    waits on another put's future would wait on itself, forever without a timeout: there the
    wait completes the passes queued behind it instead, until `future` is done. Returns what
    is left of `timeout` for the wait that follows."""
    pipeline: PutPipeline | None = _COMPLETING.__dict__.get("pipeline")
    if pipeline is None or future._result is not None:
        return timeout
    deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    pipeline.complete_until(future, deadline)
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


# Guards making a _PutFuture's Condition against completing it without one.
_CONDITION_MADE = threading.Lock()
# The futures whose Condition was made (someone waited on them or gave them a callback): in a
# forked child each gets a new one on first use, as a thread of the parent may have held the
# old one at the fork (review 128 F3: another thread's concurrent.futures.wait held a finished
# future's, and the child's as_completed hung for good on it).
_WITH_CONDITION: weakref.WeakSet[_PutFuture] = weakref.WeakSet()
# Futures given their result without their lock, their waiters not told yet (`_notify_held`):
# out of their pipeline's pending set, so a fork's child finishes them from here (review 132
# F1: their state never said FINISHED there, and a wait() on one hung the child for good).
_HELD_UNTOLD: weakref.WeakSet[_PutFuture] = weakref.WeakSet()


def _new_condition_guard_in_a_forked_child() -> None:
    # A thread of the parent may have held it at the fork; that thread does not exist here.
    global _CONDITION_MADE
    _CONDITION_MADE = threading.Lock()
    for future in list(_WITH_CONDITION):
        future._cond = None


os.register_at_fork(after_in_child=_new_condition_guard_in_a_forked_child)


def _finish_in_a_forked_child(future: _PutFuture, unknown: PutResult, renewed: set[int]) -> None:
    """(In a child made by fork.) `future` done, with `unknown` unless it has its result, and
    given to the waiters of concurrent.futures begun before the fork that it was not given
    yet; once (`_waiters_told`). Set without its locks, which a parent thread may have held at
    the fork; its done-callbacks are the parent's and run there, not here."""
    # Its Condition, which the completion thread may have held at the fork, made anew on
    # first use; nobody in this child waits on it yet.
    future._cond = None
    future._sleepers = None
    if future._state is not _FINISHED:
        future._callback_list = None
        if future._result is None:  # (set, it was held: stored or not, as the parent knew)
            future._result = unknown
        future._state = _FINISHED
    elif future._waiters_told:
        return
    # A wait() or as_completed() a thread had begun before the fork waits on its waiter's event
    # (review 127 F1: never set, the child hung), also for a future the completion thread had
    # finished but not yet given them; the waiter stays in the list its cleanup removes it
    # from. Its lock and event are made anew first: a parent thread may have held them.
    told = future._told
    for waiter in future._waiter_list or ():
        if any(waiter is t for t in told):
            continue  # (given it before the fork)
        if id(waiter) not in renewed:
            renewed.add(id(waiter))
            was_set = waiter.event.is_set()
            waiter.event = threading.Event()
            if was_set:
                waiter.event.set()
            if hasattr(waiter, "lock"):
                waiter.lock = threading.Lock()
        if any(f is future for f in waiter.finished_futures):
            # Given it, and the fork came before that was noted in `told` (a second copy was
            # KeyError in the child's as_completed; seen once in a loaded run). It is still
            # in the list: taking it out needs the future's Condition, which the telling held.
            # The event the fork may have cut off is set where one future sets it (not for
            # ALL_COMPLETED, whose count may or may not have been taken: left).
            if not hasattr(waiter, "num_pending_calls"):
                waiter.event.set()
            continue
        waiter.add_result(future)
    future._waiters_told = True


def _held_untold_in_a_forked_child() -> None:
    """The futures given their result without their lock, their waiters not told yet: out of
    every store's pending set, and maybe of a store closed since (review 134 F1: with no store
    open at the fork, nothing finished them, and a wait() on one hung the child for good)."""
    held = list(_HELD_UNTOLD)
    _HELD_UNTOLD.clear()
    unknown = PutResult(PutMessageStatus.UNKNOWN_ERROR, detail="left behind by fork()")
    renewed: set[int] = set()
    for future in held:
        _finish_in_a_forked_child(future, unknown, renewed)


os.register_at_fork(after_in_child=_held_untold_in_a_forked_child)
_PENDING: str = _futures_base.PENDING
_FINISHED: str = _futures_base.FINISHED


# How long the completion thread waits for a future's Condition a host thread holds: a
# legitimate holder (result(), add_done_callback, concurrent.futures.wait) keeps it for
# microseconds; one a Ctrl-C interrupted inside Condition.__enter__ keeps it for good.
_HELD_CONDITION_WAIT_S: Final = 0.05
# close() waits for the completion thread to run every done-callback due, as long as one of them
# finishes within this long: a host recording each ack (an fsync, a commit) may need more than
# any fixed bound for thousands, and the rest were dropped at the exit (review 93 M1, 595 of
# 3,000 after 5 s); one stuck in a callback is given up on, said.
CLOSE_STALL_S: Final = 5.0
# How long, after the store closed, such futures are looked at again for their lock.
_HELD_NOTIFY_FOR_S: Final = 600.0


def _complete_futures(completions: list[tuple[_PutFuture, PutResult]], held: list[_PutFuture]) -> list[_PutFuture]:
    """set_result for a pass's futures, with the lock taken once for the pass instead of once
    a future: those nobody waits on (no Condition made) are completed under it; the others
    through their Condition after it. Returns those whose done-callbacks are due, for the
    caller to run once every result is set: a callback may wait on a later future of the same
    pass, which only the completion thread could complete. One already done (by close(),
    racing) is left as it is.

    A future whose Condition a host thread holds past _HELD_CONDITION_WAIT_S gets its result
    without it (readable at once by result()'s lock-free path) and goes into `held`, to be
    notified and have its callbacks run once the lock is free (`_notify_held`): waiting for
    it, the one completion thread stopped every later future of the store for good when a
    Ctrl-C left the lock held inside asyncio.wrap_future's add_done_callback (review 75 H1)."""
    waited: list[tuple[_PutFuture, PutResult]] = []
    with _CONDITION_MADE:
        for future, result in completions:
            if future._cond is not None:
                waited.append((future, result))
            elif future._result is None:
                future._result = result
                future._state = _FINISHED
                future._waiters_told = True  # (none: a waiter makes the Condition)
                if future._sleepers:  # (inline: once a put on the completion thread)
                    future._sleepers.wake_all()
    completed: list[_PutFuture] = []
    for future, result in waited:
        condition = future._condition
        if not condition.acquire(timeout=_HELD_CONDITION_WAIT_S):
            if future._result is None:
                # Readable at once (result() reads it without the lock); the state, which the
                # standard waiters read under the lock, is set when they are told (_notify_held).
                # Set FINISHED here, an as_completed begun meanwhile took it for done when it
                # began, and was given it again when told: KeyError.
                future._result = result
                _HELD_UNTOLD.add(future)
                future._wake_sleepers()
                held.append(future)
            continue
        try:
            if future._result is not None:  # completed meanwhile by close() (_complete_closed), or held
                continue
            future._result = result
            future._state = _FINISHED
            _tell_waiters(future)
            condition.notify_all()
        finally:
            condition.release()
        future._wake_sleepers()
        completed.append(future)
    return completed


def _notify_held(held: list[_PutFuture]) -> list[_PutFuture]:
    """The futures of `held` whose Condition is free now, notified (their waiters and
    concurrent.futures.wait's) and taken out of `held`: their done-callbacks are due."""
    freed: list[_PutFuture] = []
    still: list[_PutFuture] = []
    for future in held:
        condition = future._condition
        if not condition.acquire(blocking=False):
            still.append(future)
            continue
        try:
            future._state = _FINISHED
            _tell_waiters(future)
            condition.notify_all()
        finally:
            condition.release()
        _HELD_UNTOLD.discard(future)
        freed.append(future)
    held[:] = still
    return freed


class _GatewayHold:
    """What a gateway's Put holds of max_put_bytes_in_flight (`_BytesInFlight.take` records it)."""

    __slots__ = ("held_bytes",)

    def __init__(self) -> None:
        self.held_bytes = 0


# `_PutReply.send`'s test-and-set: uncontended but for a race of two answers of one put (a
# group commit the flush actor answers as the supervisor expires it); the pass path never takes it.
_ANSWERED_ONCE = threading.Lock()


def _answered_once_in_a_forked_child() -> None:
    global _ANSWERED_ONCE  # a parent's thread that held it at the fork does not exist here
    _ANSWERED_ONCE = threading.Lock()


os.register_at_fork(after_in_child=_answered_once_in_a_forked_child)


class _PutReply(PassReply):
    """One pipelined put's Reply: where its answer goes (a future, an actor, or nowhere for
    fire and forget) and what the stats need. The writer hands a pass's answers to the sink
    at once (PassReply); a crash or drain answers it alone through `send`/`fail`. One slotted
    object per put, no lock, no closure: fewer objects for the garbage collector, whose passes
    were a third of put_async's cost in the caller."""

    __slots__ = ("sink", "future", "sender", "correlation_id", "topic", "started", "held_bytes")

    def __init__(
        self,
        sink: _Sink,
        future: _PutFuture | None,
        sender: pykka.ActorRef[Any] | None,
        correlation_id: object,
        topic: str,
        started: int,
    ) -> None:
        # Not Reply.__init__: no lock of its own per put. The writer's pass answers it alone
        # (`_done` set directly); every other answer, which two threads can race to give (the
        # flush actor's group commit and the supervisor expiring it past its deadline, a crash
        # handler, the drain), goes through `send` under one lock shared by all puts.
        self._done = False
        self.sink = sink  # a slot, not PassReply's property: the writer reads it once per put
        self.future = future
        self.sender = sender
        self.correlation_id = correlation_id
        self.topic = topic
        self.started = started
        self.held_bytes = 0  # of max_put_bytes_in_flight, given back with the answer

    def send(self, answer: Any, *, hand_over: bool = False, posts: list[Any] | None = None) -> None:
        with _ANSWERED_ONCE:
            if self._done:
                return
            self._done = True
        self.sink.answer_pass([(self, answer)])

    def fail(self, exc: BaseException) -> None:
        self.send(exc)


class _Sink:
    """Where a pass's answers of one kind go (PassSink)."""

    __slots__ = ()

    def answer_pass(self, answers: list[tuple[PassReply, Any]]) -> None:
        raise NotImplementedError


class _ToCompletion(_Sink):
    """Futures (and threads' fire-and-forget): the pass's answers go to the completion thread
    as one item, one wake-up per pass; their done-callbacks are host code, which the writer
    must not run."""

    __slots__ = ("_completions",)

    def __init__(self, completions: queue.SimpleQueue[list[tuple[PassReply, Any]] | None]) -> None:
        self._completions = completions

    def answer_pass(self, answers: list[tuple[PassReply, Any]]) -> None:
        self._completions.put(answers)


class _ToActors(_Sink):
    """Actor clients: each answer is told to its sender as Replied, from the answering thread
    (a tell only enqueues); a pass gives its in-flight slots back at once."""

    __slots__ = ("_pipeline",)

    def __init__(self, pipeline: PutPipeline) -> None:
        self._pipeline = pipeline

    def answer_pass(self, answers: list[tuple[PassReply, Any]]) -> None:
        pipeline = self._pipeline
        pipeline._release_slots(len(answers))
        pipeline._release_bytes(answers)
        now = time.monotonic_ns()
        figures: list[tuple[str, PutResult, int]] = []
        # Each sender's answers of the pass are told together, in order: one inbox extend;
        # its read-your-writes end is noted once, for the furthest of its stored puts.
        by_sender: dict[int, _SenderAnswers] = {}
        stored = STORED_STATUSES
        for reply, answer in cast("list[tuple[_PutReply, Any]]", answers):  # only _PutReplies carry this sink
            result = answer if type(answer) is PutResult else as_put_result(answer)
            figures.append((reply.topic, result, now - reply.started))
            sender = reply.sender
            if sender is None:  # fire and forget
                if result.status not in stored:
                    pipeline._log_forgotten(reply, result)
                continue
            entry = by_sender.get(id(sender))
            if entry is None:
                by_sender[id(sender)] = entry = _SenderAnswers(sender)
            entry.replies.append(_replied(reply.correlation_id, result))
            if result.status in stored and (end := result.commitlog_offset + result.wrote_bytes) > entry.end:
                entry.end = end
        pipeline._record(figures)
        last = len(by_sender) - 1
        for i, entry in enumerate(by_sender.values()):
            sender, replies = entry.sender, entry.replies
            if entry.end:
                pipeline.note_actor_end(sender, entry.end)
            try:
                # All but the last sender keep the GIL: one switch per pass, not one per answer.
                if not tell_all_keeping_gil(sender, replies, hand_over=i == last):
                    for replied in replies:
                        tell_from_store(sender, replied)  # (on the notifier if it may block)
            except pykka.ActorDeadError:
                pass  # the asker is gone; the puts themselves stand
            except Exception as exc:  # never let one sender keep the rest of the pass from theirs
                if (suppressed := pipeline._repeats.admit(("put answers undelivered", type(exc)))) is not None:
                    pipeline.log.warning("a put's answers could not be delivered", puts=len(replies), error=error_repr(exc),
                                         **suppressed_fields(suppressed))  # fmt: skip


class _SenderAnswers:
    """One sender's answers of a pass, and the end of its furthest stored put (0: none)."""

    __slots__ = ("sender", "replies", "end")

    def __init__(self, sender: pykka.ActorRef[Any]) -> None:
        self.sender = sender
        self.replies: list[Replied[PutResult]] = []
        self.end = 0


_new_replied = object.__new__
# The slots' member descriptors (vars(): mypy types the fields as instance attributes).
_set_correlation_id: Callable[[Replied[PutResult], Any], None] = vars(Replied)["correlation_id"].__set__
_set_answer: Callable[[Replied[PutResult], Any], None] = vars(Replied)["answer"].__set__


def _replied(correlation_id: object, answer: PutResult) -> Replied[PutResult]:
    """Replied(correlation_id=..., answer=...) through its slots: the frozen dataclass's
    __init__ sets each field through object.__setattr__ (1.08 us; this 0.37 us), once per put
    on the writer's thread. The same object: equal, hashable, matched by `case Replied(...)`."""
    replied: Replied[PutResult] = _new_replied(Replied)
    _set_correlation_id(replied, correlation_id)
    _set_answer(replied, answer)
    return replied


class _InFlightSlots:
    """The in-flight bound as a counting semaphore. With the C extension a Signal holding one
    count per free slot: a take is one sem_trywait (no Python lock: a lock and a counter cost
    ~0.8 us a put), a blocked take waits without the GIL. Without it, a counter under a lock
    that nobody holds across a wait: a blocked taker sleeps on a raw lock of its own, released
    by give() (a Condition's wait let an interrupt land between letting the lock go and its
    try, and the caller's `with` exit then raised RuntimeError, or, with a plain Lock, released
    the completion thread's hold: reviews 82 H1, 83; waits.py)."""

    __slots__ = ("_signal", "_lock", "_sleepers", "_free", "_slots")

    def __init__(self, slots: int) -> None:
        native = speedups.native
        self._signal: Any = native.Signal() if native is not None else None
        self._lock = threading.Lock()
        self._sleepers = Sleepers(self._lock)  # the blocked takers
        self._slots = slots
        self._free = slots
        if self._signal is not None:
            self._signal.post_many_holding_gil(slots)

    @property
    def native_signal(self) -> Any:
        """The C Signal counting the free slots (None without the C extension)."""
        return self._signal

    @property
    def free(self) -> int:
        return self._signal.value() if self._signal is not None else self._free

    def take(self, timeout_s: float | None, taken: list[bool]) -> bool:
        """One slot: at once, else waiting at most `timeout_s` (None: not at all). A slot taken
        is also appended to `taken` before anything that can raise: an exception raised into
        the thread as the take returns (review 82 M2: a timeout library's async exception)
        leaves it there for the caller to give back, not lost for good."""
        signal = self._signal
        if signal is not None:
            return signal.wait(0.0, taken) or (timeout_s is not None and signal.wait(timeout_s, taken))
        if self._take_free(taken) or timeout_s is None:
            return bool(taken)
        return self._sleepers.sleep_until(lambda: self._take_free(taken), timeout_s)

    def _take_free(self, taken: list[bool]) -> bool:
        with self._lock:
            if self._free <= 0:
                return False
            taken.append(True)  # (first: given back once too many at worst, never lost)
            self._free -= 1
            return True

    def give(self, n: int) -> None:
        """`n` slots back, never past the bound: a put whose caller was interrupted (a signal
        handler's exception) just after the writer took it is given back twice, by the
        caller's cleanup and by its answer (review 44 H3)."""
        signal = self._signal
        if signal is not None:
            n = min(n, self._slots - signal.value())
            if n > 0:
                signal.post_many_holding_gil(n)
            return
        with self._lock:
            n = min(n, self._slots - self._free)
            self._free += n
            if n > 0:
                self._sleepers.wake_all()  # each looks again (the pure-Python path: few)


_ACTOR_PUT_ENDS_PRUNE_AT = 1024  # senders remembered before dead ones are dropped


class _BytesInFlight:
    """The bytes of large puts told and not yet answered, at most `limit` (a larger put goes
    alone, once nothing else holds any). Giving back never waits: the completion thread and
    the writer give, and a Condition whose lock a Ctrl-C left held (its `__enter__` is Python
    code) stopped every future for good (review 74). Takers settle what was given under a plain
    lock and poll while the bound is full: only puts of 16 KiB and more come here."""

    __slots__ = ("_limit", "used", "_given", "_lock")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.used = 0  # never below what is in flight (given bytes settle at the next take)
        self._given: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()

    def take(self, n: int, timeout_s: float | None, holder: _PutReply) -> bool:
        """`n` bytes, waiting up to `timeout_s` for them (None: not at all). Recorded in
        `holder.held_bytes` before they count: an exception raised into the thread as the take
        returns (a Ctrl-C at the `with`'s exit, review 82 M1) leaves them there for the caller
        to give back; before, they were counted in flight for good, down to every large put
        refused. (Interrupted between the two, they are given back once without having
        counted: the bound is over-admitted by one put, never shrunk.)"""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._settle()
                if not self.used or self.used + n <= self._limit:
                    holder.held_bytes = n
                    self.used += n
                    return True
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, _BYTES_POLL_S))

    def give(self, n: int) -> None:
        self._given.append(n)  # one C call: never blocks, whatever holds the lock

    def settled(self) -> int:
        """The bytes in flight now (for tests and figures)."""
        with self._lock:
            self._settle()
            return self.used

    def _settle(self) -> None:
        # Subtracted, then popped: an exception raised into the taker's thread between the
        # two (review 83 M1: a Ctrl-C as popleft() returned dropped a whole pass's bytes, held
        # for good) leaves the amount queued and not subtracted, or both done.
        given = self._given
        while given:
            left = self.used - given[0]
            self.used = left if left > 0 else 0
            given.popleft()


_BYTES_POLL_S = 0.002


class PutPipeline:
    """One per store: the in-flight bound, the futures handed out, the completion thread."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._slots = _InFlightSlots(store.config.max_puts_in_flight)
        self._bytes = _BytesInFlight(store.config.max_put_bytes_in_flight)  # review 71 F2
        self._fail_fast = store.config.put_fail_fast_when_in_flight_full
        # Futures handed out and not completed, so flush() can wait for them. set.add/discard
        # and copy() are single C calls under the GIL.
        self._pending: set[_PutFuture] = set()
        # Answers for the completion thread: a list per writer pass (or one per put answered
        # outside a pass); None stops the thread.
        self._completions: queue.SimpleQueue[list[tuple[PassReply, Any]] | None] = queue.SimpleQueue()
        self._to_completion = _ToCompletion(self._completions)
        self._to_actors = _ToActors(self)
        # Per sending actor (by urn): the commitlog end of its newest stored put, noted before
        # its Replied is told, so the actor's next read through the gateway reflects it.
        self._actor_put_ends: dict[str, tuple[weakref.ref[pykka.ActorRef[Any]], int]] = {}
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._thread_ended = False  # past its loop: it runs no more due callbacks (under _thread_lock)
        # Set as the completion thread returns (not Thread.join/is_alive: on 3.10-3.12 an
        # interrupt in join() marks a running thread stopped, review 93 M1).
        self._thread_done = DoneFlag()
        self._callbacks_run = 0  # futures whose done-callbacks ran: close()'s sign of progress
        # Completed futures whose done-callbacks have yet to run, each with whether it still
        # holds its in-flight slot (see _complete, _run_due_callbacks).
        self._callbacks_due: collections.deque[tuple[_PutFuture, bool]] = collections.deque()
        # Completed futures whose Condition a host thread held (_complete_futures): notified,
        # and their callbacks run, once it is free. The completion thread's only.
        self._held_futures: list[_PutFuture] = []
        # Threads putting for mqstore.aio: at the bound their put is refused at once, not
        # counted, and the coroutine waits for room without blocking its event loop.
        self._not_waiting = threading.local()
        self._closed = False
        self.log = get_logger("mqstore.puts", store=store.config.store_path_root_dir)
        self._repeats = store.host_repeats  # the lines a host's repeated mistake makes, limited
        # A single put's encode and hand-over in one C call (None: the Python path only, as
        # on a SLAVE, which refuses every put there), and the writer incarnation it last told:
        # (ref, its stopped event, inbox append, Signal).
        slots_signal = self._slots.native_signal
        self._submitter: Any = (
            store._encoder.native_submitter(store.clock_ms, slots_signal, EncodedPut, INBOX_ENVELOPE, Message,
                                            max_record_bytes=LARGE_PUT_BYTES - 1)  # fmt: skip
            if slots_signal is not None and store._slave_refusal is None else None
        )  # fmt: skip
        self._peers = store.supervisor.ctx.peers
        self._writer_inbox: tuple[pykka.ActorRef[Any], threading.Event, Callable[[Any], None], Any] | None = None

    # read-your-writes for actors ------------------------------------------------------------
    def hold_for_gateway(self, size: int) -> PutResult | Callable[[], None]:
        """An in-flight slot (and, for a large put, its bytes) for a Put the gateway hands to
        the writer, as every other way of putting holds them; never waited for (the gateway
        serves reads too): OS_PAGE_CACHE_BUSY where they are full, as RocketMQ answers. Else
        what gives them back, to call once the put is answered (review 124 F2: the gateway's
        Puts held neither, and a host actor telling Puts faster than the disk took them grew
        the writer's inbox without bound: 1.3 GiB of 1 MiB puts, MemoryError under RLIMIT_DATA)."""
        held = _GatewayHold()
        if size >= LARGE_PUT_BYTES and not self._bytes.take(size, None, cast("_PutReply", held)):
            return BYTES_IN_FLIGHT_FULL
        slot: list[bool] = []
        if not self._slots.take(None, slot):
            if held.held_bytes:
                self._bytes.give(held.held_bytes)
            return IN_FLIGHT_FULL

        def release() -> None:
            self._slots.give(1)
            if held.held_bytes:
                self._bytes.give(held.held_bytes)

        return release

    def left_behind_by_fork(self, detail: str) -> None:
        """In a child made by fork(): the futures in flight at the fork are the parent's
        puts, which this process will never learn the outcome of (no thread of the store is
        copied). Each is completed at once with UNKNOWN_ERROR, not a failure: the parent may
        have stored it (review 124 F1: they stayed pending, and a result() or wait() without a
        timeout hung the child for good). Set without their locks, which a parent thread may
        have held at the fork (nothing in this child waits on them yet); their done-callbacks
        are the parent's and run there, not here."""
        unknown = PutResult(PutMessageStatus.UNKNOWN_ERROR, detail=detail)
        renewed: set[int] = set()
        for future in list(self._pending):  # (the completion thread takes a pass's out once all are done)
            _finish_in_a_forked_child(future, unknown, renewed)
        self._pending.clear()

    def note_actor_put(self, sender: pykka.ActorRef[Any], result: PutResult) -> None:
        """Before `sender` is told `result`: where its newest stored put ends (the answering
        thread; entries of actors that stopped are dropped as the table grows)."""
        if result.stored:
            self.note_actor_end(sender, result.commitlog_offset + result.wrote_bytes)

    def note_actor_end(self, sender: pykka.ActorRef[Any], end: int) -> None:
        """`note_actor_put` by the end of the put (one call per sender of a pass)."""
        urn = sender.actor_urn
        known = self._actor_put_ends.get(urn)
        if known is not None and known[1] >= end:
            return
        ends = self._actor_put_ends
        if known is None and len(ends) >= _ACTOR_PUT_ENDS_PRUNE_AT:
            for gone in [u for u, (ref, _) in ends.items() if (r := ref()) is None or not r.is_alive()]:
                del ends[gone]
        ends[urn] = (weakref.ref(sender), end)

    def actor_put_end(self, actor: pykka.ActorRef[Any]) -> int:
        """The end of `actor`'s newest stored put answered so far (0: none)."""
        known = self._actor_put_ends.get(actor.actor_urn)
        return known[1] if known is not None else 0

    def noting_reply(self, reply: Reply[PutResult], sender: pykka.ActorRef[Any]) -> Reply[PutResult]:
        """`reply` (told to `sender`) that first notes the put's end for read-your-writes."""

        def done(answer: Any) -> None:
            if isinstance(answer, Exception):
                reply.fail(answer)
                return
            if type(answer) is PutResult:
                self.note_actor_put(sender, answer)
            reply.send(answer)

        return Reply(callback=done, store_internal_callback=True)

    # threads ---------------------------------------------------------------------------------
    def put_async(self, message: Message) -> Future[PutResult]:
        """store.put_async (one message, `_submit_one`)."""
        future = _PutFuture()
        pending = self._pending
        try:  # (the add inside: a signal handler's exception right after it leaked the future)
            pending.add(future)
            refused = self._submit_one(message, _PutReply(self._to_completion, future, None, None, message.topic, _monotonic_ns()))
        except BaseException:  # bad input (TypeError, ValueError), or a signal handler's exception:
            pending.discard(future)  # not handed out, or the writer completes it; flush won't wait for it
            raise
        return self._handed_out(future, refused)

    def put_batch_async(self, messages: Sequence[Message]) -> Future[PutResult]:
        """store.put_batch_async (a checked, non-empty batch)."""
        future = _PutFuture()
        try:  # as put_async
            self._pending.add(future)
            refused = self._submit(messages, True, _PutReply(self._to_completion, future, None, None, messages[0].topic, _monotonic_ns()))
        except BaseException:
            self._pending.discard(future)
            raise
        return self._handed_out(future, refused)

    def _handed_out(self, future: _PutFuture, refused: PutResult | None) -> Future[PutResult]:
        """The future of a put just submitted: completed here if it was refused before the
        writer, else this thread's newest (read-your-writes: once this thread saw it done,
        its reads cover the put)."""
        if refused is not None:
            self._pending.discard(future)
            try:
                future.set_result(refused)  # refused before the writer, in the caller's thread
            except InvalidStateError:  # completed meanwhile by a racing close() ("store closed")
                pass
            return future
        local = future.seen_by = self._store._local
        local.last_async_put = future
        if self._closed:
            self._complete_closed()  # closed meanwhile: no completion thread to do it
        return future

    def _submit_one(self, message: Message, reply: _PutReply) -> PutResult | None:
        """`_submit` of one message (not a batch): encoded, its slot taken and the writer told
        in one C call (PutSubmitter) while the store is running and the writer up; whatever
        that call declines (a topic seen for the first time, a message outside the C
        encoder's fast path, no free slot) and every refusal go through `_submit`."""
        submitter = self._submitter
        store = self._store
        if (
            submitter is not None
            and not store._closed
            and store.supervisor.state is _RUNNING
            and speedups.native is not None  # (a test may switch the C paths off per case)
        ):
            writer = self._peers.get("writer")
            target = self._writer_inbox
            if target is None or target[0] is not writer:
                target = self._writer_inbox = self._native_target(writer)
            if target is not None and not target[1].is_set():
                if self._thread is None and reply.sink is self._to_completion and not self._start_completions():
                    return self._counted_refusal(reply, NO_COMPLETION_THREAD)
                if submitter.submit(message, reply, target[2], target[3]):
                    stopped = target[1]
                    # The writer stopped while the put was handed over: take it back from
                    # the dead inbox, or its future would wait until close().
                    if stopped.is_set() and take_back_told(target[0], lambda m: getattr(m, "reply", None) is reply) is not None:
                        reply.send(_WRITER_STOPPED)
                    return None
        return self._submit((message,), False, reply)

    @staticmethod
    def _native_target(
        writer: pykka.ActorRef[Any] | None,
    ) -> tuple[pykka.ActorRef[Any], threading.Event, Callable[[Any], None], Any] | None:
        """What PutSubmitter needs of this writer incarnation (None: down, or not on a FastInbox)."""
        inbox = native_inbox(writer) if writer is not None else None
        if writer is None or inbox is None:
            return None
        return writer, writer.actor_stopped, inbox[0], inbox[1]

    def _submit(self, messages: Sequence[Message], batch: bool, reply: _PutReply) -> PutResult | None:
        """Encode here, take an in-flight slot, tell the writer, which answers `reply`. A
        PutResult if refused before the writer (no slot taken, `reply` not answered); else None.
        The slot is given back once the answer is delivered (for a future, once the completion
        thread took it: a slow done-callback holds the slots, so the completion queue stays
        bounded too)."""
        store = self._store
        checked = store._encode(messages, batch)
        if isinstance(checked, PutResult):
            return checked
        size = sum(map(len, checked[0]))
        # What this put holds, recorded by the takes themselves (review 82 M1/M2): an exception
        # raised into this thread (a Ctrl-C, a timeout library's async exception) between a
        # take and the tell finds them here and gives them back; before, each such one lowered
        # the bound for good, down to every put waiting its timeout (review 44 H3).
        slot: list[bool] = []
        told = False
        try:
            if size >= LARGE_PUT_BYTES:
                if not (self._bytes.take(size, None, reply) or self._take_bytes_waiting(size, reply)):
                    if not self._not_waiting.__dict__.get("on"):  # (mqstore.aio waits, then asks again)
                        store.stats_service.record_put(reply.topic, BYTES_IN_FLIGHT_FULL, time.monotonic_ns() - reply.started)
                    return BYTES_IN_FLIGHT_FULL
            if not (self._slots.take(None, slot) or self._take_slot_waiting(slot)):  # a free slot: one C call
                if not self._not_waiting.__dict__.get("on"):
                    store.stats_service.record_put(reply.topic, IN_FLIGHT_FULL, time.monotonic_ns() - reply.started)
                return IN_FLIGHT_FULL  # (its bytes, taken for a put that goes nowhere, given back below: review 77 H1)
            if self._thread is None and reply.sink is self._to_completion and not self._start_completions():
                return self._counted_refusal(reply, NO_COMPLETION_THREAD)  # (its slot and bytes given back below)
            # An answer gives the slot and the bytes back, one inside the tell too.
            store._tell_writer(messages, batch, checked, reply, keep_gil=True)  # a writer that is down: answered here
            told = True
        finally:
            if not told:  # refused, or the tell did not return (a Ctrl-C): what no answer gave back yet
                if slot:
                    self._slots.give(1)
                left, reply.held_bytes = reply.held_bytes, 0
                if left:
                    self._bytes.give(left)
        return None

    def _take_bytes_waiting(self, size: int, holder: _PutReply) -> bool:
        """`_take_slot_waiting` for a large put's bytes."""
        if self._fail_fast or threading.current_thread() is self._thread or self._not_waiting.__dict__.get("on"):
            return False
        return self._bytes.take(size, self._store._reply_timeout_s, holder)

    def _release_bytes(self, answers: list[tuple[PassReply, Any]]) -> None:
        """The bytes a pass's large puts held (one read while none is in flight)."""
        if not self._bytes.used:  # (at or above what is in flight: 0 means none)
            return
        freed = 0
        for reply, _ in answers:
            held = getattr(reply, "held_bytes", 0)
            if held:
                reply.held_bytes = 0  # type: ignore[attr-defined]
                freed += held
        if freed:
            self._bytes.give(freed)

    def _take_slot_waiting(self, taken: list[bool]) -> bool:
        """A slot when none was free: waiting for one, unless told to fail fast."""
        # The completion thread (a done-callback putting again) must never block: only it
        # gives slots back to futures. Nor an event loop's thread (mqstore.aio).
        if self._fail_fast or threading.current_thread() is self._thread or self._not_waiting.__dict__.get("on"):
            return False
        return self._slots.take(self._store._reply_timeout_s, taken)

    def _release_slots(self, n: int) -> None:
        self._slots.give(n)

    @contextlib.contextmanager
    def not_waiting(self) -> Iterator[None]:
        """Puts in this block, in this thread, never wait for room in the in-flight bounds:
        refused at once with IN_FLIGHT_FULL or BYTES_IN_FLIGHT_FULL (not counted as failed
        puts), for a caller that waits for room its own way (mqstore.aio's event loop)."""
        flag = self._not_waiting.__dict__
        flag["on"] = True
        try:
            yield
        finally:
            flag["on"] = False

    @property
    def fails_fast(self) -> bool:
        """put_fail_fast_when_in_flight_full: a full bound answers OS_PAGE_CACHE_BUSY."""
        return self._fail_fast

    @property
    def _free_slots(self) -> int:
        """Slots free now (for tests and figures)."""
        return self._slots.free

    def _start_completions(self) -> bool:
        """`_ensure_thread` for a put_async: False, logged, when no thread can be started now
        (RLIMIT_NPROC, a pids cgroup, no memory for a stack), so that the put is refused with
        a status rather than raising into its caller (review 90 L1: put_async's "operating
        errors are results" did not hold for this one)."""
        try:
            return self._ensure_thread()
        except RuntimeError as exc:
            if str(exc) != "can't start new thread":
                raise
            _log_module.PROCESS_REPEATS.say(self.log, "warning", "a thread to complete put_async futures could not be "
                                            "started; puts refused until one can", "put completions thread not started",
                                            error=repr(exc))  # fmt: skip
            return False

    def _counted_refusal(self, reply: _PutReply, result: PutResult) -> PutResult:
        """`result`, a refusal before the writer, counted in the store's put figures."""
        self._store.stats_service.record_put(reply.topic, result, time.monotonic_ns() - reply.started)
        return result

    def _ensure_thread(self) -> bool:
        if self._thread is not None:
            return True
        with self._thread_lock:
            if self._closed:
                return False
            if self._thread is None:
                thread = StoreThread(self._complete_loop, "mqstore-put-completions")
                # Only a thread that started is the completion thread: one that could not (no
                # threads or memory left: RuntimeError to this put's caller) was kept as it,
                # and every later future waited for it for good (review 52 M1). The next
                # put_async tries again. One whose start() was interrupted (a Ctrl-C in its
                # wait for the new thread, Python code) runs all the same: it names itself the
                # completion thread (_claim) when none is; before, each such one was a second
                # consumer, never stopped (review 82 M3: 137 threads left by 60 stores).
                thread.start()
                if self._thread is None:  # (it may have claimed itself already)
                    self._thread = thread
        return True

    def _claim(self) -> bool:
        """On the completion thread's start: whether it is the one (none was named, or it is)."""
        with self._thread_lock:
            me = threading.current_thread()
            if self._thread is None and not self._closed:
                self._thread = me
            return self._thread is me

    def _complete_loop(self) -> None:
        if not self._claim():
            return  # another is the completion thread (this one's start was interrupted)
        _COMPLETING.pipeline = self
        get = self._completions.get
        try:
            while True:
                if self._held_futures:  # look again for their lock while nothing comes
                    try:
                        answers = get(timeout=_HELD_CONDITION_WAIT_S)
                    except queue.Empty:
                        self._notify_held_futures()
                        self._run_due_callbacks()
                        continue
                else:
                    answers = get()
                if answers is None:
                    break
                self._complete(answers)
                self._run_due_callbacks()
        finally:
            # Callbacks that close() queued for this thread while it was still in one
            # (_complete_closed): from here on, close() runs them itself.
            with self._thread_lock:
                self._thread_ended = True
            try:
                self._run_due_callbacks()
                held, self._held_futures = self._held_futures, []
                self._notify_held_later(held)
            finally:
                self._thread_done.set()

    def on_completion_thread(self) -> bool:
        """Whether the caller runs on this pipeline's completion thread (in a done-callback)."""
        return threading.current_thread() is self._thread

    def complete_until(self, future: Future[PutResult], deadline: float | None) -> None:
        """On the completion thread, from a done-callback: complete queued passes until
        `future` is done, the monotonic `deadline` passes or close() asks the thread to stop
        (then close() completes what is left). Their done-callbacks are not run here but
        queued for the loop, after the running one returns: run here, a callback that waits
        in turn nested without bound (RecursionError, futures never completed)."""
        while not future.done():
            remaining = _WAIT_POLL_S if deadline is None else min(deadline - time.monotonic(), _WAIT_POLL_S)
            if remaining <= 0:
                return
            try:
                answers = self._completions.get(timeout=remaining)
            except queue.Empty:
                continue  # the future may be another store's, or completed by close()
            if answers is None:
                self._completions.put(None)  # for the loop this callback returns to
                return
            self._complete(answers, hold_due_slots=True)

    def _run_due_callbacks(self) -> None:
        """Done-callbacks of completed futures, in completion order, one at a time (a callback
        that waits completes more passes, whose callbacks join the end of the line). Each
        callback is run here, not by Future._invoke_callbacks, which stops at the first that
        raises a BaseException (SystemExit): the future's later callbacks would never run."""
        due = self._callbacks_due
        while due:
            try:
                future, held = due.popleft()
            except IndexError:  # taken by close() racing a completion thread it gave up on
                return
            try:
                for callback in future._callback_list or ():
                    try:
                        callback(future)
                    except BaseException as exc:  # never the end of this thread, nor of the future's other callbacks
                        if (suppressed := self._repeats.admit(("done-callback raised", type(exc)))) is not None:
                            self.log.error("a put's done-callback raised", error=error_repr(exc), **suppressed_fields(suppressed))
            finally:
                self._callbacks_run += 1
                if held:
                    self._release_slots(1)

    def _record(self, figures: list[tuple[str, PutResult, int]]) -> None:
        """A pass's figures (topic, result, latency_ns) into the stats, one call per pass."""
        try:
            self._store.stats_service.record_puts(figures)
        except Exception as exc:  # the figures are not worth an answer never given
            self.log.error("recording puts in the stats failed", puts=len(figures), error=repr(exc))

    def _log_forgotten(self, reply: _PutReply, result: PutResult) -> None:
        """A fire-and-forget put (no future, no sender) that failed goes to the log, as nobody
        else hears of it."""
        # The stats count every one (`_record`); the log says why, once per status and minute.
        # Per topic too: one topic's repeated refusal must not hide another's (review 59 L2),
        # up to REPEAT_LOG_NEW_KINDS_PER_FAMILY new topics a minute (review 84 F6).
        family = ("fire-and-forget put failed", result.status.name)
        if (suppressed := self._repeats.admit((*family, reply.topic), family=family)) is not None:
            self.log.warning("fire-and-forget put failed", topic=reply.topic, status=result.status.name,
                             detail=result.detail, **suppressed_fields(suppressed))  # fmt: skip

    def _complete(self, answers: list[tuple[PassReply, Any]], *, hold_due_slots: bool = False) -> None:
        """Complete a pass's futures, queue their done-callbacks, give their slots back. With
        `hold_due_slots` (a pass completed while a callback waits) the slots of futures with
        callbacks come back only once those ran: else puts went on taking the freed slots,
        and the callbacks queued without bound (458k in 14 s in a review's run)."""
        now = _monotonic_ns()
        figures: list[tuple[str, PutResult, int]] = []
        completions: list[tuple[_PutFuture, PutResult]] = []
        forgotten: list[tuple[_PutReply, PutResult]] = []
        stored = STORED_STATUSES
        pass_end = 0
        for reply, answer in cast("list[tuple[_PutReply, Any]]", answers):  # only _PutReplies carry this sink
            result = answer if type(answer) is PutResult else as_put_result(answer)
            figures.append((reply.topic, result, now - reply.started))
            future = reply.future
            if future is not None:
                completions.append((future, result))
            if result.status in stored:
                if (end := result.commitlog_offset + result.wrote_bytes) > pass_end:
                    pass_end = end
            elif future is None:  # fire and forget
                forgotten.append((reply, result))
        for future, _ in completions:  # set before any is done: its reader sees it with it
            future.pass_end = pass_end
        # The stats before any future completes: a caller that saw its put done sees it counted.
        self._record(figures)
        self._release_bytes(answers)  # the records are the writer's now, or dropped: memory goes with them
        due = _complete_futures(completions, self._held_futures)
        self._release_slots(len(answers) - len(due) if hold_due_slots else len(answers))
        self._callbacks_due.extend((future, hold_due_slots) for future in due)
        self._pending.difference_update([future for future, _ in completions])  # once done: flush() waits for them
        for reply, result in forgotten:
            self._log_forgotten(reply, result)
        if self._held_futures:
            self._notify_held_futures()

    def _notify_held_futures(self) -> None:
        self._callbacks_due.extend((future, False) for future in _notify_held(self._held_futures))

    def _notify_held_later(self, held: list[_PutFuture]) -> None:
        """Futures completed without their lock when nothing is left to notify them (the
        completion thread ended, the store closed): a thread of their own notifies them and
        runs their callbacks once their lock is free (review 77 M3: a waiter inside result()
        when the store closed was never woken)."""
        if not held:
            return
        log = self.log  # (not self: a lock kept for good must not keep the closed store alive)

        def notify() -> None:
            deadline = time.monotonic() + _HELD_NOTIFY_FOR_S
            while held and time.monotonic() < deadline:
                for future in _notify_held(held):
                    for callback in future._callback_list or ():
                        try:
                            callback(future)
                        except BaseException as exc:  # the host's callback: logged, never the end of this thread
                            log.error("a put's done-callback raised", error=error_repr(exc))
                if held:
                    time.sleep(_HELD_CONDITION_WAIT_S)
            if held:  # a lock kept for good (review 79 L1: one thread a close, for ever, before)
                log.error("futures whose lock a host thread keeps were never notified", futures=len(held))

        try:
            StoreThread(notify, "mqstore-held-futures").start()
        except RuntimeError as exc:  # no thread to be had: their results are set, readable by result()
            self.log.error("futures whose lock a host thread held cannot be notified", futures=len(held), error=repr(exc))

    # actors ----------------------------------------------------------------------------------
    def tell_put(
        self, messages: Sequence[Message], *, batch: bool, sender: pykka.ActorRef[Any] | None, correlation_id: object
    ) -> bool:
        """For ActorClient: the answer goes to `sender` as Replied(correlation_id, PutResult)
        (told from the writer's thread: a tell only enqueues), or with no sender to the stats
        and the log. False if the put was refused before reaching the writer."""
        topic = messages[0].topic if messages else ""
        reply = _PutReply(self._to_actors, None, sender, correlation_id, topic, _monotonic_ns())
        if batch or len(messages) != 1:
            refused = self._submit(messages, batch, reply)
        else:
            refused = self._submit_one(messages[0], reply)
        return refused is None or self._refused(refused, topic, sender, correlation_id)

    def checked_batch(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """The store's put_batch argument checks (TypeError, ValueError), plain messages."""
        return self._store._batch(messages)

    def tell_one(self, message: Message, sender: pykka.ActorRef[Any] | None, correlation_id: object) -> bool:
        """`tell_put` of one message (ActorClient.put and put_and_forget)."""
        reply = _PutReply(self._to_actors, None, sender, correlation_id, message.topic, _monotonic_ns())
        refused = self._submit_one(message, reply)
        return refused is None or self._refused(refused, message.topic, sender, correlation_id)

    def _refused(self, refused: PutResult, topic: str, sender: pykka.ActorRef[Any] | None, correlation_id: object) -> bool:
        """An actor client's put refused before the writer: told to its sender, or logged."""
        if sender is not None:  # refused here: no slot was taken, none to give back
            try:
                sender.tell(Replied(correlation_id=correlation_id, answer=refused))
            except pykka.ActorDeadError:  # as the writer's answers to a stopped sender: dropped
                if (suppressed := self._repeats.admit(("refused put's answer dropped", refused.status.name))) is not None:
                    self.log.warning("a refused put's answer could not be delivered; dropped", topic=topic,
                                     status=refused.status.name, detail=refused.detail,
                                     **suppressed_fields(suppressed))  # fmt: skip
        elif not refused.stored:
            # Nobody hears of it: the stats count each (the store's failed puts), and the log
            # says why: the first in full, then once a minute per status and topic with the count (a caller
            # repeating it in a loop logged 13k lines/s: review 58 F4).
            self._store.stats_service.record_put(topic, refused, 0)
            family = ("fire-and-forget put refused", refused.status.name)  # (as in _log_forgotten)
            if (suppressed := self._repeats.admit((*family, topic), family=family)) is not None:
                self.log.warning("fire-and-forget put refused", topic=topic, status=refused.status.name,
                                 detail=refused.detail, **suppressed_fields(suppressed))  # fmt: skip
        return False

    # flush and close -------------------------------------------------------------------------
    def wait_handed_out(self, timeout_s: float) -> int:
        """Wait until every future handed out before this call is done (store.flush()); how
        many were not, in `timeout_s`. From a done-callback (the completion thread) it cannot
        wait for the futures that thread has still to complete: it waits for none (0)."""
        if threading.current_thread() is self._thread:
            return 0
        handed_out = self._pending.copy()
        # Polled, never concurrent.futures.wait: it takes every future's Condition, and blocks
        # for good on one a host thread's Ctrl-C left held (review 75 H1). A future is done
        # once its state is, lock or no lock (_complete_futures).
        deadline = time.monotonic() + timeout_s
        pause = 0.0002
        for future in handed_out:
            while future._result is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return sum(1 for f in handed_out if f._result is None)
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 0.005)
        return 0

    def close(self) -> None:
        """After the writer stopped (its queued puts failed into the completion queue):
        complete everything still pending, stop the completion thread."""
        with self._thread_lock:
            self._closed = True
            thread = self._thread
        stuck = False
        if thread is not None:
            self._completions.put(None)
            if thread is not threading.current_thread():
                stuck = not self._wait_for_the_completion_thread()
        self._complete_closed()
        if stuck:  # counted once the drain completed what had come meanwhile (review 95 L3)
            self.log.error("put_async done-callbacks not run: the completion thread has been in one for "
                           f"{CLOSE_STALL_S:g} s; the close goes on without it, and they run if it returns",
                           not_run=len(self._callbacks_due) + 1)  # fmt: skip

    def _wait_for_the_completion_thread(self) -> bool:
        """Until the completion thread returned (True), as long as its done-callbacks move
        (False once none finished in CLOSE_STALL_S): an interrupt here (a Ctrl-C, a SIGTERM
        handler's SystemExit) leaves it running, and the resumed close waits again (through
        Thread.join on 3.10-3.12 it was marked stopped, and the resumed close left its
        callbacks to nobody: 2,858 of 3,000 never ran, review 93 M1)."""
        done = self._thread_done
        seen = self._callbacks_run
        while not done.wait(CLOSE_STALL_S):
            if self._callbacks_run == seen:
                return False
            seen = self._callbacks_run
        return True

    def _complete_closed(self) -> None:
        """No completion thread (closed): complete what is queued and pending here. Run by
        close() and by every put_async caller that finds the pipeline closed, concurrently:
        a future is completed once, by whichever gets there first (`_complete_futures`), and
        its callbacks run through `_run_due_callbacks`, never raising into this thread."""
        while True:
            try:
                answers = self._completions.get_nowait()
            except queue.Empty:
                break
            if answers is not None:
                self._complete(answers)
        closed = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="store closed")
        leftovers = [(future, closed) for future in self._pending.copy()]
        held: list[_PutFuture] = []
        self._callbacks_due.extend((future, False) for future in _complete_futures(leftovers, held))
        self._notify_held_later(held)
        self._pending.difference_update([future for future, _ in leftovers])
        thread = self._thread
        with self._thread_lock:  # a thread not yet past its loop runs what is queued before it ends
            leave_to_thread = thread is not None and not self._thread_ended and thread is not threading.current_thread()
        if not leave_to_thread:
            self._run_due_callbacks()  # else that thread runs them when its callback returns, in order
        if thread is not None and not self._thread_done.is_set():
            # Still in a done-callback (the wait gave up, or close() was called from one): the
            # stop marker this drain took is put back, so the thread ends when it returns.
            self._completions.put(None)


class ActorClient:
    """Puts for a pykka actor, straight to the writer (no gateway hop): the message is encoded
    in the sending actor's own thread, and the answer arrives in its inbox as
    `Replied(correlation_id, PutResult)`. Keep a window of puts in flight (send the next
    when an answer arrives) rather than one at a time: the writer takes every put waiting in
    one pass. `put_and_forget` asks no answer; a failure goes to the store's stats and log.

    In the sending actor: `self.client = store.actor_client(self.actor_ref)`. Methods return
    False if the put was refused before reaching the writer (its Replied is already sent).
    The puts count against the store's `max_puts_in_flight`: when it is reached the sending
    actor's thread blocks until an answer frees a slot, or with
    `put_fail_fast_when_in_flight_full` gets OS_PAGE_CACHE_BUSY at once (a window keeps an
    actor well below it). The gateway's `Put` (told to `store.actor_ref`) still works, one
    thread hop more, and counts too, refused at the bound rather than waiting."""

    __slots__ = ("_pipeline", "_sender")

    def __init__(self, pipeline: PutPipeline, sender: pykka.ActorRef[Any]) -> None:
        if not isinstance(sender, pykka.ActorRef):
            raise TypeError(f"sender must be a pykka ActorRef, not {type(sender).__name__}")
        self._pipeline = pipeline
        self._sender = sender

    def put(self, message: Message, correlation_id: object = None) -> bool:
        return self._pipeline.tell_one(checked_message(message), self._sender, correlation_id)

    def put_batch(self, messages: Sequence[Message], correlation_id: object = None) -> bool:
        """One topic and queue, consecutive queue offsets, one answer (the store's put_batch,
        with its argument checks)."""
        checked = self._pipeline.checked_batch(messages)
        return self._pipeline.tell_put(checked, batch=True, sender=self._sender, correlation_id=correlation_id)

    def put_and_forget(self, message: Message) -> bool:
        return self._pipeline.tell_one(checked_message(message), None, None)

