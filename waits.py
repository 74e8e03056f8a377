"""Waiting on a condition whose lock the store's own threads share, from a caller's thread.

A caller's thread takes exceptions at any bytecode (a Ctrl-C, a signal handler that raises, a
timeout library's PyThreadState_SetAsyncExc). `threading.Condition.wait` takes its lock back in
Python code after waiting; an exception that lands before it did left the lock not held, and
the `with` block's exit then released a plain Lock that an actor held at that moment: the
actor's own release then failed ("release unlocked lock") and it crashed, and mutual exclusion
was gone meanwhile (review 82 H1; the store was given up in one run). So such a lock is an
RLock (owned: released only by its holder, its wait's re-take done in C), and the waiting side
releases it only if it still holds it, so the host gets its own exception, not a RuntimeError.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held_unless_interrupted", "shared_lock"]


def shared_lock() -> threading.RLock:
    """The lock of a condition a caller's thread waits on and a store thread notifies."""
    return threading.RLock()


@contextmanager
def held_unless_interrupted(lock: threading.RLock) -> Iterator[None]:
    """`with lock:` for the waiting side: at the end, released only if this thread still holds
    it (an exception in Condition.wait may have left it not re-taken)."""
    lock.acquire()
    try:
        yield
    finally:
        if lock._is_owned():  # type: ignore[attr-defined]  # (the C RLock's; Condition uses it too)
            lock.release()
