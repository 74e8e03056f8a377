"""The message-passing API: a user's pykka actor talks to `store.actor_ref` with Put/Get/
Query/Subscribe and gets `Replied(correlation_id, answer)` back (or a future completed)."""

from __future__ import annotations

import queue
import sys
from pathlib import Path
from typing import Any

import pykka
import pytest

from mqstore import GetResult, Message, MessageArrived, PutResult, QueryResult, Reply
from mqstore.messages import Get, Put, Query, Replied, Subscribe, Unsubscribe
from mqstore.storage.status import GetMessageStatus, PutMessageStatus

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py
TIMEOUT_S = 10


class Client(pykka.ThreadingActor):
    """Forwards requests built by `make(reply)` to the store, replying to itself; hands every
    Replied and MessageArrived it receives to the test through a queue."""

    def __init__(self, store_ref: pykka.ActorRef[Any], inbox: queue.Queue[Any]) -> None:
        super().__init__()
        self.store_ref = store_ref
        self.inbox = inbox

    def on_receive(self, message: Any) -> Any:
        match message:
            case ("send", correlation_id, make):
                self.store_ref.tell(make(Reply(actor=self.actor_ref, correlation_id=correlation_id)))
            case ("subscribe", topic):
                self.store_ref.tell(Subscribe(subscriber=self.actor_ref, topic=topic))
            case ("unsubscribe",):
                self.store_ref.tell(Unsubscribe(subscriber=self.actor_ref))
            case Replied() | MessageArrived():
                self.inbox.put(message)
        return None


def test_an_actor_puts_gets_and_queries_through_replies(store_dir: Path) -> None:
    inbox: queue.Queue[Any] = queue.Queue()
    with h.open_small(store_dir) as store:
        client = Client.start(store.actor_ref, inbox)
        try:
            one = Message(topic="orders", body=b"one", keys=["o-1"])
            client.tell(("send", "put-1", lambda r: Put(messages=(one,), reply=r)))
            replied = inbox.get(timeout=TIMEOUT_S)
            assert isinstance(replied, Replied) and replied.correlation_id == "put-1"
            assert isinstance(replied.answer, PutResult) and replied.answer.ok and replied.answer.queue_offset == 0

            batch = tuple(Message(topic="orders", body=b"b%d" % i, keys=[f"b-{i}"]) for i in range(3))
            client.tell(("send", 2, lambda r: Put(messages=batch, reply=r, batch=True)))
            replied = inbox.get(timeout=TIMEOUT_S)
            assert replied.correlation_id == 2 and replied.answer.ok and replied.answer.msg_num == 3

            bad = Message(topic="bad topic!", body=b"x")
            client.tell(("send", "bad", lambda r: Put(messages=(bad,), reply=r)))
            replied = inbox.get(timeout=TIMEOUT_S)
            assert replied.correlation_id == "bad" and replied.answer.status is PutMessageStatus.MESSAGE_ILLEGAL

            h.wait_dispatched(store)
            client.tell(("send", "get", lambda r: Get(topic="orders", queue_id=0, offset=0, max_count=10, reply=r)))
            replied = inbox.get(timeout=TIMEOUT_S)
            assert replied.correlation_id == "get" and isinstance(replied.answer, GetResult)
            assert replied.answer.status is GetMessageStatus.FOUND
            assert [m.body for m in replied.answer.messages] == [b"one", b"b0", b"b1", b"b2"]

            client.tell(("send", "query", lambda r: Query(topic="orders", key="b-1", max_count=4, reply=r)))
            replied = inbox.get(timeout=TIMEOUT_S)
            assert replied.correlation_id == "query" and isinstance(replied.answer, QueryResult)
            assert [m.body for m in replied.answer.messages] == [b"b1"]
        finally:
            client.stop()


def test_a_reply_future_is_completed(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        store.actor_ref.tell(Put(messages=(Message(topic="t", body=b"f"),), reply=Reply(future=future)))
        result = future.get(timeout=TIMEOUT_S)
        assert isinstance(result, PutResult) and result.ok
        h.wait_dispatched(store)
        future = pykka.ThreadingFuture()
        store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=Reply(future=future)))
        assert [m.body for m in future.get(timeout=TIMEOUT_S).messages] == [b"f"]


def test_subscribe_delivers_message_arrived_to_an_actor_until_unsubscribed(store_dir: Path) -> None:
    inbox: queue.Queue[Any] = queue.Queue()
    with h.open_small(store_dir) as store:
        client = Client.start(store.actor_ref, inbox)
        try:
            client.ask(("subscribe", "news"))  # the ask returns once the client told the store
            h.wait_until(lambda: client in store._subscriptions.subscribers(), what="the subscription")
            assert store.put(Message(topic="other", body=b"ignored")).ok
            assert store.put(Message(topic="news", body=b"n0")).ok
            arrived = inbox.get(timeout=TIMEOUT_S)
            assert isinstance(arrived, MessageArrived)
            assert (arrived.topic, arrived.queue_id, arrived.max_offset) == ("news", 0, 1)
            assert store.put_batch([Message(topic="news", body=b"n%d" % i) for i in (1, 2)]).ok
            offsets = [inbox.get(timeout=TIMEOUT_S).max_offset]
            while offsets[-1] < 3:
                offsets.append(inbox.get(timeout=TIMEOUT_S).max_offset)
            assert offsets == sorted(offsets) and offsets[-1] == 3
            client.ask(("unsubscribe",))
            h.wait_until(lambda: not store._subscriptions.subscribers(), what="the unsubscription")
            assert store.put(Message(topic="news", body=b"late")).ok
            h.wait_dispatched(store)
            assert inbox.empty()
        finally:
            client.stop()


def test_a_put_result_has_no_truth_value_from_any_way_of_putting(store_dir: Path) -> None:
    """Review 73 M5: as a tuple a PutResult was always true, so `if store.put(m):` counted a
    MESSAGE_ILLEGAL put as stored. Every way of putting answers a PutResult that refuses `bool`,
    refused or stored alike; `.ok` and `.stored` say which."""
    bad = Message(topic="bad topic!", body=b"x")
    good = Message(topic="t", body=b"x")
    with h.open_small(store_dir) as store:
        future: pykka.ThreadingFuture[PutResult] = pykka.ThreadingFuture()
        store.actor_ref.tell(Put(messages=(bad,), reply=Reply(future=future)))
        answers = [store.put(bad), store.put(good), store.put_batch([good, good]), store.put_async(bad).result(TIMEOUT_S),
                   store.put_async(good).result(TIMEOUT_S), future.get(timeout=TIMEOUT_S)]  # fmt: skip
        assert [a.ok for a in answers] == [False, True, True, False, True, False]
        assert [a.stored for a in answers] == [a.ok for a in answers]
        for answer in answers:
            with pytest.raises(TypeError, match=r"no truth value \((PUT_OK|MESSAGE_ILLEGAL)\): test \.ok"):
                bool(answer)
            with pytest.raises(TypeError):
                assert answer  # the mistake as written


def test_an_actor_client_made_before_close_refuses_puts_as_statuses_after_it(store_dir: Path) -> None:
    """The closed-store rule's exception for an ActorClient (README, review 73 M3): a put after
    the close returns False and its actor is told SERVICE_NOT_AVAILABLE; nothing raises in the
    sending actor, whose thread may be the one the close waits for."""
    inbox: queue.Queue[Any] = queue.Queue()
    store = h.open_small(store_dir)
    client_actor = Client.start(store.actor_ref, inbox)
    try:
        put_client = store.actor_client(client_actor)
        assert put_client.put(Message(topic="t", body=b"before"), correlation_id="before")
        replied = inbox.get(timeout=TIMEOUT_S)
        assert replied.correlation_id == "before" and replied.answer.ok
        store.close()
        assert put_client.put(Message(topic="t", body=b"after"), correlation_id="after") is False
        replied = inbox.get(timeout=TIMEOUT_S)
        assert replied.correlation_id == "after" and replied.answer.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    finally:
        store.close()
        client_actor.stop()
