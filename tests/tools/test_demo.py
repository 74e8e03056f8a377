"""`mqstore demo`: a short run's report, a second run on the same store, a detected loss (its Spark
job: tests/pipeline/test_demo_spark.py, beside the pipeline tests' session)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mqstore.cli import ExitCode, main
from mqstore.tools import demo


def run_demo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(["demo", "--json", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def check_consistent(report: dict[str, Any], messages: int) -> None:
    assert report["ok"], report["failures"]
    assert report["failures"] == []
    assert report["produced"] == {"sent": messages, "put_ok": messages, "statuses": {"PUT_OK": messages}}
    assert report["consumed"] == {"messages": messages, "duplicates": 0, "missing": 0, "unexpected": 0,
                                  "order_errors": 0, "foreign": 0}  # fmt: skip
    assert report["queried"]["keys"] == messages and report["queried"]["found"] == messages
    topics = report["topics"]
    assert set(topics) == set(demo.TOPICS)
    assert sum(t["put_ok"] for t in topics.values()) == messages
    assert all(t["consumed"] == t["put_ok"] for t in topics.values())
    assert all(t["messages_in_store"] == t["messages_before_run"] + t["put_ok"] for t in topics.values())
    assert all(t["bytes"] > t["put_ok"] * report["plan"]["body_bytes"] for t in topics.values())
    assert report["closed_cleanly"] is True
    assert report["throughput"]["put_per_s"] > 0 and report["throughput"]["consume_per_s"] > 0
    lat = report["latency_ms"]["put_to_consume"]
    assert lat["count"] == messages and 0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert report["latency_ms"]["put"]["count"] == messages
    assert report["store_stats"]["put_message_times_total"] == messages
    assert report["store_stats"]["put_message_failed_times"] == 0
    assert report["store_stats"]["get_message_transfered_msg_count"] == messages
    assert report["disk"]["allocated_bytes"] > 0


def test_a_short_demo_consumes_every_acked_message_once_and_finds_it_by_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "data"
    code, report, err = run_demo(capsys, "--store-dir", str(store), "--messages", "2000", "--no-spark")
    assert code == ExitCode.OK, err
    check_consistent(report, 2000)
    assert report["spark"] == {"ran": False, "note": "skipped (--no-spark)"}
    assert all(t["messages_before_run"] == 0 for t in report["topics"].values())
    # A second run on the same store starts after the first run's messages and consumes only its own.
    code, second, err = run_demo(capsys, "--store-dir", str(store), "--messages", "900", "--producers", "3", "--no-spark")
    assert code == ExitCode.OK, err
    check_consistent(second, 900)
    assert {t: v["messages_before_run"] for t, v in second["topics"].items()} == {
        t: v["messages_in_store"] for t, v in report["topics"].items()
    }


def test_the_human_report_and_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--store-dir", str(tmp_path / "d"), "--messages", "300", "--no-spark", "--query", "sample"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ": OK" in out and "DemoOrders" in out and "put-to-consume latency ms" in out
    assert "consumed" in err and "300/300" in err  # tqdm on stderr


def test_a_lost_message_fails_the_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = demo.ConsumerActor._consume
    dropped: list[int] = []

    def lossy(self: Any, queue_id: int, result: Any) -> None:
        if not dropped and result.messages:  # the first batch loses its first message
            dropped.append(1)
            result = type(result)(status=result.status, messages=result.messages[1:],
                                  next_begin_offset=result.next_begin_offset, max_offset=result.max_offset)  # fmt: skip
            self._next[queue_id] += 1
        real(self, queue_id, result)

    monkeypatch.setattr(demo.ConsumerActor, "_consume", lossy)
    monkeypatch.setattr(demo, "CATCH_UP_STALL_S", 1.0)
    code, report, _ = run_demo(capsys, "--store-dir", str(tmp_path / "d"), "--messages", "500", "--no-spark")
    assert code == ExitCode.FAILURE
    assert not report["ok"] and report["consumed"]["missing"] == 1
    assert any("not consumed" in f for f in report["failures"])


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--store-dir", str(tmp_path), "--messages", "0"]) == ExitCode.USAGE
    assert main(["demo", "--messages", "5", "--duration", "1"]) == ExitCode.USAGE  # mutually exclusive


def test_a_duration_run_stops_producing_in_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, err = run_demo(capsys, "--store-dir", str(tmp_path / "d"), "--duration", "1", "--no-spark",
                                 "--query", "none")  # fmt: skip
    assert code == ExitCode.OK, err
    assert report["produced"]["put_ok"] > 0 and report["consumed"]["missing"] == 0
    assert report["throughput"]["produce_seconds"] < 5
