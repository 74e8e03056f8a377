"""A store on a small real filesystem, one phase per run, in its own process: a SIGBUS kills
this process, not the test runner (tests/crash/test_small_filesystem.py).

    python small_fs_child.py PHASE STORE_DIR ACKED_FILE FILLER_PATH

Every acknowledged key is appended to ACKED_FILE (outside the small filesystem) before the
next put, so the parent knows what was acknowledged even if this process dies.
Phases: fill (put until the disk is full), reopen_full (open the full store, read
everything), free (delete the filler, puts must succeed again), verify (every acked key
readable, in order). Exit 0 when the phase's checks hold, 1 with a message when not.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

import mqstore
from mqstore.storage import mapguard

SETTINGS: dict[str, Any] = dict(
    # A segment larger than the whole filesystem: the 32 MiB reservation window can never
    # be had, it must shrink to what fits.
    mapped_file_size_commitlog_bytes=64 * 1024 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 2000,
    max_hash_slot_num=1000,
    max_index_num=4000,
    # The physical limit is what is tested, not the cleaner's ratios (nor its deletions).
    disk_space_warning_level_ratio=1.0,
    disk_space_clean_forcibly_ratio=1.0,
    clean_file_forcibly_enable=False,
)
BODY = b"m" * 1000
CLOSE_BOUND_S = 15.0


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def put_until_refused(store: mqstore.MessageStore, acked: TextIO, prefix: str, limit: int) -> tuple[int, Any]:
    """(puts acknowledged, the first refusal or None)."""
    for i in range(limit):
        key = f"{prefix}{i}"
        result = store.put(mqstore.Message(topic="T", body=BODY, keys=[key]))
        if not result.ok:
            return i, result
        acked.write(key + "\n")
        acked.flush()
    return limit, None


def all_keys(store: mqstore.MessageStore) -> list[str]:
    keys: list[str] = []
    offset = 0
    while True:
        got = store.get("T", 0, offset, 1000)
        if not got.messages:
            return keys
        keys += [m.key_list[0] for m in got.messages]
        offset = got.next_begin_offset


def check_refused(result: Any) -> None:
    if result is None:
        fail("the disk never filled")
    if result.status is not mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE or "disk full" not in result.detail:
        fail(f"a full disk refused with {result}")


def close_bounded(store: mqstore.MessageStore) -> None:
    started = time.monotonic()
    store.close()
    if time.monotonic() - started > CLOSE_BOUND_S:
        fail(f"close() took {time.monotonic() - started:.1f} s")


def main(phase: str, store_dir: str, acked_path: str, filler: str) -> None:
    if phase == "fill":
        with open(filler, "wb") as f:  # the space freed later
            f.write(b"\x01" * (3 * 1024 * 1024))
    with open(acked_path) as f:
        acked = f.read().split()
    with open(acked_path, "a") as out:
        store = mqstore.open(store_dir, **SETTINGS)
        if phase == "fill":
            count, refused = put_until_refused(store, out, "a", 100_000)
            check_refused(refused)
            for _ in range(3):  # still refused, and still up
                _, again = put_until_refused(store, out, "x", 1)
                check_refused(again)
            if store.supervisor.state.name != "RUNNING":
                fail(f"supervisor {store.supervisor.state.name} after the disk filled")
            print(f"acked {count} before the disk filled", flush=True)
        elif phase == "reopen_full":
            if all_keys(store) != acked:
                fail("an acknowledged message is not readable after reopening the full store")
            hits = store.query("T", acked[-1]).messages
            if [m.key_list for m in hits] != [[acked[-1]]]:
                fail(f"query of {acked[-1]} found {hits}")
        elif phase == "free":
            os.remove(filler)
            count, _ = put_until_refused(store, out, "b", 200)
            if count == 0:
                fail("puts still refused after space was freed")
            print(f"acked {count} after space was freed", flush=True)
        elif phase == "verify":
            keys = all_keys(store)
            if keys != acked:
                lost = sorted(set(acked) - set(keys))
                fail(f"{len(lost)} acknowledged lost, e.g. {lost[:5]}; read {len(keys)} of {len(acked)}")
        else:
            fail(f"unknown phase {phase}")
        close_bounded(store)
    # The SIGBUS guard keeps a write into a page with no room behind it from killing us: it
    # would be caught there, but it is the reservations' failure all the same.
    if mapguard.total_faults():
        fail(f"{mapguard.total_faults()} page faults the SIGBUS guard caught (a write with no room behind it)")
    sys.exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:5])
