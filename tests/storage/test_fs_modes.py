"""Modes and owners of what the store writes (review 65 F7): `write_atomic`'s files were
created 0666 and directories 0777, so under umask 000 any local user could rewrite the queue
ledger or the committed consumer offsets; and each rewrite undid an operator's chmod or chown
of such a file."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.storage import fs as fs_module
from mqstore.storage.fs import RealFileSystem


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_and_directories_are_not_world_writable_under_umask_000(tmp_path: Path, umask_000: None) -> None:
    fs = RealFileSystem()
    fs.makedirs(str(tmp_path / "a" / "b" / "c"))
    assert [_mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o755] * 3
    fs.write_atomic(str(tmp_path / "a" / "consumerOffset.json"), b"{}")
    assert _mode(tmp_path / "a" / "consumerOffset.json") == 0o644
    region = fs.map_file(str(tmp_path / "a" / "b" / "c" / "00000000000000000000"), 4096)
    region.close()
    assert _mode(tmp_path / "a" / "b" / "c" / "00000000000000000000") == 0o644  # as before


def test_a_file_in_the_way_of_a_directory_still_raises(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        RealFileSystem().makedirs(str(tmp_path / "f"))
    with pytest.raises(OSError):
        RealFileSystem().makedirs(str(tmp_path / "f" / "g"))


def test_a_rewrite_keeps_the_operators_mode(tmp_path: Path, umask_000: None) -> None:
    fs = RealFileSystem()
    path = tmp_path / "queue_ledger.msgpack"
    fs.write_atomic(str(path), b"one")
    os.chmod(path, 0o600)
    fs.write_atomic(str(path), b"two")
    assert path.read_bytes() == b"two" and _mode(path) == 0o600
    os.chmod(path, 0o640)
    fs.write_atomic(str(path), b"three")
    assert _mode(path) == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner takes root")
def test_a_rewrite_by_root_keeps_the_owner(tmp_path: Path) -> None:
    fs = RealFileSystem()
    path = tmp_path / "consumerOffset.json"
    fs.write_atomic(str(path), b"{}")
    os.chown(path, 65534, 65534)
    fs.write_atomic(str(path), b'{"a": 1}')
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (65534, 65534) and path.read_bytes() == b'{"a": 1}'


def test_an_owner_that_cannot_be_kept_never_fails_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = RealFileSystem()
    path = tmp_path / "stats.msgpack"
    fs.write_atomic(str(path), b"one")
    tried: list[int] = []

    def refuse(fd: int, *args: object) -> None:
        tried.append(fd)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(fs_module.os, "fchown", refuse)
    monkeypatch.setattr(fs_module.os, "fchmod", refuse)
    monkeypatch.setattr(fs_module.os, "geteuid", lambda: 12345)  # another owner than the file's
    fs.write_atomic(str(path), b"two")
    assert path.read_bytes() == b"two" and len(tried) == 2
    assert not (tmp_path / "stats.msgpack.tmp").exists()


def test_a_symlink_replaced_by_write_atomic_lends_it_neither_mode_nor_owner(tmp_path: Path) -> None:
    """Review 66 F3: the mode and owner kept were the link target's (os.stat follows links)."""
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    os.chmod(target, 0o666)
    link = tmp_path / "consumerOffset.json"
    link.symlink_to(target)
    old_umask = os.umask(0o022)
    try:
        RealFileSystem().write_atomic(str(link), b"{}")
    finally:
        os.umask(old_umask)
    assert not link.is_symlink() and stat.S_IMODE(link.stat().st_mode) == 0o644
    assert stat.S_IMODE(target.stat().st_mode) == 0o666  # the target untouched
