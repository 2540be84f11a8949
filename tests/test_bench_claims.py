"""``akadze bench claims`` at tiny sizes, so that it cannot rot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from akadze.bench.claim_scenarios import SCENARIOS, build, stale_tables
from akadze.cli import main


def _bench_databases(server_url: str) -> set[str]:
    with psycopg.connect(server_url, autocommit=True) as admin:
        return {r[0] for r in admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'akadze_bench_%'")}


def test_bench_in_place_with_load_and_report(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "claims.md"
    code = main([
        "bench", "claims", "--in-place", "--database-url", database_url,
        "--jobs", "2000", "--repeat", "2", "--load-jobs", "1000", "--load-seconds", "2",
        "--claimers", "4", "--report", str(report),
    ])
    out = capsys.readouterr()
    assert code == 0, out.err
    text = report.read_text()
    assert "PostgreSQL" in text and "Python" in text and "cores" in text
    assert "`synchronous_commit = off`, as a worker commits its claims by default" in text
    # one row per scenario and order of the seed's table: 11
    rows = [line for line in text.splitlines() if line.startswith("| ") and "2 000" in line]
    assert len(rows) == 11
    assert all(line.rstrip().endswith("| yes |") for line in rows), rows
    load = [line for line in text.splitlines()
            if line.startswith("| default |") or line.startswith("| fair |")]
    assert len(load) == 2
    for line in load:
        cells = [c.strip() for c in line.strip("|").split("|")]
        claimed, completed, twice, errors = map(int, cells[1:5])
        assert claimed > 0 and completed == claimed
        assert twice == 0 and errors == 0
        assert cells[7:9] == ["0", "0"]  # no sample and no commit over a limit


def test_bench_makes_and_drops_its_own_database(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This bench's own database, by name: other benches on the same server make and
    # drop theirs meanwhile, so the set of bench databases is no measure. (Imported
    # here: akadze.bench.claims imported before akadze.cli is a circular import.)
    from akadze.bench import claims

    made: list[str] = []
    scratch_database = claims.scratch_database

    @contextmanager
    def recorded(url: str, in_place: bool) -> Iterator[str]:
        with scratch_database(url, in_place) as scratch:
            made.append(str(conninfo_to_dict(scratch)["dbname"]))
            assert made[-1] in _bench_databases(server_url)
            yield scratch

    monkeypatch.setattr(claims, "scratch_database", recorded)
    report = tmp_path / "claims.md"
    code = main([
        "bench", "claims", "--database-url", server_url, "--jobs", "500", "--repeat", "1",
        "--scenario", "no-keys", "--scenario", "whole-one-key", "--skip-load",
        "--report", str(report), "--durable",
    ])
    assert code == 0
    text = report.read_text()
    assert "`synchronous_commit = on`, as a worker with `durable_claims=True`" in text
    assert "`no-keys`" in text and "`whole-one-key`" in text and "`urgent`" not in text
    assert "## Load" not in text
    assert len(made) == 1 and made[0].startswith("akadze_bench_")
    assert made[0] not in _bench_databases(server_url)


def test_bad_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "claims", "--scenario", "nope"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_bench_stale_stats_side_by_side(server_url: str, tmp_path: Path) -> None:
    before = _bench_databases(server_url)
    report = tmp_path / "claims.md"
    code = main([
        "bench", "claims", "--database-url", server_url, "--jobs", "500", "--repeat", "1",
        "--scenario", "at-limit-then-free", "--skip-load", "--stale-stats",
        "--report", str(report),
    ])
    assert code == 0
    text = report.read_text()
    assert "## Fresh and stale statistics" in text
    part = text.split("## Fresh and stale statistics", 1)[1]
    rows = [line for line in part.splitlines() if line.startswith("| 1 000 keys")]
    assert len(rows) == 2  # fair and default
    assert all(line.rstrip().endswith("| 20 | yes |") for line in rows), rows
    assert not _bench_databases(server_url) - before  # its scratch databases dropped


def test_bench_drained_stats_side_by_side(server_url: str, tmp_path: Path) -> None:
    """--drained-stats: the stale statistics are a drained table's, and every stale
    claim still returns what the full ranking returns."""
    report = tmp_path / "claims.md"
    code = main([
        "bench", "claims", "--database-url", server_url, "--jobs", "500", "--repeat", "1",
        "--scenario", "busy-groups", "--skip-load", "--stale-stats", "--drained-stats",
        "--report", str(report),
    ])
    assert code == 0
    part = report.read_text().split("## Fresh and stale statistics", 1)[1]
    assert "analyzed once a drain had ended" in part
    rows = [line for line in part.splitlines() if line.startswith("| 200 of 400")]
    assert len(rows) == 1
    assert rows[0].rstrip().endswith("| 20 | yes |"), rows


def test_drained_statistics_describe_a_finished_drain(
        conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """What the drained build leaves: the statistics were taken when every job of
    the scenario had finished, and the burst of the same jobs came after."""
    scenario = next(s for s in SCENARIOS if s.name == "at-limit-then-free")
    stale_tables(conn)
    build(conn, scenario, 500, stale=True, drained=True)
    states = {str(state): int(str(n)) for state, n in conn.execute(
        "SELECT state::text, count(*) FROM akadze.jobs GROUP BY 1").fetchall()}
    assert states["queued"] == 500 and states["running"] > 0
    assert states["succeeded"] == states["queued"] + states["running"]
    assert conn.execute(
        "SELECT most_common_vals::text FROM pg_stats WHERE schemaname = 'akadze'"
        " AND tablename = 'jobs' AND attname = 'state'").fetchone() == ("{succeeded}",)


def test_bench_stale_stats_refuses_in_place(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "claims", "--in-place", "--stale-stats",
                 "--database-url", database_url])
    assert code == 2
    assert "--stale-stats" in capsys.readouterr().err
