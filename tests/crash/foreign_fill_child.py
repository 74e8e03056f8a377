"""A store whose filesystem is filled to its last block by *another* writer while it runs
(test_small_filesystem.py): the store must refuse puts as a full disk, never die with SIGBUS,
take puts again once the other file is gone, and lose nothing it acknowledged.

    python foreign_fill_child.py MOUNT_POINT [PUTS_BEFORE_FILL [reopen]]

With `reopen`, the store is closed and opened again before the disk is filled: recovery reads
the last segment's tail, and the appends after it go into pages that were read first.

Prints "acked N lost M" and exits 0 when every check holds, 1 with a message when not.
"""

from __future__ import annotations

import os
import sys

import mqstore

# The same store as small_fs_child's: a segment larger than the filesystem, the cleaner off.
from small_fs_child import BODY, SETTINGS  # this directory is sys.path[0] for a script


def fill_to_the_last_byte(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    for chunk in (65536, 4096, 512, 1):
        try:
            while True:
                os.write(fd, b"z" * chunk)
        except OSError:
            pass
    os.fsync(fd)
    os.close(fd)


def main(mount_point: str, puts_before_fill: int, reopen: bool) -> None:
    store = mqstore.open(os.path.join(mount_point, "store"), **SETTINGS)
    acked: list[str] = []

    def put(key: str) -> bool:
        result = store.put(mqstore.Message(topic="T", body=BODY, keys=[key]))
        if result.ok:
            acked.append(key)
        elif result.status is not mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE:
            print(f"FAIL: {key} answered {result}", flush=True)
            sys.exit(1)
        return result.ok

    for i in range(puts_before_fill):
        put(f"a{i}")
    if reopen:
        if not store.close():
            print("FAIL: close before the reopen", flush=True)
            sys.exit(1)
        store = mqstore.open(os.path.join(mount_point, "store"), **SETTINGS)
        put("reopened")
    filler = os.path.join(mount_point, "filler")
    fill_to_the_last_byte(filler)
    refused = 0
    for i in range(20_000):
        if not put(f"b{i}"):
            refused += 1
            if refused > 50:
                break
    if refused == 0:
        print("FAIL: the full disk never refused a put", flush=True)
        sys.exit(1)
    os.remove(filler)
    if sum(put(f"c{i}") for i in range(100)) == 0:
        print("FAIL: puts still refused after space was freed", flush=True)
        sys.exit(1)
    got: list[str] = []
    for queue_id in range(4):
        offset = 0
        while True:
            batch = store.get("T", queue_id, offset, 32)
            if not batch.messages:
                break
            got += [m.key_list[0] for m in batch.messages]
            offset = batch.next_begin_offset
    closed = store.close()
    lost = len(set(acked) - set(got))
    print(f"acked {len(acked)} lost {lost} closed {closed}", flush=True)
    sys.exit(0 if lost == 0 and closed else 1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300, sys.argv[3:4] == ["reopen"])
