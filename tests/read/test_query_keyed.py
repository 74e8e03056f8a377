"""A key lookup in one C call per round (`reads.query_direct` over `native.query_keyed`, issue 18)
answers exactly as the pure-Python query (the reference: the Python index walk, read_record and
the key check in Python), across index roll-overs, hash collisions, several keys per message,
topics, time windows and max_count; it is the path a plain lookup takes; and what it does not
serve (a corrupt record, quarantined ranges, a closed map) goes to the reference, which skips and
reports it once."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from mqstore import Message, MessageStore, QueryResult, reads
from mqstore.storage import codec, speedups

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
Open = Callable[..., MessageStore]
SMALL_INDEX = {"max_index_num": 24, "max_hash_slot_num": 7}
native = speedups.native
pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built or MQSTORE_PURE_PYTHON=1")


def _pure(store: MessageStore, monkeypatch: pytest.MonkeyPatch, *args: Any) -> QueryResult:
    with monkeypatch.context() as m:
        m.setattr(speedups, "native", None)
        return store.query(*args)


class _Counted:
    """reads.query_direct, counting the answers it gave (not None: the C path served them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.served = self.declined = 0
        real = reads.query_direct

        def counted(*args: Any) -> QueryResult | None:
            answer = real(*args)
            if answer is None and speedups.native is not None:  # (not the pure reference's own call)
                self.declined += 1
            else:
                self.served += 1
            return answer

        monkeypatch.setattr(reads, "query_direct", counted)


def test_the_c_query_answers_as_the_pure_python_query(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(18)
    clock = h.ManualClock()
    store = open_store(clock_ms=clock, **SMALL_INDEX)
    keys = ["Aa", "BB", "k1", "k2", "ключ", "\U0001f600", "k" * 30]  # Aa/BB: one Java hash
    for i in range(160):
        picked = rng.sample(keys, rng.randrange(1, 3)) + [f"u{i}"]
        topic = rng.choice(["T", "T", "U"])
        result = store.put(Message(topic=topic, body=bytes([i % 256]) * rng.randrange(1, 300), keys=picked))
        assert result.ok, result
        clock.now_ms += rng.choice([0, 1, 700, 1_500])
    counted = _Counted(monkeypatch)
    compared = 0
    for _ in range(150):
        topic = rng.choice(["T", "U", "Nope"])
        key = rng.choice(keys + ["u7", "u100", "absent", "", "k"])
        max_count = rng.choice([1, 2, 5, 32, 64])
        if rng.random() < 0.4:
            begin, end = 0, 2**63 - 1
        else:
            begin = h.T0 + rng.randrange(-2_000, 150_000)
            end = begin + rng.randrange(0, 60_000)
        fast = store.query(topic, key, max_count, begin, end)
        assert fast == _pure(store, monkeypatch, topic, key, max_count, begin, end), (topic, key, max_count, begin, end)
        compared += bool(fast.messages)
    assert counted.served >= 150 and counted.declined == 0  # the C path answered every one
    assert compared > 40  # and many found something
    # The same path with one index file holding everything and every message (no roll-over).
    assert [m.topic for m in store.query("T", "Aa", 64).messages] == [
        m.topic for m in _pure(store, monkeypatch, "T", "Aa", 64).messages
    ]


def test_a_corrupt_record_goes_to_the_reference_which_skips_and_reports_it_once(
    open_store: Open, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(check_crc_on_read=True)
    results = [store.put(Message(topic="T", body=b"x" * 100, keys=["same", f"k{i}"])) for i in range(6)]
    assert all(r.ok for r in results)
    bad = results[2].commitlog_offset
    name = codec.segment_file_name(bad - bad % (1 << 20))
    with open(tmp_path / "store" / "commitlog" / name, "r+b") as f:  # a body byte, through the file
        f.seek(bad % (1 << 20) + 88 + 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    counted = _Counted(monkeypatch)
    found = store.query("T", "same", 32)
    assert [m.commitlog_offset for m in found.messages] == [r.commitlog_offset for i, r in enumerate(results) if i != 2]
    assert counted.declined == 1 and counted.served == 0
    assert store.stats()["corrupt_records_on_read"] == 1  # told once, by the reference
    assert store.query("T", "k3").messages and counted.served == 1  # a clean record: the C path


def test_with_quarantined_ranges_the_reference_answers(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    results = [store.put(Message(topic="T", body=b"y" * 10, keys=[f"k{i}"])) for i in range(4)]
    assert store.query("T", "k1").messages
    counted = _Counted(monkeypatch)
    # As recovery publishes damage it found: the record at k1 is never served.
    start = results[1].commitlog_offset
    store.read_view.add_quarantined(((start, start + results[1].wrote_bytes),))
    assert store.query("T", "k1").messages == ()
    assert [m.commitlog_offset for m in store.query("T", "k2").messages] == [results[2].commitlog_offset]
    assert counted.served == counted.declined == 0  # not even tried


def test_query_keyed_refuses_wrong_arguments_and_declines_outside_the_maps() -> None:
    assert native is not None
    args: list[Any] = [((), 7, 68, 23, 64), "T", "k", 32, 0, 2**62, lambda offset, size: None, 4 << 20,
                       codec.MessageRecord, codec.host_from_bytes, True, []]  # fmt: skip
    assert native.query_keyed(*args) == (None, 0, 0, 0)  # no files: no hits
    for at, wrong in [(0, ((),)), (1, b"T"), (6, None), (11, ())]:
        bad = list(args)
        bad[at] = wrong
        with pytest.raises(TypeError):
            native.query_keyed(*bad)
    short = list(args)
    short[0] = ((b"\0" * 39,), 7, 68, 23, 64)  # a header cut short: the reference decides
    assert native.query_keyed(*short) is None


def test_index_maps_closed_under_a_query_decline_to_the_reference(open_store: Open) -> None:
    store = open_store(**SMALL_INDEX)
    for i in range(40):
        assert store.put(Message(topic="T", body=b"z", keys=[f"k{i}"])).ok
    assert store.query("T", "k1").messages
    readers = store._readers.get()
    index_reader = readers._index
    assert index_reader is not None and index_reader.walk_args is not None
    walk = index_reader.walk_args
    index_reader.close()  # as the store closing does from another thread, with the shared maps
    index_reader.maps.close()
    assert index_reader.walk_args is None
    # A walk taken before the close reads closed maps: no answer from C, the reference decides.
    commitlog = readers.commitlog_reader()
    assert reads.query_direct(walk, commitlog, store.config, "T", "k1", 32, 0, 2**63 - 1) is None


def test_a_hit_whose_record_lost_its_key_is_named_by_both_paths(
    open_store: Open, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 97 M1: the body CRC covers neither a record's topic nor its keys; an index hit
    whose record has no key of the entry's hash (changed after it was indexed) was skipped
    unsaid, "0 messages". A record with another key of that hash is a collision ("Aa" and "BB"
    share Java's hashCode), skipped as before, and the C path still answers it."""
    store = open_store()
    results = [store.put(Message(topic="T", body=b"a body", keys=[key])) for key in ("k0", "k1", "BB")]
    assert all(r.ok for r in results)
    assert store.query("T", "k1").messages  # (indexed before its bytes change)
    bad = results[1].commitlog_offset
    name = codec.segment_file_name(bad - bad % (1 << 20))
    with open(tmp_path / "store" / "commitlog" / name, "r+b") as f:
        data = f.read()
        at = data.index(b"k1", bad % (1 << 20), results[2].commitlog_offset % (1 << 20))
        f.seek(at)
        f.write(b"kX")  # k1's KEYS token, same length: the record still reads as valid
    counted = _Counted(monkeypatch)
    found = store.query("T", "k1")
    assert found.messages == () and f"commitlog offset {bad}" in found.detail and "no key of its hash" in found.detail
    assert (counted.served, counted.declined) == (0, 1)  # the C path left it to the reference
    collision = store.query("T", "Aa")
    assert collision == QueryResult.of((), collision.index_last_update_timestamp, collision.index_last_update_phy_offset)
    assert collision.index_last_update_timestamp > 0 and (counted.served, counted.declined) == (1, 1)  # C: a hit, skipped
    assert found == _pure(store, monkeypatch, "T", "k1") and collision == _pure(store, monkeypatch, "T", "Aa")


def test_a_corrupt_record_of_another_key_of_the_same_hash_is_not_this_querys_damage(
    open_store: Open, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 100 M3: "BB" shares "Aa"'s Java hash, so its index entry is a hit of every query
    for "Aa"; its body failing its CRC was named in "Aa"'s complete answer (the CLI said
    nothing). The header and keys outside the CRC say whose it is: "BB"'s answer names it."""
    store = open_store()
    results = [store.put(Message(topic="T", body=b"a body", keys=[key])) for key in ("Aa", "BB")]
    assert all(r.ok for r in results) and store.query("T", "BB").messages
    bad = results[1].commitlog_offset
    with open(tmp_path / "store" / "commitlog" / codec.segment_file_name(0), "r+b") as f:
        f.seek(bad + 88 + 2)  # a byte of its body
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    for pure in (False, True):
        answer = _pure(store, monkeypatch, "T", "Aa") if pure else store.query("T", "Aa")
        assert [m.commitlog_offset for m in answer.messages] == [results[0].commitlog_offset]
        assert answer.detail == "", (pure, answer.detail)
        other = _pure(store, monkeypatch, "T", "BB") if pure else store.query("T", "BB")
        assert other.messages == () and f"commitlog offset {bad}" in other.detail
