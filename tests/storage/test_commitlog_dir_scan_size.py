"""The segment size of a commitlog directory, for the tools that read one without the store
(dump, inspect, verify, the scan's default): from the segments' names, so one cut, emptied or
grown file does not redefine it (review 29: the first file's or the commonest length did, and
two cut segments out of three made dump read nothing and verify blame the intact one)."""

from __future__ import annotations

import pytest

from mqstore.storage.commitlog import segment_size_of

S = 65536


@pytest.mark.parametrize(
    ("starts", "lengths", "size"),
    [
        ([0, S, 2 * S], [S, S, S], S),
        ([0, S, 2 * S], [S, 4096, 4096], S),  # two cut segments outnumber the intact one
        ([0, S, 2 * S], [S + 4096, S, S], S),  # the first grown by a stray append
        ([0, S, 2 * S], [0, S, S], S),  # the first emptied
        ([3 * S, 4 * S, 6 * S], [S, S, S], S),  # cleaned from the front, a hole further on
        ([0, 2 * S], [S, S], S),  # two segments around a hole: the files agree
        ([0], [S], S),  # a lone segment: its length
        ([0], [0], 0),  # a lone segment, emptied: no size to read anything by
        ([0], [None], 0),  # a lone entry that is not a file
        # Review 30: the names' gcd alone adopted sizes no file has.
        ([0, S, 100], [S, S, 10], S),  # a stray name off the grid
        ([0, 2 * S], [S, 4096], S),  # a hole beside a cut segment (the gcd said 2 * S)
        ([0, S, 2 * S], [S, None, S], S),  # a directory where a segment belongs
        ([0, S], [S // 2, S // 2], S // 2),  # both cut alike: the lengths say it, a hole between
        ([0], [576], 576),  # a lone segment cut short: read as far as it goes
    ],
)
def test_the_segment_size_comes_from_the_names(starts: list[int], lengths: list[int | None], size: int) -> None:
    assert segment_size_of(starts, lengths) == size
