"""Exceptions raised into a caller's thread at the interpreter's check points (a Ctrl-C, a
signal handler that raises, a timeout library's PyThreadState_SetAsyncExc) while it waits on
something a store thread shares with it, or holds what it took (reviews 82 and 83)."""

from __future__ import annotations

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


def _free(lock: Any) -> bool:
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def test_a_caller_interrupted_anywhere_in_await_view_gets_its_own_exception_and_holds_nothing() -> None:
    """Reviews 82 H1 and 83 H1: waiting on a Condition of the lock the owners publish under,
    an interrupt inside Condition.wait (after it let the lock go, before its try) left the
    lock not held, and the caller's `with` exit released the hold an actor had of it (a plain
    Lock: the actor crashed) or raised RuntimeError instead of the host's exception (an
    RLock); an attempt that took the lock outside a `with` left it held for good (every owner
    then hung). The waiter sleeps on a lock of its own now. Here the interrupt lands at each
    C call's return in await_view and everything it calls, one run per point."""
    publisher = ReadViewPublisher()

    def check(interrupted: BaseException | None, point: int) -> None:
        assert isinstance(interrupted, Interrupted), f"point {point}: {interrupted!r}"
        assert _free(publisher._lock), f"point {point}: the lock was left held"  # noqa: SLF001
        assert not any(publisher._waiting.values()), f"point {point}: a waiter left registered"  # noqa: SLF001

    run = lambda: publisher.await_view(lambda _view: False, 0.002, ANY_PUBLICATION)  # noqa: E731
    assert _interrupted_at_each_c_return(ReadViewPublisher.await_view.__code__, run, check) > 5
    publisher.publish_dispatched(1)  # works as before
    assert publisher.await_view(lambda view: view.dispatched_end == 1, 1.0) is not None


def _interrupted_at_each_c_return(code: types.CodeType, run: Any, check: Any, *, short_retries: int = 0) -> int:
    """Runs `run()` once per C call made under a frame of `code`, raising Interrupted as that
    call returns; `check(exc, point)` after each. The number of points tried. `short_retries`:
    a run that ends before the point is run again so many times before the point is taken for
    past the last C call (a run whose C calls depend on another thread's timing)."""
    point = 0
    short_runs = 0
    while True:
        point += 1
        returns = [0]

        def interrupt(frame: types.FrameType, event: str, _arg: Any, point: int = point, returns: list[int] = returns) -> None:
            if event != "c_return":
                return
            at = frame
            while at is not None and at.f_code is not code:
                at = at.f_back
            if at is not None:
                returns[0] += 1
                if returns[0] == point:
                    raise Interrupted(f"at the return of C call {point}")

        sys.setprofile(interrupt)
        try:
            run()
            interrupted: BaseException | None = None
        except BaseException as exc:
            interrupted = exc
        finally:
            sys.setprofile(None)
        if returns[0] < point:
            # Past the last C call: every point was tried (or, with `short_retries`, the other
            # thread was early: a point is given up on after several short runs only).
            short_runs += 1
            if short_runs > short_retries:
                return point - 1
            point -= 1
            continue
        short_runs = 0
        check(interrupted, point)


def test_a_pure_python_slot_taker_interrupted_anywhere_gets_its_own_exception_and_holds_nothing() -> None:
    """Reviews 82 H1 and 83 (without the C extension): the in-flight bound's Condition, the
    same way as the read view's; its blocked takers sleep on locks of their own now."""
    from mqstore.put_pipeline import _InFlightSlots
    from mqstore.storage import speedups

    native, speedups.native = speedups.native, None
    try:
        slots = _InFlightSlots(1)
    finally:
        speedups.native = native
    assert slots.native_signal is None and slots.take(None, [])  # full from here on

    def check(interrupted: BaseException | None, point: int) -> None:
        assert isinstance(interrupted, Interrupted), f"point {point}: {interrupted!r}"
        assert _free(slots._lock), f"point {point}: the lock was left held"  # noqa: SLF001
        assert not slots._sleepers, f"point {point}: a waiter left registered"  # noqa: SLF001
        assert slots.free == 0

    points = _interrupted_at_each_c_return(_InFlightSlots.take.__code__, lambda: slots.take(0.002, []), check)
    assert points > 3
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


def _thread_start_interrupted_everywhere(make: Any, *, own_exception: bool = True) -> list[int]:
    """Starts threads made by `make(target)`, one per C call returned under Thread.start (and
    what it calls), with Interrupted raised as that call returns; the points after which the
    new thread neither ran its target nor ended (blocked in its own start-up). `own_exception`:
    the starter always gets Interrupted (a plain Thread's may get RuntimeError instead)."""
    stuck: list[int] = []
    threads: list[tuple[int, threading.Thread, threading.Event]] = []

    def run() -> None:
        ran = threading.Event()
        thread = make(ran.set)
        threads.append((len(threads) + 1, thread, ran))
        thread.start()

    def check(interrupted: BaseException | None, point: int) -> None:
        assert interrupted is not None and (isinstance(interrupted, Interrupted) or not own_exception), f"point {point}: {interrupted!r}"

    points = _interrupted_at_each_c_return(threading.Thread.start.__code__, run, check)
    assert points > 3
    def in_start_up(thread: threading.Thread) -> bool:
        # Its own thread set its ident and has not left the threads starting (`_limbo`): not
        # one interrupted before its thread existed (CPython leaves that one in `_limbo`).
        return thread.ident is not None and thread in threading._limbo  # type: ignore[attr-defined]  # noqa: SLF001

    for point, thread, ran in threads[:points]:
        # Started, it runs its target; else it ends at once or never existed.
        deadline = time.monotonic() + TIMEOUT_S
        while not ran.is_set() and in_start_up(thread) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not ran.is_set() and in_start_up(thread):
            stuck.append(point)
    return stuck


# Interrupted as `_start_new_thread` returned, start() takes the new thread out of the starting
# ones and it ends with a KeyError of CPython's, reported as unraisable: not this test's matter.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_store_thread_whose_start_was_interrupted_anywhere_never_hangs_in_its_start_up() -> None:
    """Review 83 M2: Thread.start() waits for the new thread on an Event; an interrupt as the
    Event's lock was taken (Condition.__enter__, Python code) left it held, and the new thread
    blocked for good in `_started.set()` (an idle thread per interrupt; an actor's thread
    never ran its loop). A plain Thread shows it here; a StoreThread waits on a raw lock."""
    from mqstore.waits import StoreThread

    # The control: a plain Thread hangs only if its new thread reaches `_started.set()` after the
    # interrupt. The traced start is slow, and at the usual 5 ms switch interval the new thread
    # could take the GIL first and set it (a CI run saw no hang at any point); with a long one
    # it runs only once the starter waits or ends.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        assert _thread_start_interrupted_everywhere(lambda target: threading.Thread(target=target, daemon=True),
                                                    own_exception=False)  # fmt: skip
        assert _thread_start_interrupted_everywhere(lambda target: StoreThread(target, "test-thread")) == []
    finally:
        sys.setswitchinterval(interval)


def test_a_stop_request_queued_by_an_interrupted_caller_never_leaves_the_queues_mutex_held() -> None:
    """Review 29: Queue.put takes its mutex in Condition.__enter__ (Python code); a Ctrl-C as
    that lock call returned left the mutex held, and the supervisor's thread, every later
    close() and the exit hung on it. Signals held off on the main thread were the fix then: a
    timeout library's exception, a handler already pending or another thread's close were
    not covered. Here the interrupt lands at each C return of the queueing, in this thread."""
    import queue

    from mqstore.supervisor import _put_uncut

    events: queue.Queue[object] = queue.Queue()
    queued: list[int] = []

    def check(interrupted: BaseException | None, point: int) -> None:
        assert isinstance(interrupted, Interrupted), f"point {point}: {interrupted!r}"
        assert _free(events.mutex), f"point {point}: the queue's mutex was left held"
        if events.qsize():  # in: the supervisor's next get takes it, notified or not
            assert events.get(timeout=0) == "stop"
            queued.append(point)

    points = _interrupted_at_each_c_return(_put_uncut.__code__, lambda: _put_uncut(events, "stop"), check)
    assert points >= 2 and queued  # interrupted after the append, it is queued all the same
    assert events.get(timeout=0) == "stop" and events.empty()  # the last run's, not interrupted


def _future_get_interrupted_everywhere(make: Any, get_code: types.CodeType) -> list[str]:
    """One future per C call returned under its get (and what that calls), Interrupted raised
    as that call returns while an actor's stand-in thread sets it: what went wrong at each
    point (the setter blocked, the asker got something other than its exception, the value
    lost)."""
    wrong: list[str] = []
    setters: list[threading.Thread] = []
    futures: list[Any] = []

    def run() -> None:
        future = make()
        futures.append(future)
        setter = threading.Thread(target=lambda: (time.sleep(0.005), future.set("answer")), daemon=True)
        setters.append(setter)
        setter.start()
        future.get(timeout=TIMEOUT_S)

    def check(interrupted: BaseException | None, point: int) -> None:
        setter, future = setters[-1], futures[-1]
        setter.join(2.0)
        if setter.is_alive():
            wrong.append(f"point {point}: the setter blocked")
            return
        if not isinstance(interrupted, Interrupted):
            wrong.append(f"point {point}: {interrupted!r}")
        try:
            if future.get(timeout=1.0) != "answer":
                wrong.append(f"point {point}: the answer changed")
        except Exception as exc:
            wrong.append(f"point {point}: get again raised {exc!r}")

    # (A setter faster than the get, on a loaded machine, left no C call to interrupt.)
    assert _interrupted_at_each_c_return(get_code, run, check, short_retries=3) > 2
    return wrong


def test_an_ask_interrupted_anywhere_in_its_wait_never_blocks_the_answering_actor() -> None:
    """Review 83's note: pykka's ThreadingFuture waits in Condition code (an RLock's): an
    exception raised into the asker just after that lock was taken left it held, and the
    actor's set() blocked for good (an open's start handshake asks each actor from the
    caller's thread; delete_expired_files_now waited so on the cleaner). A ThreadingFuture
    shows it here; the store's actors answer through a StoreFuture."""
    import pykka

    from mqstore.runtime import RuntimeActor, StoreFuture

    assert _future_get_interrupted_everywhere(pykka.ThreadingFuture, pykka.ThreadingFuture.get.__code__)
    assert _future_get_interrupted_everywhere(StoreFuture, StoreFuture.get.__code__) == []
    assert isinstance(RuntimeActor._create_future(), StoreFuture)  # noqa: SLF001


def test_a_store_future_is_a_pykka_future() -> None:
    """What pykka does with the futures of ask() and stop(): a value or an exception, once; a
    get hook (stop's result); map; a timeout."""
    import queue

    import pykka

    from mqstore.runtime import RuntimeActor, StoreFuture

    future: StoreFuture[int] = StoreFuture()
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.01)
    future.set(3)
    assert future.get() == 3 and future.get(timeout=0) == 3 and future.map(lambda v: v + 1).get() == 4
    with pytest.raises(queue.Full):
        future.set(4)
    failed: StoreFuture[int] = StoreFuture()
    failed.set_exception((ValueError, ValueError("no"), None))
    with pytest.raises(ValueError, match="no"):
        failed.get()

    class Echo(RuntimeActor):
        def on_receive(self, message: Any) -> Any:
            if message == "fail":
                raise KeyError("fail")
            return message

    ref = Echo.start()
    try:
        assert ref.ask("hi", timeout=TIMEOUT_S) == "hi"
        with pytest.raises(KeyError):
            ref.ask("fail", timeout=TIMEOUT_S)
        waiting: list[Any] = []
        asker = threading.Thread(target=lambda: waiting.append(ref.ask("later", timeout=TIMEOUT_S)))
        asker.start()
        asker.join(TIMEOUT_S)
        assert waiting == ["later"]
    finally:
        assert ref.stop(timeout=TIMEOUT_S) is True
    assert ref.stop(block=False).get(timeout=TIMEOUT_S) is False  # dead already


def test_a_store_futures_getters_never_wait_on_one_interrupted_anywhere() -> None:
    """Review 85 F6: a getter interrupted between taking the shared gate and passing it on kept
    it, and another getter waiting without a timeout waited for good. Each getter sleeps on a
    lock of its own now (waits.Sleepers): here one is interrupted at each C return of its get
    while another waits with no timeout, and the other always gets the answer."""
    from mqstore.runtime import StoreFuture

    others: list[tuple[threading.Thread, list[str]]] = []
    futures: list[StoreFuture[str]] = []

    def run() -> None:
        future: StoreFuture[str] = StoreFuture()
        futures.append(future)
        got: list[str] = []
        other = threading.Thread(target=lambda: got.append(future.get()), daemon=True)
        others.append((other, got))
        other.start()
        setter = threading.Thread(target=lambda: (time.sleep(0.005), future.set("answer")), daemon=True)
        setter.start()
        future.get(timeout=TIMEOUT_S)

    def check(interrupted: BaseException | None, point: int) -> None:
        assert isinstance(interrupted, Interrupted), f"point {point}: {interrupted!r}"
        other, got = others[-1]
        other.join(TIMEOUT_S)
        assert got == ["answer"], f"point {point}: the other getter {'waits' if other.is_alive() else 'got ' + repr(got)}"

    # (short_retries: a run whose setter was early makes fewer C calls; a CI-like run beside a
    # review saw the third point given up on as past the last)
    assert _interrupted_at_each_c_return(StoreFuture.get.__code__, run, check, short_retries=5) > 2


def test_a_store_futures_exception_keeps_its_traceback_and_type() -> None:
    """Review 85 F8: re-raised as it was, the exception's traceback grew by every get's frames
    (102 frames after 50 gets, other threads' too); a (type, None, None) answer became a
    RuntimeError; a get hook ran once per concurrent getter."""
    import pykka

    from mqstore.runtime import StoreFuture

    def failing() -> None:
        raise ValueError("no")

    try:
        failing()
    except ValueError:
        failed: StoreFuture[None] = StoreFuture()
        failed.set_exception()
    depths = []
    for _ in range(50):
        try:
            failed.get()
        except ValueError as exc:
            tb, depth = exc.__traceback__, 0
            while tb is not None:
                depth, tb = depth + 1, tb.tb_next
            depths.append(depth)
    assert len(set(depths)) == 1, depths
    typed: StoreFuture[None] = StoreFuture()
    typed.set_exception((KeyError, None, None))
    with pytest.raises(KeyError):
        typed.get()
    runs: list[int] = []
    hooked: StoreFuture[int] = StoreFuture()
    hooked.set_get_hook(lambda _timeout: runs.append(1) or (time.sleep(0.05), 7)[1])
    getters = [threading.Thread(target=hooked.get) for _ in range(8)]
    for thread in getters:
        thread.start()
    for thread in getters:
        thread.join(TIMEOUT_S)
    assert hooked.get() == 7 and runs == [1]
    assert isinstance(StoreFuture(), pykka.Future)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_store_thread_that_dies_in_its_start_up_fails_its_start_and_one_late_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 85 F1: on 3.11 an async exception aimed at a thread starting another can hit the
    new thread first, which dies before saying it runs; `start()` then waited for good (an open
    held its store lock so, in the reviewer's runs). The start gives up after START_GIVE_UP_S
    with CPython's "can't start new thread"; a thread that runs after that runs nothing."""
    from mqstore import waits
    from mqstore.waits import StoreThread

    monkeypatch.setattr(waits, "START_GIVE_UP_S", 0.3)
    ran: list[str] = []

    class Killed(Exception):
        pass

    def killed_in_start_up() -> None:
        raise Killed("as a misdelivered async exception")

    dead = StoreThread(lambda: ran.append("dead"), "test-dead")
    dead._bootstrap_inner = killed_in_start_up  # type: ignore[method-assign]  # noqa: SLF001
    with pytest.raises(RuntimeError, match="^can't start new thread$"):
        dead.start()
    assert dead not in threading.enumerate()

    late = StoreThread(lambda: ran.append("late"), "test-late")
    real_bootstrap_inner = late._bootstrap_inner  # noqa: SLF001

    def slow_start_up() -> None:
        time.sleep(0.6)
        real_bootstrap_inner()

    late._bootstrap_inner = slow_start_up  # type: ignore[method-assign]  # noqa: SLF001
    with pytest.raises(RuntimeError, match="^can't start new thread$"):
        late.start()
    time.sleep(1.0)  # it ran its start-up by now
    assert ran == []
    started = StoreThread(lambda: ran.append("ran"), "test-ran")
    started.start()
    started.join(TIMEOUT_S)
    assert ran == ["ran"]


def test_a_put_futures_result_interrupted_anywhere_gives_the_callers_exception_and_holds_nothing() -> None:
    """Review 85 F5/F7: result() waited on the Future's Condition: a Ctrl-C as its lock was
    taken left that lock held (another thread's result(timeout=3) never returned), and one as
    Condition.wait let it go gave the host RuntimeError('cannot release un-acquired lock').
    It sleeps on a raw lock of its own now; the completion (here from another thread, as the
    store's completion thread) wakes it."""
    from mqstore.put_pipeline import _complete_futures, _PutFuture
    from mqstore.storage.status import PutMessageStatus

    stored = mqstore.PutResult(status=PutMessageStatus.PUT_OK, commitlog_offset=0, wrote_bytes=10)
    futures: list[Any] = []
    completers: list[threading.Thread] = []

    def run() -> None:
        future = _PutFuture()
        future._condition  # made, as a concurrent.futures.wait or a callback makes it  # noqa: B018, SLF001
        futures.append(future)
        def complete() -> None:
            # Once result() sleeps (or was interrupted before it could): completed before the
            # call, a loaded machine's late result() made no C call to interrupt (0 points).
            deadline = time.monotonic() + 0.5
            while future._sleepers is None and time.monotonic() < deadline:  # noqa: SLF001
                time.sleep(0.001)
            time.sleep(0.005)
            _complete_futures([(future, stored)], [])

        completer = threading.Thread(target=complete)
        completers.append(completer)
        completer.start()
        future.result(timeout=TIMEOUT_S)

    def check(interrupted: BaseException | None, point: int) -> None:
        future, completer = futures[-1], completers[-1]
        completer.join(TIMEOUT_S)
        assert not completer.is_alive(), f"point {point}: the completion blocked"
        assert isinstance(interrupted, Interrupted), f"point {point}: {interrupted!r}"
        assert _free(future._cond._lock), f"point {point}: the future's lock was left held"  # noqa: SLF001
        assert future.result(timeout=1.0) is stored

    assert _interrupted_at_each_c_return(_PutFuture.result.__code__, run, check) > 3


def test_a_store_futures_get_with_a_timeout_never_waits_out_another_getters_hook() -> None:
    """Review 86 F4: a get hook ran under a lock taken with no timeout, so a get(timeout=0)
    (the supervisor's look at a stop future) waited out another getter's hook."""
    import pykka

    from mqstore.runtime import StoreFuture

    release = threading.Event()

    def hook(timeout: float | None) -> int:
        if not release.wait(TIMEOUT_S if timeout is None else timeout):
            raise pykka.Timeout("the hook's own wait")
        return 7

    hooked: StoreFuture[int] = StoreFuture()
    hooked.set_get_hook(hook)
    slow = threading.Thread(target=hooked.get)  # in the hook until released
    slow.start()
    time.sleep(0.05)
    started = time.monotonic()
    with pytest.raises(pykka.Timeout):
        hooked.get(timeout=0)
    assert time.monotonic() - started < 1.0
    release.set()
    slow.join(TIMEOUT_S)
    assert hooked.get() == 7


def test_a_store_lock_acquire_interrupted_anywhere_leaves_the_store_openable_in_this_process(tmp_path: Path) -> None:
    """Review 86's fuzz: an exception raised as the acquire's in-process claim (`_held.add`, or
    its guard's exit) returned, before its try, kept the claim for good: every later open in
    the process was StoreLockedError ("already started in this process")."""
    from mqstore.storage.fs import RealFileSystem
    from mqstore.storage.lockfiles import StoreLock

    fs = RealFileSystem()
    path = str(tmp_path / "lock")
    taken: list[StoreLock] = []

    def run() -> None:
        lock = StoreLock(fs, path)
        taken.append(lock)
        lock.acquire()

    def check(interrupted: BaseException | None, point: int) -> None:
        assert isinstance(interrupted, Interrupted), f"point {point}: {interrupted!r}"
        assert not taken[-1].locked, f"point {point}: taken, and the caller never knew"
        again = StoreLock(fs, path)
        again.acquire()  # StoreLockedError if the claim was left behind
        again.release()

    assert _interrupted_at_each_c_return(StoreLock.acquire.__code__, run, check) > 10
    taken[-1].release()  # the last run's, not interrupted
