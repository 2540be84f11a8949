"""Smoke test of ``akadze bench throughput`` with tiny sizes (figures are not checked)."""

from __future__ import annotations

from pathlib import Path

from akadze.cli import main


def test_bench_throughput_runs_and_writes_a_report(database_url: str, tmp_path: Path) -> None:
    report = tmp_path / "throughput.md"
    code = main(["bench", "throughput", "--jobs", "60", "--jobs", "25", "--slots", "8",
                 "--samples", "3", "--waiter-rounds", "1", "--waiter-jobs", "300",
                 "--fan-out", "50", "--report", str(report), "--database-url", database_url])
    assert code == 0
    text = report.read_text()
    assert "| 60 | 8 |" in text and "| 25 | 8 |" in text
    assert "commit returned | 3 |" in text
    assert "## With one waiter per 100 jobs" in text and "| median |" in text
    assert "## Fan-out / fan-in" in text and "| 50 |" in text and text.count(" | 1 |") >= 1
    assert "PostgreSQL" in text and "cores" in text



def test_bench_throughput_stale_beside_fresh(database_url: str, tmp_path: Path) -> None:
    report = tmp_path / "throughput.md"
    code = main(["bench", "throughput", "--jobs", "40", "--slots", "4", "--slots", "10",
                 "--stale-stats", "--samples", "0", "--waiter-rounds", "0", "--fan-out", "0",
                 "--report", str(report), "--database-url", database_url])
    assert code == 0
    text = report.read_text()
    assert "| fresh jobs/s | stale jobs/s | stale / fresh |" in text
    rows = [line for line in text.splitlines() if line.startswith("| 40 |")]
    assert [line.split("|")[2].strip() for line in rows] == ["4", "10"]
    assert all(len(line.strip("|").split("|")) == 6 for line in rows), rows
    assert "analyzed while empty" in text
