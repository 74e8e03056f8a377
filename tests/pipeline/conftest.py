"""Fixtures of the Spark pipeline tests: one SparkSession per process (local[2], 2 shuffle
partitions, no UI) and a generated store shared by the tests that only read it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest


def load_helpers() -> Any:
    """tests/ has no packages (importlib mode), so the helper module is loaded by path, once."""
    name = "mqstore_pipeline_test_helpers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("pipeline_helpers.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


h = load_helpers()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from mqstore.pipeline.session import get_spark

    session = get_spark(
        "local[2]",
        app_name="mqstore-tests",
        progress=False,
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def generated_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """About 3 MB of records in 64 KiB segments, shared by the tests that only read it."""
    return h.write_commitlog(tmp_path_factory.mktemp("gen") / "store", h.make_specs(3000))


