"""`spark.read.format("rocketmq")` in a plain pyspark process: no mqstore import, no
registration call; Spark finds the `pyspark_rocketmq` package by its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]  # loaded by conftest.py (tests/ has no packages)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PACKAGE = Path(mqstore.__file__).resolve().parent / "pyspark_rocketmq"

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    df = spark.read.format("rocketmq").load(sys.argv[1])
    got = {
        "count": df.count(),
        "topics": sorted(r[0] for r in df.select("topic").distinct().collect()),
        # The lookup and the reads run in Spark's Python workers: the driver imports nothing.
        "driver_imported": sorted(m for m in sys.modules if m.split(".")[0] in ("mqstore", "pyspark_rocketmq")),
    }
    spark.stop()
    print("RESULT " + json.dumps(got))
    """
)


def test_a_fresh_pyspark_process_reads_a_store_by_format_name_without_registering(tmp_path: Path) -> None:
    # The package as an installed wheel lays it out: a top-level `pyspark_rocketmq` on the path
    # (the wheel's contents are checked in tests/test_packaging.py). Independent of how this
    # checkout is installed: setuptools' editable finder hides packages from Spark's lookup.
    site = tmp_path / "site"
    site.mkdir()
    (site / "pyspark_rocketmq").symlink_to(PACKAGE, target_is_directory=True)
    script = tmp_path / "plain_session.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "PYSPARK_", "SPARK_"))}
    env.update(PYTHONPATH=str(site), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    sample = h.BROKER_SAMPLES[0]
    result = subprocess.run(
        [sys.executable, str(script), str(sample)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert result.returncode == 0 and lines, f"{result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    got = json.loads(lines[-1][len("RESULT ") :])
    expected = [rec for _, _, rec in h.reference_records([sample])]
    assert got["count"] == len(expected) > 0
    assert got["topics"] == sorted({rec.topic for rec in expected})
    assert got["driver_imported"] == []
