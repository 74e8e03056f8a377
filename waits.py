"""The lock of a condition that a caller's thread waits on and a store thread notifies.

A caller's thread takes exceptions at the interpreter's check points (after a call returns, at
a Python function's entry): a Ctrl-C, a signal handler that raises, a timeout library's
PyThreadState_SetAsyncExc. With a plain Lock, `threading.Condition.wait` takes the lock back in
a Python method (`_acquire_restore`): an exception at its entry left the lock not held, and the
caller's `with` exit then released it while an actor held it; the actor's own release failed
and it crashed (review 82 H1; one run gave the store up). An RLock's wait releases and takes it
back in C, and only its holder may release it. So such a lock is an RLock, entered with a plain
`with lock:` (C, no check point between the take and the block) and never through the
Condition's own `__enter__` (Python: an exception after its take left the lock held for good,
review 83 H1 of an attempt that entered it through a generator).
"""

from __future__ import annotations

import threading

__all__ = ["DoneFlag", "shared_lock"]


def shared_lock() -> threading.RLock:
    """The lock of a condition a caller's thread waits on and a store thread notifies."""
    return threading.RLock()


class DoneFlag:
    """A one-way flag a caller's thread waits on, on a raw lock (taken and released in C).
    `threading.Event` waits through `Condition.__enter__`, Python code: an exception raised
    into the waiting caller just after its lock was taken left it held for good, and the store
    thread's `set()` then blocked forever (review 83 H2: a Ctrl-C in close() left the
    supervisor's thread stuck, a second close() hung, and the interpreter never exited)."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()  # released by set(): each waiter passes it on
        self._set = False

    def set(self) -> None:
        self._set = True
        try:
            self._gate.release()
        except RuntimeError:  # set already (or a waiter interrupted as it passed it on)
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether it is set, waiting at most `timeout` seconds. Never blocks the setter: a
        waiter interrupted between taking the gate and passing it on delays the others at most
        their timeout, and they find the flag set then."""
        if self._set:
            return True
        if self._gate.acquire(timeout=timeout):
            self._gate.release()
            return True
        return self._set
