"""`mqstore recover` run by another user than the store directory's owner (root on a store a
service user runs) warns that the files it makes will be its own, which the service's open then
refuses (review 65 F4). Needs root to hand the directory to another user; skips otherwise."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from mqstore.config import StoreConfig
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.recovery import warn_if_made_for_another_owner


def test_recover_by_another_user_than_the_owner_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing the store directory to another user needs root")
    caplog.set_level(logging.WARNING, logger="mqstore")
    root = tmp_path / "store"
    root.mkdir()
    cfg = StoreConfig.load(overrides={"store_path_root_dir": str(root)})
    warn_if_made_for_another_owner(cfg, RealFileSystem())
    assert not [r for r in caplog.records if "owned by this user" in r.getMessage()]  # root's own store
    os.chown(root, 65534, 65534)
    warn_if_made_for_another_owner(cfg, RealFileSystem())
    said = [r for r in caplog.records if "owned by this user" in r.getMessage()]
    assert len(said) == 1 and said[0].mqstore_event["store_owner_uid"] == 65534  # type: ignore[attr-defined]
