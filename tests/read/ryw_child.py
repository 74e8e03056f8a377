"""The 100k read-your-writes pairs of tests/read/test_read_contract.py, in their own process.

    python ryw_child.py STORE_DIR PAIRS THREADS BUDGET_S [DONE_FILE]

Puts from THREADS threads, each put followed by max_offset of its queue, PAIRS in all; prints
one JSON line: pairs done, misses (the first few) and seconds. The pairs wait on dispatch, not
on the CPU, so tests/conftest.py starts this when the suite's collection ends and the test
reads its answer: it runs beside the rest of the suite instead of adding ~45 s to it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

import mqstore
from mqstore import Message


def main(store_dir: str, pairs: int, threads_n: int, budget_s: float) -> None:
    store = mqstore.open(store_dir, allocate_wait_timeout_ms=200, mapped_file_size_commitlog_bytes=1 << 20)
    misses: list[tuple[int, int, int]] = []
    failed: list[str] = []
    done = [0] * threads_n

    def producer(t: int) -> None:
        message = Message(topic="RYW", queue_id=t, body=b"r" * 16)
        for _ in range(pairs // threads_n):
            result = store.put(message)
            if not result.ok:
                failed.append(repr(result))
                return
            seen = store.max_offset("RYW", t)
            if seen <= result.queue_offset:
                misses.append((t, result.queue_offset, seen))
            done[t] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=producer, args=(t,), daemon=True) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(budget_s - (time.monotonic() - started), 0))
    elapsed = time.monotonic() - started
    alive = any(thread.is_alive() for thread in threads)
    clean = False if alive else store.close()
    print(json.dumps({"done": sum(done), "misses": len(misses), "first_misses": misses[:3], "failed": failed[:3],
                      "seconds": round(elapsed, 1), "timed_out": alive, "clean_close": clean}), flush=True)


if __name__ == "__main__":
    # DONE_FILE (optional): where the exit status goes once the output is written, for a
    # reader that is not this process's parent (an xdist worker: tests/conftest.py).
    done_file = sys.argv[5] if len(sys.argv) > 5 else None
    status = 1
    try:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if done_file is not None:
            with open(done_file + ".part", "w") as f:
                f.write(str(status))
            os.replace(done_file + ".part", done_file)
    sys.exit(status)
