"""Not an example to run: strict mypy (.ci/run) checks that the public API's types catch a
user's mistakes. Each `type: ignore[code]` marks a mistake mypy must report; strict mode's
warn_unused_ignores fails the run once it stops reporting one (review 73 H1: `get` was typed
`(*Any, **Any)` behind its stats decorator, and its misuse passed; M2: `open`'s settings were
`**Any`; M1: the actor protocol was untyped, `store.actor_ref` a `pykka.ActorRef[Any]`; M4: `stats()` was
`dict[str, Any]`, and its lags are None while the store is not running)."""

from __future__ import annotations

from typing import Any

import pykka

import mqstore
from mqstore.messages import Get, Put, Query


def _mistakes(store: mqstore.MessageStore) -> None:
    store.get("t", "0", 0)  # type: ignore[arg-type]
    store.get("t", 0, 0, tagz="A")  # type: ignore[call-arg]
    store.put(mqstore.Message(topic="t", body="text"))  # type: ignore[arg-type]
    store.put_batch(mqstore.Message(topic="t", body=b"x"))  # type: ignore[arg-type]
    store.query("t", 1)  # type: ignore[arg-type]
    mqstore.open("s", flush_disk_typ="SYNC_FLUSH")  # type: ignore[call-arg]
    mqstore.open("s", flush_disk_type="SYNC")  # type: ignore[arg-type]
    mqstore.open("s", max_puts_in_flight="10")  # type: ignore[arg-type]


def _stats_mistakes(store: mqstore.MessageStore) -> bool:
    stats = store.stats()
    print(stats["dispatch_behnd_bytes"])  # type: ignore[typeddict-item]
    return stats["dispatch_behind_bytes"] > 0  # type: ignore[operator]


def _protocol_mistakes(store: mqstore.MessageStore, me: pykka.ActorRef[Any]) -> None:
    store.actor_ref.tell("hello")  # type: ignore[arg-type]
    store.actor_ref.tell(mqstore.Message(topic="t", body=b"x"))  # type: ignore[arg-type]
    for_puts: pykka.ThreadingFuture[mqstore.PutResult] = pykka.ThreadingFuture()
    store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=mqstore.Reply(future=for_puts)))  # type: ignore[arg-type]
    store.actor_ref.tell(Query(topic="t", key="k", max_count=1, reply=mqstore.Reply(callback=_on_put)))  # type: ignore[arg-type]


def _on_put(answer: mqstore.PutResult | Exception) -> None:
    print(answer)


def _on_reply(message: object) -> int:
    match message:
        case mqstore.Replied(answer=mqstore.GetResult() as got):
            return len(got.mesages)  # type: ignore[attr-defined]
        case mqstore.Replied(answer=mqstore.PutResult() as put):
            return put.queue_offset
        case mqstore.Replied(answer=Exception() as error):
            raise error
    return 0


def _told(store: mqstore.MessageStore, me: pykka.ActorRef[Any]) -> None:
    messages = (mqstore.Message(topic="t", body=b"x"),)
    store.actor_ref.tell(Put(messages=messages, reply=mqstore.Reply(actor=me, correlation_id=1)))
    store.actor_ref.tell(Put(messages=messages, reply=mqstore.Reply(callback=_on_put)))
    # What the runtime takes, mypy takes too (review 73 L4): a list of messages, a bytearray or
    # memoryview body, a callback returning a value, any correlation id.
    answers: list[object] = []
    listed = [mqstore.Message(topic="t", body=bytearray(b"x")), mqstore.Message(topic="t", body=memoryview(b"y"))]
    store.actor_ref.tell(Put(messages=listed, reply=mqstore.Reply(callback=answers.append)))
    store.actor_client(me).put(listed[0], correlation_id=["a", "list"])
    for_gets: pykka.ThreadingFuture[mqstore.GetResult] = pykka.ThreadingFuture()
    store.actor_ref.tell(Get(topic="t", queue_id=0, offset=0, max_count=1, reply=mqstore.Reply(future=for_gets)))


def _opened() -> mqstore.MessageStore:
    return mqstore.open("s", flush_disk_type="SYNC_FLUSH", max_puts_in_flight=1024, store_path_commitlog=None)


def _right(store: mqstore.MessageStore) -> int:
    got: mqstore.GetResult = store.get("t", 0, 0, 32, tags="A")
    put: mqstore.PutResult = store.put_async(mqstore.Message(topic="t", body=b"x")).result()
    return len(got.messages) + put.queue_offset
