"""Batch side of mqstore: CommitLog segments as a Spark table, and jobs over it.

* `segments`  finding segments, walking record boundaries, planning splits (no Spark)
* `columnar`  decoding records into pyarrow RecordBatches, column by column (no Spark)
* `datasource` the `rocketmq` Python data source (Spark 4 API) and `read_commitlog`
* `session`   `get_spark()`: local[*] unless spark-submit or --master says otherwise
* `stats`, `export`, `reindex`, `lookup`  jobs, each a spark-submit script
* `cli`       `add_subcommands(subparsers)`: `mqstore spark <job> ...`

pyspark is an optional extra: importing this package (or `cli`, `args`) does not import it.
"""
