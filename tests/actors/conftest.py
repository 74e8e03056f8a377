"""Fixtures of the actor-level tests. tests/ has no packages (importlib mode), so the helper
module is loaded by path, once, as `mqstore_actor_test_helpers`; test modules take it from
sys.modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

HELPERS = "mqstore_actor_test_helpers"


def load_helpers() -> Any:
    if HELPERS not in sys.modules:
        spec = importlib.util.spec_from_file_location(HELPERS, Path(__file__).with_name("actor_helpers.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[HELPERS] = module
        spec.loader.exec_module(module)
    return sys.modules[HELPERS]


load_helpers()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"
