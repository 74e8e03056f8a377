"""Fixtures of the cleaner tests. The helper module is loaded by path, once, as
`mqstore_cleaner_test_helpers` (tests/ has no packages); test modules take it from sys.modules."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.actors import cleaner as cleaner_module
from mqstore.storage.disk import FixedDiskGauge
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.ticker import ManualTicker, RealTicker

HELPERS = "mqstore_cleaner_test_helpers"


def load_helpers() -> Any:
    if HELPERS not in sys.modules:
        spec = importlib.util.spec_from_file_location(HELPERS, Path(__file__).with_name("cleaner_helpers.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[HELPERS] = module
        spec.loader.exec_module(module)
    return sys.modules[HELPERS]


H = load_helpers()


@pytest.fixture
def clock() -> Any:
    return H.ManualClock()


def _harness(clock: Any, *, ticker: Any = None, **settings: Any) -> Iterator[Any]:
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/store")
    gauge = FixedDiskGauge(0.10)
    sleeps: list[int] = []
    store = mqstore.open("/store", fs=fs, clock_ms=clock, disk_gauge=gauge, cleaner_sleep_ms=sleeps.append,
                         ticker=ticker or H.FollowingTicker(clock), **{**H.SMALL, **settings})  # fmt: skip
    try:
        yield H.Harness(store, fs, clock, gauge, sleeps)
    finally:
        store.close()


@pytest.fixture
def harness(clock: Any) -> Iterator[Any]:
    """A store with the default cleaning rules: disk pressure deletes expired files only."""
    yield from _harness(clock)


@pytest.fixture
def forcing_harness(clock: Any) -> Iterator[Any]:
    """A store whose owner chose RocketMQ's forced cleaning: above the forced ratio, files go
    regardless of age."""
    yield from _harness(clock, clean_file_forcibly_enable=True)


@pytest.fixture
def jumping_harness(clock: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A store whose monotonic clock is the real one: the test's clock moving ahead is a jump
    of the wall clock, not time passing. (Its first round is due at once: that minute is
    monotonic time too.)"""
    monkeypatch.setattr(cleaner_module, "CLEAN_FIRST_DELAY_MS", 0)
    yield from _harness(clock, ticker=RealTicker())


@pytest.fixture
def manual_ticker() -> ManualTicker:
    return ManualTicker()


@pytest.fixture
def ticked_harness(clock: Any, manual_ticker: ManualTicker) -> Iterator[Any]:
    """A store whose monotonic time moves only when the test advances `manual_ticker`: the
    wall clock and the time that passed are set apart."""
    yield from _harness(clock, ticker=manual_ticker)
