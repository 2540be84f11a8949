"""Worker processes for the fault and soak scenarios: real ``akadze worker`` processes.

Nothing here supervises them: a worker that dies stays dead unless the scenario
itself restarts it (to model a deploy after a kill -9). Each writes its log to a
file of its own, which the report reads (timeouts hit, outcomes discarded).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .fault_tasks import QUEUE

APP = "akadze.bench.fault_tasks:app"


@dataclass
class WorkerProc:
    index: int
    generation: int
    worker_id: str
    proc: subprocess.Popen[bytes]
    log: Path
    fair: bool
    url: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cluster:
    """``workers`` worker processes on ``url``; ``urls`` may give one URL per worker
    index (session options such as timeouts)."""

    url: str
    logdir: Path
    workers: int = 4
    slots: int = 8
    lease: float = 2.5
    poll_interval: float = 0.25
    fair_every: int = 2  # every second worker claims in fair order
    urls: dict[int, str] = field(default_factory=dict)
    worker_args: tuple[str, ...] = ()  # more `akadze worker` options for every worker
    procs: dict[int, WorkerProc] = field(default_factory=dict)
    retired: list[WorkerProc] = field(default_factory=list)
    started: int = 0

    def start_all(self) -> None:
        for index in range(self.workers):
            self.start(index)

    def start(self, index: int) -> WorkerProc:
        generation = sum(1 for p in self.retired if p.index == index)
        worker_id = f"fault-w{index}-g{generation}"
        url = self.urls.get(index, self.url)
        fair = self.fair_every > 0 and index % self.fair_every == 0
        log = self.logdir / f"{worker_id}.log"
        cmd = [sys.executable, "-m", "akadze", "worker", APP, "--queue", QUEUE,
               "--slots", str(self.slots), "--lease", str(self.lease),
               "--poll-interval", str(self.poll_interval), "--shutdown-timeout", "3",
               "--worker-id", worker_id, "--log-level", "warning", "--database-url", url]
        if fair:
            cmd.append("--fair")
        cmd += self.worker_args
        env = dict(os.environ, AKADZE_DATABASE_URL=url, PYTHONUNBUFFERED="1")
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        worker = WorkerProc(index, generation, worker_id, proc, log, fair, url)
        self.procs[index] = worker
        self.started += 1
        return worker

    def signal(self, index: int, sig: signal.Signals) -> WorkerProc:
        worker = self.procs[index]
        os.kill(worker.pid, sig)
        return worker

    def kill(self, index: int) -> WorkerProc:
        """kill -9: the process dies at once, its jobs stay 'running' until rescued."""
        worker = self.signal(index, signal.SIGKILL)
        worker.proc.wait()
        self.retired.append(worker)
        del self.procs[index]
        return worker

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.procs.values() if w.alive()]

    def dead(self) -> list[WorkerProc]:
        """Processes that ended although nobody killed them."""
        return [w for w in self.procs.values() if not w.alive()]

    def rss_kib(self) -> dict[str, int]:
        """Resident memory of each live worker process (KiB, from /proc)."""
        found: dict[str, int] = {}
        for worker in self.alive():
            try:
                status = Path(f"/proc/{worker.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    found[worker.worker_id] = int(line.split()[1])
        return found

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM (graceful: running jobs get the shutdown timeout), then SIGKILL."""
        for worker in self.procs.values():
            if worker.alive():
                try:
                    os.kill(worker.pid, signal.SIGCONT)
                    os.kill(worker.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for worker in self.procs.values():
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()

    def logs(self) -> str:
        parts = []
        for worker in [*self.retired, *self.procs.values()]:
            with contextlib.suppress(OSError):
                parts.append(worker.log.read_text(errors="replace"))
        return "\n".join(parts)
