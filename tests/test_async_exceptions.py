"""Exceptions raised into a caller's thread at the interpreter's check points (a Ctrl-C, a
signal handler that raises, a timeout library's PyThreadState_SetAsyncExc) while it waits on
something a store thread shares with it, or holds what it took (reviews 82 and 83)."""

from __future__ import annotations

import inspect
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message
from mqstore.read_view import ANY_PUBLICATION, ReadViewPublisher

TIMEOUT_S = 10.0


class Interrupted(Exception):
    """Stands for the host's KeyboardInterrupt (which pytest would take for its own)."""


_WAIT_LINES, _WAIT_FIRST_LINE = inspect.getsourcelines(threading.Condition.wait)
_RETAKE_LINE = next(n for n, line in enumerate(_WAIT_LINES, _WAIT_FIRST_LINE) if "self._acquire_restore(" in line)


def _interrupted_at_the_retake(retaking: threading.Event) -> Any:
    """A sys.settrace function: `retaking` set as Condition.wait comes to take its lock back,
    and Interrupted raised where a real one lands then, at the entry of the Python method
    `Condition._acquire_restore` that takes a plain Lock back (an RLock's is C: nothing to
    land on)."""

    def trace(frame: types.FrameType, event: str, _arg: Any) -> Any:
        if event == "call" and frame.f_code is threading.Condition._acquire_restore.__code__:
            raise Interrupted("raised where Condition.wait takes its lock back")
        if event == "call" and frame.f_code is threading.Condition.wait.__code__:

            def in_wait(frame: types.FrameType, event: str, _arg: Any) -> Any:
                if event == "line" and frame.f_lineno == _RETAKE_LINE:
                    retaking.set()
                return in_wait

            return in_wait
        return None

    return trace


def _free(lock: Any) -> bool:
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def test_a_caller_interrupted_in_await_view_leaves_a_publishers_hold_of_the_lock_alone() -> None:
    """Review 82 H1: the waiter's `with` exit released the plain Lock a publisher (an actor)
    held at that moment; the publisher's own release then raised RuntimeError and the actor
    crashed (the writer, reput, the queues' and the index's owners, in the reviewer's runs)."""
    publisher = ReadViewPublisher()
    outcome: dict[str, BaseException | None] = {}
    waiting, publisher_holds, let_go = threading.Event(), threading.Event(), threading.Event()
    retaking = threading.Event()

    def caller() -> None:
        sys.settrace(_interrupted_at_the_retake(retaking))
        try:
            waiting.set()
            publisher.await_view(lambda _view: False, 0.3, ANY_PUBLICATION)
            outcome["caller"] = None
        except BaseException as exc:
            outcome["caller"] = exc
        finally:
            sys.settrace(None)

    def actor() -> None:  # an owner publishing: takes the lock while the caller waits, and keeps it
        assert waiting.wait(TIMEOUT_S)
        try:
            with publisher._lock:  # noqa: SLF001  (as every publish_* does)
                publisher_holds.set()
                assert let_go.wait(TIMEOUT_S)
            outcome["actor"] = None
        except BaseException as exc:
            outcome["actor"] = exc

    threads = [threading.Thread(target=caller), threading.Thread(target=actor)]
    for thread in threads:
        thread.start()
    assert publisher_holds.wait(TIMEOUT_S)
    assert retaking.wait(TIMEOUT_S)  # the caller's wait timed out while the actor holds the lock
    let_go.set()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert outcome["actor"] is None, f"the actor's hold was released by the caller: {outcome['actor']!r}"
    assert outcome["caller"] is None or isinstance(outcome["caller"], Interrupted), repr(outcome["caller"])
    assert _free(publisher._lock)  # noqa: SLF001  (not left held by the caller either)
    publisher.publish_dispatched(1)  # the lock works as before
    assert publisher.await_view(lambda view: view.dispatched_end == 1, 1.0) is not None


def test_the_pure_python_in_flight_slots_stay_exclusive_when_a_waiter_is_interrupted() -> None:
    """Review 82 H1 (without the C extension): the in-flight bound's condition, the same way."""
    from mqstore.put_pipeline import _InFlightSlots
    from mqstore.storage import speedups

    native, speedups.native = speedups.native, None
    try:
        slots = _InFlightSlots(1)
    finally:
        speedups.native = native
    assert slots.native_signal is None and slots.take(None, [])
    outcome: dict[str, BaseException | None] = {}
    waiting, giver_holds, let_go = threading.Event(), threading.Event(), threading.Event()
    retaking = threading.Event()

    def caller() -> None:
        sys.settrace(_interrupted_at_the_retake(retaking))
        try:
            waiting.set()
            slots.take(0.3, [])
            outcome["caller"] = None
        except BaseException as exc:
            outcome["caller"] = exc
        finally:
            sys.settrace(None)

    def completion_thread() -> None:
        assert waiting.wait(TIMEOUT_S)
        try:
            with slots._lock:  # noqa: SLF001  (as give() does)
                giver_holds.set()
                assert let_go.wait(TIMEOUT_S)
            outcome["giver"] = None
        except BaseException as exc:
            outcome["giver"] = exc

    threads = [threading.Thread(target=caller), threading.Thread(target=completion_thread)]
    for thread in threads:
        thread.start()
    assert giver_holds.wait(TIMEOUT_S)
    assert retaking.wait(TIMEOUT_S)
    let_go.set()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert outcome["giver"] is None, f"the completion thread's hold was released by the caller: {outcome['giver']!r}"
    assert outcome["caller"] is None or isinstance(outcome["caller"], Interrupted), repr(outcome["caller"])
    assert _free(slots._lock)  # noqa: SLF001
    slots.give(1)
    assert slots.free == 1 and slots.take(None, [])


def _raising_after(original: Any) -> Any:
    """`original` (a take), then Interrupted when it took something: the exception that lands
    in the caller just as the take returned, before the caller could record what it holds."""

    def take(self: Any, *args: Any) -> Any:
        if original(self, *args):
            raise Interrupted("raised as the take returned")
        return False

    return take


def _completion_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mqstore-put-completions" and t.is_alive()]


def test_bytes_and_a_slot_taken_just_before_an_interrupt_are_given_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 82 M1/M2: bytes of `max_put_bytes_in_flight` counted inside the take, and a slot
    taken in C, were lost for good when an exception landed before the caller stored that it
    held them (a Ctrl-C at the take's `with` exit; a timeout library's async exception just
    after the C call): every large put was then refused after a 20 s wait. The takes record
    what they took in the put's own state now, and the interrupted put gives it back."""
    from mqstore.put_pipeline import _BytesInFlight, _InFlightSlots

    with mqstore.open(tmp_path / "store", max_puts_in_flight=4) as store:
        slots = store._puts._slots  # noqa: SLF001
        for taker in (_BytesInFlight, _InFlightSlots):
            with monkeypatch.context() as patched:
                patched.setattr(taker, "take", _raising_after(taker.take))
                for _ in range(8):
                    with pytest.raises(Interrupted):
                        store.put_async(Message(topic="t", body=b"x" * 40_000))  # large: the Python path
            assert store._puts._bytes.settled() == 0, taker.__name__  # noqa: SLF001
            assert slots.free == 4, taker.__name__
        assert all(store.put_async(Message(topic="t", body=b"y" * 40_000)).result(TIMEOUT_S).ok for _ in range(8))
        assert store._puts._bytes.settled() == 0 and slots.free == 4  # noqa: SLF001


def test_a_completion_thread_whose_start_was_interrupted_is_the_only_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 82 M3: a Ctrl-C in Thread.start's wait for the new completion thread (Python
    code) left that thread running, never recorded: the next put_async started another, two
    consumers of one queue (callbacks out of order), and one never stopped (137 threads left
    by 60 stores). The thread names itself the completion thread now when none is."""
    start = threading.Thread.start
    interrupted: list[threading.Thread] = []

    def interrupted_start(self: threading.Thread) -> None:
        start(self)  # the OS thread runs
        if self.name == "mqstore-put-completions" and not interrupted:
            interrupted.append(self)
            raise Interrupted("raised in Thread.start's wait for the new thread")

    before = len(_completion_threads())
    store = mqstore.open(tmp_path / "store")
    try:
        with monkeypatch.context() as patched:
            patched.setattr(threading.Thread, "start", interrupted_start)
            with pytest.raises(Interrupted):
                store.put_async(Message(topic="t", body=b"first"))
            results = [store.put_async(Message(topic="t", body=b"%d" % i)) for i in range(20)]
        assert all(f.result(TIMEOUT_S).ok for f in results)
        deadline = time.monotonic() + TIMEOUT_S
        while len(_completion_threads()) > before + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_completion_threads()) == before + 1
    finally:
        assert store.close()
    deadline = time.monotonic() + TIMEOUT_S
    while len(_completion_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_completion_threads()) == before, "a completion thread outlived its store"


def test_bytes_given_back_are_not_dropped_by_an_interrupted_settle() -> None:
    """Review 83 M1: the taker's settling of given-back bytes popped an amount, then subtracted
    it; an exception as popleft() returned dropped it (a whole pass's bytes), counted in flight
    for good. Subtracted first, popped after: interrupted, both or neither are done."""
    from mqstore.put_pipeline import _BytesInFlight

    in_flight = _BytesInFlight(1_000_000)
    assert in_flight.take(800_000, None, types.SimpleNamespace(held_bytes=0))  # type: ignore[arg-type]
    in_flight.give(800_000)
    fired: list[bool] = []

    def interrupt(frame: types.FrameType, event: str, arg: Any) -> None:
        at_settle = frame.f_code is _BytesInFlight._settle.__code__
        if event == "c_return" and not fired and at_settle and getattr(arg, "__name__", "") == "popleft":
            fired.append(True)
            raise Interrupted("raised as popleft() returned")

    sys.setprofile(interrupt)
    try:
        with pytest.raises(Interrupted):
            in_flight.settled()
    finally:
        sys.setprofile(None)
    assert fired and in_flight.settled() == 0
