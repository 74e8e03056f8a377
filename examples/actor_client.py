"""The message-passing API: a pykka actor sends Put/Get/Query/Subscribe to `store.actor_ref`
and receives the answers as `Replied(correlation_id, answer)` messages; no thread blocks.

Run: python examples/actor_client.py   (uses a temporary directory)
"""

import tempfile
import threading
from typing import Any

import pykka

import mqstore
from mqstore import Message, MessageArrived, Reply
from mqstore.messages import Get, Put, Query, Replied, Subscribe


class OrderClient(pykka.ThreadingActor):
    def __init__(self, store_ref: pykka.ActorRef[Any], done: threading.Event) -> None:
        super().__init__()
        self.store = store_ref
        self.done = done

    def on_start(self) -> None:
        # Hear about every message dispatched to the "orders" topic.
        self.store.tell(Subscribe(subscriber=self.actor_ref, topic="orders"))
        # Ask for a put; the answer comes back to us tagged "put".
        reply = Reply(actor=self.actor_ref, correlation_id="put")
        self.store.tell(Put(messages=(Message(topic="orders", body=b"order 1", keys=["order-1"]),), reply=reply))

    def on_receive(self, message: Any) -> None:
        match message:
            case Replied(correlation_id="put", answer=result):
                print("put", result.status.name, "queue offset", result.queue_offset)
            case MessageArrived(topic=topic, queue_id=queue_id, max_offset=max_offset):
                # The message is readable now: read it, and look it up by key.
                print("arrived", topic, queue_id, "max offset", max_offset)
                reply = Reply(actor=self.actor_ref, correlation_id="get")
                self.store.tell(Get(topic=topic, queue_id=queue_id, offset=0, max_count=10, reply=reply))
                reply = Reply(actor=self.actor_ref, correlation_id="query")
                self.store.tell(Query(topic=topic, key="order-1", max_count=10, reply=reply))
            case Replied(correlation_id="get", answer=got):
                print("get", got.status.name, [m.body.decode() for m in got.messages])
            case Replied(correlation_id="query", answer=found):
                print("query", [m.body.decode() for m in found.messages])
                self.done.set()


with tempfile.TemporaryDirectory() as path:
    with mqstore.open(path, mapped_file_size_commitlog_bytes=1024 * 1024) as store:
        done = threading.Event()
        client = OrderClient.start(store.actor_ref, done)
        finished = done.wait(timeout=10)
        client.stop()
    print("done" if finished else "timed out")
