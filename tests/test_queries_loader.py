"""The named-query loader: fragments are spliced in, comment lines are not sent."""

from __future__ import annotations

import pytest

from akadze import queries


def test_every_query_is_sent_without_comment_lines_or_includes() -> None:
    names = queries.names()
    assert "claim_window" in names and "claim_sweep" in names
    for name in names:
        lines = queries.text(name).splitlines()
        assert lines, name
        assert not any(line.startswith("--") for line in lines), name
        assert all(line == line.strip() and line for line in lines), name


def test_a_fragment_is_spliced_into_each_query_that_includes_it() -> None:
    counts = queries.text("claim_counts")
    remembered = queries.text("claim_remembered")
    # Both count a key's limit state the same way, once each.
    start = remembered.index("SELECT l.key")
    end = remembered.index(")", remembered.index("jsonb_array_elements_text", start))
    block = remembered[start:end].rstrip()
    assert len(block) > 100
    assert counts.count(block) == 1 and remembered.count(block) == 1
    # A fragment is no query of its own.
    with pytest.raises(KeyError, match="claim_limit_counts"):
        queries.text("claim_limit_counts")


def test_the_claim_statements_stay_under_psycopgs_conversion_cache_limit() -> None:
    # psycopg caches its conversion of a query's placeholders only up to 4 KiB;
    # longer texts are parsed again at every execution.
    for name in ("claim_window", "claim_window_whole", "claim_group_rows", "claim_take",
                 "claim_sweep", "claim_groups"):
        assert len(queries.text(name).encode()) <= 4096, name
