"""Rebuild consumequeue/ and index/ from the commitlog alone, in parallel (spec §8.5, §9, §10).

    spark-submit pipeline/reindex.py STORE_DIR OUT_DIR [--cq-file-size B] [--max-index-num N]
    mqstore spark reindex STORE_DIR OUT_DIR [--master URL]

The bytes are written by the store's own writers (`storage.consume_queue.ConsumeQueue`,
`storage.index.IndexFile`) fed in dispatch order, so the formats live in one place; Spark
decides who writes what:
* ConsumeQueue: one task per (topic, queueId), units in commitlog order. PREPARED and
  ROLLBACK messages are not queued (§8.5). Byte-identical to what the store builds.
* Index: entries are numbered in commitlog order (UNIQ_KEY, then each KEYS token; ROLLBACK
  not indexed) and file k takes entries [k*(maxIndexNum-1), (k+1)*(maxIndexNum-1)), which is
  how IndexService fills files. One task per index file; each file starts from the previous
  file's last entry (§10.6 quirk), computed on the driver. File names are the first entry's
  store time (the store names files by its clock, which a rebuild cannot know), kept strictly
  increasing as IndexService does.

Tasks write to OUT_DIR directly, so OUT_DIR must be on a file system every executor shares
with the driver (local mode, or one host, or a shared mount). OUT_DIR's consumequeue/ and
index/ must be absent or empty: a rebuild never deletes or appends to queue or index files,
and refuses a store that is running there (`outputs.claim_reindex_target`). To rebuild a
stopped store's own files, move them aside first; queues whose records have all left the
log cannot be rebuilt from it, so keep those.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from mqstore.cli import CliError, ExitCode
from mqstore.config import ConfigError, StoreConfig
from mqstore.log import get_logger
from mqstore.pipeline.args import parser_for, reindex_args
from mqstore.pipeline.datasource import count_expired_log, read_commitlog
from mqstore.pipeline.outputs import claim_reindex_target, refuse_overlap
from mqstore.pipeline.session import get_spark
from mqstore.storage.codec import (
    MAX_TOPIC_BYTES,
    TOPIC_NAME_JAVA_REGEX,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    names_a_queue,
)
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.queue_ledger import unpack_ledger_file
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import IndexFile, index_file_name, index_file_name_after

log = get_logger(__name__)

REINDEX_COLUMNS = [
    "commitlog_offset", "size", "topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp",
    "tags_code", "keys", "uniq_key", "error",
]  # fmt: skip

_CQ_RESULT = "topic string, queue_id int, units long, max_offset long"
_CQ_ARROW_SCHEMA = pa.schema([("topic", pa.string()), ("queue_id", pa.int32()), ("units", pa.int64()),
                              ("max_offset", pa.int64())])  # fmt: skip
_INDEX_RESULT = "file_no long, name string, entries long"


def _messages(spark: SparkSession, store: str, split_size: str | None, strict: bool, log_dir: str) -> DataFrame:
    df = read_commitlog(spark, [store], columns=REINDEX_COLUMNS, split_size=split_size, strict=strict,
                        corrupt_log=log_dir)  # fmt: skip
    # Timestamps as epoch ms (the writers take ms); corrupt ranges are not messages.
    return df.where(F.col("error").isNull()).withColumn("store_ms", F.unix_millis("store_timestamp"))


def cleaned_floors(store: str, root: str | None = None) -> dict[tuple[str, int], int]:
    """The queue ledger's floors of the queues `clean_unused_topic` removed: the commitlog
    offset below which a queue's records are the removed queue's, which get no unit (review 126
    F1: rebuilt, they took the queue offsets of puts acknowledged after the clean). Read from
    the store `root` where it is known (the settings' `store_path_commitlog` keeps the log
    elsewhere: review 128 F2); else a store's `commitlog/` given alone is read with the ledger
    beside it, and another directory of segments has none to read. A ledger that cannot be
    read refuses the rebuild."""
    if root is None:
        root = store
        if _source_of(store) == store:  # a commitlog directory given alone: the store's `commitlog/`?
            absolute = os.path.abspath(store)
            if os.path.basename(absolute.rstrip(os.sep)) != "commitlog":
                return {}
            root = os.path.dirname(absolute.rstrip(os.sep))  # (review 127 F2: its ledger was not read)
    path = os.path.join(root, "queue_ledger.msgpack")  # (StoreConfig.queue_ledger_path)
    if not os.path.lexists(path):
        return {}
    try:
        with open(path, "rb") as f:
            return dict(unpack_ledger_file(f.read()).cleaned)
    except (OSError, ValueError) as exc:  # (LedgerError and UnknownVersionError are ValueErrors)
        raise CliError(ExitCode.FAILURE, f"{path} cannot be read ({exc}): without its floors a rebuild would give the "
                       "queues clean_unused_topic removed their old records back; make it readable, or open the "
                       "store, which rebuilds its queues itself") from None  # fmt: skip


def build_consume_queues(
    messages: DataFrame, out_dir: str, mapped_file_size: int, floors: dict[tuple[str, int], int] | None = None
) -> list[dict[str, Any]]:
    root = os.path.join(out_dir, "consumequeue")
    floors = floors or {}
    tx = F.col("sys_flag").bitwiseAND(TRANSACTION_MASK)
    # A record whose topic or queue id cannot name a queue gets no unit, as the store's dispatch
    # gives it none (a flipped bit of a header the body CRC does not cover, or a crafted log):
    # its name became a path, "../x" or "/rders" outside OUT_DIR (review 126 F2).
    names_a_queue_ = (F.col("topic").rlike(TOPIC_NAME_JAVA_REGEX) & (F.length("topic") <= MAX_TOPIC_BYTES)
                      & (F.col("queue_id") >= 0))  # fmt: skip
    queued = messages.where(~tx.isin(TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE) & names_a_queue_).select(
        "topic", "queue_id", "commitlog_offset", "size", "tags_code", "queue_offset"
    )

    def write_queue(table: pa.Table) -> pa.Table:
        t = table.sort_by("commitlog_offset")  # dispatch order is commitlog order
        topic, queue_id = t["topic"][0].as_py(), t["queue_id"][0].as_py()
        if not names_a_queue(topic, queue_id):  # (filtered above: never a path outside OUT_DIR)
            raise ValueError(f"a record's topic {topic!r} or queue id {queue_id} cannot name a queue")
        floor = floors.get((topic, queue_id))
        if floor is not None:  # the records of the queue clean_unused_topic removed
            t = t.filter(pc.greater_equal(t["commitlog_offset"], floor))
            if t.num_rows == 0:
                return _CQ_ARROW_SCHEMA.empty_table()
        cq = ConsumeQueue(RealFileSystem(), topic, queue_id, root, mapped_file_size=mapped_file_size,
                          clock_ms=lambda: int(time.time() * 1000))  # fmt: skip
        cq.load()
        for off, size, tags, qoff in zip(
            t["commitlog_offset"].to_pylist(), t["size"].to_pylist(), t["tags_code"].to_pylist(), t["queue_offset"].to_pylist()
        ):
            if not cq.put_message_position_info(off, size, tags, qoff):
                raise OSError(f"cannot write consume queue {topic}/{queue_id} at queue offset {qoff}")
        cq.flush(0)
        max_offset = cq.get_max_offset_in_queue()
        cq.mapped_file_queue.shutdown(0)
        return pa.table({"topic": [topic], "queue_id": [queue_id], "units": [t.num_rows], "max_offset": [max_offset]},
                        schema=_CQ_ARROW_SCHEMA)  # fmt: skip

    rows = queued.groupBy("topic", "queue_id").applyInArrow(write_queue, _CQ_RESULT).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: (r["topic"], r["queue_id"]))


def index_entries(messages: DataFrame, max_index_num: int) -> DataFrame:
    """One row per index entry: rank (global, commitlog order), file_no, key, phy, store_ms."""
    tx = F.col("sys_flag").bitwiseAND(TRANSACTION_MASK)
    tokens = F.filter(F.split(F.coalesce(F.col("keys"), F.lit("")), " "), lambda k: k != "")
    keys = F.concat(F.when(F.col("uniq_key").isNotNull(), F.array(F.col("uniq_key"))).otherwise(F.array()), tokens)
    per_msg = (
        messages.where(tx != TRANSACTION_ROLLBACK_TYPE)
        .select("topic", "commitlog_offset", "store_ms", keys.alias("keys"))
        .withColumn("n", F.size("keys"))
        .where(F.col("n") > 0)
    )
    # The running count needs one global order; it is one long per message, so a single
    # partition is fine at commitlog scale (a GiB of 1 KiB messages is a million rows).
    w = Window.orderBy("commitlog_offset").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = per_msg.withColumn("first_rank", F.sum("n").over(w) - F.col("n"))
    entries = ranked.select(
        "topic", "commitlog_offset", "store_ms", "first_rank", F.posexplode("keys").alias("pos", "k")
    ).withColumn("rank", F.col("first_rank") + F.col("pos"))
    per_file = max_index_num - 1  # entry 0 is never used
    return entries.select(
        "rank",
        (F.col("rank") / F.lit(per_file)).cast("long").alias("file_no"),
        F.concat(F.col("topic"), F.lit("#"), F.col("k")).alias("key"),
        F.col("commitlog_offset").alias("phy"),
        "store_ms",
    )


def _file_plan(entries: DataFrame) -> dict[int, dict[str, int | str]]:
    """Per index file: the previous file's last entry (begin values) and a name."""
    rows = (
        entries.groupBy("file_no")
        .agg(
            F.min_by("store_ms", "rank").alias("first_ms"),
            F.max_by("phy", "rank").alias("last_phy"),
            F.max_by("store_ms", "rank").alias("last_ms"),
        )
        .orderBy("file_no")
        .collect()
    )
    plan: dict[int, dict[str, int | str]] = {}
    prev_phy, prev_ms, last_name = 0, 0, ""
    for r in rows:
        name = index_file_name(r["first_ms"])
        if name <= last_name:  # (a clock stepped back, a DST fall-back: as IndexService names them)
            name = index_file_name_after(last_name)
        plan[r["file_no"]] = {"name": name, "prev_phy": prev_phy, "prev_ms": prev_ms}
        prev_phy, prev_ms, last_name = r["last_phy"], r["last_ms"], name
    return plan


def build_index(messages: DataFrame, out_dir: str, max_hash_slot_num: int, max_index_num: int) -> list[dict[str, Any]]:
    index_dir = os.path.join(out_dir, "index")
    entries = index_entries(messages, max_index_num).cache()
    try:
        plan = _file_plan(entries)
        if not plan:
            return []

        def write_file(table: pa.Table) -> pa.Table:
            t = table.sort_by("rank")
            file_no = t["file_no"][0].as_py()
            p = plan[file_no]
            fs = RealFileSystem()
            fs.makedirs(index_dir)
            f = IndexFile.create(fs, os.path.join(index_dir, str(p["name"])), max_hash_slot_num=max_hash_slot_num,
                                 max_index_num=max_index_num, end_phy_offset=int(p["prev_phy"]),
                                 end_timestamp=int(p["prev_ms"]))  # fmt: skip
            try:
                for key, phy, ms in zip(t["key"].to_pylist(), t["phy"].to_pylist(), t["store_ms"].to_pylist()):
                    if not f.put_key(key, phy, ms):
                        raise AssertionError(f"index file {p['name']} full before its planned entries")
                f.flush()
            finally:
                f.close()
            return pa.table({"file_no": [file_no], "name": [str(p["name"])], "entries": [t.num_rows]},
                            schema=pa.schema([("file_no", pa.int64()), ("name", pa.string()), ("entries", pa.int64())]))  # fmt: skip

        rows = entries.groupBy("file_no").applyInArrow(write_file, _INDEX_RESULT).collect()
    finally:
        entries.unpersist()
    return sorted((r.asDict() for r in rows), key=lambda r: r["file_no"])


def reindex(
    spark: SparkSession,
    store: str,
    out_dir: str,
    *,
    cq_file_size: int = 6_000_000,
    max_hash_slot_num: int = 5_000_000,
    max_index_num: int = 20_000_000,
    with_index: bool = True,
    split_size: str | None = None,
    strict: bool = False,
) -> dict[str, Any]:
    out_dir = os.path.abspath(out_dir)
    with claim_reindex_target(out_dir, [_source_of(store)]):
        return _rebuild(spark, store, out_dir, cq_file_size=cq_file_size, max_hash_slot_num=max_hash_slot_num,
                        max_index_num=max_index_num, with_index=with_index, split_size=split_size, strict=strict)  # fmt: skip


def _source_of(store: str) -> str:
    """What a rebuild reads: the store's commitlog directory (or the directory given)."""
    return os.path.join(store, "commitlog") if os.path.isdir(os.path.join(store, "commitlog")) else store


def _rebuild(
    spark: SparkSession,
    store: str,
    out_dir: str,
    *,
    cq_file_size: int,
    max_hash_slot_num: int,
    max_index_num: int,
    with_index: bool,
    split_size: str | None,
    strict: bool,
    root: str | None = None,
) -> dict[str, Any]:
    """The rebuild itself, into directories `claim_reindex_target` holds."""
    # Where the tasks say which segments the store's retention deleted before they read them
    # (review 56 M2): a rebuild of a running store then lacks those records, which the summary
    # says (OUT_DIR is shared with every executor already).
    floors = cleaned_floors(store, root)  # (before Spark reads anything: a refusal costs nothing)
    log_dir = _read_log_dir(store, out_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    messages = _messages(spark, store, split_size, strict, log_dir).cache()
    try:
        queues = build_consume_queues(messages, out_dir, cq_file_size, floors)
        files = build_index(messages, out_dir, max_hash_slot_num, max_index_num) if with_index else []
        expired = count_expired_log(log_dir)
    finally:
        messages.unpersist()
        shutil.rmtree(log_dir, ignore_errors=True)
    log.info("reindex done", queues=len(queues), index_files=len(files), expired_segments=expired)
    return {"out": out_dir, "consume_queues": queues, "index_files": files, "expired_segments": expired}


def _read_log_dir(store: str, out_dir: str) -> str:
    """Where the tasks say what they could not read: inside OUT_DIR, shared with every
    executor already; beside it where OUT_DIR is the store read (a rebuild in place), since the
    data source refuses a read log inside a store it reads (review 108 F7). Review 126 F3: the
    README's rebuild in place always failed there, after Spark had started."""
    inside = os.path.join(out_dir, ".reindex-read-log")
    try:
        refuse_overlap(inside, [store], "corruptLog")
        return inside
    except CliError:
        parent, name = os.path.split(os.path.abspath(out_dir))
        if os.access(parent, os.W_OK | os.X_OK):
            return os.path.join(parent, f".{name}.reindex-read-log")
        return tempfile.mkdtemp(prefix="mqstore-reindex-read-log-")  # (local mode: the driver's disk)


def build_parser() -> argparse.ArgumentParser:
    return parser_for("reindex", __doc__, reindex_args)


def places_of(store: str, cfg: StoreConfig) -> tuple[str, str | None]:
    """(what the rebuild reads, the store root whose queue ledger it reads, or None to find
    it beside what it reads). Where the settings keep the commitlog elsewhere
    (`store_path_commitlog`) and STORE is that store's root or its commitlog directory, the
    commitlog and the root (review 128 F2: the root alone read no segment, and the commitlog
    directory alone no ledger)."""
    if cfg.store_path_commitlog:
        given = os.path.realpath(store)
        root, commitlog = os.path.realpath(cfg.root_dir), os.path.realpath(cfg.commitlog_dir)
        if given in (root, commitlog):
            return cfg.commitlog_dir, cfg.root_dir
    return store, None


def settings_of(args: argparse.Namespace) -> StoreConfig:
    """The store's settings (`mqstore --config FILE`, MQSTORE_* variables, the defaults) with
    the command line's geometry over them, checked as settings are (review 126 F6: a
    --max-index-num of 1 divided by zero)."""
    given = {"mapped_file_size_consume_queue_bytes": args.cq_file_size, "max_hash_slot_num": args.max_hash_slot_num,
             "max_index_num": args.max_index_num}  # fmt: skip
    try:
        return StoreConfig.load(getattr(args, "config", None), overrides={k: v for k, v in given.items() if v is not None})
    except ConfigError as exc:
        raise CliError(ExitCode.USAGE, str(exc)) from None


def run(args: argparse.Namespace) -> int:
    out_dir = os.path.abspath(args.out)
    cfg = settings_of(args)
    source, root = places_of(args.store, cfg)
    with claim_reindex_target(out_dir, [_source_of(source)]):  # refusals before the JVM starts
        spark = get_spark(args.master, app_name="mqstore-reindex")
        summary = _rebuild(spark, source, out_dir, cq_file_size=cfg.mapped_file_size_consume_queue_bytes,
                           max_hash_slot_num=cfg.max_hash_slot_num, max_index_num=cfg.max_index_num,
                           with_index=not args.no_index, split_size=args.split_size, strict=args.strict, root=root)  # fmt: skip
    sys.stdout.write(json.dumps(summary) + "\n")
    if summary["expired_segments"]:
        sys.stderr.write(f"reindex: {summary['expired_segments']} segments were deleted by the store's retention while "
                         "the job ran: their records are not in the rebuilt files, whose queues may hold filler units "
                         "there (rebuild a stopped store)\n")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except CliError as exc:  # spark-submit: a refusal is a line and an exit code, as in `mqstore spark`
        sys.stderr.write(f"reindex: {exc.message}\n")
        return int(exc.code)


if __name__ == "__main__":
    sys.exit(main())
