"""The newcomer's first hour (issue 20), walked as a script: a fresh embedded server,
the README's quickstart verbatim, a worker started as ``module:app`` and as a file
path, a job of a task no worker knows, a database without the schema, a wrong
password, ``akadze db stop`` followed by a command, the enqueue how-to as written, and
``akadze demo --jobs 100`` (twice here; ten times in a row in the ``slow`` test).

Everything runs as the newcomer would run it: the ``akadze`` script and ``python`` in
subprocesses, with no ``AKADZE_DATABASE_URL`` (the embedded server lives in a home of
its own, ``AKADZE_EMBEDDED_DIR``), and every output is checked.
"""

from __future__ import annotations

import ast
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from embedded_support import temporary_home

from akadze import Akadze, MigrationError, embedded
from akadze.cli import main

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).with_name("akadze")
DEADLINE = 60.0
PASSWORD_REFUSED = 'password authentication failed for user "postgres"'


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    with temporary_home("akadze-newcomer-") as path:
        yield path


@pytest.fixture
def newcomer(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The newcomer's shell: no database URL, the embedded server in ``home``; the
    working directory is a fresh project directory (returned)."""
    monkeypatch.delenv("AKADZE_DATABASE_URL", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv(embedded.ENV_DIR, str(home))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # in-process commands import the app
    yield tmp_path
    for name in [m for m in sys.modules if m == "myproject" or m.startswith("myproject.")]:
        del sys.modules[name]


def sh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command as typed: ``akadze ...`` is the installed script, ``python`` this one."""
    program = {"akadze": str(SCRIPT), "python": sys.executable}.get(args[0], args[0])
    return subprocess.run([program, *args[1:]], capture_output=True, text=True,
                          timeout=timeout, check=False)


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("akadze: "), result.stderr
    return lines[0]


def readme_block(fence: str, after: str) -> str:
    """The first ```fence block of the README after the heading or line ``after``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(after)
    match = re.compile(rf"^```{fence}\n(.*?)^```", re.MULTILINE | re.DOTALL).search(text, start)
    assert match is not None
    return match.group(1)


class Worker:
    """``akadze worker ...`` in the background, its output read as it comes."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [str(SCRIPT), "worker", *args, "--poll-interval", "0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.process.poll() is None, "".join(self.seen)
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in the worker's output:\n" + "".join(self.seen))

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=DEADLINE)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        assert self.process.returncode == 0, "".join(self.seen)
        output = "".join(self.seen)
        assert "Traceback" not in output, output
        return output


def wait_state(url: str, job_id: int, state: str) -> None:
    deadline = time.monotonic() + DEADLINE
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s",
                               (job_id,)).fetchone()
            if row == (state,):
                return
            time.sleep(0.05)  # polling the database's state with a deadline
    raise AssertionError(f"job {job_id} never became {state} (last {row})")


def the_demo_passes(times: int) -> list[float]:
    """``akadze demo --jobs 100`` ``times`` times in a row; every run passes every check
    and leaves nothing behind. Returns each run's seconds."""
    took = []
    for run in range(times):
        began = time.monotonic()
        result = sh("akadze", "demo", "--jobs", "100")
        took.append(time.monotonic() - began)
        out = result.stdout
        assert result.returncode == 0, f"run {run + 1}:\n{out}{result.stderr}"
        assert "Traceback" not in result.stderr
        checks = [line for line in out.splitlines() if line.startswith(("PASS", "FAIL"))]
        assert len(checks) == 6 and all(line.startswith("PASS") for line in checks), out
        assert re.search(r"^all checks passed \(\d+\.\d+s\)$", out, re.MULTILINE), out
        fair = next(line for line in checks if line.startswith("PASS fair share"))
        assert "at least 10 each" in fair and "no more than" not in fair
    with psycopg.connect(embedded.default_url()) as conn:  # every run removed its traces
        left = conn.execute(
            "SELECT (SELECT count(*) FROM akadze.jobs WHERE queue LIKE 'demo-%%'), "
            "(SELECT count(*) FROM akadze.limits), (SELECT count(*) FROM akadze.start_marks)"
        ).fetchone()
    assert left == (0, 0, 0)
    return took


@pytest.mark.timeout(600)  # a hang guard: a dozen subprocesses take long on a busy machine
def test_the_newcomer_path(newcomer: Path, home: Path) -> None:
    began = time.monotonic()
    # -- a fresh machine: nothing there yet
    status = sh("akadze", "db", "status")
    assert status.returncode == 1 and status.stdout.startswith("not initialised")

    # -- the README quickstart, verbatim: it starts the embedded server itself
    (newcomer / "quickstart.py").write_text(readme_block("python", "## Quickstart"))
    result = sh("python", "quickstart.py")
    assert result.returncode == 0, result.stderr
    enqueued, counts = result.stdout.strip().splitlines()
    assert re.fullmatch(r"enqueued \d+", enqueued)
    assert ast.literal_eval(counts) == {"succeeded": 1, "retried": 0, "snoozed": 0,
                                        "failed": 0, "cancelled": 0, "given_back": 0}
    url = sh("akadze", "db", "url").stdout.strip()

    # -- "In production run workers as processes", verbatim, with the app as a module...
    migrate_line, worker_line = readme_block("sh", "In production run workers").splitlines()
    assert sh(*migrate_line.split()).stdout.strip() == "schema is up to date; nothing to apply"
    (newcomer / "myproject").mkdir()
    (newcomer / "myproject" / "__init__.py").write_text("")
    (newcomer / "myproject" / "jobs.py").write_text(
        readme_block("python", "## Quickstart").split("async def main")[0])
    app = Akadze(database_url=url)

    @app.task("greet", queue="default")
    def greet(name: str, excited: bool = False) -> str:
        return name

    @app.task("welcome", queue="default")  # a task the worker's app does not have
    def welcome(user_id: int) -> None:
        return None

    first = greet.using().enqueue_sync(name="grace")
    worker = Worker(*worker_line.split()[2:])
    worker.wait_for("starting on")
    wait_state(url, first, "succeeded")

    # -- ... a job of a task no live worker runs: warned once, listed, exported
    unknown = welcome.using().enqueue_sync(user_id=1)
    warning = worker.wait_for("no live worker of the queue runs")
    assert "queue 'default' has ready jobs of task 'welcome'" in warning
    listed = sh("akadze", "queues", "list")
    assert ("warning: queue default: 1 ready job of task 'welcome', which no live worker of "
            "the queue runs") in listed.stdout
    metrics = sh("akadze", "metrics").stdout
    assert 'akadze_queue_unserved_ready_jobs{queue="default",task="welcome"} 1' in metrics
    output = worker.stop()
    assert output.count("no live worker of the queue runs") == 1

    # -- ... and as a file path
    second = greet.using().enqueue_sync(name="ada")
    worker = Worker("./myproject/jobs.py:app", "--queue", "default")
    wait_state(url, second, "succeeded")
    worker.stop()
    wait_state(url, unknown, "queued")  # still waiting for a worker that knows it

    # -- a database without the schema
    with psycopg.connect(embedded.admin_url(home), autocommit=True) as admin:
        admin.execute("CREATE DATABASE blank")
    blank = url.replace("/akadze?", "/blank?")
    line = one_line(sh("akadze", "jobs", "list", "--database-url", blank), 1)
    assert line.startswith("akadze: the database has no akadze schema")
    line = one_line(sh("akadze", "worker", "myproject.jobs:app", "--database-url", blank), 1)
    assert line.endswith("has no akadze schema: run akadze migrate")
    blank_app = Akadze(database_url=blank)

    @blank_app.task("greet")
    def greet_blank(name: str) -> str:
        return name

    with pytest.raises(MigrationError, match=r"no akadze schema .*: run akadze migrate"):
        greet_blank.using().enqueue_sync(name="x")

    # -- a wrong password: every database command says so in one line, exit 1
    tcp = sh("akadze", "db", "url", "--tcp", "--show-password").stdout.strip()
    wrong = re.sub(r"(://postgres:)[^@]+@", r"\1not-the-password@", tcp)
    line = one_line(sh("akadze", "jobs", "list", "--database-url", wrong), 1)
    assert line.endswith(PASSWORD_REFUSED) and "not-the-password" not in line
    assert ":***@127.0.0.1:" in line
    for argv in (["migrate"], ["migrate", "--check"], ["worker", "myproject.jobs:app"],
                 ["jobs", "show", "1"], ["jobs", "cancel", "1"], ["jobs", "requeue", "1"],
                 ["jobs", "retry", "1"], ["queues", "list"], ["queues", "pause", "q"],
                 ["queues", "resume", "q"], ["limits", "list"], ["limits", "clear", "k"],
                 ["limits", "set", "k", "--max-running", "1"], ["workers", "list"],
                 ["metrics"], ["demo", "--jobs", "100"]):
        assert main([*argv, "--database-url", wrong]) == 1, argv

    # -- akadze db stop, then a command: the server comes back, and says so
    assert sh("akadze", "db", "stop").stdout.strip() == "stopped"
    assert sh("akadze", "db", "status").returncode == 1
    listed = sh("akadze", "queues", "list")
    assert listed.returncode == 0
    notice = listed.stderr.strip()
    assert re.fullmatch(r"akadze: started the embedded PostgreSQL server \(pid \d+, port \d+\); "
                        r"akadze db stop stops it", notice), notice
    assert sh("akadze", "queues", "list").stderr == ""  # running now: nothing to say

    # -- the enqueue how-to, as written, for someone who followed the README
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs/howto/enqueue.md").read_text(),
                        re.MULTILINE | re.DOTALL)
    (newcomer / "howto.py").write_text("\n".join(b for b in blocks if not b.startswith("# not")))
    result = sh("python", "howto.py")
    assert result.returncode == 0, result.stderr

    # -- the demo at its smallest size, twice (ten times: the slow test below)
    took = the_demo_passes(2)
    print(f"newcomer path: {time.monotonic() - began:.1f}s; demo --jobs 100 runs: "
          + ", ".join(f"{t:.1f}s" for t in took))


@pytest.mark.slow
def test_the_demo_passes_ten_times_in_a_row(newcomer: Path) -> None:
    took = the_demo_passes(10)
    print("demo --jobs 100, ten runs: " + ", ".join(f"{t:.1f}s" for t in took))
    assert os.environ.get("AKADZE_DATABASE_URL") is None
