"""Blocks are reserved before anything is written through a map (issue 19, item 1): on a
full disk each storage class refuses with DiskFullError and writes nothing, instead of
writing into a page with no blocks behind it (SIGBUS). Simulated disk with a capacity."""

from __future__ import annotations

import pytest

from mqstore.storage.checkpoint import StoreCheckpoint
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.storage.index import IndexFile
from mqstore.storage.mapped_file import (
    KEEP_FREE_FOR_DERIVED_BYTES,
    DiskFullError,
    MappedFile,
)


def small_disk(capacity: int) -> SimulatedFileSystem:
    fs = SimulatedFileSystem(capacity_bytes=capacity)
    fs.makedirs("/d")
    return fs


def fill(fs: SimulatedFileSystem, leave: int) -> None:
    """Take all but `leave` bytes of the disk with another file."""
    fs.write_atomic("/d/filler", bytes(fs.free_bytes() - leave))


def test_append_bytes_on_a_full_disk_writes_nothing_and_succeeds_once_space_returns() -> None:
    fs = small_disk(1 << 20)
    mf = MappedFile(fs, "/d/00000000000000000000", 64 * 1024)
    fill(fs, KEEP_FREE_FOR_DERIVED_BYTES)  # only the margin the store never takes
    with pytest.raises(DiskFullError):
        mf.append_bytes(b"\x01" * 20)
    assert mf.wrote_position == 0 and mf.mapped_buffer[:20] == bytes(20)
    fs.remove("/d/filler")
    assert mf.append_bytes(b"\x01" * 20)
    assert mf.reserved_until >= 20
    fs.assert_no_sigbus()


def test_consume_queue_unit_is_not_counted_when_its_write_was_refused() -> None:
    """The duplicate guard (max_physic_offset) moves only after the unit is in: the retry
    after space returns must write it, not skip it."""
    fs = small_disk(1 << 20)
    cq = ConsumeQueue(fs, "T", 0, "/d/cq", mapped_file_size=20 * 100, clock_ms=lambda: 0)
    assert cq.put_message_position_info(100, 10, 0, 0)
    fill(fs, KEEP_FREE_FOR_DERIVED_BYTES)
    # The first file (2000 bytes) was reserved whole; the second cannot be.
    for q in range(1, 100):
        assert cq.put_message_position_info(100 + q * 10, 10, 0, q)
    with pytest.raises(DiskFullError):
        cq.put_message_position_info(2000, 10, 0, 100)
    assert cq.max_physic_offset == 100 + 99 * 10
    fs.remove("/d/filler")
    assert cq.put_message_position_info(2000, 10, 0, 100)
    assert cq.get_unit(100) == (2000, 10, 0)
    fs.assert_no_sigbus()


def test_a_new_index_file_on_a_full_disk_is_refused_and_leaves_no_file() -> None:
    fs = small_disk(1 << 20)
    fs.makedirs("/d/index")
    fill(fs, KEEP_FREE_FOR_DERIVED_BYTES)
    with pytest.raises(DiskFullError):
        IndexFile.create(fs, "/d/index/20260101000000000", max_hash_slot_num=100, max_index_num=400)
    assert fs.listdir("/d/index") == []


def test_index_entries_are_reserved_before_they_are_written() -> None:
    fs = small_disk(4 << 20)
    fs.makedirs("/d/index")
    slots, entries = 100, 100_000  # a 2 MB file: entries are reserved a window (1 MiB) ahead
    f = IndexFile.create(fs, "/d/index/20260101000000000", max_hash_slot_num=slots, max_index_num=entries)
    reserved = f.reserve_entries(f.index_count + 1)
    assert 1 < reserved < entries
    fill(fs, KEEP_FREE_FOR_DERIVED_BYTES)
    written = 0
    with pytest.raises(DiskFullError):
        for i in range(entries):
            f.put_key(f"T#k{i}", 1000 + i, 1)
            written += 1
    assert f.index_count == reserved == written + 1  # refused before writing, nothing half-done
    fs.assert_no_sigbus()


def test_a_new_checkpoint_on_a_full_disk_is_refused_and_leaves_no_file() -> None:
    fs = small_disk(64 * 1024)
    fill(fs, 0)
    with pytest.raises(DiskFullError):
        StoreCheckpoint(fs, "/d/checkpoint")
    assert not fs.exists("/d/checkpoint")


def test_the_simulated_disk_records_a_write_into_an_unbacked_page_as_sigbus() -> None:
    """The check the tests above rely on: it must catch a write with no reservation."""
    fs = small_disk(1 << 20)
    region = fs.map_file("/d/f", 8192)
    fill(fs, 0)
    region.buf[5000] = 1  # no reserve(): on a real full disk, SIGBUS
    with pytest.raises(AssertionError, match="SIGBUS"):
        fs.assert_no_sigbus()


@pytest.mark.parametrize("use_native", [True, False], ids=["c-kernel", "python"])
def test_indexing_stops_at_the_reservation_and_resumes_without_duplicates(
    use_native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C kernel gets only the entries that have blocks; where it stops, the Python path
    refuses whole messages. After space returns, indexing resumes where it stopped: every
    key found exactly once."""
    from mqstore.storage import speedups
    from mqstore.storage.codec import DispatchFields
    from mqstore.storage.index import IndexService

    if use_native and speedups.native is None:
        pytest.skip("the C extension is not built")
    if not use_native:
        monkeypatch.setattr(speedups, "native", None)
    fs = small_disk(4 << 20)
    service = IndexService(fs, "/d/index", clock_ms=lambda: 1_000, max_hash_slot_num=100, max_index_num=100_000)
    requests = tuple(
        DispatchFields("T", 0, 1000 + 100 * i, 100, 0, 1_000, i, f"a{i} b{i}", f"U{i}", 0, 0) for i in range(40_000)
    )  # 3 entries each: 120,000 entries, past the first file and the disk
    done = service.build_index_until_full(requests, 0, 100, 0)
    assert done == 100
    fill(fs, KEEP_FREE_FOR_DERIVED_BYTES)
    done = service.build_index_until_full(requests, done, len(requests), 0)
    assert done < len(requests) and service.disk_full is not None and not service.index_error
    fs.assert_no_sigbus()
    fs.remove("/d/filler")
    while done < len(requests):
        before = done
        done = service.build_index_until_full(requests, done, len(requests), 0)
        assert done > before, service.disk_full
    for i in (0, done // 3, 33_333, 39_999):
        offsets = service.query_offset("T", f"b{i}", 10, 0, 2**62).phy_offsets
        assert offsets == [1000 + 100 * i], (i, offsets)
    fs.assert_no_sigbus()
