"""Recovery-scan benchmark (not in CI): how fast start-up recovery reads a CommitLog.

Generates a commitlog of --gib GiB of 1 KiB messages directly with the codec (one segment's
bytes are built in memory from one encoded template, patched per record, and written in one
go), then times, on that directory:

* recover_normally   (clean stop: CRC-checked scan of the last three segments)
* recover_abnormally (crash, no checkpoint: CRC-checked scan of every segment, each record
  decoded and handed to the dispatch callback)
* recover_store      (crash: the whole start-up recovery, i.e. the scan above plus the pass
  that rebuilds the topic-queue table from the re-dispatch start)

The log is healthy, so truncation changes nothing and the same files serve every run.
Prints a table and writes JSON to bench/results/recovery-<ts>.json.

    /work/venv/bin/python -m mqstore.bench.bench_recovery [--gib 1] [--segment-mib 1024] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable

from mqstore.config import StoreConfig
from mqstore.storage import codec
from mqstore.storage.commitlog import CommitLog
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.recovery import recover_store

BODY = b"r" * 1024
TOPIC = "bench"
END_FILE_MIN_BLANK_LENGTH = 8  # a record must leave room for the END_OF_FILE header (§3.7)


def _clock_ms() -> int:
    return time.time_ns() // 1_000_000


def generate(commitlog_dir: str, total_bytes: int, segment_bytes: int) -> int:
    """Write segments until `total_bytes` of records; returns the number of messages."""
    os.makedirs(commitlog_dir, exist_ok=True)
    host = codec.HostAddress("127.0.0.1", 10911)
    props = codec.properties_to_string({"KEYS": "k", "UNIQ_KEY": "0" * 32})
    template = codec.encode_message(topic=TOPIC, queue_id=0, body=BODY, properties=props,
                                    born_host=host, store_host=host)  # fmt: skip
    size = len(template)
    messages = 0
    offset = 0
    now = _clock_ms()
    while offset < total_bytes:
        seg = bytearray(segment_bytes)
        pos = 0
        while pos + size + END_FILE_MIN_BLANK_LENGTH <= segment_bytes and offset + pos < total_bytes:
            seg[pos : pos + size] = template
            codec.patch_record(seg, pos, queue_offset=messages, commitlog_offset=offset + pos,
                               store_timestamp=now + messages // 1000)  # fmt: skip
            messages += 1
            pos += size
        if offset + pos < total_bytes:  # the segment is full: END_OF_FILE filler
            seg[pos : pos + 8] = codec.blank_record_header(segment_bytes - pos)
        with open(os.path.join(commitlog_dir, codec.segment_file_name(offset)), "wb") as f:
            f.write(seg)
        offset += segment_bytes
    return messages


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    end = fn()
    return time.perf_counter() - started, end


def run(root: str, gib: float, segment_mib: int) -> dict[str, Any]:
    segment = segment_mib * 1024 * 1024
    total = int(gib * (1 << 30))
    cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commitlog_bytes=segment)
    t0 = time.perf_counter()
    messages = generate(cfg.commitlog_dir, total, segment)
    gen_s = time.perf_counter() - t0
    fs = RealFileSystem()
    files = len(os.listdir(cfg.commitlog_dir))

    def commitlog() -> CommitLog:
        log = CommitLog(fs, cfg.commitlog_dir, mapped_file_size=segment, max_message_size=cfg.max_message_size_bytes,
                        clock_ms=_clock_ms, check_crc_on_recover=True)  # fmt: skip
        assert log.load()
        return log

    def normally() -> int:
        log = commitlog()
        try:
            return log.recover_normally(-1)
        finally:
            log.shutdown()

    dispatched = [0]

    def abnormally() -> int:
        log = commitlog()
        try:
            return log.recover_abnormally(0, lambda _r: dispatched.__setitem__(0, dispatched[0] + 1))
        finally:
            log.shutdown()

    def whole() -> int:
        return recover_store(cfg, fs, last_exit_ok=False, clock_ms=_clock_ms).max_offset

    rows = []
    for name, fn, scanned in (
        ("recover_normally", normally, min(files, 3) * segment),
        ("recover_abnormally", abnormally, total),
        ("recover_store (crash)", whole, total),
    ):
        seconds, end = _timed(fn)
        assert end >= total - segment, (name, end, total)
        data = min(scanned, end)
        rows.append({"scan": name, "bytes": data, "seconds": round(seconds, 3),
                     "gb_per_s": round(data / seconds / 1e9, 4), "msgs_per_s": round(data / (size_of(end, messages)) / seconds)})  # fmt: skip
    return {"gib": gib, "segment_mib": segment_mib, "segments": files, "messages": messages,
            "message_bytes": len(BODY), "generate_seconds": round(gen_s, 2), "results": rows}  # fmt: skip


def size_of(end: int, messages: int) -> float:
    return end / max(messages, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="commitlog size to generate (GiB; default 1)")
    ap.add_argument("--segment-mib", type=int, default=1024, help="segment size (MiB; default 1024, RocketMQ's)")
    ap.add_argument("--dir", default=None, help="where to build the store (default: a temp dir, removed after)")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="mqstore-bench-recovery-")
    try:
        result = run(root, args.gib, args.segment_mib)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{result['messages']} messages of {len(BODY)} B in {result['segments']} segments of "
          f"{args.segment_mib} MiB (generated in {result['generate_seconds']} s)")  # fmt: skip
    print(f"{'scan':<24}{'bytes':>14}{'seconds':>10}{'GB/s':>9}{'msgs/s':>12}")
    for r in result["results"]:
        print(f"{r['scan']:<24}{r['bytes']:>14}{r['seconds']:>10}{r['gb_per_s']:>9}{r['msgs_per_s']:>12}")
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"recovery-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"written {path}")


if __name__ == "__main__":
    main()
