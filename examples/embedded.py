"""The embedded API: open a store, put, put a batch, read a queue, query by key, close.

Run: python examples/embedded.py   (uses a temporary directory; nothing is left behind)
"""

import tempfile

import mqstore
from mqstore import Message

with tempfile.TemporaryDirectory() as path:
    # Small segments keep the example light; every setting has a RocketMQ name.
    with mqstore.open(path, mapped_file_size_commitlog_bytes=1024 * 1024) as store:
        # One message: the result carries its offsets and its RocketMQ message id.
        result = store.put(Message(topic="orders", body=b"order 1", tags="new", keys=["order-1"]))
        print("put", result.status.name, "queue offset", result.queue_offset, "msg id", result.msg_id)

        # A batch lands contiguously, with consecutive queue offsets, as one result.
        batch = [Message(topic="orders", body=b"order %d" % i, keys=[f"order-{i}"]) for i in (2, 3)]
        result = store.put_batch(batch)
        print("batch", result.status.name, "messages", result.msg_num)

        # Long polling: block until queue 0 has a message at offset 2 (dispatch is asynchronous).
        store.wait_for_messages("orders", 0, 2, timeout_s=5)

        # Read the queue from offset 0, as a consumer would.
        got = store.get("orders", 0, 0, max_count=32)
        print("get", got.status.name, [m.body.decode() for m in got.messages])

        # Find a message by one of its keys, and by its message id.
        found = store.query("orders", "order-2")
        print("query", [m.body.decode() for m in found.messages])
        record = store.lookup_msg_id(result.msg_ids[0])
        print("lookup", record.body.decode() if record else None)
    # Leaving the block closed the store: everything flushed, the abort file removed.
    print("closed")
