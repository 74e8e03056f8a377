"""Spark finds `format("rocketmq")` through this package, with no registration call.

Spark 4 looks up Python data sources once per session by importing every top-level module
whose name starts with `pyspark_` and registering its `DefaultSource` under its `name()`
(pyspark/sql/worker/lookup_data_sources.py). This package is that hook and nothing else:
the data source lives in `mqstore.pipeline.datasource`, and this module is only imported in
Spark's Python workers, never by the driver process unless the user does.
"""

from __future__ import annotations

from mqstore.pipeline.datasource import RocketMQDataSource

# An alias, not a subclass: Spark pickles the class by reference, and one class keeps
# `spark.dataSource.register(RocketMQDataSource)` and the lookup from registering two.
DefaultSource = RocketMQDataSource

__all__ = ["DefaultSource"]
