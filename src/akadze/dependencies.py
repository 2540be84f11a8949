"""Workflows, checked and counted: the graph of one enqueue and what each new job waits
for. A pure core (plain data in, plain data out, the standard library only),
property-tested; akadze.enqueue does the I/O and the schema's trigger (migration 0012)
the releases.

A job names its parents with ``after=``: existing jobs by id, or other items of the same
``enqueue_many``. It waits (state ``waiting``) until every parent is done; a parent is
done when it succeeded or, for a child whose ``after_policy`` is ``"run"``, when it
ended at all. A parent that failed or was cancelled cancels a child whose policy is
``"cancel"`` (the default), and so on down the subtree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TERMINAL = ("succeeded", "failed", "cancelled")


def find_cycle(edges: Mapping[int, Sequence[int]]) -> list[int] | None:
    """A cycle of ``edges`` (child -> its parents, by item index) as the items on it,
    first repeated at the end, or None when the graph is acyclic."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for root in sorted(edges):
        if state.get(root):
            continue
        path: list[int] = [root]
        stack: list[tuple[int, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            node, position = stack[-1]
            parents = edges.get(node, ())
            if position == len(parents):
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            stack[-1] = (node, position + 1)
            parent = parents[position]
            seen = state.get(parent)
            if seen == 1:
                return [*path[path.index(parent):], parent]
            if seen is None:
                state[parent] = 1
                path.append(parent)
                stack.append((parent, 0))
    return None


@dataclass(frozen=True, slots=True)
class Start:
    """How a new job starts: its state, how many parents it waits for, and the parent
    that cancels it at once (a parent that had already failed or been cancelled)."""

    state: str
    waiting_for: int
    cancelled_by: int | None = None


def start(new_parents: int, existing: Sequence[tuple[int, str]], run_anyway: bool) -> Start:
    """The start of a job with ``new_parents`` parents among the items of its own call
    (not finished, by definition) and ``existing`` ones as ``(id, state)``."""
    pending = new_parents + sum(1 for _, state in existing if state not in TERMINAL)
    if not run_anyway:
        for parent, state in existing:
            if state in ("failed", "cancelled"):
                return Start("waiting", pending, cancelled_by=parent)
    if new_parents == 0 and not existing:
        return Start("queued", 0)
    return Start("waiting" if pending else "queued", pending)
