"""bench_spark's report (medians, the Markdown table) and its place in `mqstore bench` (the Spark
runs themselves are not CI)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from mqstore.bench import bench_spark, cli
from mqstore.bench.bench_spark import _median, render_table
from mqstore.bench.report import render_markdown

# The least of a `mqstore bench` result that render_markdown reads.
SKELETON: dict[str, Any] = {"cases": [], "machine": {}, "mode": "full"}


def test_median_of_odd_and_even_samples() -> None:
    assert _median([3.0, 1.0, 2.0]) == 2.0
    assert _median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_table_shows_each_query_with_its_ratios_and_cpu() -> None:
    report = {
        "size_mb": 1024, "records": 1_048_576, "msg_size": 1024, "spark_cores": 2,
        "load_before": {"loadavg": [3.8, 5.0, 6.2]}, "load_after": {"loadavg": [7.1, 6.4, 6.5]},
        "results": [
            {"name": "rocketmq-count", "seconds": 4.0, "mb_per_s": 268.4, "best_mb_per_s": 300.0,
             "vs_parquet": 0.5, "vs_binaryfile": 1.25, "jvm_cpu_s": 3.1, "python_cpu_s": 1.2},
            {"name": "python-arrow", "seconds": 1.0, "mb_per_s": 1073.7},
        ],
    }  # fmt: skip
    lines = render_table(report).splitlines()
    assert "load average [3.8, 5.0, 6.2] before" in lines[0]
    assert lines[4] == "| rocketmq-count | 4.00 | 268.4 | 300.0 | 0.5 | 1.25 | 3.1 | 1.2 |"
    assert lines[5] == "| python-arrow | 1.00 | 1073.7 | 1073.7 |  |  |  |  |"


REPORT = {
    "size_mb": 1024, "records": 1_048_576, "msg_size": 1024, "spark_cores": 2,
    "load_before": {"loadavg": [1.0, 1.0, 1.0]}, "load_after": {"loadavg": [2.0, 2.0, 2.0]},
    "results": [{"name": "rocketmq-count", "seconds": 4.0, "mb_per_s": 268.4, "vs_parquet": 0.5, "vs_binaryfile": 1.25}],
}  # fmt: skip


@pytest.mark.parametrize("mode", ["quick", "tiny"])
def test_mqstore_bench_skips_the_spark_case_outside_full_mode_and_says_why(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_spark, "run", lambda **kw: pytest.fail("the Spark case ran in " + mode))
    got = cli.spark_case(mode, tmp_path)
    assert got["status"] == "skipped" and "full mode" in got["reason"]
    assert "Spark case skipped" in capsys.readouterr().err
    assert f"Spark pipeline: skipped ({got['reason']})" in render_markdown({**SKELETON, "spark": got})


def test_mqstore_bench_runs_bench_spark_in_full_mode_and_shows_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(bench_spark, "run", lambda **kw: calls.append(kw) or REPORT)
    monkeypatch.setattr(cli, "spark_unavailable_reason", lambda: None)
    got = cli.spark_case("full", tmp_path)
    assert calls == [{"size_mb": 1024, "segment_mb": 1024, "repeat": 3, "work_dir": str(tmp_path)}]
    assert got == {"status": "ok", **REPORT}
    text = render_markdown({**SKELETON, "spark": got})
    assert "| rocketmq-count | 4.00 | 268.4 | 268.4 | 0.5 | 1.25 |  |  |" in text


def test_a_failing_spark_case_is_reported_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(**kw: Any) -> dict[str, Any]:
        raise RuntimeError("count: rocketmq answered 1, parquet 2")

    monkeypatch.setattr(bench_spark, "run", boom)
    monkeypatch.setattr(cli, "spark_unavailable_reason", lambda: None)
    got = cli.spark_case("full", tmp_path)
    assert got["status"] == "failed" and "rocketmq answered 1" in got["reason"]


def test_bench_parses_no_spark() -> None:
    parser = argparse.ArgumentParser(prog="mqstore")
    cli.add_subcommands(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["bench", "--no-spark"]).no_spark
    assert not parser.parse_args(["bench"]).no_spark
