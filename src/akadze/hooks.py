"""Calling the app's hooks: ``on_enqueue(conn, job)`` in the enqueue transaction,
``on_transition(conn, job, from_state, to_state)`` in the transaction of each change,
``before_run(job)`` and ``after_run(job)`` in the worker.

A hook may be a plain function or a coroutine function; the async callers await what a
hook returns when it is awaitable. A sync path (a ``_sync`` function, a claim on a sync
connection, a plain task's own transaction in its thread) has no event loop to await
on: an async hook is refused there, before any hook of the call runs when it can be
told by its definition, with :class:`~akadze.errors.AsyncHookError`. This module is the
one place that refuses them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from .errors import AsyncHookError
from .jobs import ClaimedJob

Hook = Callable[..., Any]


def _name(hook: Hook) -> str:
    return str(getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or hook)


def is_async(hook: Hook) -> bool:
    """Whether calling ``hook`` makes a coroutine: an ``async def`` function, or an object
    whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def refuse_async(hook: Hook, kind: str, where: str, outcome: object = None) -> NoReturn:
    """Raise the AsyncHookError of ``hook`` met on a sync path; ``outcome``, the awaitable
    it returned if it was called, is closed so that no "never awaited" warning is
    printed."""
    close = getattr(outcome, "close", None)
    if callable(close):
        close()
    raise AsyncHookError(
        f"{kind} hook {_name(hook)!r} is async, but {where} runs hooks synchronously: "
        "make the hook a plain function, or use the async API with an async session"
    )


def check_plain(hooks: Iterable[Hook], kind: str, where: str) -> None:
    """Refuse, before anything runs, the hooks a sync path cannot call."""
    for hook in hooks:
        if is_async(hook):
            refuse_async(hook, kind, where)


def call_sync(hooks: Sequence[Hook], args: Sequence[Any], kind: str, where: str) -> None:
    """Call each hook with ``args`` on a sync path; an async one is refused."""
    check_plain(hooks, kind, where)
    for hook in hooks:
        outcome = hook(*args)
        if inspect.isawaitable(outcome):
            refuse_async(hook, kind, where, outcome)


async def call_async(hooks: Iterable[Hook], args: Sequence[Any]) -> None:
    """Call each hook with ``args``, awaiting what it returns when it is awaitable."""
    for hook in hooks:
        outcome = hook(*args)
        if inspect.isawaitable(outcome):
            await outcome


async def call_transition_hooks(
    hooks: Iterable[Hook], conn: Any, job: ClaimedJob, from_state: str, to_state: str
) -> None:
    await call_async(hooks, (conn, job, from_state, to_state))


def call_transition_hooks_sync(
    hooks: Iterable[Hook], conn: Any, job: ClaimedJob, from_state: str, to_state: str
) -> None:
    """The on_transition hooks of a change made in a plain task's own transaction."""
    call_sync(list(hooks), (conn, job, from_state, to_state), "on_transition",
              "a plain task's own transaction")


async def call_run_hooks(hooks: Iterable[Hook], job: ClaimedJob) -> None:
    """``before_run``/``after_run`` hooks, in registration order."""
    await call_async(hooks, (job,))
