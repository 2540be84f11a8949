"""Opt-in signals of a running worker: ``Worker(app, on_event=callback)``.

The worker calls ``callback(event)`` with a :class:`WorkerEvent` at the moments
tests (and monitoring) want to observe, always from the worker's event loop and
in the order things happened. The callback must return quickly and must not
block; an exception it raises is logged and does not affect the worker. Without
a callback nothing is built or called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("akadze.worker")

EventKind = Literal[
    "started",
    "ready",
    "listening",
    "claimed",
    "cut_back",
    "idle",
    "lease_renewed",
    "fenced",
    "lost",
    "outcomes_written",
    "cancel_checked",
    "stopping",
    "stopped",
]

#: Every kind of event, in the order a worker's life usually shows them.
EVENT_KINDS: tuple[EventKind, ...] = (
    "started", "ready", "listening", "claimed", "cut_back", "idle", "lease_renewed", "fenced",
    "lost", "outcomes_written", "cancel_checked", "stopping", "stopped",
)


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """One moment in a worker's life.

    ``kind`` says what happened (see the table in docs/reference/worker.md);
    ``queue`` is set for ``claimed``, ``cut_back`` and ``idle``; ``job_ids`` holds
    the jobs concerned (claimed, claimed ahead and given back by ``cut_back``, given
    back when fenced, found lost after a reconnect, outcomes accepted by the fence,
    the running jobs the database marks cancel-requested for ``cancel_checked``);
    ``discarded`` the jobs whose outcome the fence refused (``outcomes_written``);
    ``detail`` is ``"graceful"`` or ``"now"`` for ``stopping``, what made the worker
    check its runs for ``lost``, and for ``claimed`` ``"hand_off"`` (started by a
    hand-off) or ``"window"`` (a claim sent for a start-rate window's opening).
    """

    kind: EventKind
    worker_id: str
    queue: str | None = None
    job_ids: tuple[int, ...] = ()
    discarded: tuple[int, ...] = ()
    detail: str | None = None


EventCallback = Callable[[WorkerEvent], object]


class Events:
    """Hands events to the worker's ``on_event`` callback, if it has one."""

    def __init__(self, worker_id: str, callback: EventCallback | None) -> None:
        self._worker_id = worker_id
        self._callback = callback

    @property
    def wanted(self) -> bool:
        """Whether anyone listens (callers skip building costly fields otherwise)."""
        return self._callback is not None

    def emit(
        self,
        kind: EventKind,
        *,
        queue: str | None = None,
        job_ids: Iterable[int] = (),
        discarded: Iterable[int] = (),
        detail: str | None = None,
    ) -> None:
        if self._callback is None:
            return
        event = WorkerEvent(kind, self._worker_id, queue, tuple(job_ids), tuple(discarded),
                            detail)
        try:
            self._callback(event)
        except Exception as exc:
            logger.error("worker %s: the on_event callback failed on %r: %s",
                         self._worker_id, kind, exc, exc_info=exc)
