"""Run the fast test suite several times with both cores saturated by another process.

    python scripts/load_stability.py [--runs 3] [--cpu N] [--shards K] [--pytest-args "..."]
                                     [--log DIR]

A test that passes on a quiet machine and fails when the machine is busy depends on
timing: it waits with a sleep instead of for an event, or asserts a duration. This
script makes the machine busy on purpose: ``stress-ng --cpu N`` (N = the number of
cores by default), or, without stress-ng, one busy-looping process per core, for the
whole of every run. Each run is the fast suite as CI runs it (``pytest -q``); the
summary gives, per run, its exit code, the counts pytest reported and its duration,
and the load average. ``--shards K`` runs each pass of the suite as K pytest processes
at once, each with every K-th test file (the machine is then busier still, and a pass
takes less wall time when other work competes for the cores). Exit code 0 only when
every run passed; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# pytest's last line ("3 failed, 497 passed, 2 deselected in 301.20s"), with or without
# the rule of "=" around it (-q leaves it out)
SUMMARY = re.compile(r"^=* ?(\d+ \w+(?:, \d+ \w+)*) in ([\d.]+)s", re.MULTILINE)


def _busy_loop() -> None:  # pragma: no cover - runs in a child process
    while True:
        pass


class Load:
    """Both (or ``cpus``) cores kept busy by another process until :meth:`stop`."""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.how = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._loops: list[multiprocessing.Process] = []

    def start(self) -> None:
        stress = shutil.which("stress-ng")
        if stress:
            self._proc = subprocess.Popen(
                [stress, "--cpu", str(self.cpus), "--quiet"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
            self.how = f"stress-ng --cpu {self.cpus}"
            return
        for _ in range(self.cpus):
            loop = multiprocessing.Process(target=_busy_loop, daemon=True)
            loop.start()
            self._loops.append(loop)
        self.how = f"{self.cpus} busy-looping processes (no stress-ng)"

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
            self._proc = None
        for loop in self._loops:
            loop.terminate()
            loop.join(10)
        self._loops = []


def test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))


def _start_pytest(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _counts(log: Path) -> tuple[str, dict[str, int]]:
    found = SUMMARY.findall(log.read_text(errors="replace"))
    if not found:
        return "no summary (see the log)", {}
    line = found[-1][0]
    return line, {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", line)}


def run_suite(pytest_args: list[str], log: Path, shards: int) -> tuple[int, str, float]:
    """One pass of the suite: (exit code, pytest's summary, seconds)."""
    began = time.monotonic()
    files = test_files()
    logs = [log] if shards == 1 else [
        log.with_suffix(f".shard{i + 1}.log") for i in range(shards)]
    suites = [_start_pytest(pytest_args if shards == 1 else
                            [*pytest_args, *files[i::shards]], logs[i])
              for i in range(shards)]
    try:
        codes = [suite.wait() for suite in suites]
    finally:
        for suite in suites:  # interrupted: end the runs and what they started
            if suite.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(suite.pid, signal.SIGTERM)
                suite.wait()
    total: dict[str, int] = {}
    for shard in logs:
        for kind, n in _counts(shard)[1].items():
            total[kind] = total.get(kind, 0) + n
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(total.items()))
    if shards > 1:
        summary += f" ({shards} shards)"
    code = next((c for c in codes if c != 0), 0)
    return code, summary or "no summary (see the logs)", time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the suite (default 3)")
    parser.add_argument("--cpu", type=int, default=os.cpu_count() or 2,
                        help="busy processes (default: one per core)")
    parser.add_argument("--shards", type=int, default=1,
                        help="pytest processes per pass, each with every K-th test file")
    parser.add_argument("--pytest-args", default="", help="more pytest arguments, one string")
    parser.add_argument("--log", type=Path, default=Path("/tmp/akadze-load-stability"),
                        help="where each run's output goes")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.cpu < 1 or args.shards < 1:
        parser.error("--runs, --cpu and --shards must be at least 1")
    args.log.mkdir(parents=True, exist_ok=True)
    # A SIGTERM ends the script through its finally clauses: the load and the current
    # run stop with it (both run in sessions of their own, so nothing else would).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = Load(args.cpu)
    load.start()
    results = []
    try:
        print(f"load: {load.how}; {args.runs} runs of the fast suite; logs in {args.log}",
              flush=True)
        for number in range(1, args.runs + 1):
            log = args.log / f"run-{number}.log"
            code, summary, seconds = run_suite(shlex.split(args.pytest_args), log, args.shards)
            load1 = os.getloadavg()[0]
            results.append(code)
            print(f"run {number}: {'passed' if code == 0 else f'FAILED (exit {code})'}: "
                  f"{summary}, {seconds:.0f} s, load average {load1:.1f}", flush=True)
    finally:
        load.stop()
    failed = sum(1 for code in results if code != 0)
    print(f"{len(results) - failed} of {len(results)} runs passed under load")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
