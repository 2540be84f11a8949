"""The dashboard's pure core, property-tested: bounded counts, throughput buckets from a
sample, shares of starts, and the jobs list's filters (a page's links give back the
filter they were made from)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze.dashboard import _model

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)


@given(st.lists(st.integers(0, 50), max_size=6), st.integers(1, 50))
def test_a_bounded_sum_is_exact_only_when_no_part_reached_the_cap(parts: list[int],
                                                                  cap: int) -> None:
    parts = [min(p, cap) for p in parts]
    total = _model.bounded_sum(parts, cap)
    assert total.value == sum(parts)
    assert total.exact == all(p < cap for p in parts)
    assert total.text.endswith("+") != total.exact


def test_counts_read_as_the_pages_print_them() -> None:
    assert _model.Count(10_000, exact=False).text == "10 000+"
    assert _model.Count(999).text == "999"
    assert _model.age(timedelta(seconds=3725)) == "1h 02m"
    assert _model.percent(0.004) == "<1%"


finish_rows = st.lists(st.tuples(
    st.sampled_from(["a", "b"]), st.sampled_from(_model.FINISHED), st.integers(0, 14),
    st.integers(1, 30), st.integers(0, 899)), max_size=20)


@given(finish_rows, st.integers(1, 400))
def test_throughput_keeps_every_finish_and_hides_what_a_full_sample_missed(
    raw: list[tuple[str, str, int, int, int]], cap: int
) -> None:
    rows = [(q, s, b, n, NOW - timedelta(seconds=b * 60 + off % 60))
            for q, s, b, n, off in raw]
    series = _model.throughput(rows, NOW, buckets=15, bucket_seconds=60, cap=cap)
    sampled = sum(r[3] for r in rows) >= cap
    for queue, t in series.items():
        assert len(t.buckets) == 15 and [b.ago for b in t.buckets] == list(range(14, -1, -1))
        assert sum(t.finished.values()) == sum(r[3] for r in rows if r[0] == queue)
        assert t.sampled == sampled
        known = sum(b.total or 0 for b in t.buckets)
        assert known <= sum(t.finished.values())
        if not sampled:
            assert known == sum(t.finished.values())
            assert t.covered == timedelta(minutes=15)
        for b in t.buckets:
            covered_whole = (b.ago + 1) * 60 <= t.covered.total_seconds()
            assert (b.counts is not None) == (covered_whole or not sampled)


@given(st.lists(st.tuples(st.one_of(st.none(), names), st.integers(1, 40)), max_size=8,
                unique_by=lambda t: t[0]),
       st.dictionaries(st.one_of(st.none(), names), st.integers(1, 5), max_size=6),
       st.lists(st.one_of(st.none(), names), max_size=6), st.integers(1, 10),
       st.integers(0, 100))
def test_shares_list_the_busiest_groups_and_account_for_the_others(
    top: list[tuple[str | None, int]], running: dict[str | None, int],
    waiting: list[str | None], rows: int, extra: int
) -> None:
    total = sum(n for _, n in top) + extra
    found = _model.shares("q", top, total, len(top), running, waiting, rows=rows)
    assert len(found.groups) <= rows
    assert len({g.key for g in found.groups}) == len(found.groups)
    assert found.other_starts == total - sum(g.starts for g in found.groups)
    assert sum(g.share for g in found.groups) + found.other_share == pytest.approx(
        1.0 if total else 0.0)
    starts = [g.starts for g in found.groups]
    assert starts == sorted(starts, reverse=True)
    assert found.running == sum(running.values())


filters = st.builds(
    _model.JobFilter,
    queue=st.one_of(st.none(), names.map(str.strip).filter(bool)),
    states=st.lists(st.sampled_from(_model.STATES), unique=True, max_size=3).map(tuple),
    task=st.one_of(st.none(), names.map(str.strip).filter(bool)),
    limit_key=st.one_of(st.none(), names.map(str.strip).filter(bool)),
    meta=st.one_of(st.none(), st.dictionaries(names, st.one_of(names, st.integers()),
                                              min_size=1, max_size=3)),
    id=st.one_of(st.none(), st.integers(1, _model.ID_MAX)),
    before=st.one_of(st.none(), st.integers(1, _model.ID_MAX)),
)


@given(filters)
def test_a_filter_survives_its_own_links(where: _model.JobFilter) -> None:
    params = {k: [v] for k, v in where.query().items()}
    assert _model.parse_filter(params) == where


@pytest.mark.parametrize(("params", "message"), [
    ({"state": ["lost"]}, "unknown state 'lost'"),
    ({"id": ["0"]}, "id must be a positive job id"),
    ({"before": ["9" * 30]}, "before must be a positive job id"),
    ({"meta": ["[1, 2]"]}, "is not key=value"),
    ({"meta": ["{\"a\": NaN}"]}, "meta is not a JSON object"),
    ({"meta": ["tenant"]}, "is not key=value"),
    ({"queue": ["a\x00b"]}, "without NUL"),
])
def test_a_bad_filter_says_what_is_wrong(params: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _model.parse_filter(params)
