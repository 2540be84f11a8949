"""What a fault scenario's injector works with: the options of the run and its context
(the scratch database, the private server, the workers, the monitor, the notes)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from .fault_cluster import Cluster
from .fault_harness import Monitor
from .fault_server import PrivateServer
from .proxy import Proxy

Conn = psycopg.Connection[Any]


@dataclass
class Options:
    jobs: int = 3000
    workers: int = 4
    slots: int = 8
    seed: int = 1
    lease: float = 2.5
    recovery_timeout: float = 120.0
    fault_seconds: float = 8.0  # how long the timed faults last (terminate, timeouts)
    logdir: Path = Path("/tmp")
    # The workers' URL instead of the scratch database's own (a conninfo in, one out):
    # the same database through PgBouncer, say; with worker_args for `akadze worker`.
    worker_url: Callable[[str], str] | None = None
    worker_args: tuple[str, ...] = ()


@dataclass
class Context:
    name: str
    options: Options
    rng: random.Random
    url: str
    server: PrivateServer | None
    cluster: Cluster
    monitor: Monitor
    proxy: Proxy | None = None  # between the partitioned workers and the server
    notes: list[str] = field(default_factory=list)
    faults: int = 0
    last_fault: float = 0.0
    phases: list[tuple[str, ...]] = field(default_factory=list)
    expected: int = 0  # jobs enqueued in total (a producer may add more while it runs)

    def connect(self) -> Conn:
        return psycopg.connect(self.url, autocommit=True, application_name="akadze-fault")

    def fault(self) -> None:
        self.faults += 1
        self.last_fault = time.monotonic()


