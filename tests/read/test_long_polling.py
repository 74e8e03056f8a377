"""Long polling (§8.6): a waiting consumer wakes within milliseconds of a put, and costs no CPU
while it waits; actors subscribe to arrivals."""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Callable

import pykka
import pytest

from mqstore import Message, MessageArrived, MessageStore, StoreClosedError
from mqstore.messages import Get, Reply, Subscribe

h = sys.modules["mqstore_read_test_helpers"]
Open = Callable[..., MessageStore]
WAKE_LATENCY_MAX_S = 0.5  # generous: machines are noisy; typically a few ms
IDLE_CPU_MAX_S = 0.1


def test_a_blocked_consumer_wakes_within_milliseconds_of_a_put(open_store: Open) -> None:
    store = open_store()
    h.put_n(store, 1)
    woke: list[float] = []
    waiting = threading.Event()

    def consumer() -> None:
        waiting.set()
        if store.wait_for_messages("T", 0, 1, timeout_s=10):
            woke.append(time.monotonic())

    thread = threading.Thread(target=consumer)
    thread.start()
    assert waiting.wait(5)
    time.sleep(0.05)  # let it block in the wait
    put_at = time.monotonic()
    assert store.put(Message(topic="T", body=b"wake")).ok
    thread.join(10)
    assert woke, "the consumer was not woken"
    latency = woke[0] - put_at
    print(f"wake latency {latency * 1000:.2f} ms")
    assert latency < WAKE_LATENCY_MAX_S
    assert store.get("T", 0, 1, 32).messages[0].body == b"wake"


def test_an_idle_waiting_consumer_burns_no_cpu(open_store: Open) -> None:
    store = open_store()
    h.put_n(store, 1)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(store.wait_for_messages("T", 0, 1, timeout_s=1.2)))
    cpu_before = time.process_time()  # the whole process: the store's actors count too
    thread.start()
    thread.join(5)
    cpu = time.process_time() - cpu_before
    print(f"process CPU over ~1.2 s of idle waiting: {cpu * 1000:.1f} ms")
    assert result == [False]  # timed out: nothing arrived
    assert cpu < IDLE_CPU_MAX_S


def test_close_wakes_waiting_consumers(open_store: Open) -> None:
    store = open_store()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(store.wait_for_messages("T", 0, 0, timeout_s=30)))
    thread.start()
    time.sleep(0.05)
    started = time.monotonic()
    store.close()
    thread.join(10)
    assert result == [False] and time.monotonic() - started < 10


def test_a_consumer_waiting_with_no_timeout_hears_that_the_supervisor_gave_up(open_store: Open) -> None:
    """Nothing is published after the supervisor gave up (FAILED), so nothing would wake a
    waiter: it slept its whole timeout (here: forever). Now the wait under way and any later
    one raise StoreClosedError naming the failure. Not an instant False: a long-poll loop that
    takes False for "nothing yet" would spin on it."""
    store = open_store()
    h.put_n(store, 1)
    outcome: list[object] = []

    def consumer() -> None:
        try:
            outcome.append(store.wait_for_messages("T", 0, 1, timeout_s=math.inf))
        except StoreClosedError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=consumer)
    thread.start()
    time.sleep(0.05)  # let it block in the wait
    store.supervisor._give_up(RuntimeError("an actor kept failing"))
    thread.join(10)
    assert not thread.is_alive(), "the waiter was never woken"
    assert len(outcome) == 1 and isinstance(outcome[0], StoreClosedError), outcome
    assert "gave up" in str(outcome[0]) and "an actor kept failing" in str(outcome[0])
    for offset in (0, 1):  # a message there or not: the queue's bounds went with its actor
        with pytest.raises(StoreClosedError, match="gave up"):
            store.wait_for_messages("T", 0, offset, timeout_s=math.inf)
    assert not store.running


def test_wait_returns_at_once_when_the_message_is_already_there(open_store: Open) -> None:
    store = open_store()
    h.put_n(store, 3)
    assert store.wait_for_messages("T", 0, 2, timeout_s=0)
    assert not store.wait_for_messages("T", 0, 3, timeout_s=0)


class Collector(pykka.ThreadingActor):
    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[MessageArrived] = []
        self.got = threading.Event()

    def on_receive(self, message: object) -> None:
        if isinstance(message, MessageArrived):
            self.arrived.append(message)
            self.got.set()


def test_an_actor_subscribed_to_a_queue_is_told_each_arrival(open_store: Open) -> None:
    store = open_store()
    collector = Collector.start()
    try:
        proxy = collector.proxy()
        store.actor_ref.tell(Subscribe(subscriber=collector, topic="T", queue_id=0))
        # The gateway handles messages in order: once this Get is answered, we are subscribed.
        done: pykka.ThreadingFuture = pykka.ThreadingFuture()
        store.actor_ref.tell(Get(topic="T", queue_id=0, offset=0, max_count=1, reply=Reply(future=done)))
        done.get(timeout=5)
        store.put(Message(topic="Other", body=b"-"))
        h.put_n(store, 2)
        got: threading.Event = proxy.got.get()
        assert got.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and max(a.max_offset for a in proxy.arrived.get()) < 2:
            time.sleep(0.01)
        arrived = proxy.arrived.get()
        assert {(a.topic, a.queue_id) for a in arrived} == {("T", 0)}
        assert max(a.max_offset for a in arrived) == 2
    finally:
        collector.stop()
