"""Pipelined puts are bounded by bytes as well as by count (review 71 F2): with the default
4096 puts in flight, puts of 1 MiB held 4 GiB while the writer was behind, and a 256 MiB
container's process was OOM-killed in under a second. A put of 16 KiB or more (encoded) also
takes its bytes from `max_put_bytes_in_flight`; smaller puts are held by the count alone."""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path

import mqstore
from mqstore import Message, PutMessageStatus, PutResult
from mqstore.faults import HoldAt
from mqstore.put_pipeline import LARGE_PUT_BYTES

TIMEOUT_S = 15.0
BODY = b"b" * (100 * 1024)
SETTINGS = dict(
    mapped_file_size_commitlog_bytes=8 * 1024 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 1000,
    max_hash_slot_num=64,
    max_index_num=400,
    max_put_bytes_in_flight=1024 * 1024,
)


def _held_writer(path: Path, **settings: object) -> tuple[mqstore.MessageStore, HoldAt, Future[PutResult]]:
    hold = HoldAt("writer.mid_batch_append", hold_s=TIMEOUT_S * 2)
    store = mqstore.open(path, faults=hold, **{**SETTINGS, **settings})
    assert store.put(Message(topic="t", body=b"first")).ok
    hold.armed.set()
    held = store.put_async(Message(topic="t", body=b"held"))  # small: not counted in bytes
    assert hold.entered.wait(TIMEOUT_S), "the writer was not held"
    return store, hold, held


def test_large_puts_beyond_the_byte_bound_fail_fast_and_small_ones_do_not_count(tmp_path: Path) -> None:
    store, hold, held = _held_writer(tmp_path / "s", put_fail_fast_when_in_flight_full=True)
    try:
        taken = [store.put_async(Message(topic="t", body=BODY)) for _ in range(10)]  # 10 x ~100 KiB: 1 MiB
        refused = store.put_async(Message(topic="t", body=BODY)).result(timeout=TIMEOUT_S)
        assert refused.status is PutMessageStatus.OS_PAGE_CACHE_BUSY
        assert refused.detail == "max_put_bytes_in_flight reached"
        small = [store.put_async(Message(topic="t", body=b"s" * (LARGE_PUT_BYTES // 2))) for _ in range(50)]
        assert not any(f.done() for f in small)  # handed to the held writer, not refused
        hold.release.set()
        assert all(f.result(timeout=TIMEOUT_S).ok for f in [held, *taken, *small])
        assert store._puts._bytes.settled() == 0  # every large put's bytes given back
        assert store.put_async(Message(topic="t", body=BODY)).result(timeout=TIMEOUT_S).ok
    finally:
        hold.release.set()
        store.close()


def test_a_large_put_beyond_the_byte_bound_waits_for_room_and_one_larger_than_the_bound_goes_alone(
    tmp_path: Path,
) -> None:
    store, hold, held = _held_writer(tmp_path / "s")
    try:
        taken = [store.put_async(Message(topic="t", body=BODY)) for _ in range(10)]
        waiting: list[Future[PutResult]] = []
        import threading

        putter = threading.Thread(target=lambda: waiting.append(store.put_async(Message(topic="t", body=BODY))))
        putter.start()
        putter.join(0.5)
        assert putter.is_alive() and not waiting  # blocked on the bound, as on the count
        hold.release.set()
        putter.join(TIMEOUT_S)
        assert all(f.result(timeout=TIMEOUT_S).ok for f in [held, *taken, *waiting]) and len(waiting) == 1
        huge = store.put_async(Message(topic="t", body=b"h" * (2 * 1024 * 1024)))  # past the bound: alone
        assert huge.result(timeout=TIMEOUT_S).ok
        assert store._puts._bytes.settled() == 0
    finally:
        hold.release.set()
        store.close()


def test_a_ctrl_c_while_a_large_put_is_told_leaks_no_bytes_and_giving_back_never_waits(
    tmp_path: Path, monkeypatch: object
) -> None:
    """Review 74: a KeyboardInterrupt between taking a large put's bytes and telling the writer
    left them counted for good (later large puts refused "max_put_bytes_in_flight reached"),
    and one landing inside the Condition's Python `__enter__` left its lock held: the completion
    thread, giving bytes back, then waited for good and no future completed. Bytes not handed
    to an answer go back; giving back is one deque append, whoever holds the lock."""
    import pytest

    from mqstore.store import MessageStore

    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        tell = MessageStore._tell_writer

        def interrupted(self: MessageStore, *args: object, **kwargs: object) -> None:
            raise KeyboardInterrupt

        patch = pytest.MonkeyPatch()
        patch.setattr(MessageStore, "_tell_writer", interrupted)
        try:
            with pytest.raises(KeyboardInterrupt):
                store.put_async(Message(topic="t", body=BODY))
        finally:
            patch.setattr(MessageStore, "_tell_writer", tell)
        assert store._puts._bytes.settled() == 0
        store._puts._bytes._lock.acquire()  # as a Ctrl-C inside a taker's lock would leave it
        try:
            store._puts._bytes.give(1)  # returns: no lock
            answered = store.put_async(Message(topic="t", body=b"small"))  # not a large put: no lock either
            assert answered.result(timeout=TIMEOUT_S).ok
        finally:
            store._puts._bytes._lock.release()
        assert store.put_async(Message(topic="t", body=b"h" * (2 * 1024 * 1024))).result(timeout=TIMEOUT_S).ok
        assert store._puts._bytes.settled() == 0


def test_the_gateways_puts_are_held_to_both_bounds_and_refused_beyond_them_not_queued(tmp_path: Path) -> None:
    """Review 124 F2: a Put told to `store.actor_ref` held neither an in-flight slot nor its
    bytes: a host actor telling Puts faster than the disk took them grew the writer's inbox
    without bound (1.3 GiB of 1 MiB puts; MemoryError under RLIMIT_DATA). The gateway never
    waits for room (it serves reads too): beyond either bound the Put is OS_PAGE_CACHE_BUSY."""
    import threading

    from mqstore import Reply
    from mqstore.messages import Put

    store, hold, held = _held_writer(tmp_path / "s", max_puts_in_flight=16)
    answers: list[PutResult] = []
    lock = threading.Lock()

    def answered(answer: PutResult) -> None:
        with lock:
            answers.append(answer)

    def tell(body: bytes, n: int) -> None:
        for _ in range(n):
            store.actor_ref.tell(Put(messages=(Message(topic="t", body=body),), reply=Reply(callback=answered)))

    def count(status: PutMessageStatus, detail: str) -> int:
        with lock:
            return sum(a.status is status and a.detail == detail for a in answers)

    try:
        tell(BODY, 12)  # 10 x ~100 KiB fill the 1 MiB; 2 refused
        deadline = time.monotonic() + TIMEOUT_S
        while count(PutMessageStatus.OS_PAGE_CACHE_BUSY, "max_put_bytes_in_flight reached") < 2:
            assert time.monotonic() < deadline, answers
            time.sleep(0.01)
        tell(b"small", 20)  # 10 slots of 16 left after the held put, the 10 large: 15 refused
        while count(PutMessageStatus.OS_PAGE_CACHE_BUSY, "max_puts_in_flight reached") < 15:
            assert time.monotonic() < deadline, answers
            time.sleep(0.01)
        assert len(answers) == 17  # the rest wait in the writer's inbox, holding their slots
        hold.release.set()
        assert held.result(timeout=TIMEOUT_S).ok
        while len(answers) < 32:
            assert time.monotonic() < deadline, answers
            time.sleep(0.01)
        assert sum(a.ok for a in answers) == 15
        assert store._puts._bytes.settled() == 0 and store._puts._slots.free == 16  # every hold given back
    finally:
        hold.release.set()
        store.close()
