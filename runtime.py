"""The store's actor runtime: the only module that touches pykka's internals (inboxes,
envelopes, refs), so a pykka upgrade is read against one file.

- `FastInbox` and `RuntimeActor`: the store actors' inbox in C-backed parts, with a look at
  its head for coalescing notices and a drain that fails what a dying actor leaves behind.
- `FollowingRef`: an actor ref that always points at the live incarnation of a supervised
  actor, so a host's `store.actor_ref` survives the gateway's restart.
- The notifier (Mopidy's listener pattern): host code (subscriber callables, `Reply`
  callbacks) runs on a listener actor's thread, reached by `tell`, never on a store actor's.
  An exception there is logged with the listener's name (repeats of one kind once a minute,
  with a count) and the listener carries on. Arrival notices a subscriber has not taken yet
  coalesce, the newest per queue, so a stuck subscriber holds one per queue, not one per batch.
"""

from __future__ import annotations

import functools
import itertools
import os
import queue
import sys
import threading
import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

import pykka
from pykka._envelope import Envelope

from . import log as _log
from .log import RepeatedLog, error_repr, get_logger, suppressed_fields
from .messages import AskFor, Waiter
from .storage import speedups
from .waits import DoneFlag, StoreThread

__all__ = [
    "FastInbox",
    "RuntimeActor",
    "QueuedRequest",
    "FollowingRef",
    "Listener",
    "call_listener",
    "start_listener",
    "call_soon",
    "taken_back_if_stopped",
    "tell_and_await",
    "tell_keeping_gil",
    "tell_all_keeping_gil",
    "take_back_told",
    "native_inbox",
    "INBOX_ENVELOPE",
    "ask",
    "Subscriptions",
]

T = TypeVar("T")
R = TypeVar("R")


def ask(ref: pykka.ActorRef[Any], request: AskFor[R], *, timeout_s: float | None) -> R:
    """pykka's ask, typed by the request: the answer is the request's one reply type."""
    answer: R = ref.ask(request, block=True, timeout=timeout_s)
    return answer


_ACTOR_STOP = pykka.messages._ActorStop


class FastInbox:
    """An actor inbox in C-backed parts: a deque for the messages and wake tokens (one per
    message) that the actor's thread blocks on without the GIL. pykka's own
    inbox is a queue.Queue, several Python-level lock operations per put and get; with this
    inbox and `Waiter` replies a 4-client echo actor went from 28k to 50k round trips/s.
    Any thread may put; only the actor's thread takes."""

    __slots__ = ("_items", "_tokens", "_signal")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        native = speedups.native
        # With the C extension the tokens are a semaphore whose post drops the GIL while it
        # wakes the actor (see messages.Waiter); else a SimpleQueue of Nones.
        self._signal: Any = native.Signal() if native is not None else None
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()

    # A host thread's put appends and posts in one C call (Signal.post(append, item)): a signal
    # handler's exception (a Ctrl-C the host catches) between the two would leave a message
    # without its token, and the actor one message late from then on. Without the C extension
    # the post sits in a `finally`: CPython runs a pending handler as the append returns,
    # inside the `try`, so only a second signal during the post itself can still break it.
    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._signal is not None:
            self._signal.post(self._items.append, item)
            return
        try:
            self._items.append(item)
        finally:
            self._tokens.put(None)

    def put_keeping_gil(self, item: Any) -> None:
        """`put`, but the caller keeps the GIL while the actor wakes: for a producer that is
        about to put again (put_async), so puts pile up for the actor to drain in one pass
        instead of the producer switching out to the actor once per put."""
        if self._signal is not None:
            self._signal.post_holding_gil(self._items.append, item)
            return
        try:
            self._items.append(item)
        finally:
            self._tokens.put(None)

    def put_all_keeping_gil(self, items: list[Any], *, hand_over: bool = False) -> None:
        """`put_keeping_gil` for several items at once (a writer pass's answers to one actor):
        one deque extend, then a token each; with `hand_over` the last token drops the GIL
        while the actor wakes, as `put` does. Actor threads only: no signal handler runs
        there to come between the extend and the posts (see `put`)."""
        self._items.extend(items)
        signal = self._signal
        if signal is not None:
            signal.post_many_holding_gil(len(items) - 1 if hand_over and items else len(items))
            if hand_over and items:
                signal.post()
        else:
            for _ in items:
                self._tokens.put(None)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self._signal is not None:
            wait_s = (-1.0 if timeout is None else max(timeout, 0.0)) if block else 0.0
            if not self._signal.wait(wait_s):
                raise queue.Empty
        else:
            self._tokens.get(block, timeout)
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def holds_a_stop(self) -> bool:
        """Whether a stop (`ActorRef.stop()`'s `_ActorStop`) waits in the inbox: for an actor
        in a long pass, to end it and let the stop in (a copy of the items: any thread puts)."""
        return any(type(envelope.message) is _ACTOR_STOP for envelope in list(self._items))

    def take_left(self) -> Any | None:
        """The oldest message, or None if there is none, not waiting and leaving the tokens:
        for draining a stopped actor's inbox, where a racing tell's message may have been
        taken back (`take_back_told`) between an emptiness check and a `get`."""
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def qsize(self) -> int:
        return len(self._items)

    def take_all_of_kind(self, kind: type[T], limit: int) -> list[T]:
        """The told messages of type `kind` waiting at the head (at most `limit`), taken out
        in order: an actor that can handle many at once (the writer's put pass) drains them."""
        items = self._items
        taken: list[T] = []
        while items and len(taken) < limit and items[0].reply_to is None and type(items[0].message) is kind:
            taken.append(items.popleft().message)
            # Its token was put right after the message (or is about to be): take it.
            if self._signal is not None:
                self._signal.wait(-1.0)
            else:
                self._tokens.get()
        return taken

    def take_newest_of_kind(self, message: T, key: Callable[[T], int] | None = None) -> T:
        """`message`, or the newest of the told messages of its type waiting at the head (all
        of them taken out); with `key`, the one with the highest key (the newest of equals)."""
        items = self._items
        kind = type(message)
        while items and items[0].reply_to is None and type(items[0].message) is kind:
            taken: T = items.popleft().message
            if key is None or key(taken) >= key(message):
                message = taken
            # Its token was put right after the message (or is about to be): take it.
            if self._signal is not None:
                self._signal.wait(-1.0)
            else:
                self._tokens.get()
        return message


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A message a stopping actor found in its inbox (its pykka asker already failed)."""

    message: object


class StoreFuture(pykka.Future[T]):
    """pykka's ThreadingFuture on a raw lock: what a store actor's `ask` answers through
    (`RuntimeActor._create_future`), waited on by the asker's thread (an open's start
    handshake is a caller's). ThreadingFuture's get enters a Condition of an RLock in Python
    code: an exception raised into the asker just after that lock was taken (a Ctrl-C, a
    timeout library's async exception) left it held, and the actor's `set()` then blocked
    for good (waits.py). Here the setter never waits: it stores the result, then sets a
    `DoneFlag` each getter sleeps on with a lock of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._there = DoneFlag()  # set once a result or a get hook is there
        self._setting = threading.Lock()  # one result: entered by plain `with` only
        self._hooking = threading.Lock()  # a get hook runs once, whoever gets first (as pykka's)
        self._result: tuple[Any, Any] | None = None  # (value, exc_info or None)

    def get(self, *, timeout: float | None = None) -> Any:
        if not self._there.wait(timeout):
            raise pykka.Timeout(f"{timeout} seconds")
        if self._get_hook is not None:
            if timeout is not None:
                # Not behind another getter's hook: within this one's own timeout (review 86 F4:
                # a get(timeout=0) waited out another getter's; the hook may run twice then).
                return super().get(timeout=timeout)
            with self._hooking:  # once, whoever gets first (as pykka's)
                return super().get(timeout=timeout)
        assert self._result is not None
        value, exc_info = self._result
        if exc_info is not None:
            # As pykka's: the original traceback each time (re-raised as it was, it grew by the
            # frames of every get, other threads' included: review 85 F8).
            exc_type, exc_value, exc_traceback = exc_info
            if exc_value is None:
                exc_value = exc_type()
            raise exc_value.with_traceback(exc_traceback)
        return value

    def set(self, value: Any | None = None) -> None:
        self._settle((value, None))

    def set_exception(self, exc_info: Any = None) -> None:
        exc_info = exc_info or sys.exc_info()
        if exc_info[0] is None:
            failed = RuntimeError("failed without an exception")
            exc_info = (RuntimeError, failed, None)
        self._settle((None, tuple(exc_info)))

    def set_get_hook(self, func: Any) -> None:
        with self._setting:
            if self._result is not None:
                raise queue.Full
            super().set_get_hook(func)
        self._there.set()

    def _settle(self, result: tuple[Any, Any]) -> None:
        with self._setting:
            if self._result is not None or self._get_hook is not None:
                raise queue.Full  # as ThreadingFuture: set once
            self._result = result
        self._there.set()


_actor_thread_numbers = itertools.count(1)  # names as pykka's: <class>-<n>


class RuntimeActor(pykka.ThreadingActor):
    """A pykka thread actor on a `FastInbox`, on a daemon thread (a host that forgets close()
    still exits)."""

    use_daemon_thread = True
    loop_thread: StoreThread | None = None  # set as its loop starts

    @staticmethod
    def _create_actor_inbox() -> Any:  # pykka's hook; its type is pykka's private inbox
        return FastInbox()

    def stop_requested(self) -> bool:
        """Whether a stop waits in this actor's inbox (the supervisor's, to restart or close):
        a handler in a long pass ends it rather than hold the stop past the supervisor's wait."""
        inbox = self.actor_inbox
        return isinstance(inbox, FastInbox) and inbox.holds_a_stop()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:  # pykka's hook: the futures of ask() and stop()
        return StoreFuture()

    def _start_actor_loop(self) -> None:
        # Out of pykka's global registry: a host's ActorRegistry.stop_all() (which pykka also
        # runs when any actor of the host raises SystemExit) stopped the store's actors behind
        # its supervisor's back, and the store said RUNNING with nothing running (review 27).
        # The store stops its own actors, at close() or the exit handler.
        pykka.ActorRegistry.unregister(self.actor_ref)
        # pykka's start on a StoreThread: an open (a caller's thread) starts the actors, and
        # an interrupt there must not leave one's thread blocked in its own start-up.
        name = f"{type(self).__name__}-{next(_actor_thread_numbers)}"
        self.loop_thread = StoreThread(self._actor_loop, name, daemon=self.use_daemon_thread)
        self.loop_thread.start()

    def _actor_loop_teardown(self) -> None:
        """pykka's drain after the stop, by items rather than tokens (FastInbox.take_left): a
        told message taken back meanwhile must not leave `get` popping an empty inbox."""
        inbox = self._fast_inbox()
        while (envelope := inbox.take_left()) is not None:
            if envelope.reply_to is None:
                # Told after the stop's own drain (on_stop): pykka drops it; its asker would
                # wait out its timeout for an answer nobody gives.
                try:
                    self.fail_told_after_stop(envelope.message)
                except Exception as exc:  # the teardown must finish: the actor's end
                    get_logger("mqstore.runtime").error("answering a request left after the stop failed", error=repr(exc))
                continue
            if isinstance(envelope.message, pykka.messages._ActorStop):
                envelope.reply_to.set(None)
            else:
                dead = pykka.ActorDeadError(f"{self.actor_ref} stopped before handling the message")
                envelope.reply_to.set_exception(exc_info=(pykka.ActorDeadError, dead, None))

    # An exception that is no Exception (SystemExit, KeyboardInterrupt, raised by code the
    # actor ran: a host's mapping read by the gateway, a subscriber's name) is a crash like any
    # other here. pykka's loop stopped the actor unreported and ran ActorRegistry.stop_all(),
    # which stopped every actor of the host; its start-up and stop let one end the thread, and
    # nothing answered the start or the stop: the store kept its lock for the process's life
    # (review 136 F1, F3).
    def _actor_loop_setup(self) -> None:  # pykka's: an on_start failure is only logged there
        try:
            self.on_start()
        except BaseException as exc:
            try:
                self.on_start_failed(exc)
            finally:
                self._handle_failure(type(exc), exc, exc.__traceback__)

    def _actor_loop(self) -> None:
        try:
            super()._actor_loop()
        except BaseException:
            # Raised into the thread where no handler above catches it (an exception raised
            # into it from another thread, PyThreadState_SetAsyncExc): reported as a crash
            # too, or the actor was gone for good while its ref said alive (review 139 F1).
            try:
                if not self.actor_stopped.is_set():
                    self._crashed()
            finally:
                self._actor_loop_teardown()

    def _actor_loop_running(self) -> None:
        while not self.actor_stopped.is_set():
            envelope = None
            try:
                # Inside the try: an idle actor waits here, where an exception raised into its
                # thread lands (review 139 F1).
                envelope = self.actor_inbox.get()
                response = self._handle_receive(envelope.message)
                if envelope.reply_to is not None:
                    envelope.reply_to.set(response)
            except BaseException:
                if envelope is not None and envelope.reply_to is not None:  # an ask: the asker's error
                    envelope.reply_to.set_exception()
                    continue
                self._crashed()

    def _crashed(self) -> None:
        """The exception being handled stops the actor and is reported (`on_failure`)."""
        failure = sys.exc_info()
        self._handle_failure(*failure)
        try:
            self.on_failure(*failure)
        except BaseException:
            self._handle_failure(*sys.exc_info())

    def _stop(self) -> None:
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()
        try:
            self.on_stop()
        except BaseException:
            self._handle_failure(*sys.exc_info())

    def on_start_failed(self, error: BaseException) -> None:
        """`on_start` raised `error`; the actor stops after this (pykka calls no `on_failure`)."""

    def fail_told_after_stop(self, message: object) -> None:
        """A told message found in the inbox after the stop; a store actor answers its reply."""

    def _fast_inbox(self) -> FastInbox:
        inbox = self.actor_inbox
        if not isinstance(inbox, FastInbox):
            raise TypeError(f"{type(self).__name__} runs on {type(inbox).__name__}, not FastInbox")
        return inbox

    def inbox_empty(self) -> bool:
        return self._fast_inbox().empty()

    def inbox_size(self) -> int:
        return self._fast_inbox().qsize()

    def newest_of_queued(self, message: T, key: Callable[[T], int] | None = None) -> T:
        """`message` or, if more told messages of its type wait at the head of the inbox, the
        newest of them (taken out). Only for notices with absolute positions, where the newest
        says everything the older ones said (STYLE habit 4): one pass of work instead of many."""
        return self._fast_inbox().take_newest_of_kind(message, key)

    def take_all_queued(self, kind: type[T], limit: int) -> list[T]:
        """The told messages of type `kind` waiting at the head of the inbox (at most `limit`)."""
        return self._fast_inbox().take_all_of_kind(kind, limit)

    def drain_queued(self, why: str) -> list[QueuedRequest]:
        """Take every message left in the inbox: pykka asks among them fail with
        ActorDeadError(`why`) here; the caller fails the store's own replies they carry."""
        inbox = self._fast_inbox()
        left: list[QueuedRequest] = []
        while (envelope := inbox.take_left()) is not None:  # items, not tokens (take_left)
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception(exc_info=(pykka.ActorDeadError, pykka.ActorDeadError(why), None))
            left.append(QueuedRequest(envelope.message))
        return left


def tell_keeping_gil(ref: pykka.ActorRef[Any], message: object) -> bool:
    """Tell an actor on a FastInbox without handing it the GIL (FastInbox.put_keeping_gil);
    False if it is stopped, also when it stopped during the tell (the message is not left in
    its dead inbox: `take_back_told`), or not on a FastInbox (the caller tells it as usual)."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, FastInbox) or ref.actor_stopped.is_set():
        return False
    # FastInbox.put_keeping_gil, inline (this runs once per put): the message and its token in
    # one C call.
    signal = inbox._signal
    if signal is not None:
        signal.post_holding_gil(inbox._items.append, Envelope(message))
    else:
        inbox.put_keeping_gil(Envelope(message))
    # Stopped meanwhile (its drain may have run already): taken back, told nothing.
    return not taken_back_if_stopped(ref, message)


def taken_back_if_stopped(ref: pykka.ActorRef[Any], message: object) -> bool:
    """After a tell of `message` to `ref`: True if the actor has stopped and `message` was
    still in its dead inbox, now taken out (nobody will answer it: the caller does); False if
    the actor runs, or it or its drain took the message (and answers it)."""
    return ref.actor_stopped.is_set() and take_back_told(ref, lambda m: m is message) is not None


def tell_and_await(ref: pykka.ActorRef[Any], message: object, waiter: Waiter, first_wait_s: float) -> bool | None:
    """Tell an actor on a FastInbox and block on `waiter` for its answer, in one stretch
    without the GIL (`_native.Signal.post_then_wait`): a caller that hands a request over and
    waits never takes the GIL back in between, where the woken actor often held it already
    and the caller slept once more for it. True: answered within `first_wait_s` (the waiter
    holds the answer); False: told, not answered yet (the caller waits on as usual, and
    checks for a stop); None: not told (stopped, or no C extension: tell it as usual)."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, FastInbox) or ref.actor_stopped.is_set():
        return None
    signal = inbox._signal
    if signal is None:  # no C extension: neither has the inbox nor the waiter a C signal
        return None
    # The message goes in with its token in the same C call (see FastInbox.put).
    if signal.post_then_wait(waiter._signal, first_wait_s, inbox._items.append, Envelope(message)):
        waiter._taken = True
        return True
    return False


def take_back_told(ref: pykka.ActorRef[Any], matches: Callable[[Any], bool]) -> Any | None:
    """A tell can race the actor's stop: it checked the actor was alive, then the actor stopped
    and drained its inbox (`StoreActor.on_stop` fails what it finds), then the message
    arrived, where nobody will ever take it. Called once `ref` is seen stopped after such a
    tell: the told message that `matches`, taken back out of the dead inbox (the caller answers
    it), or None when it is not there (the drain or the actor took it, and answered it). The
    drain takes messages out one at a time, so exactly one of the two gets it."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, FastInbox):
        return None
    for envelope in list(inbox._items):
        if envelope.reply_to is None and matches(envelope.message):
            try:
                inbox._items.remove(envelope)
            except ValueError:
                return None  # the drain took it meanwhile
            return envelope.message
    return None


# What a FastInbox holds per message (pykka's Envelope): for PutSubmitter, which builds it in C.
INBOX_ENVELOPE: type[Envelope[Any]] = Envelope


def native_inbox(ref: pykka.ActorRef[Any]) -> tuple[Callable[[Any], None], Any] | None:
    """The append of an actor's FastInbox and its C Signal, for a native hand-over that does
    what `tell_keeping_gil` does (storage._native.PutSubmitter); None if it is not on a
    FastInbox with the C extension (tell it through `tell_keeping_gil`)."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, FastInbox) or inbox._signal is None:
        return None
    return inbox._items.append, inbox._signal


def tell_all_keeping_gil(ref: pykka.ActorRef[Any], messages: list[Any], *, hand_over: bool = False) -> bool:
    """Tell an actor on a FastInbox several messages, in order, in one step (`put_all_keeping_gil`);
    False if it is stopped or not on a FastInbox (nothing was told: tell them as usual)."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, FastInbox) or ref.actor_stopped.is_set():
        return False
    inbox.put_all_keeping_gil([Envelope(m) for m in messages], hand_over=hand_over)
    return True


class _Stopped(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.set()


# pykka's own control messages, which its actor loop runs itself before `on_receive` sees them:
# told by a host, `_ActorStop` (what `ActorRef.stop()` sends) stopped the gateway for good, the
# supervisor still RUNNING, and a `ProxyCall` of `release` stopped its readers for good (review
# 103 M2, L1). The store's own code stops and calls its actors through their own refs.
_PYKKA_CONTROL = (pykka.messages._ActorStop, pykka.messages.ProxyCall, pykka.messages.ProxyGetAttr,
                  pykka.messages.ProxySetAttr)  # fmt: skip


def _refuse_pykka_control(message: object, label: str) -> None:
    if isinstance(message, _PYKKA_CONTROL):
        raise TypeError(f"{type(message).__name__} is pykka's own control message: {label} belongs to its "
                        "supervisor (close the store to stop it), and its requests are the store's messages "
                        "(mqstore.messages)")  # fmt: skip


class FollowingRef(pykka.ActorRef[Any]):
    """A ref to whichever incarnation of a supervised actor is live: `resolve()` gives the
    current ref (None while it is being restarted, when a tell raises ActorDeadError as it
    would for any dead actor). Everything pykka's ref does goes through these attributes."""

    def __init__(self, resolve: Callable[[], pykka.ActorRef[Any] | None], label: str) -> None:
        # Not super().__init__: that pins one actor incarnation, which is what this avoids.
        self._resolve = resolve
        self._label = label

    def _current(self) -> pykka.ActorRef[Any] | None:
        return self._resolve()

    # pykka declares these as plain attributes; here they follow the restarts.
    @property
    def actor_class(self) -> type[Any]:  # type: ignore[override]
        ref = self._current()
        return ref.actor_class if ref is not None else pykka.ThreadingActor

    @property
    def actor_urn(self) -> str:  # type: ignore[override]
        ref = self._current()
        return ref.actor_urn if ref is not None else f"urn:mqstore:{self._label}:restarting"

    @property
    def actor_inbox(self) -> Any:  # type: ignore[override]
        ref = self._current()
        if ref is None:
            raise pykka.ActorDeadError(f"{self._label} is being restarted")
        return ref.actor_inbox

    @property
    def actor_stopped(self) -> threading.Event:  # type: ignore[override]
        ref = self._current()
        return ref.actor_stopped if ref is not None else _Stopped()

    def stop(self, *, block: bool = True, timeout: float | None = None) -> Any:
        """Refused: the supervisor owns the actor's life (a stopped gateway would not be
        restarted, and the store's actor API would be gone until the store reopens)."""
        raise TypeError(f"{self._label} belongs to its supervisor: close the store to stop it")

    def tell(self, message: Any) -> None:
        _refuse_pykka_control(message, self._label)
        super().tell(message)

    def ask(self, message: Any, *, block: bool = True, timeout: float | None = None) -> Any:
        _refuse_pykka_control(message, self._label)
        return super().ask(message, block=block, timeout=timeout)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FollowingRef):
            return self._resolve is other._resolve
        return self._current() == other

    def __hash__(self) -> int:
        return hash(self._label)

    def __repr__(self) -> str:
        return f"<FollowingRef {self._label} -> {self._current()!r}>"


# ---------------------------------------------------------------------------------------
# The notifier: host code on listener threads


@dataclass(frozen=True, slots=True)
class _Call:
    callback: Callable[[Any], object]
    argument: Any
    name: str


class _PendingArrivals:
    """A subscriber's arrival notices not handed to it yet: the newest per (topic, queue id),
    as `MessageArrived.max_offset` is absolute and a newer notice says all an older one did
    (STYLE habit 4). A subscriber that is slow or stuck (a callback hung on the network, an
    actor whose bounded inbox is full) so holds at most one notice per queue, and its listener
    one `_Drain`: before, the listener's inbox took one notice per dispatch batch, without
    bound (review 58 F3: 4,161 after 120k puts, ~244 B each). Every queue that got messages is
    still told, with its newest `max_offset`."""

    __slots__ = ("_lock", "_events", "_scheduled", "_closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, int], Any] = {}
        self._scheduled = False  # a _Drain is on its way to (or in) the listener
        self._closed = False  # unsubscribed: nothing more is handed over

    def add(self, event: Any) -> bool:
        """Keep `event` (over an older one of its queue); True: the caller tells the listener
        a drain, none being on its way."""
        with self._lock:
            if self._closed:
                return False
            self._events[(event.topic, event.queue_id)] = event
            if self._scheduled:
                return False
            self._scheduled = True
            return True

    def take(self) -> list[Any]:
        """Every notice pending, in the order their queues first got one."""
        with self._lock:
            events = list(self._events.values())
            self._events.clear()
            return events

    def more_came(self) -> bool:
        """After a drain handed over what it took: True if notices came meanwhile (the
        listener tells itself the drain again, behind whatever else it has to do); else no
        drain is on its way from now on."""
        with self._lock:
            if self._events and not self._closed:
                return True
            self._scheduled = False
            return False

    def abandon(self) -> None:
        """The drain told never ran (its listener stopped first): the next notice tells one."""
        with self._lock:
            self._scheduled = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._events.clear()


@dataclass(frozen=True, slots=True)
class _Drain:
    """Told to a listener: hand `pending`'s notices to `deliver`, one at a time."""

    pending: _PendingArrivals
    deliver: Callable[[Any], object]
    name: str


class Listener(RuntimeActor):
    """Runs host callables, one at a time, on its own thread. A callable that raises is
    logged with its name, the first time of a kind in full and then once a minute with a
    count (`repeats`, the store's; else the process's); the listener carries on (a listener
    never crashes)."""

    def __init__(self, name: str, repeats: RepeatedLog | None = None) -> None:
        super().__init__()
        self.name = name
        self.log = get_logger("mqstore.notifier", listener=name)
        self.failures = 0
        self._repeats = repeats

    def on_receive(self, message: Any) -> None:
        if type(message) is _Drain:
            self._drain(message)
        elif isinstance(message, _Call):
            self._call(message.callback, message.argument, message.name)
        else:
            self.log.error("listener got a message that is not a call", message=repr(message)[:200])

    def _call(self, callback: Callable[[Any], object], argument: Any, name: str) -> None:
        try:
            callback(argument)
        # Host code: logged, never our crash. SystemExit too, as a put's done-callback's is:
        # out of here, pykka's loop answered it with ActorRegistry.stop_all(), every actor of
        # the host stopped unsaid (review 93 M2).
        except BaseException as exc:
            self.failures += 1
            # A callback raising at every call logged 500 lines/s (review 58 F4).
            repeats = self._repeats if self._repeats is not None else _log.PROCESS_REPEATS
            if (suppressed := repeats.admit(("listener raised", name, type(exc)))) is not None:
                self.log.error("listener raised", listener=name, error=error_repr(exc), **suppressed_fields(suppressed))

    def _drain(self, drain: _Drain) -> None:
        try:
            for event in drain.pending.take():
                if drain.pending.closed:  # unsubscribed meanwhile (a failed tell unsubscribes)
                    break
                self._call(drain.deliver, event, drain.name)
        except BaseException:
            # This listener ends (an exception raised into its thread; a host callable's are
            # caught in _call): no drain is on its way any more, so the next notice is told,
            # finds the listener dead and drops the subscriber; the mark left set kept every
            # later notice in a dict nobody drained (review 59 M2).
            drain.pending.abandon()
            raise
        if drain.pending.more_came():
            self.actor_ref.tell(drain)  # behind what else waits here: one subscriber never starves the rest

    def fail_told_after_stop(self, message: object) -> None:
        if type(message) is _Drain:
            message.pending.abandon()


def start_listener(name: str, repeats: RepeatedLog | None = None) -> pykka.ActorRef[Listener]:
    return Listener.start(name, repeats)


def listener_name(callback: object) -> str:
    """A callable's name for logs and its listener's thread: its qualified name, else its
    type's. Never its repr, which runs on the thread that answers (a writer, a reader): a
    partial's repr of a large argument stalled every put, and a repr that raised crashed a
    gateway reader (review 44 M2, H1)."""
    try:
        name = getattr(callback, "__qualname__", None)
    except Exception:  # the host's object: its attributes may raise
        name = None
    return name if type(name) is str and name else type(callback).__qualname__


def call_listener(ref: pykka.ActorRef[Any], callback: Callable[[T], object], argument: T, name: str) -> bool:
    """Have `ref` (a Listener) call `callback(argument)`; False if that listener is gone."""
    try:
        ref.tell(_Call(callback, argument, name))
    except pykka.ActorDeadError:
        return False
    return True


_shared_lock = threading.Lock()
_shared: dict[str, pykka.ActorRef[Any]] = {}  # the process's shared listeners, by name
# What was for a shared listener whose thread could not be started (a thread shortage: a pids
# limit), in order, sent by the next tell or supervisor tick that can start it. Dropped for good
# before (review 76: 30 reply callbacks never called, the host waiting on them for good).
_unsent: deque[tuple[str, object]] = deque()
UNSENT_LIMIT: Final = 100_000  # beyond it the oldest go (logged): a shortage must not eat memory


def _no_shared_listeners_in_a_forked_child() -> None:
    # Their threads are the parent's: in a child the refs said alive and nothing ran what was
    # told to them, so a store the child opened never called a reply callback (review 29).
    global _shared_lock
    _shared.clear()
    _unsent.clear()
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_no_shared_listeners_in_a_forked_child)


def call_soon(callback: Callable[[T], object], argument: T, *, listener: str = "reply-callbacks") -> None:
    """Call `callback(argument)` on one of the process's shared listeners: "reply-callbacks"
    (Reply callbacks: one thread for all of them, so one slow callback delays other callbacks,
    never a put), or "blocking-tells" (`tell_from_store`). Restarted if something stopped it."""
    _tell_shared(listener, _Call(callback, argument, listener_name(callback)))


def _tell_shared(listener: str, message: object) -> bool:
    """Tell the process's shared listener `listener` (restarted if something stopped it); kept
    for later, in order, while its thread cannot be started."""
    for _ in range(2):
        with _shared_lock:
            if _unsent and not _send_unsent_locked():
                _keep_unsent_locked(listener, message)
                return True
            ref = _live_shared_locked(listener)
            if ref is None:
                _keep_unsent_locked(listener, message)
                return True
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            continue
        return True
    return False


def _live_shared_locked(listener: str) -> pykka.ActorRef[Any] | None:
    """The shared listener, started if need be; None when no thread can be started now."""
    ref = _shared.get(listener)
    if ref is None or not ref.is_alive():
        try:
            ref = _shared[listener] = start_listener(listener)
        except RuntimeError as exc:  # "can't start new thread"
            if (suppressed := _log.PROCESS_REPEATS.admit(("listener not started", listener))) is not None:
                get_logger("mqstore.runtime").error("a listener thread could not be started; what it is to run waits "
                                                    "for a thread", listener=listener, error=repr(exc),
                                                    waiting=len(_unsent) + 1, **suppressed_fields(suppressed))  # fmt: skip
            return None
    return ref


def _keep_unsent_locked(listener: str, message: object) -> None:
    if len(_unsent) >= UNSENT_LIMIT:
        _unsent.popleft()
        if (suppressed := _log.PROCESS_REPEATS.admit(("unsent dropped",))) is not None:
            get_logger("mqstore.runtime").error("no listener thread for long: the oldest waiting reply callback or "
                                                "tell is dropped", limit=UNSENT_LIMIT,
                                                **suppressed_fields(suppressed))  # fmt: skip
    _unsent.append((listener, message))


def _send_unsent_locked() -> bool:
    """Send what waited for a listener, oldest first; False when one still cannot start."""
    while _unsent:
        listener, message = _unsent[0]
        ref = _live_shared_locked(listener)
        if ref is None:
            return False
        _unsent.popleft()
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            _shared.pop(listener, None)  # dead since: started again for the next one
            _unsent.appendleft((listener, message))
    return True


def send_unsent() -> None:
    """What waited for a listener thread, sent if one can be started now (the supervisor's
    ticks: a shortage may end with nothing more to tell)."""
    if _unsent:
        with _shared_lock:
            _send_unsent_locked()


def may_block_on_tell(ref: pykka.ActorRef[Any]) -> bool:
    """Whether telling `ref` could block the teller: a ref of the host's own class, or an
    inbox with a bound (pykka's own is an unbounded queue.Queue; the store's, a FastInbox)."""
    if type(ref) is not pykka.ActorRef:
        return True
    inbox: object = ref.actor_inbox  # (pykka types it as its own protocol)
    if isinstance(inbox, FastInbox) or type(inbox) is queue.SimpleQueue:
        return False
    return not (type(inbox) is queue.Queue and inbox.maxsize <= 0)


def tell_from_store(ref: pykka.ActorRef[Any], message: object, on_failed: Callable[[], None] | None = None) -> None:
    """Tell the host's actor `ref` from a store actor's thread. One whose tell may block (a
    bounded inbox the host's actor is slow to empty) is told on the "blocking-tells" listener
    instead: told from the writer it blocked every put of the process, from reput all dispatch,
    and the close (review 27). Only such tells share that listener, so a stuck one holds up
    others of its kind, never a reply callback or a put (review 28). Told directly, its
    ActorDeadError or the host's ref's own error reaches the caller; on the listener it is
    logged there and `on_failed()` runs (a subscriber is unsubscribed)."""
    if may_block_on_tell(ref):
        call_soon(_tell_on_listener, (ref, message, on_failed), listener="blocking-tells")
    else:
        ref.tell(message)


def _tell_on_listener(told: tuple[pykka.ActorRef[Any], object, Callable[[], None] | None]) -> None:
    ref, message, on_failed = told
    try:
        ref.tell(message)
    except Exception as exc:  # ActorDeadError (it stopped), or the host's ref's own error
        # Answers to one stopped actor fail here one by one: their lines are limited.
        # Per actor: a second host actor that stopped is news (review 59 L1).
        if (suppressed := _log.PROCESS_REPEATS.admit(("tell to a host actor failed", type(exc), id(ref)))) is not None:
            get_logger("mqstore.notifier").warning("a tell to the host's actor failed; dropped", actor=repr(ref),
                                                   error=error_repr(exc), **suppressed_fields(suppressed))  # fmt: skip
        if on_failed is not None:
            on_failed()


def _tell_subscriber(ref: pykka.ActorRef[Any], on_failed: Callable[[], None], event: Any) -> None:
    _tell_on_listener((ref, event, on_failed))


@dataclass(frozen=True, slots=True)
class _Subscription:
    subscriber: object  # the host's actor ref or callable, as given (unsubscribe names it)
    topic: str | None
    queue_id: int | None
    listener: pykka.ActorRef[Any] | None  # a callable's own listener; None for an actor
    name: str
    # The notices not handed over yet, and the drain that hands them over: a callable's (on
    # its listener), an actor's whose tell may block (on "blocking-tells"); None for an actor
    # told directly, which takes its notices at once.
    drain: _Drain | None


_FilterKey = tuple[str | None, int | None]


class Subscriptions:
    """Who hears `MessageArrived` (the store's subscribers). Publishing only tells: an actor
    subscriber is told the event, a callable is called by its own listener (each isolated, so
    a slow one delays only itself; one listener per callable, whatever its filters). A
    subscriber not keeping up gets the newest notice per queue (`_PendingArrivals`). Safe from
    any thread; publish never blocks on host code, and visits only the subscriptions whose
    filter an event can match (review 84: every one, 0.95 ms a publish with 20k of them)."""

    def __init__(self, repeats: RepeatedLog | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: list[_Subscription] = []  # in subscription order (changed under the lock)
        self._next_place = 0
        # The same entries by filter, and each one's place in that order (by id: a host's
        # callable may not hash), swapped whole with `_entries` (no lock on publish).
        self._by_filter: tuple[dict[_FilterKey, tuple[_Subscription, ...]], dict[int, int]] = ({}, {})
        self._listeners: dict[object, pykka.ActorRef[Any]] = {}  # each callable's (by `_identity_key`)
        self.log = get_logger("mqstore.notifier")
        self._repeats = repeats  # the store's, for the lines of subscriber callables that raise

    def add(self, subscriber: object, topic: str | None = None, queue_id: int | None = None) -> None:
        """Subscribe; again with the same subscriber and filter, nothing (one call per event,
        not one per subscribe: review 44 L2)."""
        with self._lock:
            if self._subscribed(subscriber, topic, queue_id):
                return
            shared = self._listener_of(subscriber)
        new_listener = None
        if isinstance(subscriber, pykka.ActorRef):
            ref: pykka.ActorRef[Any] = subscriber
            name = str(ref)
            drain = None
            if may_block_on_tell(ref):
                drain = _Drain(_PendingArrivals(), functools.partial(_tell_subscriber, ref, lambda: self.remove(ref)), name)
            entry = _Subscription(subscriber, topic, queue_id, None, name, drain)
        elif callable(subscriber):
            name = listener_name(subscriber)
            # One listener per callable (review 84: a thread per filter, 512 for 500 queues),
            # so the host's callable is never called from two threads at once either.
            listener = shared if shared is not None else (new_listener := start_listener(name, self._repeats))
            entry = _Subscription(subscriber, topic, queue_id, listener, name, _Drain(_PendingArrivals(), subscriber, name))
        else:
            raise TypeError(f"subscriber must be an actor ref or a callable, not {type(subscriber).__name__}")
        with self._lock:
            # Another thread subscribed it meanwhile (this filter, or its first listener).
            if self._subscribed(subscriber, topic, queue_id) or (
                new_listener is not None and self._listener_of(subscriber) is not None
            ):
                _stop_quietly(new_listener)
                if not self._subscribed(subscriber, topic, queue_id):
                    entry = replace(entry, listener=self._listener_of(subscriber))
                else:
                    return
            self._append(entry)

    def _subscribed(self, subscriber: object, topic: str | None, queue_id: int | None) -> bool:
        key = _identity_key(subscriber)
        return any(_identity_key(e.subscriber) == key for e in self._by_filter[0].get((topic, queue_id), ()))

    def _listener_of(self, subscriber: object) -> pykka.ActorRef[Any] | None:
        return self._listeners.get(_identity_key(subscriber))

    def _swap(self, entries: tuple[_Subscription, ...]) -> None:
        """(Under the lock.) The entries, and the same by filter."""
        by_filter: dict[_FilterKey, list[_Subscription]] = {}
        for entry in entries:
            by_filter.setdefault((entry.topic, entry.queue_id), []).append(entry)
        self._entries = list(entries)
        self._next_place = len(entries)
        self._by_filter = ({key: tuple(group) for key, group in by_filter.items()}, {id(e): i for i, e in enumerate(entries)})
        self._listeners = {_identity_key(e.subscriber): e.listener for e in entries if e.listener is not None}

    def _append(self, entry: _Subscription) -> None:
        """(Under the lock.) One entry more, in place: publish only looks its tables up (one
        `get` each, atomic), and the entry's place goes in before its filter's group does.
        (Copies of the tables per subscribe made 20k subscribes take 4.6 s.)"""
        by_filter, order = self._by_filter
        order[id(entry)] = self._next_place
        self._next_place += 1
        key = (entry.topic, entry.queue_id)
        by_filter[key] = (*by_filter.get(key, ()), entry)
        self._entries.append(entry)
        if entry.listener is not None:
            self._listeners[_identity_key(entry.subscriber)] = entry.listener

    def _without(self, gone: list[_Subscription]) -> None:
        """(Under the lock.) The entries but `gone` (by identity: an entry's `==` would
        compare the host's objects)."""
        ids = {id(e) for e in gone}
        self._swap(tuple(e for e in self._entries if id(e) not in ids))

    def remove(self, subscriber: object) -> None:
        """Its entries, by who it is (`_identity_key`), never by its `==`: that is the host's
        code, run under this lock on reput's thread when a dead actor is dropped (review 131
        F3: an `__eq__` that slept stopped dispatch, and the close waited on the lock for
        good; one always True unsubscribed every other subscriber)."""
        key = _identity_key(subscriber)
        with self._lock:
            gone = [e for e in self._entries if _identity_key(e.subscriber) == key]
            if gone:
                self._without(gone)
        for entry in gone:
            _close_subscription(entry)

    def drop_stopped(self) -> int:
        """Unsubscribe the actors that stopped (the store's tick hook, once a second): one is
        dropped at its next notice otherwise, and one whose queues went quiet never was (review
        84: 5.6 KB each, 20k of them slowed every dispatch)."""
        with self._lock:
            gone = [e for e in self._entries if isinstance(e.subscriber, pykka.ActorRef) and e.subscriber.actor_stopped.is_set()]
            if gone:
                self._without(gone)
        for entry in gone:
            _close_subscription(entry)
        return len(gone)

    def subscribers(self) -> list[object]:
        with self._lock:
            return [e.subscriber for e in self._entries]

    def publish(self, events: list[Any]) -> None:
        """Tell every matching subscriber each event (`MessageArrived`); a dead actor
        subscriber is dropped."""
        by_filter, order = self._by_filter  # swapped whole: no lock on the dispatch path
        if not events or not by_filter:
            return
        found: dict[int, _Subscription] = {}
        for event in events:
            for key in ((event.topic, event.queue_id), (event.topic, None), (None, event.queue_id), (None, None)):
                group = by_filter.get(key)
                if group:
                    for entry in group:
                        found[id(entry)] = entry
        if not found:
            return
        entries = found.values() if len(found) == 1 else sorted(found.values(), key=lambda e: order[id(e)])
        for entry in entries:  # in subscription order
            for event in events:
                if (entry.topic is None or entry.topic == event.topic) and (
                    entry.queue_id is None or entry.queue_id == event.queue_id
                ):
                    if not self._deliver(entry, event):
                        self.remove(entry.subscriber)
                        break

    def _deliver(self, entry: _Subscription, event: Any) -> bool:
        drain = entry.drain
        if drain is not None:
            if not drain.pending.add(event):
                return True  # a drain is on its way: it hands this notice over too
            if entry.listener is not None:
                try:
                    entry.listener.tell(drain)
                except pykka.ActorDeadError:
                    return False
            elif not _tell_shared("blocking-tells", drain):
                drain.pending.abandon()
            return True
        ref: Any = entry.subscriber
        try:
            tell_from_store(ref, event, on_failed=lambda: self.remove(ref))
        except pykka.ActorDeadError:
            return False
        except Exception as exc:  # the host's ref: reput must not crash on it (at every dispatch)
            get_logger("mqstore.runtime").error("a subscriber's tell failed; it is unsubscribed",
                                                subscriber=repr(ref), error=repr(exc))  # fmt: skip
            return False
        return True

    def close(self) -> None:
        with self._lock:
            entries = self._entries
            self._swap(())
        for entry in entries:
            _close_subscription(entry)


def _identity_key(subscriber: object) -> object:
    """Who a subscriber is, without running host code (under the lock): the host's callable
    itself (by id: an entry keeps it alive, so its id is its own while it is subscribed); a
    bound method by its object and function (a new method object per `obj.method`); a pykka
    ref by its actor (two refs of one actor)."""
    if type(subscriber) is types.MethodType:
        return ("method", id(subscriber.__self__), id(subscriber.__func__))
    if type(subscriber) is types.BuiltinMethodType:
        return ("builtin", id(subscriber.__self__), subscriber.__name__)
    if type(subscriber) is pykka.ActorRef:
        return ("actor", subscriber.actor_urn)
    return id(subscriber)


def _close_subscription(entry: _Subscription) -> None:
    if entry.drain is not None:
        entry.drain.pending.close()
    _stop_quietly(entry.listener)


def _stop_quietly(ref: pykka.ActorRef[Any] | None) -> None:
    if ref is None:
        return
    try:
        ref.stop(block=False)
    except pykka.ActorDeadError:
        pass
