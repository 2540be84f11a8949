"""Calling the app's hooks: ``before_run(job)``, ``after_run(job)`` in the worker, and
``on_transition(conn, job, from_state, to_state)`` in the transaction of each change.

A hook may be a plain function or a coroutine function; the async callers await
what a hook returns when it is awaitable. In a plain task's own transaction
(``complete_tx`` in a thread) there is no event loop to await on, so an async
``on_transition`` hook is refused there with a clear error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .errors import AkadzeError
from .jobs import ClaimedJob

if TYPE_CHECKING:
    from .app import Akadze


def transition_hooks(session: object, app: Akadze | None) -> list[Callable[..., Any]]:
    """The on_transition hooks for an admin call: those of ``app``, or of ``session``
    when the session is the app itself; none otherwise."""
    from .app import Akadze

    if app is None and isinstance(session, Akadze):
        app = session
    return list(app.on_transition_hooks) if app is not None else []


async def call_transition_hooks(
    hooks: Iterable[Callable[..., Any]],
    conn: Any,
    job: ClaimedJob,
    from_state: str,
    to_state: str,
) -> None:
    for hook in hooks:
        outcome = hook(conn, job, from_state, to_state)
        if inspect.isawaitable(outcome):
            await outcome


def call_transition_hooks_sync(
    hooks: Iterable[Callable[..., Any]],
    conn: Any,
    job: ClaimedJob,
    from_state: str,
    to_state: str,
) -> None:
    for hook in hooks:
        outcome = hook(conn, job, from_state, to_state)
        if inspect.isawaitable(outcome):
            close = getattr(outcome, "close", None)
            if close is not None:
                close()
            raise AkadzeError(
                f"on_transition hook {getattr(hook, '__name__', hook)!r} is async, but this "
                "transition happens in a plain task's (sync) transaction"
            )


async def call_run_hooks(hooks: Iterable[Callable[..., Any]], job: ClaimedJob) -> None:
    """``before_run``/``after_run`` hooks, in registration order."""
    for hook in hooks:
        outcome = hook(job)
        if inspect.isawaitable(outcome):
            await outcome
