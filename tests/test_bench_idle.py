"""``akadze bench idle`` at a tiny size, so that it cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from akadze.cli import main


def _rows(text: str, after: str) -> list[list[str]]:
    """The body of the first table after the heading ``after``."""
    lines: list[str] = []
    for line in text.split(after, 1)[1].splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    # lines[0] is the header, lines[1] the |---| line
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]


def test_idle_bench_measures_both_easings_and_the_storm(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "idle.md"
    code = main(["bench", "idle", "--database-url", server_url, "--workers", "3",
                 "--processes", "1", "--busy-jobs", "300", "--window", "2", "--rounds", "1",
                 "--storm-rates", "5", "--storm-seconds", "2", "--report", str(report)])
    out = capsys.readouterr()
    assert code == 0, out.err
    text = report.read_text()
    assert "Host: CPU" in text and "load average" in text
    idle = {row[0]: row for row in _rows(text, "## Idle workers")}
    on = idle["beside the idle workers, easing on"]
    off = idle["beside the idle workers, easing off"]
    # on: the idle workers never claimed (listening, their looks found nothing and
    # they wait for their 10 s safety poll: no look may fall in the window); off: they
    # claimed every poll, never looked
    assert float(on[2]) == 0 and float(on[3]) < float(off[2]), on
    assert float(off[2]) > 0 and float(off[3]) == 0, off
    storms = _rows(text, "## Notification storm")
    assert [row[1] for row in storms] == ["on", "off"]
    for row in storms:
        assert row[2] == "10" and float(row[3]) > 0 and float(row[5]) >= 0, row


def test_idle_bench_refuses_bad_storm_rates(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "idle", "--database-url", "postgresql://nobody@127.0.0.1:1/x",
                 "--storm-rates", "10,x"])
    assert code == 2
    assert "--storm-rates" in capsys.readouterr().err
