"""Fixtures for the read-side tests: stores opened in tmp dirs and closed at teardown.
Helpers live in read_helpers.py, loaded once as `mqstore_read_test_helpers`."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import MessageStore

HELPERS = "mqstore_read_test_helpers"
if HELPERS not in sys.modules:
    _spec = importlib.util.spec_from_file_location(HELPERS, Path(__file__).with_name("read_helpers.py"))
    assert _spec is not None and _spec.loader is not None
    sys.modules[HELPERS] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[HELPERS])
h = sys.modules[HELPERS]


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., MessageStore]]:
    """open_store(**settings) -> a running store in tmp_path/store; all closed at teardown."""
    opened: list[MessageStore] = []

    def open_(root: Path | None = None, **settings: Any) -> MessageStore:
        store = mqstore.open(root or tmp_path / "store", **{**h.SMALL, **settings})
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()

