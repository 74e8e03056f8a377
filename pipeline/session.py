"""One way to get a SparkSession for mqstore's jobs.

Job code never names a master: `get_spark()` uses the one spark-submit was given, the one
passed in (`--master`), or `local[*]` when run as a plain script.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from .datasource import register


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(
    master: str | None = None,
    app_name: str = "mqstore",
    *,
    conf: Mapping[str, str] | None = None,
    progress: bool = True,
    log_level: str = "WARN",
) -> SparkSession:
    """A SparkSession with the `rocketmq` data source registered.

    Workers run this interpreter (the venv's), the driver binds to loopback unless told
    otherwise, the session time zone is UTC (hour buckets and export dates do not depend on
    the machine), and Spark's console progress bar shows long stages.
    """
    # Executors start Python workers with this interpreter, so they import the same mqstore.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not under_spark_submit():
        # The JVM picks its bind address before any conf is read; without this it warns and
        # advertises the machine's external address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    existing = SparkConf()
    if under_spark_submit():
        SparkContext._ensure_initialized()  # connect to spark-submit's JVM to see its --conf
        existing = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not under_spark_submit() and not existing.contains("spark.master"):
        builder = builder.master("local[*]")
    defaults = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "true" if progress else "false",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        # topic, queue_id, store_timestamp and commitlog_offset filters reach the reader.
        "spark.sql.python.filterPushdown.enabled": "true",
    }
    for key, value in defaults.items():
        if not existing.contains(key):
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark
