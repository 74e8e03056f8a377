"""The cleaner's disk gauge and pause are typed ActorContext fields, set through `mqstore.open`."""

from __future__ import annotations

from pathlib import Path

import mqstore
from mqstore.actors.base import ActorContext, real_sleep_ms
from mqstore.storage.disk import FileSystemDiskGauge, FixedDiskGauge, PsutilDiskGauge
from mqstore.storage.fs import SimulatedFileSystem


def test_defaults_are_psutil_over_real_files_and_a_real_sleep(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        ctx: ActorContext = store.supervisor.ctx
        assert isinstance(ctx.disk_gauge, PsutilDiskGauge)
        assert 0.0 <= ctx.disk_gauge.used_ratio(str(store.config.commitlog_dir)) <= 1.0
        assert ctx.cleaner_sleep_ms is real_sleep_ms


def test_a_simulated_disk_is_measured_by_its_own_report() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    with mqstore.open("/s", fs=fs) as store:
        assert isinstance(store.supervisor.ctx.disk_gauge, FileSystemDiskGauge)


def test_open_passes_the_gauge_and_the_pause_to_the_cleaner() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    gauge = FixedDiskGauge(0.42)
    sleeps: list[int] = []
    with mqstore.open("/s", fs=fs, disk_gauge=gauge, cleaner_sleep_ms=sleeps.append) as store:
        ctx = store.supervisor.ctx
        assert ctx.disk_gauge is gauge and ctx.cleaner_sleep_ms == sleeps.append
        store.delete_expired_files_now()  # a manual round reads the disk through the gauge
        assert {path for path, _ in gauge.readings} >= {str(store.config.commitlog_dir)}
