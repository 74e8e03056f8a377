"""`_native.index_select` (issue 18: a key lookup's chain walk in C) against the Python walk of
`IndexFile.select_phy_offset`, the reference: the same offsets in the same order, on files
built by put_key (hash collisions, non-ASCII keys, time windows, max_num, offsets already in
the result) and on damaged files (chains that cycle or point past the file, garbage slots)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.storage import speedups
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.storage.index import IndexFile

native = speedups.native
pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built or MQSTORE_PURE_PYTHON=1")
T0 = 1_700_000_000_123
KEYS = ["t#a", "t#b", "t#Aa", "t#BB", "t#ключ", "t#\U0001f600", "t#k" * 40]  # Aa/BB: one Java hash


def _file(slots: int, entries: int) -> IndexFile:
    fs = SimulatedFileSystem()
    fs.makedirs("/i")
    return IndexFile.create(fs, "/i/20240101000000000", max_hash_slot_num=slots, max_index_num=entries)


def _python_walk(f: IndexFile, monkeypatch: pytest.MonkeyPatch, *args: object) -> list[int] | str:
    with monkeypatch.context() as m:
        m.setattr(speedups, "native", None)
        try:
            return f.select_phy_offset(*args)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the outcome compared
            return type(exc).__name__


def _c_walk(f: IndexFile, *args: object) -> list[int] | str:
    try:
        return f.select_phy_offset(*args)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - the outcome compared
        return type(exc).__name__


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slots=st.integers(1, 7),
    puts=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(KEYS[:2]), st.sampled_from(KEYS)),  # long chains, and collisions
            st.integers(0, 2**40),
            st.one_of(st.sampled_from([-3_000, 0, 5_000, 10_000, 20_000]), st.integers(-5_000, 60_000)),
        ),
        max_size=40,
    ),
    damage=st.lists(st.tuples(st.integers(0, 40 + 7 * 4 + 48 * 20 - 1), st.integers(0, 255)), max_size=4),
    key=st.one_of(st.sampled_from(KEYS[:2]), st.sampled_from(KEYS + ["t#none"])),
    max_num=st.integers(1, 80),
    window=st.tuples(
        st.one_of(st.sampled_from([0, 4_000, 5_000, 12_000]), st.integers(-10_000, 70_000)),
        st.one_of(st.sampled_from([10**9, 20_000]), st.integers(-10_000, 70_000)),
    ),
    prefill=st.lists(st.integers(0, 9), max_size=3),
)
def test_the_c_walk_finds_what_the_python_walk_finds(
    monkeypatch: pytest.MonkeyPatch,
    slots: int,
    puts: list[tuple[str, int, int]],
    damage: list[tuple[int, int]],
    key: str,
    max_num: int,
    window: tuple[int, int],
    prefill: list[int],
) -> None:
    f = _file(slots, 48)
    for k, phy, dt in puts:
        f.put_key(k, phy, T0 + dt)
    for at, value in damage:  # through the map the walk reads
        f._buf[at % len(f._buf)] = value
    f.reload_header()
    begin, end = T0 + window[0], T0 + window[1]
    reference = _python_walk(f, monkeypatch, key, max_num, begin, end, list(prefill))
    assert _c_walk(f, key, max_num, begin, end, list(prefill)) == reference


def test_the_c_walk_runs_and_declines_where_an_entry_lies_outside_the_file() -> None:
    assert native is not None
    f = _file(3, 8)
    for i in range(5):
        f.put_key("t#k", 100 * i, T0 + i)
    found: list[int] = []
    args = (f.max_hash_slot_num, f._entries_pos, f.index_count, f.begin_timestamp, f.index_count, 10, 0, 2**62)
    assert native.index_select(f._buf, "t#k", *args, found) is True and found == [400, 300, 200, 100, 0]
    # A bound past the file (an entry number the map cannot hold): the Python walk decides.
    found = [7]
    wide = (f.max_hash_slot_num, f._entries_pos + 10_000, f.index_count, f.begin_timestamp, f.index_count, 10, 0, 2**62)
    assert native.index_select(f._buf, "t#k", *wide, found) is False and found == [7]
    with pytest.raises(TypeError):
        native.index_select(f._buf, b"t#k", *args, found)
