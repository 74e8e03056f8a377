"""`mqstore demo`'s Spark stats job, in the pipeline tests' worker: the demo borrows the session
running there (getOrCreate). In a worker of its own it started a second JVM, ~80 s of a loaded
CI run. tests/tools/test_demo.py checks the rest of the demo's report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from mqstore.cli import ExitCode, main

pytestmark = pytest.mark.spark


def _demo_report_checks() -> Any:
    """tests/tools/test_demo.py, loaded by path (tests/ has no packages), for its
    check_consistent: the whole report checked as the demo's other tests check it."""
    spec = importlib.util.spec_from_file_location("mqstore_demo_report_checks",
                                                  Path(__file__).parents[1] / "tools" / "test_demo.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_spark_stats_job_counts_what_the_queues_hold(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = tmp_path / "small.toml"  # 1 MiB segments: Spark has less sparse space to split
    small.write_text("mapped_file_size_commitlog_bytes = 1048576\nmax_hash_slot_num = 10000\nmax_index_num = 40000\n")
    code = main(["--config", str(small), "demo", "--json", "--no-progress", "--store-dir", str(tmp_path / "d"),
                 "--messages", "1500"])  # fmt: skip
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert code == ExitCode.OK, err
    _demo_report_checks().check_consistent(report, 1500)
    job = report["spark"]
    assert job["ran"] and job["matches_queues"] and job["corrupt_records"] == 0
    assert job["messages"] == 1500
    assert job["topics"] == {t: v["put_ok"] for t, v in report["topics"].items()}
    assert all(v["spark_messages"] == v["put_ok"] for v in report["topics"].values())
    assert spark.range(3).count() == 3  # the borrowed session still runs
