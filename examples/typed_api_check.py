"""Not an example to run: strict mypy (.ci/run) checks that the public API's types catch a
user's mistakes. Each `type: ignore[code]` marks a mistake mypy must report; strict mode's
warn_unused_ignores fails the run once it stops reporting one (review 73 H1: `get` was typed
`(*Any, **Any)` behind its stats decorator, and its misuse passed; M2: `open`'s settings were
`**Any`)."""

from __future__ import annotations

import mqstore


def _mistakes(store: mqstore.MessageStore) -> None:
    store.get("t", "0", 0)  # type: ignore[arg-type]
    store.get("t", 0, 0, tagz="A")  # type: ignore[call-arg]
    store.put(mqstore.Message(topic="t", body="text"))  # type: ignore[arg-type]
    store.put_batch(mqstore.Message(topic="t", body=b"x"))  # type: ignore[arg-type]
    store.query("t", 1)  # type: ignore[arg-type]
    mqstore.open("s", flush_disk_typ="SYNC_FLUSH")  # type: ignore[call-arg]
    mqstore.open("s", flush_disk_type="SYNC")  # type: ignore[arg-type]
    mqstore.open("s", max_puts_in_flight="10")  # type: ignore[arg-type]


def _opened() -> mqstore.MessageStore:
    return mqstore.open("s", flush_disk_type="SYNC_FLUSH", max_puts_in_flight=1024, store_path_commitlog=None)


def _right(store: mqstore.MessageStore) -> int:
    got: mqstore.GetResult = store.get("t", 0, 0, 32, tags="A")
    put: mqstore.PutResult = store.put_async(mqstore.Message(topic="t", body=b"x")).result()
    return len(got.messages) + put.queue_offset
