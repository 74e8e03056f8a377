"""bench_spark's report: medians and the Markdown table (the Spark runs themselves are not CI)."""

from __future__ import annotations

from mqstore.bench.bench_spark import _median, render_table


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
