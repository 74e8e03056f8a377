"""Opening a store and the recovery scan (issue 18), part of `mqstore bench` (our cases only).

One store per body size, `BenchConfig.open_store_bytes` of commitlog (quick: 64 MiB, full:
2 GiB), is filled through the public API by a child process that is then killed with
SIGKILL once every put is acknowledged and dispatched: the *crashed* store. A copy opened and
closed once is the *clean* store. Per repeat:

* `open_clean`: `mqstore.open` of the clean store, until it returns (`open_s`), and the CPU
  seconds of the process's threads meanwhile (`open_cpu_s`: the VM's 2 cores are shared, and
  wall time swings with the load).
* `open_crash`: `mqstore.open` of a fresh copy of the crashed store, until it returns
  (`open_s`, `open_cpu_s`: crash recovery; re-dispatch runs after the open returns) and until
  the queues and the index are rebuilt (`ready_s`, `ready_cpu_s`: what RocketMQ's own
  recovery, which dispatches as it scans, compares with); and its floor in the same run, the
  crash recovery alone (`recover_s`: `recover_store` on another fresh copy, no actors, no
  re-dispatch). Their difference is what re-dispatch adds.
* `recovery`: the CommitLog recovery scan over every segment of the clean store, body CRC
  checked (`gb_per_s`, data bytes over seconds), and in the same run the plain-read floor:
  zlib.crc32 over the same bytes through a fresh map (`floor_gb_per_s`).

The stores live beside the repeats' work directories and are removed after the last repeat.

    python -m mqstore.bench.bench_open fill DIR --bytes N --body B   (the child; prints "ready")
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from mqstore.bench.harness import ASYNC, Outcome, Recorder, run_case, timed
from mqstore.bench.workload import BATCH_SIZE_MSGS, QUEUE_COUNT, TAGS, TOPIC, BenchConfig

__all__ = ["OpenCases", "copy_store", "fill_store", "scan_and_floor"]

FILL_TIMEOUT_S = 900.0
# The bytes a record takes besides its body (header, topic, KEYS/TAGS/UNIQ_KEY properties): to
# size the fill by commitlog bytes. A guess; the fill stops at the commitlog's real size.
_RECORD_OVERHEAD_BYTES = 150


def fill_store(path: str, total_bytes: int, body_bytes: int, config: dict[str, Any]) -> int:
    """Put batches of 32 until the commitlog holds `total_bytes`; wait until every message is
    visible through `get` (dispatched). Returns the number of messages. Leaves the store open
    (the caller is killed, or closes it)."""
    import random

    import mqstore

    rng = random.Random(total_bytes ^ body_bytes)
    pool = rng.randbytes(body_bytes * 64 + 4096)
    store = mqstore.open(path, flush_disk_type="ASYNC_FLUSH", **config)
    count = 0
    newest: dict[int, int] = {}
    batch_no = 0
    while count * (body_bytes + _RECORD_OVERHEAD_BYTES) < total_bytes:
        queue_id = batch_no % QUEUE_COUNT
        batch = [
            mqstore.Message(topic=TOPIC, queue_id=queue_id, body=pool[(i * 61) % 4096 : (i * 61) % 4096 + body_bytes],
                            tags=TAGS[i % len(TAGS)], keys=[f"open-{i:010d}"])  # fmt: skip
            for i in range(count, count + BATCH_SIZE_MSGS)
        ]
        r = store.put_batch(batch)
        if not r.ok:
            raise RuntimeError(f"put_batch failed: {r.status}")
        newest[queue_id] = r.queue_offset + r.msg_num - 1
        count += BATCH_SIZE_MSGS
        batch_no += 1
    for queue_id, offset in newest.items():
        if not store.wait_for_messages(TOPIC, queue_id, offset, FILL_TIMEOUT_S):
            raise RuntimeError(f"{TOPIC}/{queue_id}: offset {offset} not dispatched after {FILL_TIMEOUT_S}s")
    return count


def _build(root: Path, total_bytes: int, body_bytes: int, config: dict[str, Any]) -> tuple[Path, Path, int, int]:
    """(crashed store, clean store, messages, commitlog bytes) under `root`, built once per body size."""
    crashed, clean = root / "crashed", root / "clean"
    cmd = [sys.executable, "-m", "mqstore.bench.bench_open", "fill", str(crashed), "--bytes", str(total_bytes),
           "--body", str(body_bytes), "--config", repr(config)]  # fmt: skip
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line.startswith("ready "):
            child.wait(FILL_TIMEOUT_S)
            raise RuntimeError(f"filling {crashed} failed: {line!r} {child.stderr.read() if child.stderr else ''}")
        messages = int(line.split()[1])
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)  # the crash: every put acknowledged, nothing closed
        child.wait(FILL_TIMEOUT_S)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    copy_store(crashed, clean)
    import mqstore

    with mqstore.open(clean, **config) as store:  # recovered once, then stopped cleanly
        log_end = store.dispatch_progress()[0]
    return crashed, clean, messages, log_end


def copy_store(source: Path, target: Path) -> None:
    """Copy a store keeping its files' holes, as the crash left them (shutil's copy writes the
    unwritten tail of a 1 GiB segment as zeros: other files, and a slower open)."""

    def copy_sparse(src: str, dst: str) -> None:
        from mqstore.storage.fs import RealFileSystem

        size = os.path.getsize(src)
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            for start, end in RealFileSystem().data_extents(src, 0, size):
                fin.seek(start)
                fout.seek(start)
                left = end - start
                while left > 0:
                    chunk = fin.read(min(left, 8 << 20))
                    if not chunk:
                        break
                    fout.write(chunk)
                    left -= len(chunk)
            fout.truncate(size)
        shutil.copystat(src, dst)

    shutil.copytree(source, target, copy_function=copy_sparse)


READY_TIMEOUT_S = 1800.0


def _open_seconds(path: Path, config: dict[str, Any]) -> dict[str, float]:
    """Seconds of `mqstore.open` until it returns (`open_s`, and `open_cpu_s`: CPU of every
    thread of the process, the store's actors included), and until the store is whole again
    (`ready_s`, `ready_cpu_s`): re-dispatch, which runs after the open returns, has handed on
    the whole log and the queues and the index have written it. Polled every 10 ms (a bench,
    not a test)."""
    import mqstore

    started, cpu_started = time.perf_counter(), time.process_time()
    store = mqstore.open(path, **config)
    try:
        figures = {"open_s": time.perf_counter() - started, "open_cpu_s": time.process_time() - cpu_started}
        deadline = started + READY_TIMEOUT_S
        while not _whole(store):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"re-dispatch did not catch up in {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        figures["ready_s"] = time.perf_counter() - started
        figures["ready_cpu_s"] = time.process_time() - cpu_started
    finally:
        store.close()
    return figures


def _whole(store: Any) -> bool:
    """Dispatch handed on the whole log, and the queues (and the index) wrote all of it."""
    view = store.read_view.view
    end = view.readable_end
    indexed = view.indexed_end >= end or not store.config.message_index_enable
    return view.dispatched_end >= end and view.queues_written >= end and indexed


def _recover_seconds(path: Path, config: dict[str, Any]) -> float:
    """Seconds of the crash recovery alone (what `mqstore.open` runs before its actors start)
    on a store left by kill -9: the floor of opening it."""
    from mqstore.config import StoreConfig
    from mqstore.storage.fs import RealFileSystem
    from mqstore.storage.recovery import recover_store

    cfg = StoreConfig.load(overrides={**config, "store_path_root_dir": str(path)})
    if not os.path.exists(cfg.abort_path):
        raise RuntimeError(f"{path} was stopped cleanly: no crash to recover")
    started = time.perf_counter()
    recover_store(cfg, RealFileSystem(), last_exit_ok=False, clock_ms=lambda: time.time_ns() // 1_000_000)
    return time.perf_counter() - started


def scan_and_floor(store: Path, config: dict[str, Any]) -> tuple[int, float, float]:
    """(data bytes, scan seconds, floor seconds) on a closed store: the CommitLog recovery scan
    of every segment with the body CRC checked, then zlib.crc32 over the same bytes."""
    from mqstore.config import StoreConfig
    from mqstore.storage.commitlog import CommitLog
    from mqstore.storage.fs import RealFileSystem

    cfg = StoreConfig.load(overrides={**config, "store_path_root_dir": str(store)})
    log = CommitLog(RealFileSystem(), cfg.commitlog_dir, mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
                    max_message_size=cfg.max_message_size_bytes, clock_ms=lambda: time.time_ns() // 1_000_000,
                    check_crc_on_recover=True)  # fmt: skip
    if not log.load():
        raise RuntimeError(f"cannot load {cfg.commitlog_dir}")
    log.zero_tail_bytes = 0  # as recovery after a clean stop: the tail is already clean, nothing written
    try:
        started = time.perf_counter()
        end = log.recover_normally(-1, all_files=True)
        scan_s = time.perf_counter() - started
        first = max(log.get_min_offset(), 0)
    finally:
        log.shutdown()
    data = end - first
    if data <= 0:
        raise RuntimeError(f"the recovery scan of {store} found no data")
    segment = cfg.mapped_file_size_commitlog_bytes
    started = time.perf_counter()
    crc = 0
    for name in sorted(os.listdir(cfg.commitlog_dir)):
        start = int(name)
        length = min(segment, end - start)
        if length <= 0:
            continue
        with open(os.path.join(cfg.commitlog_dir, name), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            crc = zlib.crc32(memoryview(m)[:length], crc)
    floor_s = time.perf_counter() - started
    return data, scan_s, floor_s


class OpenCases:
    """Our open and recovery-scan cases, one repeat per call (stores built on the first)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._built: dict[int, tuple[Path, Path, int, int]] = {}
        self._calls: dict[int, int] = {}

    def run(self, rec: Recorder, cfg: BenchConfig, body: int, work_dir: Path) -> None:
        root = work_dir.parent / f"ours-open-{body}"
        self._calls[body] = self._calls.get(body, 0) + 1
        try:
            if body not in self._built:
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(parents=True)
                self._built[body] = _build(root, cfg.open_store_bytes, body, self.config)
            crashed, clean, messages, log_bytes = self._built[body]
            size = (f"{log_bytes / (1 << 30):.2f} GiB" if log_bytes >= 1 << 30 else f"{log_bytes / (1 << 20):.0f} MiB")
            size += f" of commitlog, {messages:,} messages"
            run_case(rec, "ours", "recovery", ASYNC, body, lambda: self._scan(clean),
                     note=f"CommitLog recovery scan (CRC checked) of every segment; floor: zlib.crc32 over the same bytes; {size}")  # fmt: skip
            run_case(rec, "ours", "open_clean", ASYNC, body, lambda: self._open(clean),
                     note=f"mqstore.open of a cleanly stopped store until it returns; {size}")  # fmt: skip
            run_case(rec, "ours", "open_crash", ASYNC, body, lambda: self._open_copy(crashed, work_dir / "crashed"),
                     note=f"mqstore.open after kill -9 until it returns (open_s) and until re-dispatch rebuilt the queues and index (ready_s); {size}")  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a failed build fails all three cases, recorded
            for case in ("recovery", "open_clean", "open_crash"):
                rec.mark("ours", case, ASYNC, body, "failed", f"building the store: {type(e).__name__}: {e}")
        finally:
            if self._calls[body] >= cfg.repeats:
                shutil.rmtree(root, ignore_errors=True)
                self._built.pop(body, None)

    def _scan(self, clean: Path) -> Outcome:
        with timed() as t:
            data, scan_s, floor_s = scan_and_floor(clean, self.config)
        return Outcome({"gb_per_s": data / scan_s / 1e9, "floor_gb_per_s": data / floor_s / 1e9}, t.peak_rss_mb)

    def _open(self, path: Path) -> Outcome:
        with timed() as t:
            figures = _open_seconds(path, self.config)
        return Outcome(figures, t.peak_rss_mb)

    def _open_copy(self, crashed: Path, target: Path) -> Outcome:
        shutil.rmtree(target, ignore_errors=True)
        copy_store(crashed, target)
        os.sync()  # the copy's write-back is not the open's: it slowed the open's own writes
        try:
            recover_s = _recover_seconds(target, self.config)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        copy_store(crashed, target)
        os.sync()
        try:
            outcome = self._open(target)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return Outcome({**outcome.metrics, "recover_s": recover_s}, outcome.peak_rss_mb)


def main(argv: list[str] | None = None) -> int:
    import ast

    p = argparse.ArgumentParser(prog="python -m mqstore.bench.bench_open", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    fill = sub.add_parser("fill", help="fill a store, print 'ready N', then wait to be killed")
    fill.add_argument("path")
    fill.add_argument("--bytes", type=int, required=True)
    fill.add_argument("--body", type=int, required=True)
    fill.add_argument("--config", default="{}", help="store settings, a Python dict literal")
    args = p.parse_args(argv)
    count = fill_store(args.path, args.bytes, args.body, ast.literal_eval(args.config))
    print(f"ready {count}", flush=True)
    time.sleep(FILL_TIMEOUT_S)  # killed here (SIGKILL), as a crash
    return 1


if __name__ == "__main__":
    sys.exit(main())
