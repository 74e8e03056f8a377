"""The single put's one-call path (issue 16): `_native.PutSubmitter` encodes a plain message,
takes its in-flight slot and tells the writer in one C call. Everything it declines goes the
Python way, so these check that both ways write the same bytes and answer the same, that each
fallback and refusal still happens, and that the in-flight bound and a writer that is down
behave as before."""

from __future__ import annotations

import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from mqstore import Message, PutMessageStatus, PutResult
from mqstore.errors import StoreClosedError
from mqstore.messages import EncodedPut
from mqstore.runtime import INBOX_ENVELOPE
from mqstore.storage import speedups
from mqstore.storage.put_encoding import PutEncoder
from mqstore.storage import codec

helpers = sys.modules["mqstore_actor_test_helpers"]

pytestmark = pytest.mark.skipif(speedups.native is None, reason="the one-call path is the C extension's")

TIMEOUT_S = 15.0
NOW_MS = 1_700_000_000_123


class _Recording:
    """The store's PutSubmitter, with what each submit answered (True, False or None)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.answers: list[bool | None] = []

    def submit(self, message: Any, reply: Any, append: Any, signal: Any) -> bool | None:
        answer: bool | None = self.real.submit(message, reply, append, signal)
        self.answers.append(answer)
        return answer


def _recording(store: Any) -> _Recording:
    spy = _Recording(store._puts._submitter)
    store._puts._submitter = spy
    return spy


def _fixed_clock() -> int:
    return NOW_MS


# Plain messages (the C path) and every kind the C encoder declines (the Python path).
PLAIN = [
    Message(topic="orders", body=b"plain"),
    Message(topic="orders", body=b"k" * 1024, queue_id=3, keys=["a", "b"], tags="t"),
    Message(topic="orders", body=b"", keys="one", flag=7, born_timestamp_ms=5),
]
DECLINED = [
    Message(topic="orders", body=b"props", properties={"color": "red"}),
    Message(topic="orders", body=b"born", born_host="10.0.0.1:9"),
    Message(topic="orders", body=b"nowait", wait_store_msg_ok=False),
    Message(topic="orders", body=bytearray(b"bytearray")),
]


def _put_all(store: Any, messages: list[Message]) -> list[PutResult]:
    futures = [store.put_async(m) for m in messages]
    return [f.result(TIMEOUT_S) for f in futures]


def _log_bytes(store: Any) -> bytes:
    helpers.wait_dispatched(store)
    data = store.get_commitlog_data(0)
    assert data is not None
    return bytes(data[1])


def test_the_one_call_path_writes_the_bytes_and_answers_of_the_python_path(tmp_path: Path) -> None:
    answers: dict[bool, tuple[list[PutResult], bytes]] = {}
    for one_call in (True, False):
        with helpers.open_small(tmp_path / f"s{one_call}", clock_ms=_fixed_clock) as store:
            if not one_call:
                store._puts._submitter = None  # the Python path only
            spy = _recording(store) if one_call else None
            # The first put of a topic validates it in Python; the rest of PLAIN go in one call.
            # One at a time: a pass appends the puts waiting for it queue by queue, so how they met
            # in the inbox (the machine's load) would order the log (a CI dry run: offset 849 for
            # the second put on one path, 102 on the other).
            results = [store.put_async(m).result(TIMEOUT_S) for m in PLAIN + DECLINED + PLAIN]
            answers[one_call] = (results, _log_bytes(store))
            stats = store.stats_service.snapshot()
            assert stats["put_message_times_total"] == len(results) and stats["put_message_failed_times"] == 0
            if spy is not None:
                assert spy.answers.count(True) == 2 * len(PLAIN) - 1
    assert answers[True] == answers[False]
    results, _ = answers[True]
    assert all(r.ok for r in results)


def test_each_message_the_c_encoder_declines_goes_the_python_way_and_is_stored(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok  # topic validated
        spy = _recording(store)
        free = store._puts._free_slots
        results = _put_all(store, DECLINED)
        assert spy.answers == [None] * len(DECLINED)
        assert all(r.ok for r in results)
        helpers.wait_until(lambda: store._puts._free_slots == free, what="every slot back")
        helpers.wait_dispatched(store)
        stored = [store.lookup(r.commitlog_offset) for r in results]
        assert [m.body for m in stored if m is not None] == [bytes(m.body) for m in DECLINED]


def test_refusals_and_bad_input_are_the_python_paths_and_hold_no_slot(store_dir: Path) -> None:
    with helpers.open_small(store_dir, max_message_size_bytes=4096) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok
        spy = _recording(store)
        free = store._puts._free_slots
        refused = {
            "bad topic": Message(topic="bad topic!", body=b"x"),
            "too large": Message(topic="orders", body=b"x" * 5000),
            "key with a space": Message(topic="orders", body=b"x", keys=["a b"]),
            "tag with a separator": Message(topic="orders", body=b"x", tags="a\x01b"),
        }
        for why, message in refused.items():
            result = store.put_async(message).result(TIMEOUT_S)
            assert result.status is PutMessageStatus.MESSAGE_ILLEGAL, why
        with pytest.raises(TypeError, match="body"):
            store.put_async(Message(topic="orders", body="text"))  # type: ignore[arg-type]
        with pytest.raises((TypeError, ValueError), match="queue_id"):
            store.put_async(Message(topic="orders", body=b"x", queue_id=-1))
        with pytest.raises(TypeError, match="message"):
            store.put_async(b"not a message")  # type: ignore[arg-type]
        assert spy.answers == [None] * 6  # each declined by C, then refused or raised by Python
        assert store._puts._free_slots == free
        assert not store._puts._pending
    with pytest.raises(StoreClosedError):
        store.put_async(Message(topic="orders", body=b"closed"))


def test_a_slave_store_has_no_one_call_path_and_refuses_every_put(store_dir: Path) -> None:
    with helpers.open_small(store_dir, broker_role="SLAVE") as store:
        assert store._puts._submitter is None
        result = store.put_async(Message(topic="orders", body=b"x")).result(TIMEOUT_S)
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "SLAVE" in result.detail


def test_no_free_slot_fails_fast_through_the_python_path(store_dir: Path) -> None:
    with helpers.open_small(store_dir, max_puts_in_flight=2, put_fail_fast_when_in_flight_full=True) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok
        spy = _recording(store)
        slots = store._puts._slots
        assert slots.take(None, []) and slots.take(None, [])  # every slot held, as by two puts in flight
        try:
            refused = store.put_async(Message(topic="orders", body=b"over"))
            assert refused.done() and refused.result().status is PutMessageStatus.OS_PAGE_CACHE_BUSY
            assert spy.answers == [False]
            assert store._puts._free_slots == 0
        finally:
            slots.give(2)
        assert store.put_async(Message(topic="orders", body=b"again")).result(TIMEOUT_S).ok
        assert spy.answers == [False, True]


def test_no_free_slot_blocks_until_one_is_given_back(store_dir: Path) -> None:
    with helpers.open_small(store_dir, max_puts_in_flight=1) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok
        slots = store._puts._slots
        assert slots.take(None, [])
        got: list[PutResult] = []
        putter = threading.Thread(
            target=lambda: got.append(store.put_async(Message(topic="orders", body=b"b")).result(TIMEOUT_S))
        )
        putter.start()
        putter.join(0.3)
        assert putter.is_alive() and not got, "put_async did not wait for a slot"
        slots.give(1)
        putter.join(TIMEOUT_S)
        assert got and got[0].ok


def test_a_writer_that_is_down_answers_service_not_available(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok
        spy = _recording(store)
        peers = store.supervisor.ctx.peers
        free = store._puts._free_slots
        writer = peers.pop("writer")  # as while the supervisor restarts it
        try:
            down = store.put_async(Message(topic="orders", body=b"down")).result(TIMEOUT_S)
        finally:
            peers["writer"] = writer
        assert down.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert spy.answers == []
        helpers.wait_until(lambda: store._puts._free_slots == free, what="the slot back")
        assert store.put_async(Message(topic="orders", body=b"up")).result(TIMEOUT_S).ok
        assert spy.answers == [True]


def test_the_actor_clients_single_puts_take_the_one_call_path(store_dir: Path) -> None:
    import pykka

    from mqstore.messages import Replied

    class Sender(pykka.ThreadingActor):
        def __init__(self) -> None:
            super().__init__()
            self.got: list[Replied] = []
            self.done = threading.Event()

        def on_receive(self, message: Any) -> None:
            if isinstance(message, Replied):
                self.got.append(message)
                if len(self.got) == 3:
                    self.done.set()

    with helpers.open_small(store_dir) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok
        spy = _recording(store)
        ref = Sender.start()
        try:
            actor = ref._actor_weakref()
            client = store.actor_client(ref)
            assert client.put(Message(topic="orders", body=b"a"), correlation_id=1)
            assert client.put(Message(topic="orders", body=b"p", properties={"x": "y"}), correlation_id=2)
            assert client.put_and_forget(Message(topic="orders", body=b"f"))
            assert client.put(Message(topic="orders", body=b"c"), correlation_id=3)
            assert actor.done.wait(TIMEOUT_S)
            assert [r.correlation_id for r in actor.got] == [1, 2, 3]
            assert all(r.answer.ok for r in actor.got)
            assert spy.answers == [True, None, True, True]
            with pytest.raises(TypeError, match="message"):
                client.put(b"not a message")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="message"):
                client.put_and_forget("not a message")  # type: ignore[arg-type]
            assert spy.answers == [True, None, True, True]  # nothing submitted for them
        finally:
            ref.stop()


def _submitter(slots: Any, topics: dict[str, bytes], max_size: int = 4 * 1024 * 1024) -> Any:
    native = speedups.native
    assert native is not None
    return native.PutSubmitter(
        topics,
        _fixed_clock,
        slots,
        EncodedPut,
        INBOX_ENVELOPE,
        Message,
        b"\x7f\x00\x00\x01",
        0,
        b"\x0a\x00\x00\x02",
        10911,
        max_size,
    )


def _rig(free_slots: int = 1, max_size: int = 4 * 1024 * 1024) -> tuple[Any, Any, Any, deque[Any], Any]:
    """(the extension, its in-flight slots with `free_slots` free, the writer inbox's Signal
    and item deque, a submitter over them that knows the topic "orders")."""
    native = speedups.native
    assert native is not None
    slots, inbox_signal = native.Signal(), native.Signal()
    slots.post_many_holding_gil(free_slots)
    return native, slots, inbox_signal, deque(), _submitter(slots, {"orders": b"orders"}, max_size)


def test_submit_builds_the_writers_put_as_the_python_encoder_would() -> None:
    _, slots, inbox_signal, items, submitter = _rig()
    reply = object()
    message = Message(topic="orders", body=b"body", queue_id=2, keys=["k1", "k2"], tags="t")
    assert submitter.submit(message, reply, items.append, inbox_signal) is True
    assert slots.value() == 0 and inbox_signal.value() == 1
    (envelope,) = items
    assert type(envelope) is INBOX_ENVELOPE and envelope.reply_to is None
    put = envelope.message
    assert type(put) is EncodedPut
    encoder = PutEncoder(codec.HostAddress("10.0.0.2", 10911), 4 * 1024 * 1024)
    expected = encoder.encode([message], False, NOW_MS)
    assert put.records == expected.records
    assert put[:7] == (expected.records, "orders", 2, 0, False, True, reply)
    assert isinstance(put.enqueued_ns, int) and put.enqueued_ns > 0


def test_submit_declines_without_taking_a_slot_or_telling() -> None:
    _, slots, inbox_signal, items, submitter = _rig(max_size=200)
    declined = [
        Message(topic="unseen", body=b"x"),  # not validated yet
        Message(topic="orders", body=b"x" * 300),  # over the limit: Python refuses it
        Message(topic="orders", body=b"x", properties={"a": "b"}),
        Message(topic="orders", body=b"x", queue_id=-1),
        Message(topic="orders", body="text"),  # type: ignore[arg-type]
    ]
    for message in declined:
        assert submitter.submit(message, None, items.append, inbox_signal) is None, message
    assert slots.value() == 1 and inbox_signal.value() == 0 and not items
    assert submitter.submit(Message(topic="orders", body=b"x"), None, items.append, inbox_signal) is True
    assert submitter.submit(Message(topic="orders", body=b"y"), None, items.append, inbox_signal) is False
    assert slots.value() == 0 and inbox_signal.value() == 1 and len(items) == 1


def test_submit_gives_the_slot_back_when_the_hand_over_fails() -> None:
    native, slots, inbox_signal, _, submitter = _rig()

    def broken_append(_item: Any) -> None:
        raise RuntimeError("inbox gone")

    with pytest.raises(RuntimeError, match="inbox gone"):
        submitter.submit(Message(topic="orders", body=b"x"), None, broken_append, inbox_signal)
    assert slots.value() == 1 and inbox_signal.value() == 0
    with pytest.raises(TypeError):
        submitter.submit(Message(topic="orders", body=b"x"), None, [].append, object())
    with pytest.raises(TypeError, match="not initialised"):
        native.PutSubmitter.__new__(native.PutSubmitter).submit(
            Message(topic="orders", body=b"x"), None, [].append, inbox_signal
        )
    with pytest.raises(TypeError):
        native.PutSubmitter(
            {}, "not callable", slots, EncodedPut, INBOX_ENVELOPE, Message, b"\0\0\0\0", 0, b"\0\0\0\0", 0, 1
        )


def test_a_put_future_makes_its_lists_only_for_waiters_and_callbacks() -> None:
    """_PutFuture's waiter and callback lists are made on first use, like its Condition: a
    future only polled and completed makes neither; waiters and callbacks still work."""
    from concurrent.futures import as_completed, wait

    from mqstore import put_pipeline

    ok = PutResult(status=PutMessageStatus.PUT_OK)
    lone = put_pipeline._PutFuture()
    lone.set_result(ok)
    assert lone._waiter_list is None and lone._callback_list is None and lone.result(0) is ok
    called: list[Any] = []
    lone.add_done_callback(called.append)  # done already: called at once
    waited, polled = put_pipeline._PutFuture(), put_pipeline._PutFuture()
    waited.add_done_callback(called.append)
    threading.Timer(0.05, waited.set_result, (ok,)).start()
    assert wait([waited, polled], timeout=TIMEOUT_S, return_when="FIRST_COMPLETED").not_done == {polled}
    assert called == [lone, waited] and waited._waiter_list == [] and polled._waiter_list == []
    polled.set_result(ok)
    assert list(as_completed([polled], timeout=TIMEOUT_S)) == [polled]


def test_signal_post_many_adds_n_in_one_call() -> None:
    native = speedups.native
    assert native is not None
    signal = native.Signal()
    signal.post_many_holding_gil(3)
    signal.post_many_holding_gil(0)
    assert signal.value() == 3 and signal.wait(0.0) and signal.value() == 2
    with pytest.raises(ValueError):
        signal.post_many_holding_gil(-1)
    assert signal.value() == 2


def test_the_c_encoders_body_crc_is_zlibs_on_every_length() -> None:
    """encode_one's CRC is the carry-less-multiply kernel of the read path (zlib.crc32 on a
    CPU without it): the record's BODYCRC field is codec.body_crc's for every body length."""
    import os

    native = speedups.native
    assert native is not None
    for length in [*range(260), 1023, 1024, 1025, 4096 + 7, 65536 + 3]:
        body = os.urandom(length)
        (record,) = native.encode_batch(
            (Message(topic="T", body=body),), b"T", NOW_MS, b"\x7f\0\0\1", 0, b"\x0a\0\0\2", 10911, 1 << 20, "T", 0
        )
        assert int.from_bytes(record[8:12], "big") == codec.body_crc(body), length


class _Loud(Message):
    """A Message subclass whose attribute is not its tuple item."""

    @property
    def body(self) -> bytes:  # type: ignore[override]
        return b"LOUD"


def test_submit_reads_a_message_by_position_and_anything_else_by_attribute() -> None:
    native, slots, inbox_signal, items, submitter = _rig(free_slots=2)
    plain, loud = Message(topic="orders", body=b"quiet", keys="k"), _Loud(topic="orders", body=b"quiet", keys="k")
    assert submitter.submit(plain, None, items.append, inbox_signal) is True
    assert submitter.submit(loud, None, items.append, inbox_signal) is True
    encoder = PutEncoder(codec.HostAddress("10.0.0.2", 10911), 4 * 1024 * 1024)
    for envelope, message in zip(items, (plain, loud)):
        assert envelope.message.records == encoder.encode([message], False, NOW_MS).records
    (loud_record,) = items[1].message.records
    assert b"LOUD" in loud_record and b"quiet" not in loud_record
    with pytest.raises(IndexError):  # a Message tuple of the wrong length: its attributes raise, nothing is told
        submitter.submit(tuple.__new__(Message, ("orders",)), None, items.append, inbox_signal)
    assert len(items) == 2 and inbox_signal.value() == 2
    with pytest.raises(ValueError, match="no field"):
        native.PutSubmitter(
            {}, _fixed_clock, slots, EncodedPut, INBOX_ENVELOPE, EncodedPut, b"\0\0\0\0", 0, b"\0\0\0\0", 0, 1
        )


def test_after_the_writer_is_restarted_puts_go_to_its_new_inbox_in_one_call(store_dir: Path) -> None:
    from mqstore import FaultPlan

    plan = FaultPlan()
    with helpers.open_small(store_dir, faults=plan) as store:
        assert store.put_async(Message(topic="orders", body=b"first")).result(TIMEOUT_S).ok
        old_writer = store.supervisor.ctx.peers["writer"]
        plan.arm("writer.after_append", 1)
        crashed = store.put_async(Message(topic="orders", body=b"crash")).result(TIMEOUT_S)
        assert crashed.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        helpers.wait_until(
            lambda: store.supervisor.ctx.peers.get("writer") not in (None, old_writer), what="writer restarted"
        )
        helpers.wait_until(lambda: store.put(Message(topic="orders", body=b"probe")).ok, what="writer taking puts")
        spy = _recording(store)
        after = [store.put_async(Message(topic="orders", body=b"after%d" % i)) for i in range(3)]
        assert all(f.result(TIMEOUT_S).ok for f in after)
        assert spy.answers == [True, True, True]
        assert store._puts._writer_inbox is not None and store._puts._writer_inbox[0] is not old_writer
