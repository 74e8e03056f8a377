"""The message-passing API: a pykka actor puts through `store.actor_client(self.actor_ref)`
(encoded in the actor's own thread, told straight to the store's writer) keeping a window of
puts in flight, and sends Get/Query/Subscribe to `store.actor_ref`. Every answer arrives as a
`Replied(correlation_id, answer)` message; no thread blocks. The answer is the request's result
type or the exception that answered instead (a malformed request, a store actor that stopped
first): the class patterns below match each, and narrow it for mypy (this file is checked).

Run: python examples/actor_client.py   (uses a temporary directory)
"""

import tempfile
import threading
from typing import Any

import pykka

import mqstore
from mqstore import GetResult, Message, MessageArrived, PutResult, QueryResult, Replied, Reply
from mqstore.messages import Get, Query, Subscribe

ORDERS = 1000
WINDOW = 32  # puts in flight: the writer appends every put waiting in one pass


class OrderProducer(pykka.ThreadingActor):
    def __init__(self, store: mqstore.MessageStore, done: threading.Event) -> None:
        super().__init__()
        self.store = store
        self.done = done
        self.sent = 0
        self.answered = 0
        self.stored = 0
        self.arrived = False
        self.asked = False
        self.reads_answered = 0

    def on_start(self) -> None:
        self.client = self.store.actor_client(self.actor_ref)
        # Hear about every message dispatched to the "orders" topic.
        self.store.actor_ref.tell(Subscribe(subscriber=self.actor_ref, topic="orders"))
        for _ in range(WINDOW):
            self.send_next()

    def send_next(self) -> None:
        if self.sent < ORDERS:
            message = Message(topic="orders", body=b"order %d" % self.sent, keys=["order-%d" % self.sent])
            self.client.put(message, correlation_id=("put", self.sent))  # answered as Replied
            self.sent += 1

    def on_receive(self, message: Any) -> None:
        match message:
            case Replied(correlation_id=("put", _n), answer=answer):
                self.answered += 1
                # A PutResult, or an exception in its place: neither is a bool (`if result:` raises).
                self.stored += isinstance(answer, PutResult) and answer.ok
                if self.sent < ORDERS:
                    self.send_next()  # one answer in, one more put out: the window stays full
                elif self.answered == ORDERS:
                    print("put PUT_OK" if self.stored == ORDERS else "put FAILED", self.stored, "messages, window", WINDOW)
                    # A batch: one topic and queue, consecutive offsets, one answer.
                    batch = [Message(topic="orders", body=b"bulk %d" % i) for i in range(3)]
                    self.client.put_batch(batch, correlation_id="batch")
                    # Fire and forget: no answer; a failure goes to the store's stats and log.
                    self.client.put_and_forget(Message(topic="audit", body=b"orders sent"))
            case Replied(correlation_id="batch", answer=PutResult() as result):
                print("batch", result.status.name, "messages", result.msg_num)
            case MessageArrived(topic=topic, queue_id=queue_id, max_offset=max_offset):
                if not self.arrived:  # readable now (told after every dispatch)
                    self.arrived = True
                    print("arrived", topic, queue_id, "max offset", max_offset)
                if max_offset >= ORDERS + 3 and not self.asked:  # the orders and the batch
                    self.asked = True
                    # A Reply is typed by its request's answer: Reply[GetResult] made in the call,
                    # Reply[QueryResult] declared where it is made apart.
                    self.store.actor_ref.tell(Get(topic="orders", queue_id=0, offset=0, max_count=3,
                                                  reply=Reply(actor=self.actor_ref, correlation_id="get")))  # fmt: skip
                    query_reply: Reply[QueryResult] = Reply(actor=self.actor_ref, correlation_id="query")
                    self.store.actor_ref.tell(Query(topic="orders", key="order-1", max_count=10, reply=query_reply))
            case Replied(correlation_id="get", answer=GetResult() as got):
                print("get", got.status.name, [m.body.decode() for m in got.messages])
                self.read_answered()
            case Replied(correlation_id="query", answer=QueryResult() as found):
                print("query", [m.body.decode() for m in found.messages])
                self.read_answered()
            case Replied(correlation_id=asked, answer=Exception() as error):
                print("request", asked, "answered with", repr(error))
                if asked in ("get", "query"):
                    self.read_answered()

    def read_answered(self) -> None:
        # Reads run on the gateway's reader pool: the get and the query answer in either order.
        self.reads_answered += 1
        if self.reads_answered == 2:
            self.done.set()


with tempfile.TemporaryDirectory() as path:
    with mqstore.open(path, mapped_file_size_commitlog_bytes=4 * 1024 * 1024) as store:
        done = threading.Event()
        producer = OrderProducer.start(store, done)
        finished = done.wait(timeout=30)
        producer.stop()
    print("done" if finished else "timed out")
