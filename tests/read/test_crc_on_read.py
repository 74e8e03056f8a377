"""The CRC on read (issue 19 item 4): a record whose body no longer matches its CRC is never
served as good. `get` skips it with a `detail` and a logged error, `lookup`, `lookup_msg_id`
and `query` do not return it, and `stats` counts it. The damage is made while the store is
open (through the file, which the store's maps share), so recovery has no say in it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable

import pytest

from mqstore import GetMessageStatus as S
from mqstore import MessageStore
from mqstore.storage import codec

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
Open = Callable[..., MessageStore]
BODY_AT = 88  # the body of a record with IPv4 hosts


def _flip_body_byte(root: Path, commitlog_offset: int, segment_bytes: int = 1 << 20) -> None:
    name = codec.segment_file_name(commitlog_offset - commitlog_offset % segment_bytes)
    with open(root / "commitlog" / name, "r+b") as f:
        f.seek(commitlog_offset % segment_bytes + BODY_AT + 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.parametrize("direct", [True, False], ids=["own_maps", "asked"])
def test_a_flipped_body_byte_is_skipped_logged_and_counted(
    open_store: Open, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    store = open_store(check_crc_on_read=True)
    results = h.put_n(store, 10)
    bad = results[3]
    _flip_body_byte(tmp_path / "store", bad.commitlog_offset)
    if not direct:  # every get asks the owning actor for the units, as when the view cannot decide
        from mqstore import reads

        monkeypatch.setattr(reads, "get_from_view", lambda *args, **kwargs: None)
    with caplog.at_level(logging.ERROR, logger="mqstore"):
        got = store.get("T", 0, 0, 32)
        raw = store.get("T", 0, 0, 32, raw=True)
        assert store.lookup(bad.commitlog_offset) is None
        assert store.lookup_msg_id(bad.msg_id) is None
        assert store.query("T", "k3").messages == ()
        assert [m.body for m in store.query("T", "k4").messages] == [b"x" * 100]  # its neighbour is fine
    assert got.status is S.FOUND
    assert [m.queue_offset for m in got.messages] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert all(m.body == b"x" * 100 for m in got.messages)
    assert got.next_begin_offset == 10
    assert str(bad.commitlog_offset) in got.detail and "CRC" in got.detail
    assert len(raw.raw) == 9 and str(bad.commitlog_offset) in raw.detail
    assert store.stats()["corrupt_records_on_read"] == 5  # get, raw get, lookup, lookup_msg_id, query
    logged = [r for r in caplog.records if r.getMessage() == "corrupt_record_on_read"]
    assert len(logged) == 5 and all(r.mqstore_event["commitlog_offset"] == bad.commitlog_offset for r in logged)  # type: ignore[attr-defined]
    # it does not take a place in the batch: the next good one does
    one = store.get("T", 0, 3, 1)
    assert [m.queue_offset for m in one.messages] == [4] and one.next_begin_offset == 5 and "CRC" in one.detail
    # the last one alone: nothing found, and the consumer moves past it
    _flip_body_byte(tmp_path / "store", results[9].commitlog_offset)
    last = store.get("T", 0, 9, 1)
    assert last.status is S.NO_MATCHED_MESSAGE and last.messages == () and last.next_begin_offset == 10
    assert str(results[9].commitlog_offset) in last.detail


def test_tag_filtered_gets_skip_it_too(open_store: Open, tmp_path: Path) -> None:
    store = open_store(check_crc_on_read=True)
    results = h.put_n(store, 6, tags=lambda i: "A")
    _flip_body_byte(tmp_path / "store", results[2].commitlog_offset)
    for raw in (False, True):
        got = store.get("T", 0, 0, 32, tags="A", raw=raw)
        assert len(got.raw if raw else got.messages) == 5 and "CRC" in got.detail


def test_with_check_crc_on_read_off_the_damaged_body_is_served(open_store: Open, tmp_path: Path) -> None:
    """The setting exists for a measured reason (README); off, reads are as before."""
    store = open_store(check_crc_on_read=False)
    results = h.put_n(store, 5)
    _flip_body_byte(tmp_path / "store", results[1].commitlog_offset)
    got = store.get("T", 0, 0, 32)
    assert len(got.messages) == 5 and got.messages[1].body != b"x" * 100 and got.detail == ""
    assert store.stats()["corrupt_records_on_read"] == 0


def test_check_crc_on_read_is_on_by_default() -> None:
    """On: it costs less than 10% of get throughput with 1 KiB bodies (figures in defaults.toml)."""
    from mqstore.config import StoreConfig

    assert StoreConfig().check_crc_on_read is True
