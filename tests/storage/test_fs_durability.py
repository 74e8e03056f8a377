"""A new file's or directory's name is made durable in its parent when it is created: msync
makes a segment's data durable, not the directory entry that finds it, and a segment that
vanished at a power loss with flushed records in it would be a hole (POSIX wants the
directory fsynced; ext4's ordered journal usually covers for it, other filesystems do not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqstore.storage import fs as fs_module
from mqstore.storage.fs import RealFileSystem


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = fs_module.fsync_dir

    def spy(directory: str) -> None:
        calls.append(directory)
        real(directory)

    monkeypatch.setattr(fs_module, "fsync_dir", spy)
    return calls


def test_a_created_file_has_its_directory_synced_once(tmp_path: Path, synced: list[str]) -> None:
    fs = RealFileSystem()
    path = tmp_path / ("%020d" % 0)
    region = fs.map_file(str(path), 8192, create=True)
    region.close()
    assert synced == [str(tmp_path)]
    for readonly in (False, True):  # opening it again creates nothing
        region = fs.map_file(str(path), 8192, create=not readonly, readonly=readonly)
        region.close()
    assert synced == [str(tmp_path)]


def test_created_directories_are_synced_in_their_parents(tmp_path: Path, synced: list[str]) -> None:
    fs = RealFileSystem()
    fs.makedirs(str(tmp_path / "consumequeue" / "T" / "0"))
    assert synced == [str(tmp_path), str(tmp_path / "consumequeue"), str(tmp_path / "consumequeue" / "T")]
    synced.clear()
    fs.makedirs(str(tmp_path / "consumequeue" / "T" / "0"))
    fs.makedirs(str(tmp_path / "consumequeue" / "T" / "1"))
    assert synced == [str(tmp_path / "consumequeue" / "T")]


def test_a_file_that_cannot_be_mapped_is_not_left_open(tmp_path: Path, synced: list[str]) -> None:
    fs = RealFileSystem()
    with pytest.raises(OSError):
        fs.map_file(str(tmp_path / "missing"), 8192, create=False)
    assert synced == []


def test_a_new_file_whose_set_up_failed_is_removed_so_the_retry_syncs_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: after a failed directory sync the file stayed, and the retry opened it
    as an old file and never synced its name."""
    import errno

    calls: list[str] = []

    def failing_once(directory: str) -> None:
        calls.append(directory)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected", directory)

    monkeypatch.setattr(fs_module, "fsync_dir", failing_once)
    path = str(tmp_path / ("%020d" % 0))
    with pytest.raises(OSError):
        RealFileSystem().map_file(path, 4096)
    RealFileSystem().map_file(path, 4096).close()
    assert calls == [str(tmp_path), str(tmp_path)]
