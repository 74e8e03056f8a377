"""A close cut short (review 26, F1 and F2). close() marked the store closed, then wrote the last
stats snapshot and the consumer offsets before stopping the supervisor, unprotected: a Ctrl-C
there (or any error, such as an offsets file that could not be encoded) left every actor
running, the lock held and the abort file in place; every later close(), the exit handler's
too, returned False and did nothing, and the offsets committed before it were lost. Now a
failing step is logged and the close goes on; a KeyboardInterrupt stops the close where it
lands, and the next close() finishes it."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message, StoreClosedError
from mqstore.supervisor import SupervisorState


def _filled(root: Path) -> mqstore.MessageStore:
    store = mqstore.open(root)
    for i in range(5):
        assert store.put(Message("T", b"m%d" % i)).ok
    store.commit_offset("group", "T", 0, 4)
    return store


def _everything_kept(root: Path) -> None:
    with mqstore.open(root) as again:  # in this process: the lock was given back
        assert again.query_offset("group", "T", 0) == 4
        assert [m.body for m in again.get("T", 0, 0, 32).messages] == [b"m%d" % i for i in range(5)]


def _interrupted(call: Any, fires: Any) -> list[str]:
    """`call()`, with KeyboardInterrupt raised (a profile hook) at the first C call's return
    for which `fires(frame, the C function)` is true; it must raise it. Where it fired (one
    place at most)."""
    import sys

    fired: list[str] = []

    def interrupt(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and not fired and fires(frame, arg):
            fired.append(f"{frame.f_code.co_qualname}: {getattr(arg, '__name__', arg)}")
            raise KeyboardInterrupt

    sys.setprofile(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        sys.setprofile(None)
    return fired


def test_a_ctrl_c_in_the_close_before_the_stop_is_finished_by_the_next_close(tmp_path: Path) -> None:
    store = _filled(tmp_path / "s")
    real = store._stats_ticker.close

    def interrupted() -> None:
        raise KeyboardInterrupt

    store._stats_ticker.close = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.close()
    assert store.closed and store.supervisor.state is SupervisorState.RUNNING
    with pytest.raises(StoreClosedError):
        store.put(Message("T", b"after"))  # closed to calls meanwhile
    store._stats_ticker.close = real  # type: ignore[method-assign]
    assert store.close() is True
    assert store.supervisor.state is SupervisorState.STOPPED
    assert store.close() is True  # finished: once more is a no-op with the same answer
    assert not (tmp_path / "s" / "abort").exists()
    _everything_kept(tmp_path / "s")


class _TimedOut(Exception):
    """A timeout library's exception (an Exception, not a KeyboardInterrupt)."""


@pytest.mark.parametrize(("where", "raised"), [("before_the_request_is_queued", KeyboardInterrupt),
                                               ("during_the_wait", KeyboardInterrupt), ("during_the_wait", _TimedOut)])  # fmt: skip
def test_a_ctrl_c_in_the_supervisors_stop_is_finished_by_the_next_close(tmp_path: Path, where: str, raised: type[BaseException]) -> None:
    """Review 28: with one stop request kept for a second stop() to wait on, a Ctrl-C after it
    was recorded but before it was queued left the next close waiting 30 s for a request never
    taken, then finished with every actor running. Every stop() now queues its own and waits
    for the thread's shutdown, whichever request it took. Review 85 F9: a timeout library's
    exception there was taken for a failed step of the close, which went on and said False
    while the shutdown still ran; it cuts the close short as a Ctrl-C does."""
    from mqstore import supervisor as supervisor_module

    store = _filled(tmp_path / "s")
    supervisor = store.supervisor
    patched = {"before_the_request_is_queued": (supervisor_module, "_put_uncut"),
               "during_the_wait": (supervisor._shut_down, "wait")}  # fmt: skip
    target, name = patched[where]
    real = getattr(target, name)

    def interrupted_once(*args: Any, **kwargs: Any) -> Any:
        setattr(target, name, real)
        raise raised

    setattr(target, name, interrupted_once)
    with pytest.raises(raised):
        store.close()
    started = time.monotonic()
    assert store.close() is True
    assert time.monotonic() - started < 10
    assert supervisor.state is SupervisorState.STOPPED
    _everything_kept(tmp_path / "s")


def test_a_close_waiting_on_another_threads_close_finishes_it_when_that_one_is_cut_short(tmp_path: Path) -> None:
    """Review 28: a close() waiting for another thread's close returned False as soon as that
    one was interrupted, with the store still running."""
    store = _filled(tmp_path / "s")
    real = store._stats_ticker.close
    in_close = threading.Event()

    def interrupted_after_a_while() -> None:
        store._stats_ticker.close = real  # type: ignore[method-assign]
        in_close.set()
        time.sleep(0.3)  # the other thread's close() is waiting by now
        raise KeyboardInterrupt

    store._stats_ticker.close = interrupted_after_a_while  # type: ignore[method-assign]
    other: list[bool] = []

    def close_from_another_thread() -> None:
        in_close.wait(10)
        other.append(store.close())

    thread = threading.Thread(target=close_from_another_thread)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        store.close()
    thread.join(30)
    assert other == [True]
    assert store.supervisor.state is SupervisorState.STOPPED
    assert store.close() is True
    _everything_kept(tmp_path / "s")


def test_a_step_of_the_close_that_fails_does_not_keep_the_store_running(tmp_path: Path) -> None:
    store = _filled(tmp_path / "s")

    def broken() -> None:
        raise RuntimeError("the snapshot's encoder broke")

    store._stats_ticker.close = broken  # type: ignore[method-assign]
    assert store.close() is False  # not clean: a step failed (logged)
    assert store.supervisor.state is SupervisorState.STOPPED
    _everything_kept(tmp_path / "s")


def test_an_offsets_write_that_fails_otherwise_than_with_an_os_error_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pending-write mark was dropped before the write and set back only on OSError: a
    failure of another kind lost the commits made since the last write, until the next one."""
    store = _filled(tmp_path / "s")
    real = store.offsets._offsets.persist
    calls = [0]

    def fails_once(snapshot: Any = None) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("not encodable")
        real(snapshot)

    monkeypatch.setattr(store.offsets._offsets, "persist", fails_once)
    with pytest.raises(ValueError):
        store.persist_offsets()
    assert store.close() is True  # the close's write is the retry
    assert calls[0] == 2
    _everything_kept(tmp_path / "s")


def test_a_group_or_topic_that_cannot_be_written_is_refused_when_committed(tmp_path: Path) -> None:
    """A lone surrogate (what os.fsdecode gives for non-UTF-8 bytes) was kept, and then failed
    every write of the whole table: every group's later commits were lost."""
    store = _filled(tmp_path / "s")
    bad = b"bad\xff".decode("utf-8", "surrogateescape")
    for args in ((bad, "T", 0, 1), ("group", bad, 0, 1)):
        with pytest.raises(ValueError, match="UTF-8"):
            store.commit_offset(*args)
    store.commit_offset("group", "T", 0, 4)
    store.persist_offsets()
    assert store.close() is True
    _everything_kept(tmp_path / "s")


def test_a_close_interrupted_after_queueing_its_request_still_stops_the_store(tmp_path: Path) -> None:
    """Review 29, and its fix made thread-proof: the stop request goes into the supervisor's
    queue under the queue's mutex taken in C. Interrupted after the request went in and before
    its notify, the close raises the host's exception; the supervisor's thread finds the
    request at its next wake all the same, and the store stops; a second close() says so."""
    from mqstore import supervisor as supervisor_module

    store = _filled(tmp_path / "s")
    supervisor = store.supervisor
    queueing_code = supervisor_module._put_uncut.__code__
    fired = _interrupted(store.close, lambda frame, arg: frame.f_code is queueing_code and getattr(arg, "__name__", "") == "append")
    assert fired == ["_put_uncut: append"]
    supervisor._thread.join(20)  # noqa: SLF001
    assert not supervisor._thread.is_alive(), "the supervisor never took the request"  # noqa: SLF001
    assert store.close() is True
    _everything_kept(tmp_path / "s")


def test_a_ctrl_c_as_close_takes_the_lock_of_its_wait_never_blocks_the_supervisor(tmp_path: Path) -> None:
    """Review 83 H2: close() waited for the supervisor's shutdown on a threading.Event, whose
    wait enters a Condition in Python code: a Ctrl-C as its lock call returned left the lock
    held for good; the supervisor's thread then blocked in set(), a second close() hung, and
    the interpreter never exited. The interrupt lands here (a profile hook) as the first lock
    call inside stop()'s wait returns. (Its queueing of the request: the test above and
    tests/test_async_exceptions.py.)"""
    from mqstore.supervisor import Supervisor

    store = _filled(tmp_path / "s")
    supervisor = store.supervisor
    fired = _interrupted(store.close, lambda frame, arg: getattr(arg, "__name__", "") in ("acquire", "__enter__")
                         and _under(frame, Supervisor.stop.__code__) and not _under(frame, "_put_uncut"))  # fmt: skip
    assert fired, "no lock call inside stop()"
    closed: list[bool] = []
    second = threading.Thread(target=lambda: closed.append(store.close()), daemon=True)
    second.start()
    second.join(20)
    assert closed == [True], f"the second close() hung (interrupted at {fired})"
    assert supervisor.state is SupervisorState.STOPPED
    supervisor._thread.join(10)  # noqa: SLF001
    assert not supervisor._thread.is_alive(), "the supervisor's thread never ended"  # noqa: SLF001
    _everything_kept(tmp_path / "s")


# An open interrupted (review 85 F3/F4): an exception raised into the opening thread where the
# test says (a profile hook, at the return of a C call under the named code), then the store
# must open again in this process, with nothing of the failed open left running.


def _interrupted_open(root: Path, fires: Any) -> list[str]:
    """Open `root` with KeyboardInterrupt raised where `fires` says (`_interrupted`)."""
    return _interrupted(lambda: mqstore.open(root), fires)


def _under(frame: Any, code: str | types.CodeType, **locals_: Any) -> bool:
    """Whether `frame` runs under a call of `code` (a code object, or a function's name) whose
    locals include `locals_`."""
    while frame is not None:
        if (frame.f_code is code or frame.f_code.co_name == code) and all(frame.f_locals.get(k) == v for k, v in locals_.items()):
            return True
        frame = frame.f_back
    return False


def _no_actor_left(before: set[threading.Thread]) -> None:
    from mqstore.runtime import RuntimeActor

    def left() -> list[str]:
        return [t.name for t in threading.enumerate() if t not in before and t.is_alive()
                and t.name.split("-")[0] in {c.__name__ for c in _actor_classes(RuntimeActor)}]  # fmt: skip

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == []


def _actor_classes(base: type) -> list[type]:
    found = []
    for sub in base.__subclasses__():
        found.append(sub)
        found.extend(_actor_classes(sub))
    return found


def test_an_open_interrupted_as_its_lock_was_taken_gives_the_lock_back(tmp_path: Path) -> None:
    """Review 85 F4a: interrupted after the lock was taken and before the lock knew it (its
    log line), or before the open's cleanup could see it, every later open in this process
    was StoreLockedError."""
    _filled(tmp_path / "s").close()
    fired = _interrupted_open(tmp_path / "s", lambda frame, _arg: _under(frame, "info") and _under(frame, "acquire"))
    assert fired
    _everything_kept(tmp_path / "s")


def test_an_open_interrupted_after_an_actors_thread_began_stops_that_actor(tmp_path: Path) -> None:
    """Review 85 F3: a start cut short after the writer's thread began never gave its ref back;
    the failed open released the lock while that writer recovered the files, and ran on
    beside the next open's writer (two owners of the log)."""
    _filled(tmp_path / "s").close()
    before = set(threading.enumerate())
    fired = _interrupted_open(
        tmp_path / "s",
        lambda frame, arg: getattr(arg, "__name__", "") == "acquire" and _under(frame, "_made_child", name="writer")
        and _under(frame, "start"),
    )  # fmt: skip
    assert fired
    _no_actor_left(before)
    _everything_kept(tmp_path / "s")


def test_an_open_whose_cleanup_is_interrupted_still_gives_the_lock_back(tmp_path: Path) -> None:
    """Review 85 F4b: a failed open interrupted again while it stopped its actors left them
    running unseen and the lock held for good. What it had not stopped yet is told to stop
    and the lock goes once they did."""
    from mqstore.actors.index import IndexActor

    _filled(tmp_path / "s").close()
    before = set(threading.enumerate())
    real = IndexActor.on_start
    IndexActor.on_start = lambda self: (_ for _ in ()).throw(OSError(5, "injected"))  # type: ignore[method-assign]
    try:
        fired = _interrupted_open(tmp_path / "s", lambda frame, arg: getattr(arg, "__name__", "") in ("get", "acquire")
                                  and _under(frame, "_stop_children"))  # fmt: skip
    finally:
        IndexActor.on_start = real  # type: ignore[method-assign]
    assert fired
    _no_actor_left(before)
    _everything_kept(tmp_path / "s")


def _in_started_supervisor(frame: Any) -> bool:
    """Under Supervisor.start, once it said the store RUNNING."""
    from mqstore.supervisor import Supervisor

    while frame is not None:
        if frame.f_code is Supervisor.start.__code__:
            return frame.f_locals["self"].state is SupervisorState.RUNNING
        frame = frame.f_back
    return False


@pytest.mark.parametrize("where", ["child_made", "gateway_thread", "store_said_running", "supervisor_thread_made", "offsets_load"])
def test_an_open_interrupted_anywhere_past_its_children_leaves_nothing_running(tmp_path: Path, where: str) -> None:
    """Review 86: past review 85's fixes, an open cut short (F1) just after a child's start
    returned (the actor in neither `made` nor `peers`: it ran on beside the next open's), (F3)
    in the gateway's start (never noted as made: it and its readers ran on), (F2) after the
    children and before or after the supervisor's thread (its log line), or in the offsets'
    load (which caught Exception only), left actors running and the lock held for good."""
    from mqstore.offsets import ConsumerOffsets
    from mqstore.waits import DoneFlag, StoreThread

    _filled(tmp_path / "s").close()
    before = set(threading.enumerate())
    fires = {
        "child_made": lambda frame, arg: getattr(arg, "__name__", "") == "pop" and frame.f_code.co_name == "_start_child"
        and frame.f_locals.get("name") == "writer" and frame.f_locals.get("ref") is not None,
        "gateway_thread": lambda frame, arg: getattr(arg, "__name__", "") == "acquire"
        and _under(frame, "_made_child", name="gateway") and _under(frame, DoneFlag.wait.__code__),
        "supervisor_thread_made": lambda frame, _arg: _in_started_supervisor(frame) and _under(frame, StoreThread.__init__.__code__),
        # The first C return once RUNNING (the ticker's wake-up, the "store started" line):
        "store_said_running": lambda frame, _arg: _in_started_supervisor(frame),
        "offsets_load": lambda frame, _arg: _under(frame, ConsumerOffsets.load.__code__),
    }[where]  # fmt: skip
    assert _interrupted_open(tmp_path / "s", fires)
    _no_actor_left(before)
    _everything_kept(tmp_path / "s")
