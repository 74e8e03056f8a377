"""A put handed to the writer just as the writer stops: the stop's drain of its inbox (which
fails every put it finds) may have run before the put arrived, leaving it in an inbox nobody
reads again. A future has no timeout, so such a put must be taken back and answered
SERVICE_NOT_AVAILABLE at once, not left pending until close()."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pykka
import pytest

import mqstore
from mqstore.runtime import FastInbox, RuntimeActor, take_back_told, tell_keeping_gil
from mqstore.storage import speedups
from mqstore.storage.status import PutMessageStatus

TOPIC = "race"


class _Idle(RuntimeActor):
    def on_receive(self, message: Any) -> Any:
        return None


class _Told:
    def __init__(self, reply: object) -> None:
        self.reply = reply


def test_take_back_told_finds_a_message_left_in_a_stopped_inbox_once() -> None:
    ref = _Idle.start()
    ref.stop(block=True)
    inbox = ref.actor_inbox
    assert isinstance(inbox, FastInbox) and ref.actor_stopped.is_set()
    mine, other = _Told("mine"), _Told("other")
    inbox.put_keeping_gil(pykka._envelope.Envelope(other))  # as a tell racing the stop would
    inbox.put_keeping_gil(pykka._envelope.Envelope(mine))
    assert take_back_told(ref, lambda m: m.reply == "mine") is mine
    assert take_back_told(ref, lambda m: m.reply == "mine") is None  # taken once
    assert [e.message for e in inbox._items] == [other]


class _StopsDuringTheTell:
    """An actor ref's `actor_stopped` seen unset by the tell's check, set right after it:
    the actor stopped (and drained its inbox) between the check and the append."""

    def __init__(self) -> None:
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > 1


def test_tell_keeping_gil_takes_back_what_it_told_an_actor_that_stopped_during_the_tell() -> None:
    ref: Any = SimpleNamespace(actor_inbox=FastInbox(), actor_stopped=_StopsDuringTheTell())
    told = _Told("put")
    assert tell_keeping_gil(ref, told) is False  # the caller answers it (store: "writer is restarting")
    assert ref.actor_inbox.empty()
    alive: Any = SimpleNamespace(actor_inbox=FastInbox(), actor_stopped=threading.Event())
    assert tell_keeping_gil(alive, told) is True
    assert [e.message for e in alive.actor_inbox._items] == [told]


class _RacedInbox(FastInbox):
    """A FastInbox whose emptiness check is followed, at once, by another thread's take-back
    of its oldest message: the worst moment for a drain that checks, then takes."""

    __slots__ = ("raced",)

    def empty(self) -> bool:
        answer = super().empty()
        if not answer and self.raced is not None:
            raced, self.raced = self.raced, None
            assert take_back_told(raced, lambda m: isinstance(m, _Told)) is not None
        return answer


class _RacedActor(RuntimeActor):
    @staticmethod
    def _create_actor_inbox() -> Any:
        inbox = _RacedInbox()
        inbox.raced = None
        return inbox

    def on_receive(self, message: Any) -> Any:
        return None


def test_a_stopped_actors_drains_go_by_items_so_a_take_back_cannot_break_them() -> None:
    """A take-back between a drain's emptiness check and its `get` left `get` popping an
    empty inbox (pykka's teardown: IndexError in the actor's thread): the drains take items,
    not tokens."""
    ref = _RacedActor.start()
    actor = ref._actor_weakref()  # held: the stopped actor's drains are called below
    ref.stop(block=True)
    inbox = ref.actor_inbox
    assert isinstance(inbox, _RacedInbox) and isinstance(actor, RuntimeActor)
    inbox.put_keeping_gil(pykka._envelope.Envelope(_Told("mine")))  # a tell that raced the stop
    inbox.raced = ref
    actor._actor_loop_teardown()  # pykka's drain after the stop
    assert inbox.empty() and inbox.take_left() is None
    again = _Told("again")
    inbox.put_keeping_gil(pykka._envelope.Envelope(again))
    drained = actor.drain_queued("stopped")  # StoreActor.on_stop's drain: no check to race
    assert [q.message for q in drained] == [again]
    assert take_back_told(ref, lambda m: m is again) is None  # the drain answers it, not both


@pytest.mark.skipif(speedups.native is None, reason="the one-call put path needs the C extension")
def test_a_put_async_handed_over_as_the_writer_stops_is_answered_not_left_pending(tmp_path: Path) -> None:
    armed: list[Any] = []

    def clock_ms() -> int:
        # PutSubmitter.submit reads the clock between its check that the writer is alive
        # and the hand-over: the writer stops (and drains its inbox) right there.
        if armed:
            store = armed.pop()
            writer = store.supervisor.ctx.peers.get("writer")
            assert writer is not None
            writer.stop(block=True)
        return int(time.time() * 1000)

    store = mqstore.open(tmp_path / "s", clock_ms=clock_ms)
    try:
        first = store.put_async(mqstore.Message(topic=TOPIC, queue_id=0, body=b"first"))
        assert first.result(timeout=10).status is PutMessageStatus.PUT_OK  # the topic is known now
        armed.append(store)
        raced = store.put_async(mqstore.Message(topic=TOPIC, queue_id=0, body=b"raced"))
        assert not armed, "the race was not staged: the put did not take the one-call path"
        try:
            result = raced.result(timeout=5)
        except FutureTimeout:
            pytest.fail("the put's future was left pending in the stopped writer's inbox")
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, result
        assert store._puts._free_slots == store.config.max_puts_in_flight  # its slot came back
    finally:
        store.close()


needs_native = pytest.mark.skipif(speedups.native is None, reason="the C extension's Signal")


@needs_native
def test_post_then_wait_posts_then_takes_one_or_says_it_took_none() -> None:
    assert speedups.native is not None
    told, answer = speedups.native.Signal(), speedups.native.Signal()
    answer.post_holding_gil()
    assert told.post_then_wait(answer, 1.0) is True
    assert (told.value(), answer.value()) == (1, 0)
    started = time.monotonic()
    assert told.post_then_wait(answer, 0.05) is False  # posted all the same
    assert time.monotonic() - started >= 0.04
    assert (told.value(), answer.value()) == (2, 0)


class _Answers(RuntimeActor):
    """Answers each told `_Told` through its reply (a Waiter), as the writer answers a put."""

    def on_receive(self, message: Any) -> Any:
        message.reply.set(("answer", message))
        return None


@needs_native
def test_tell_and_await_hands_over_and_has_the_answer_in_one_stretch() -> None:
    from mqstore.messages import Waiter
    from mqstore.runtime import tell_and_await

    ref = _Answers.start()
    try:
        waiter = Waiter()
        told = _Told(waiter)
        assert tell_and_await(ref, told, waiter, 5.0) is True
        assert waiter.get(timeout=0) == ("answer", told)  # taken already: no wait
    finally:
        ref.stop(block=True)
    assert tell_and_await(ref, _Told(Waiter()), Waiter(), 5.0) is None  # stopped: not told


@needs_native
def test_tell_and_await_leaves_a_slow_answer_to_the_callers_own_wait() -> None:
    from mqstore.messages import Waiter
    from mqstore.runtime import tell_and_await

    silent: Any = SimpleNamespace(actor_inbox=FastInbox(), actor_stopped=threading.Event())
    waiter = Waiter()
    told = _Told(waiter)
    assert tell_and_await(silent, told, waiter, 0.01) is False  # told, no answer yet
    assert [e.message for e in silent.actor_inbox._items] == [told]
    waiter.set("late")
    assert waiter.get(timeout=1) == "late"


@needs_native
def test_a_put_handed_over_as_the_writer_stops_is_answered_not_left_to_the_reply_timeout(tmp_path: Path) -> None:
    """`put` tells the writer and waits in one stretch; the writer stopped right after the
    check that it was alive (its drain ran before the put arrived): the put is taken back out
    of the dead inbox and answered SERVICE_NOT_AVAILABLE, not after the reply timeout."""
    store = mqstore.open(tmp_path / "s")
    try:
        assert store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"first")).ok
        peers = store.supervisor.ctx.peers
        writer = peers["writer"]
        dead: Any = SimpleNamespace(actor_inbox=FastInbox(), actor_stopped=_StopsDuringTheTell())
        peers["writer"] = dead
        try:
            started = time.monotonic()
            result = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"raced"))
            assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, result
            assert time.monotonic() - started < 5, "waited for the reply timeout"
            assert dead.actor_inbox.empty()  # taken back
        finally:
            peers["writer"] = writer
        assert store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"after")).ok
        assert [m.body for m in store.get(TOPIC, 0, 0, 8).messages] == [b"first", b"after"]
    finally:
        store.close()
