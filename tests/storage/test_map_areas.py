"""The store's share of the process's map areas (storage/map_areas.py): at most three quarters
of vm.max_map_count, so that a long log of small segments never takes the areas the host's own
allocations need. Past the share a map is refused with ENOMEM, as the kernel refuses one at the
limit, and the store answers it as it answers a process out of maps: puts refused, nothing
acknowledged lost, puts resuming once the limit is raised.

The kernel's limit itself is system-wide (a sysctl), so these tests give the account a limit
of their own; the note of the change that added it measured the real one."""

from __future__ import annotations

import errno
import gc
import mmap
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import mqstore
import mqstore.stats as stats_module
import mqstore.storage.fs as fs_module
from mqstore import Message
from mqstore.storage.fs import RealMappedRegion
from mqstore.storage.map_areas import LIMIT_READ_EVERY_S, MapAreas, new_file_share, read_max_map_count, store_share


class _Limit:
    """A vm.max_map_count the test sets, how often the account read it, and its clock."""

    def __init__(self, value: int | None) -> None:
        self.value = value
        self.reads = 0
        self.now = 1000.0

    def __call__(self) -> int | None:
        self.reads += 1
        return self.value

    def clock(self) -> float:
        return self.now

    def set(self, value: int | None) -> None:
        """The operator's sysctl, and the second after which the account has read it."""
        self.value = value
        self.now += LIMIT_READ_EVERY_S


@pytest.fixture
def limit(monkeypatch: pytest.MonkeyPatch) -> _Limit:
    """The process's account replaced by one under a limit the test sets (unbounded at first)."""
    chosen = _Limit(None)
    areas = MapAreas(chosen, chosen.clock)
    monkeypatch.setattr(fs_module, "MAP_AREAS", areas)
    monkeypatch.setattr(stats_module, "MAP_AREAS", areas)
    return chosen


def test_the_share_is_three_quarters_of_the_limit_and_none_without_one() -> None:
    assert store_share(65_530) == 65_530 - 16_382
    assert store_share(4) == 3
    assert store_share(None) is None


def test_new_files_stop_an_eighth_short_of_the_share() -> None:
    assert new_file_share(store_share(65_530)) == 49_148 - 6_143
    assert new_file_share(8) == 7
    assert new_file_share(None) is None


def _limit_for_new_files(bound: int) -> int:
    """The smallest vm.max_map_count under which new files may take `bound` maps."""
    limit = bound
    while new_file_share(store_share(limit)) != bound:  # (never more than a few steps)
        limit += 1
    return limit


def test_the_kernel_limit_is_read_from_proc(tmp_path: Path) -> None:
    path = tmp_path / "max_map_count"
    path.write_text("65530\n")
    assert read_max_map_count(str(path)) == 65_530
    path.write_text("junk\n")
    assert read_max_map_count(str(path)) is None
    assert read_max_map_count(str(tmp_path / "absent")) is None


def test_maps_past_the_share_are_refused_with_enomem_until_one_is_given_back() -> None:
    chosen = _Limit(8)  # a share of 6
    areas = MapAreas(chosen)
    releases = [areas.take(f"/f{i}") for i in range(6)]
    assert areas.live == 6
    with pytest.raises(OSError) as refused:
        areas.take("/f6")
    assert refused.value.errno == errno.ENOMEM and refused.value.filename == "/f6"
    assert "vm.max_map_count" in str(refused.value) and "6 maps" in str(refused.value)
    assert areas.live == 6
    releases[0]()
    releases[0]()  # a second release of one map gives nothing more back
    assert areas.live == 5
    releases.append(areas.take("/f6"))
    with pytest.raises(OSError):
        areas.take("/f7")


def test_a_new_file_is_refused_where_a_map_of_a_file_already_there_is_not() -> None:
    areas = MapAreas(lambda: 11)  # a share of 9, of it 8 for new files
    for i in range(8):
        areas.take(f"/new{i}", new_file=True)
    with pytest.raises(OSError) as refused:
        areas.take("/new8", new_file=True)
    assert "as many as new files may take (8" in str(refused.value)
    areas.take("/there")  # a reader's map of a file already there: the last of the share
    with pytest.raises(OSError) as refused:
        areas.take("/there-too")
    assert "its whole share" in str(refused.value)


def test_the_limit_is_read_once_a_second_and_again_when_the_share_is_used_up() -> None:
    chosen = _Limit(8)
    areas = MapAreas(chosen, chosen.clock)
    for i in range(6):
        areas.take(f"/f{i}")
    assert chosen.reads == 1  # all within one second
    chosen.value = 12  # the operator raised vm.max_map_count: a share of 9, seen at the share's end
    for i in range(6, 9):
        areas.take(f"/f{i}")
    assert areas.live == 9 and chosen.reads == 2
    with pytest.raises(OSError):
        areas.take("/f9")
    assert chosen.reads == 3  # each take that finds the share used up reads it again
    chosen.set(4)  # lowered: seen a second later, by any take (9 held, a share of 3)
    with pytest.raises(OSError):
        areas.take("/f10")
    assert areas.share() == 3 and areas.live == 9


def test_an_unknown_limit_bounds_nothing() -> None:
    areas = MapAreas(lambda: None)
    for i in range(100):
        areas.take(f"/f{i}")
    assert areas.live == 100 and areas.share() is None


def test_a_region_counts_its_map_until_closed_and_a_refused_one_leaves_no_file(tmp_path: Path, limit: _Limit) -> None:
    limit.value = 4  # a share of 3
    regions = [RealMappedRegion(str(tmp_path / f"f{i}"), 8192, create=True, readonly=False) for i in range(3)]
    assert fs_module.MAP_AREAS.live == 3
    with pytest.raises(OSError) as refused:
        RealMappedRegion(str(tmp_path / "f3"), 8192, create=True, readonly=False)
    assert refused.value.errno == errno.ENOMEM
    assert not (tmp_path / "f3").exists()  # made for the map, removed with its refusal
    regions[0].close()
    regions[0].close()
    assert fs_module.MAP_AREAS.live == 2
    regions.append(RealMappedRegion(str(tmp_path / "f3"), 8192, create=True, readonly=False))
    assert fs_module.MAP_AREAS.live == 3
    for region in regions[1:]:
        region.close()
    assert fs_module.MAP_AREAS.live == 0


def test_a_map_collected_without_a_close_gives_its_area_back(tmp_path: Path, limit: _Limit) -> None:
    limit.value = 4
    region = RealMappedRegion(str(tmp_path / "f"), 8192, create=True, readonly=False)
    assert fs_module.MAP_AREAS.live == 1
    del region
    gc.collect()
    assert fs_module.MAP_AREAS.live == 0


def test_a_close_refused_by_a_readers_export_keeps_the_map_counted(tmp_path: Path, limit: _Limit) -> None:
    limit.value = 4
    region = RealMappedRegion(str(tmp_path / "f"), 8192, create=True, readonly=False)
    view = memoryview(region.buf)  # a reader's export: the map cannot be closed under it
    with pytest.raises(BufferError):
        region.close()
    assert fs_module.MAP_AREAS.live == 1  # still mapped
    view.release()
    region.close()
    assert fs_module.MAP_AREAS.live == 0


def test_a_store_past_its_share_refuses_puts_loses_none_and_resumes_once_the_limit_is_raised(
    tmp_path: Path, limit: _Limit
) -> None:
    settings = dict(mapped_file_size_commitlog_bytes=64 << 10, max_message_size_bytes=16 << 10)
    with mqstore.open(str(tmp_path / "store"), **settings) as store:  # type: ignore[arg-type]
        assert store.put(Message(topic="T", body=b"first")).ok
        # Room for 160 more new files than the store maps now (the share's eighth kept for
        # reads is then 24: a reading thread's 16 segments and its queue file fit).
        bound = fs_module.MAP_AREAS.live + 160
        limit.set(_limit_for_new_files(bound))
        share = store_share(limit.value)
        assert share is not None and share - bound >= 17
        acknowledged = [b"first"]
        refused = None
        for i in range(2000):
            body = b"%05d" % i + b"x" * 8000
            result = store.put(Message(topic="T", body=body))
            if not result.ok:
                refused = result
                break
            acknowledged.append(body)
        assert refused is not None, "no put was refused past the share"
        assert refused.status is mqstore.PutMessageStatus.CREATE_MAPPED_FILE_FAILED
        assert refused.detail is not None and "vm.max_map_count" in refused.detail
        assert "as many as new files may take" in refused.detail
        assert fs_module.MAP_AREAS.live <= share  # (past `bound` only maps of files already there: flush, readers)
        process = store.stats()["process"]
        assert process["store_maps"] == fs_module.MAP_AREAS.live and process["store_maps_share"] == share
        # The host keeps its quarter: its own maps are not the store's to take.
        host_map = mmap.mmap(-1, 1 << 20)
        host_map.close()
        # Reads go on meanwhile, as on a full disk: every acknowledged put reads back.
        assert _read_all(store, len(acknowledged)) == acknowledged
        # The operator raises the limit: the next put makes its segment.
        limit.set(1_000_000)
        assert store.put(Message(topic="T", body=b"after")).ok
        acknowledged.append(b"after")
        assert _read_all(store, len(acknowledged)) == acknowledged


def _read_all(store: mqstore.MessageStore, count: int) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    while offset < count:
        result = store.get("T", 0, offset, 32)
        assert result.messages, result
        got.extend(m.body for m in result.messages)
        offset = result.next_begin_offset
    return got


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_thread_held_the_account_maps_without_waiting(tmp_path: Path) -> None:
    """A host that forks while one of its stores' threads is inside the account (a reader
    mapping a file): the child's first map must not wait for the parent's thread for good."""
    from mqstore.storage.map_areas import MAP_AREAS

    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with MAP_AREAS._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: map a new file, then report by the exit status
            code = 1
            try:
                region = RealMappedRegion(str(tmp_path / "child"), 8192, create=True, readonly=False)
                region.close()
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child's map waited for a lock a parent's thread held")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join()


def test_a_refusal_is_logged_without_holding_the_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 91 A1: the refusal was logged holding the account's lock. A map's finalizer
    (release) may run in a garbage collection inside another thread's logging handler, which
    holds the handler's lock: each thread then waited for the other's lock for good."""
    import logging

    from mqstore import log as mqstore_log
    from mqstore.log import RepeatedLog

    monkeypatch.setattr(mqstore_log, "PROCESS_REPEATS", RepeatedLog(lambda: 0))  # (logged, not throttled away)
    areas = MapAreas(lambda: 4)
    held = areas.take("/held")
    for i in range(2):
        areas.take(f"/f{i}")
    released_while_logging: list[bool] = []

    class ReleasingHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # As another thread's collection running the finalizer of a map it dropped.
            other = threading.Thread(target=held)
            other.start()
            other.join(2)
            released_while_logging.append(not other.is_alive())

    handler = ReleasingHandler(level=logging.ERROR)
    logger = logging.getLogger("mqstore.storage.map_areas")
    logger.addHandler(handler)
    try:
        with pytest.raises(OSError):
            areas.take("/refused")
    finally:
        logger.removeHandler(handler)
    assert released_while_logging == [True]
    assert areas.live == 2


def test_a_reader_short_of_maps_gives_its_own_back_and_reads_on(tmp_path: Path, limit: _Limit) -> None:
    """Review 91 B1: a busy reading thread keeps up to 16 segments and 64 queue files mapped;
    when the store's share was used up, its next map failed while it held those, and its get
    answered "could not be mapped now". It now gives its own back and maps again."""
    settings = dict(mapped_file_size_commitlog_bytes=64 << 10, max_message_size_bytes=16 << 10)
    with mqstore.open(str(tmp_path / "store"), **settings) as store:  # type: ignore[arg-type]
        bodies = [b"%05d" % i + b"x" * 8000 for i in range(8 * 40)]  # 40 segments
        for body in bodies:
            assert store.put(Message(topic="T", body=body)).ok
        assert _read_all(store, len(bodies)) == bodies  # this thread's reader now holds 16 segments
        limit.set(_limit_for_new_files(fs_module.MAP_AREAS.live))  # not one map more for new files...
        share = store_share(limit.value)
        assert share is not None
        while fs_module.MAP_AREAS.live < share:  # ...nor for reads: the share used up by others
            fs_module.MAP_AREAS.take("/elsewhere")
        result = store.get("T", 0, 0, 32)  # the first segments: not mapped by this thread now
        assert [m.body for m in result.messages] == bodies[:32], result
