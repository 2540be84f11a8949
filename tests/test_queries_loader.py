"""The named-query loader: fragments are spliced in, comment lines are not sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from akadze import queries
from akadze.bench import queries as bench_queries


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
                 "claim_sweep", "claim_groups", "claim_window_presumed", "claim_presume_busy",
                 "claim_group_heads"):
        assert len(queries.text(name).encode()) <= 4096, name


def test_the_harness_queries_are_not_in_the_runtime_namespace() -> None:
    runtime = set(queries.names())
    harness = set(bench_queries.names())
    assert {"bench_plain_claim", "fault_audit", "demo_jobs", "watch_install"} <= harness
    assert not runtime & harness
    assert not any(name.startswith(("bench_", "fault_", "demo_", "watch_", "soak_"))
                   for name in runtime)
    # The harness includes the runtime's fragments: its plain claim returns the job row.
    assert "j.max_attempts, j.meta" in bench_queries.text("bench_plain_claim")


def test_a_fragment_the_harness_defines_again_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "harness_sql_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.sql").write_text("-- fragment: job_columns\nj.id\n\n-- name: q\nSELECT 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loader = queries.Queries("harness_sql_probe", base=queries.runtime)
    with pytest.raises(RuntimeError, match="fragment 'job_columns' defined twice"):
        loader.text("q")


def test_every_query_is_used_by_some_code() -> None:
    root = Path(__file__).resolve().parent.parent
    code = "\n".join(path.read_text(encoding="utf-8")
                     for folder in ("src", "tests") for path in (root / folder).rglob("*.py")
                     if path != Path(__file__).resolve())
    unused = [name for name in (*queries.names(), *bench_queries.names())
              if f'"{name}"' not in code]
    assert unused == []


def _probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str
           ) -> queries.Queries:
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.sql").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return queries.Queries(name)


def test_a_fragment_may_include_fragments(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    loader = _probe(tmp_path, monkeypatch, "nested_sql_probe",
                    "-- fragment: inner\nx.b\n\n-- fragment: outer\nx.a,\n-- include: inner\n\n"
                    "-- name: q\nSELECT\n-- include: outer\nFROM x\n")
    assert loader.text("q") == "SELECT\nx.a,\nx.b\nFROM x"


def test_fragments_that_include_each_other_are_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    loader = _probe(tmp_path, monkeypatch, "cycle_sql_probe",
                    "-- fragment: one\n-- include: two\n\n-- fragment: two\n-- include: one\n\n"
                    "-- name: q\nSELECT\n-- include: one\n")
    with pytest.raises(RuntimeError, match="more than 4 levels deep"):
        loader.text("q")


def test_both_claim_windows_read_key_state_from_one_fragment() -> None:
    block = queries.text("claim_window").split("CASE WHEN l.key IS NOT NULL THEN", 1)[1]
    block = block.split("OFFSET 0) l ON true", 1)[0]
    assert len(block) > 300
    assert queries.text("claim_window_judged").count(block) == 1
