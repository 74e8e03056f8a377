"""Waiting, in a caller's thread, for something a store thread does.

A caller's thread takes exceptions at the interpreter's check points (after a call returns, at
a Python function's entry): a Ctrl-C, a signal handler that raises, a timeout library's
PyThreadState_SetAsyncExc. `threading.Condition` lets such an exception land between letting
its lock go and taking it back (`Condition.wait`), or just after taking it (`__enter__`, Python
code): the caller's `with` exit then released a hold an actor had of a shared lock (the actor
crashed, review 82 H1), raised RuntimeError instead of the host's exception, or left the lock
held for good (every owner hung, review 83 H1/H2). So a caller never waits on a Condition or a
`threading.Event` that a store thread takes: it sleeps on a raw lock of its own (`Sleepers`:
the read view's waiters, the pure-Python slot takers, a put future's `result()`, `DoneFlag`,
`runtime.StoreFuture`), and a lock it shares with the
store's threads is entered only by a plain `with lock:` (taken and given back in C) around
work that never waits. The threads the store starts (often from a caller's thread: the first
`put_async`, an open) are `StoreThread`s for the same reason.
"""

from __future__ import annotations

import _thread
import contextlib
import threading
import time
from typing import Any, Callable

__all__ = ["DoneFlag", "Sleepers", "StoreThread"]


class Sleepers:
    """Threads sleeping until something holds, each on a raw lock of its own: the one way this
    package waits in a caller's thread. `sleep_until` registers its lock under `guard` (a plain
    lock the wakers may share, entered only by `with`), then looks at `done` and sleeps on its
    lock; `wake_all` releases every registered lock and each sleeper looks again. Registered
    before it looks, a sleeper never misses a wake that follows the change it waits for."""

    __slots__ = ("_guard", "_gates")

    def __init__(self, guard: threading.Lock | None = None) -> None:
        self._guard = guard if guard is not None else threading.Lock()
        self._gates: list[Any] = []

    def __len__(self) -> int:
        """How many sleep (false: none, a waker's cheap look)."""
        return len(self._gates)

    def sleep_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Whether `done()` came true, sleeping at most `timeout` seconds (None: until it does)."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        gate = _thread.allocate_lock()
        gate.acquire()  # released by wake_all: a binary semaphore, no wake-up lost
        try:
            with self._guard:
                self._gates.append(gate)
            while not done():
                if deadline is None:
                    gate.acquire()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                gate.acquire(timeout=min(remaining, threading.TIMEOUT_MAX))  # inf: until woken
            return True
        finally:
            with self._guard:
                with contextlib.suppress(ValueError):
                    self._gates.remove(gate)

    def wake_all(self) -> None:
        for gate in list(self._gates):
            if gate.locked():
                with contextlib.suppress(RuntimeError):  # released meanwhile
                    gate.release()


class DoneFlag:
    """A one-way flag a caller's thread waits on (`Sleepers`). `threading.Event` waits through
    `Condition.__enter__`, Python code: an exception raised into the waiting caller just after
    its lock was taken left it held for good, and the store thread's `set()` then blocked
    forever (review 83 H2: a Ctrl-C in close() left the supervisor's thread stuck, a second
    close() hung, and the interpreter never exited)."""

    def __init__(self) -> None:
        self._set = False
        self._sleepers = Sleepers()

    def set(self) -> None:
        self._set = True
        self._sleepers.wake_all()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting at most `timeout` seconds (None: until it is). Never
        blocks the setter, and no waiter waits on another."""
        return self._set or self._sleepers.sleep_until(self.is_set, timeout)

    def _at_fork_reinit(self) -> None:
        """A forked child's copy (threading's own hook, as `Event._at_fork_reinit`): a lock
        another thread of the parent held would be held for good there."""
        self._sleepers = Sleepers()


# How long a StoreThread's start waits for the new thread to say it runs: one that never does
# (killed in its own start-up, below) is given up, and runs nothing if it starts later.
START_GIVE_UP_S = 10.0


class StoreThread(threading.Thread):
    """A thread (a daemon unless said) whose start a caller's thread may make, interrupted anywhere.
    `Thread.start()` waits for the new thread on a `threading.Event`: an exception raised into
    the starter just as that Event's lock was taken (in `Condition.__enter__`, Python code)
    left the lock held, and the new thread blocked for good in its own start-up (review 83
    M2: one idle thread per such interrupt; an actor's thread so never ran its loop). The
    start waits on a `DoneFlag` instead, whatever lands in the starter; and at most
    START_GIVE_UP_S: on 3.11 an async exception aimed at the starter can hit the new thread
    first (it carries the starter's id until it runs), which then dies before saying it runs,
    and `start()` waited for good (review 85 F1). Given up, the start raises CPython's own
    "can't start new thread" (a shortage, to the supervisor), and the thread, should it run
    after all, returns at once."""

    def __init__(self, target: Callable[[], Any], name: str, *, daemon: bool = True) -> None:
        super().__init__(target=target, name=name, daemon=daemon)
        self._claim = threading.Lock()  # entered by plain `with` only
        self._given_up = False
        if isinstance(getattr(self, "_started", None), threading.Event):  # CPython's, as of 3.11-3.13
            self._started = _StartedFlag(self._give_up)  # (the Event methods Thread uses)

    def cancel_unless_running(self) -> bool:
        """True if the thread has not said it runs, and now never runs its target; False if it
        runs (or ran) it. For a starter whose `start()` was cut short: whether the thread is
        its to stop."""
        with self._claim:
            if self._started.is_set():
                return False
            self._given_up = True
            return True

    def _give_up(self) -> bool:
        """(The starter, its wait over.) True if given up: the thread never said it runs."""
        if not self.cancel_unless_running():
            return False
        with getattr(threading, "_active_limbo_lock", contextlib.nullcontext()):
            getattr(threading, "_limbo", {}).pop(self, None)  # start() leaves it there
        return True

    def run(self) -> None:
        with self._claim:
            if self._given_up:
                return
        super().run()


class _StartedFlag(DoneFlag):
    """`Thread._started` of a StoreThread: `start()`'s wait (the only one without a timeout)
    lasts at most START_GIVE_UP_S."""

    def __init__(self, give_up: Callable[[], bool]) -> None:
        super().__init__()
        self._give_up = give_up

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            return super().wait(timeout)
        if super().wait(START_GIVE_UP_S) or not self._give_up():
            return True
        raise RuntimeError("can't start new thread")  # CPython's words: the supervisor's shortage
