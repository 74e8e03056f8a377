"""A running store whose file another process cuts short, in its own process: without the
SIGBUS guard that kills this process, not the test runner (tests/crash/test_cut_under_map.py).

    python cut_under_map_child.py WHAT STORE_DIR   (commitlog, next_segment, queue, index, checkpoint)
    python cut_under_map_child.py reopen STORE_DIR
    python cut_under_map_child.py foreign_fault SCRATCH_DIR

The first form puts keyed messages, cuts the named file (the commitlog segment being written,
inside its records; the next one, made ready and not named yet), then reads, queries and puts on, and prints one JSON line: what was
acknowledged (the key and its queue offset) before and after the cut, and what the store said.
`reopen` opens the store again and prints what it serves. `foreign_fault` opens a store (the
guard is in place), then touches a page cut from a file the store does not own: that must
still die of SIGBUS.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time
from typing import Any

import mqstore
from mqstore.storage import mapguard

SETTINGS: dict[str, Any] = dict(
    mapped_file_size_commitlog_bytes=256 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 1000,
    max_hash_slot_num=1000,
    max_index_num=4000,
)
BODY = b"m" * 1000
CUT_AT = 64 * 1024


def _put(store: mqstore.MessageStore, key: str) -> tuple[str, str, list[int]]:
    """(status, detail, [queue offset, where the record ends in the log])"""
    result = store.put(mqstore.Message(topic="t", body=BODY, keys=[key]))
    return result.status.name, result.detail, [result.queue_offset, result.commitlog_offset + result.wrote_bytes]


def cut(what: str, store_dir: str) -> None:
    store = mqstore.open(store_dir, **SETTINGS)
    before: dict[str, list[int]] = {}
    for i in range(400):  # ~440 KiB: two segments
        status, detail, queue_offset = _put(store, f"b{i}")
        assert status == "PUT_OK", (status, detail)
        before[f"b{i}"] = queue_offset
    store.flush()
    segment = SETTINGS["mapped_file_size_commitlog_bytes"]
    if what == "commitlog":  # the segment the writer appends to, inside its records
        end = store.stats()["commitlog_max_offset"]
        path = os.path.join(store_dir, "commitlog", f"{end - end % segment:020d}")
        assert end % segment > CUT_AT, end
        os.truncate(path, CUT_AT)
    elif what == "next_segment":  # the one the allocator made ready: puts roll into its rest
        end = store.stats()["commitlog_max_offset"]
        path = os.path.join(store_dir, "commitlog", f"{end - end % segment + segment:020d}")
        # It has no name yet: another process of the same user (or root) reaches it through
        # the store process's descriptors (review 81 L2), as this does.
        for made_ahead in _unnamed_in(os.path.join(store_dir, "commitlog")):
            os.truncate(made_ahead, CUT_AT)
    elif what == "queue":
        directory = os.path.join(store_dir, "consumequeue", "t", "0")
        path = os.path.join(directory, sorted(os.listdir(directory))[-1])
        os.truncate(path, 0)
    elif what == "index":
        directory = os.path.join(store_dir, "index")
        path = os.path.join(directory, sorted(os.listdir(directory))[-1])
        os.truncate(path, 4096)
    else:
        path = os.path.join(store_dir, "checkpoint")
        os.truncate(path, 0)
    got = store.get("t", 0, 0, 32)
    store.query("t", "b1")
    after: dict[str, list[int]] = {}
    refused: list[tuple[str, str]] = []
    for i in range(200):
        status, detail, queue_offset = _put(store, f"a{i}")
        if status == "PUT_OK":
            after[f"a{i}"] = queue_offset
        else:
            refused.append((status, detail))
    store.flush() if not refused else None
    cut_files = store.stats()["files_cut_under_map"]
    clean = store.close()
    print(json.dumps({"cut": path, "cut_at": CUT_AT, "before": before, "after": after, "refused": refused[:3], "refused_count": len(refused),
                      "get_status": got.status.name, "files_cut_under_map": cut_files, "clean_close": clean,
                      "guard_faults": mapguard.total_faults()}))  # fmt: skip


def _unnamed_in(directory: str) -> list[str]:
    """/proc/self/fd paths of the files this process holds that were made unnamed in
    `directory` and are still unnamed (the allocator's segments made ahead), once there is one."""
    deadline = time.monotonic() + 10
    while True:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            link = f"/proc/self/fd/{fd}"
            try:
                if os.readlink(link).startswith(f"{os.path.abspath(directory)}/#") and os.stat(link).st_nlink == 0:
                    found.append(link)
            except OSError:
                continue  # closed meanwhile
        if found or time.monotonic() > deadline:
            assert found, "no segment made ahead"
            return found
        time.sleep(0.01)


def reopen(store_dir: str) -> None:
    store = mqstore.open(store_dir, **SETTINGS)
    served: dict[str, int] = {}
    offset = 0
    while True:
        result = store.get("t", 0, offset, 32)
        if not result.messages:
            break
        for message in result.messages:
            served[message.keys] = message.queue_offset
        offset = result.next_begin_offset
    keyed = {key: len(store.query("t", key).messages) for key in ("b1", "b399", "a0", "a199")}
    put = store.put(mqstore.Message(topic="t", body=BODY, keys=["z"]))
    store.close()
    print(json.dumps({"served": served, "queried": keyed, "put": put.status.name, "put_detail": put.detail}))


def foreign_fault(scratch: str) -> None:
    store = mqstore.open(os.path.join(scratch, "store"), **SETTINGS)
    assert _put(store, "x")[0] == "PUT_OK" and mapguard.installed()
    path = os.path.join(scratch, "not-the-store's")
    with open(path, "wb") as f:
        f.write(b"\1" * 8192)
    with open(path, "r+b") as f:
        page = mmap.mmap(f.fileno(), 8192)
    os.truncate(path, 0)
    print("touching", flush=True)
    page[4096]  # SIGBUS: not a page of the store's
    print("survived a fault that was not the store's", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    action, directory = sys.argv[1], sys.argv[2]
    if action == "reopen":
        reopen(directory)
    elif action == "foreign_fault":
        foreign_fault(directory)
    else:
        cut(action, directory)
