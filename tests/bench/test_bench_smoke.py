"""Smoke tests of the benchmark instrument: shape of the JSON and the arithmetic of the ratios.

A tiny configuration, in-process, no server. Nothing here asserts anything about speed.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from mqstore.bench import cli
from mqstore.bench.alternatives import SERVERLESS
from mqstore.bench.harness import COMPARISONS, OURS, compute_ratios, pinned_note, write_table
from mqstore.bench.report import render_markdown
from mqstore.bench.workload import BenchConfig

GENERIC_CASES = ("append", "read", "lookup", "append_sync", "put_each_4", "put_each_16", "put_pipelined")
# What an alternative's API does not have: recorded as not available, with the reason.
NOT_AVAILABLE = {
    ("persistqueue", "lookup"),
    ("sqlite", "put_pipelined"),
    ("lmdb", "put_pipelined"),
    ("persistqueue", "put_pipelined"),
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    base = tmp_path_factory.mktemp("bench")
    # The data dir does not exist yet: `mqstore bench --data-dir NEW` makes it.
    return cli.run(BenchConfig.tiny(), SERVERLESS, base / "out", base / "not" / "yet", table=False)


def _case(result: dict[str, Any], system: str, case: str, body: int) -> dict[str, Any]:
    found = [c for c in result["cases"] if (c["system"], c["case"], c["body_bytes"]) == (system, case, body)]
    assert len(found) == 1, (system, case, body, found)
    return found[0]


def test_tiny_run_records_every_case_of_every_serverless_alternative(
    tiny_run: tuple[int, dict[str, Any], Path],
) -> None:
    code, result, path = tiny_run
    assert code == 0, result["failed"]
    assert result["spark"]["status"] == "skipped", "the Spark case runs in full mode only"
    for system in SERVERLESS:
        for case in GENERIC_CASES:
            for body in BenchConfig.tiny().body_sizes_bytes:
                c = _case(result, system, case, body)
                assert c["class"] == ("sync" if case == "append_sync" else "async")
                if (system, case) in NOT_AVAILABLE:
                    assert c["status"] == "not_available" and c["note"]
                    continue
                assert c["status"] == "ok", c
                assert c["metrics"], c
                for m in c["metrics"].values():
                    assert m["min"] <= m["median"] <= m["max"]
                    assert len(m["samples"]) == BenchConfig.tiny().repeats
                assert c["peak_rss_mb"] > 0


def test_json_files_hold_machine_disk_and_config(tiny_run: tuple[int, dict[str, Any], Path]) -> None:
    _, result, path = tiny_run
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads((path.parent / "latest.json").read_text())
    assert on_disk["mode"] == "tiny"
    for key in ("cpu_model", "logical_cores", "ram_bytes", "disk", "python", "date"):
        assert key in on_disk["machine"]
    for key in ("seq_write_fsync_mb_s", "append_fdatasync_p50_us", "append_fdatasync_p99_us"):
        assert on_disk["disk"][key]["median"] > 0
    for name in SERVERLESS:
        assert on_disk["systems"][name]["available"]
        assert set(on_disk["systems"][name]["durability"]) == {"async", "sync"}


def test_ratios_are_ours_over_theirs_medians_within_one_class(
    tiny_run: tuple[int, dict[str, Any], Path],
) -> None:
    _, result, _ = tiny_run
    # Stand-in figures for ours: sqlite's (the floor's where sqlite has no such API), doubled,
    # under our case names.
    cases = [c for c in result["cases"] if c["system"] != OURS]
    for ours_case, their_case, _cls in COMPARISONS:
        stand_in = "floor_mmap" if ("sqlite", their_case) in NOT_AVAILABLE else "sqlite"
        for c in [c for c in cases if c["system"] == stand_in and c["case"] == their_case]:
            fake = copy.deepcopy(c)
            fake.update(system=OURS, case=ours_case)
            for m in fake["metrics"].values():
                m["median"] *= 2
            cases.append(fake)
    ratios = compute_ratios(cases)
    index = {(c["system"], c["case"], c["class"], c["body_bytes"]): c for c in cases}
    assert ratios
    for r in ratios:
        ours = index[(OURS, r["ours_case"], r["class"], r["body_bytes"])]["metrics"][r["metric"]]["median"]
        theirs = index[(r["system"], r["their_case"], r["class"], r["body_bytes"])]["metrics"][r["metric"]]["median"]
        assert r["ratio"] == pytest.approx(ours / theirs)
        assert (r["ours_case"], r["their_case"], r["class"]) in COMPARISONS
    compared = {(r["system"], r["their_case"]) for r in ratios}
    for system in SERVERLESS:
        for _, their_case, _ in COMPARISONS:
            if (system, their_case) not in NOT_AVAILABLE:
                assert (system, their_case) in compared
    assert all(r["ratio"] == pytest.approx(2.0) for r in ratios if r["system"] == "sqlite")
    pipelined = [r["ratio"] for r in ratios if r["their_case"] == "put_pipelined" and r["system"] == "floor_mmap"]
    assert pipelined and all(ratio == pytest.approx(2.0) for ratio in pipelined)


def test_table_shows_every_system(tiny_run: tuple[int, dict[str, Any], Path]) -> None:
    _, result, _ = tiny_run
    out = io.StringIO()
    write_table(result, out)
    for system in SERVERLESS:
        assert system in out.getvalue()


def test_ours_cases_and_ratios_when_the_public_api_exists(tmp_path: Path) -> None:
    code, result, _ = cli.run(BenchConfig.tiny(), ["ours", "sqlite"], tmp_path / "out", tmp_path, table=False)
    assert code == 0, result["failed"]
    for case in ("put_batch", "get", "query", "sync_put_16", "put_each_4", "put_each_16", "put_pipelined", "lag"):
        assert _case(result, OURS, case, 128)["status"] == "ok"
    assert _case(result, OURS, "recovery", 128)["status"] == "ok"
    # Every comparison sqlite has an API for (it has no pipelined puts: not available, no ratio).
    assert {r["ours_case"] for r in result["ratios"]} == {o for o, t, _ in COMPARISONS if ("sqlite", t) not in NOT_AVAILABLE}
    assert _case(result, "sqlite", "put_pipelined", 128)["status"] == "not_available"
    assert "put, 1 message per call, 4 threads, msgs/s" in render_markdown(result)
    # Issue 18: the recovery scan beside its plain-read floor, and opening a store clean and
    # after kill -9, each with the store it measured in its note.
    assert set(_case(result, OURS, "recovery", 128)["metrics"]) == {"gb_per_s", "floor_gb_per_s"}
    # Beside each open's wall time the process's CPU seconds (the 2-core VM is shared: wall time
    # swings with the load); beside the open after kill -9 its floor, the crash recovery alone
    # (recover_store on another copy), so what re-dispatch adds is their difference.
    ready = {"open_s", "open_cpu_s", "ready_s", "ready_cpu_s"}  # returned, and queues and index rebuilt
    expected = {"open_clean": ready, "open_crash": ready | {"recover_s"}}
    for case, metrics in expected.items():
        c = _case(result, OURS, case, 128)
        assert c["status"] == "ok" and set(c["metrics"]) == metrics and "messages" in c["note"], c
        assert all(c["metrics"][m]["median"] > 0 for m in metrics), c
    table = io.StringIO()
    write_table(result, table)
    assert "open_crash" in table.getvalue() and "floor_gb_per_s" in table.getvalue()

    assert "open after kill -9, until queues and index are rebuilt, s" in render_markdown(result)
    assert "crash recovery alone (open after kill -9's floor), s" in render_markdown(result)
    assert not list(tmp_path.glob("ours-open-*")), "the open stores are removed after the last repeat"


def test_add_subcommands_registers_bench_with_its_options() -> None:
    parser = argparse.ArgumentParser(prog="mqstore")
    cli.add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--quick", "--out", "/tmp/x"])
    assert args.quick and args.out == Path("/tmp/x") and args.handler is cli.handle


def test_markdown_report_has_a_row_per_compared_case_and_the_figures_of_the_json(
    tiny_run: tuple[int, dict[str, Any], Path],
) -> None:
    from mqstore.bench.report import ROWS, render_markdown

    _, result, _ = tiny_run
    text = render_markdown(result)
    bodies = sorted({c["body_bytes"] for c in result["cases"] if c["body_bytes"] is not None})
    for _, _, _, label in ROWS:
        assert text.count(f"| {label} |") == len(bodies)  # one row per body size
    sqlite_append = _case(result, "sqlite", "append", bodies[-1])["metrics"]["msgs_per_s"]["median"]
    assert f"{sqlite_append:,.0f}" in text


def test_a_run_confined_to_fewer_cpus_says_so(tiny_run: tuple[int, dict[str, Any], Path]) -> None:
    _, result, _ = tiny_run
    assert result["machine"]["cpu_affinity"], "the JSON records the CPUs the run could use"
    assert pinned_note({"cpu_affinity": [0], "logical_cores": 2}) == " (process on CPU 0)"
    assert pinned_note({"cpu_affinity": [0, 2], "logical_cores": 4}) == " (process on CPUs 0,2)"
    assert pinned_note({"cpu_affinity": [0, 1], "logical_cores": 2}) == ""
    assert pinned_note({}) == "", "results written before the field existed"


def test_the_read_benchmarks_catch_up_case_reports_both_rates_from_one_run(tmp_path: Path) -> None:
    """bench_read's catch-up case: a producer alone, then beside a consumer catching up."""
    import mqstore
    from mqstore.bench import bench_read

    with mqstore.open(tmp_path / "store") as store:
        bench_read._fill(store, 200)
        figures = bench_read._catch_up(store, 200, seconds=0.2)
    assert set(figures) == {"catch_up_producer_alone_msgs_per_s", "catch_up_producer_with_consumer_msgs_per_s",
                            "catch_up_consumer_msgs_per_s", "catch_up_producer_ratio"}  # fmt: skip
    assert figures["catch_up_producer_alone_msgs_per_s"] > 0 and figures["catch_up_consumer_msgs_per_s"] >= 0
    ratio = figures["catch_up_producer_with_consumer_msgs_per_s"] / figures["catch_up_producer_alone_msgs_per_s"]
    assert figures["catch_up_producer_ratio"] == pytest.approx(ratio, abs=0.01)


def test_the_put_benchmarks_cases_run_against_the_store_and_the_floor(tmp_path: Path) -> None:
    """bench_put's cases on a few hundred messages: each returns a rate for the store (every
    put answered PUT_OK and visible through get) and for its same-run floor."""
    import mqstore
    from mqstore.bench import bench_put as bp

    messages = bp._messages(256, bp.BODY_128)
    cases = {
        "put_async": bp.case_put_async,
        "actors": bp.case_actors,
        "put 4 threads": lambda target, ms: bp.case_put_threads(target, ms, 4),
        "put_batch": bp.case_put_batch,
    }
    for name, case in cases.items():
        store = mqstore.open(tmp_path / name, mapped_file_size_commitlog_bytes=1 << 20, max_puts_in_flight=64)
        try:
            assert case(store, messages) > 0, name
            assert store.max_offset("bench", 0) == 64  # every put stored once
        finally:
            store.close()
        floor = bp._Floor()
        try:
            assert case(floor, messages) > 0, name
        finally:
            floor.close()


def test_the_put_benchmark_says_where_a_single_puts_cpu_goes(tmp_path: Path) -> None:
    """Per-thread CPU per put, by role: the producers, the writer and the dispatch actors each
    spent some, and the total is their sum. Nothing about how much."""
    import mqstore
    from mqstore.bench import bench_put as bp

    messages = bp._messages(256, bp.BODY_128)
    with mqstore.open(tmp_path / "s", mapped_file_size_commitlog_bytes=1 << 20) as store:
        figures = bp.put_threads_cpu(store, messages, 2)
        assert store.max_offset("bench", 0) == 64
    roles = {role: us for role, us in figures.items() if role not in ("total", "wall")}
    assert {"producers", "CommitLogWriter"} <= set(roles), figures
    assert all(us > 0 for us in roles.values()) and figures["wall"] > 0
    assert figures["total"] == pytest.approx(sum(roles.values()), abs=0.05 * len(roles) + 0.06)


def test_one_cpu_pins_every_thread_and_gives_each_its_cpus_back() -> None:
    import os
    import threading

    from mqstore.bench import bench_put as bp

    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    with bp._one_cpu() as cpu:
        started = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        started.start()
        started.join()
        assert os.sched_getaffinity(0) == {cpu} and seen == [{cpu}]
    assert os.sched_getaffinity(0) == before
