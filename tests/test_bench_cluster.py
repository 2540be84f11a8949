"""``akadze bench cluster`` at a tiny size, so that it cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from akadze.cli import main


def _table(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[1:]]


def test_cluster_bench_measures_every_cell_through_the_proxy(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "cluster.md"
    code = main(["bench", "cluster", "--database-url", server_url, "--claimers", "2",
                 "--rtts", "0,1", "--seconds", "0.4", "--jobs", "600",
                 "--report", str(report)])
    out = capsys.readouterr()
    assert code == 0, out.err
    text = report.read_text()
    assert "Host: CPU" in text and "load average" in text
    rows = _table(text)
    header = [c.strip() for c in text.split("| claimers |", 1)[1].split("\n", 1)[0]
              .strip("|").split("|")]
    assert len(rows) == 2 * 3, rows
    columns = ["claimers", *header]
    for row in rows:
        cell = dict(zip(columns, row, strict=True))
        assert float(cell["claims/s"]) > 0, cell
        assert cell["claimed twice"] == "0" and cell["errors"] == "0", cell
        if cell["RTT ms"] == "1":
            # the injected round trip shows in what the bench measured (fastest of 30
            # each way: a lower bound with room for a machine busy throughout)
            assert float(cell["measured +ms"]) >= 0.5, cell
        if cell["mode"] == "plain":
            assert cell["turn wait %"] == "-"
        else:
            assert cell["turn wait %"] != "-"
    assert {r[3] for r in rows} == {"plain", "fifo", "fair"}


@pytest.mark.parametrize(("args", "message"), [
    (["--modes", "fifo,lifo"], "unknown mode 'lifo'"),
    (["--rtts", "0,x"], "is not a comma-separated list of numbers"),
    (["--claimers", "0"], "claimers must be 1 to 64"),
])
def test_cluster_bench_refuses_bad_options(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "cluster", "--database-url", "postgresql://nobody@127.0.0.1:1/x",
                 *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
