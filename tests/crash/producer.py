"""Child process for the crash tests: put messages from several threads and print each
acknowledgement, one flushed line per PUT_OK, until killed.

    python producer.py STORE_DIR SEED THREADS

Lines: `OK <key> <topic> <queue_id> <queue_offset>` per acknowledged message (a batch prints one
line per message, after the whole batch was acknowledged), and `READY` once the store is open.
Keys are unique: `<seed>-<thread>-<n>[-<i>]`. Batches carry a shared `B<seed>-<thread>-<n>` tag
in their properties so the test can check all-or-nothing.
"""

from __future__ import annotations

import random
import sys
import threading

import mqstore

TOPIC = "crash"
QUEUES = 4


def main() -> None:
    store_dir, seed, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = mqstore.open(
        store_dir,
        flush_disk_type="SYNC_FLUSH",
        mapped_file_size_commitlog_bytes=64 * 1024,
        mapped_file_size_consume_queue_bytes=20 * 200,
        max_hash_slot_num=1000,  # 84 KB index files, not 420 MB: tests hash and copy these stores
        max_index_num=4000,
    )
    out_lock = threading.Lock()

    def emit(lines: list[str]) -> None:
        with out_lock:
            sys.stdout.write("".join(lines))
            sys.stdout.flush()

    def producer(t: int) -> None:
        rng = random.Random(seed * 1000 + t)
        n = 0
        while True:
            n += 1
            queue_id = rng.randrange(QUEUES)
            body_size = rng.choice((10, 200, 1500))
            if rng.random() < 0.3:
                count = rng.randint(2, 6)
                batch_id = f"B{seed}-{t}-{n}"
                msgs = [
                    mqstore.Message(topic=TOPIC, queue_id=queue_id, keys=[f"{seed}-{t}-{n}-{i}"],
                                    body=bytes([i % 256]) * body_size, properties={"batch": f"{batch_id}/{count}"})
                    for i in range(count)
                ]  # fmt: skip
                result = store.put_batch(msgs)
                if result.status is mqstore.PutMessageStatus.PUT_OK:
                    emit([f"OK {m.keys[0]} {TOPIC} {queue_id} {result.queue_offset + i}\n" for i, m in enumerate(msgs)])
            else:
                key = f"{seed}-{t}-{n}"
                result = store.put(mqstore.Message(topic=TOPIC, queue_id=queue_id, keys=[key], tags="T",
                                                   body=key.encode() * (body_size // len(key) + 1)))  # fmt: skip
                if result.status is mqstore.PutMessageStatus.PUT_OK:
                    emit([f"OK {key} {TOPIC} {queue_id} {result.queue_offset}\n"])

    for t in range(threads):
        threading.Thread(target=producer, args=(t,), daemon=True).start()
    emit(["READY\n"])
    threading.Event().wait()


if __name__ == "__main__":
    main()
