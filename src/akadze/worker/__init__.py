"""The worker runtime: :class:`Worker`, and the running job as a task sees it.

- :class:`Worker` claims and runs jobs (``akadze worker module:app`` runs one);
  ``Worker(..., on_event=callback)`` reports :class:`WorkerEvent` signals;
- :func:`current` returns the :class:`RunContext` of the job the calling task runs;
- :func:`is_transient` tells database trouble that retrying cures from the rest;
- :data:`IDLE_EASING` (a harness switch and counters, for benchmarks): whether idle
  claim loops look before they claim and spread their wake-ups, and what they did.

Everything else in this package is private: ``_worker`` composes the collaborators
(``_claims``, ``_runner``, ``_flusher``, ``_leases``, ``_ownership``,
``_cancellation``, ``_maintenance``, ``_wakeup``, ``_shutdown``) that share ``_state`` and get their
connections from ``_connections`` (docs/reference/worker.md has the map).
"""

from __future__ import annotations

from ._events import EVENT_KINDS, EventKind, WorkerEvent
from ._runs import CompleteTx, RunContext, current
from ._trouble import is_transient
from ._wakeup import IDLE_EASING, IdleEasing
from ._worker import Worker

__all__ = [
    "EVENT_KINDS",
    "IDLE_EASING",
    "CompleteTx",
    "EventKind",
    "IdleEasing",
    "RunContext",
    "Worker",
    "WorkerEvent",
    "current",
    "is_transient",
]
