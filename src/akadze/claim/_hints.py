"""What a connection's last claim of a queue learnt about the queue, kept for
its next claim of that queue: hints that spare finding the queue's shape out
again. How the windowed claim checks and uses them: :mod:`akadze.claim._windows` and
``docs/explanation/claim.md`` ("What a connection remembers")."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, replace

__all__ = ["Hints", "Memory", "memory"]

# At most this many blocked keys are remembered per queue and connection.
MEMORY_MAX = 4096


@dataclass(frozen=True)
class Hints:
    """What a connection's last claim of a queue learnt about the queue's shape.
    Hints only: the next claim checks each one before it relies on it, so a
    stale hint changes how much the claim reads, never what it returns.

    ``blocked``: the keys it left without room. ``read``: when it read windows,
    how many rows it read up to the last one it planned (the next claim's first
    window holds that many, and a claim's worth more). ``groups``: every group
    with queued rows, when a skip scan listed them all. ``many_groups``: the rows
    it read showed more groups than a skip scan is tried for (the next claim
    does not try it). ``unflagged``: those of ``blocked`` whose jobs it met in
    the free part of the queue (queued before the key had its limit): the next
    claim leaves them out of that part too (ready_window_parts). ``dominated``:
    its windows read mostly the entries of the keys they left out of the free
    part; ``wide``: how many more claims may list the queue's groups with the wide
    skip scan (akadze.claim._windows, DOMINATED_RATIO). ``busy``: in fair order,
    the groups it found with at least ``busy_turn`` jobs running in the queue,
    the turn of its worst planned row: the next claim presumes them hopeless
    while they still have that many (akadze.claim._windows, PRESUME_FROM).
    """

    blocked: tuple[str, ...] = ()
    read: int = 0
    groups: frozenset[str | None] | None = None
    many_groups: bool = False
    unflagged: frozenset[str] = frozenset()
    dominated: bool = False
    wide: int = 0
    busy: tuple[str, ...] = ()
    busy_turn: int = 0


_NO_HINTS = Hints()


class Memory:
    """What each connection's last claim of a queue learnt about the queue
    (:class:`Hints`).

    A worker claims the same queue again and again, and the queue's shape
    changes slowly: a key at its limit is usually still there at the next claim,
    a fair queue that needed three windows needs them again, and a queue of a
    few groups keeps them. Without this, every claim finds all that out anew,
    a round trip at a time. The next claim checks each hint in its first round
    trip before it relies on it (a remembered key's state is counted again, the
    groups are listed again), so a hint never changes a claim's result, only how
    much it reads. Connections are held weakly; a connection that cannot be is
    not remembered.
    """

    def __init__(self) -> None:
        self._hints: weakref.WeakKeyDictionary[object, dict[str, Hints]] = (
            weakref.WeakKeyDictionary())
        # Sync callers may claim from several threads, each on its connection.
        self._lock = threading.Lock()

    def get(self, conn: object, queue: str) -> Hints:
        with self._lock:
            try:
                return self._hints.get(conn, {}).get(queue, _NO_HINTS)
            except TypeError:
                return _NO_HINTS

    def put(self, conn: object, queue: str, hints: Hints) -> None:
        with self._lock:
            try:
                by_queue = self._hints.setdefault(conn, {})
            except TypeError:
                return
            if hints != _NO_HINTS:
                by_queue[queue] = replace(hints, blocked=hints.blocked[:MEMORY_MAX])
            else:
                by_queue.pop(queue, None)


memory = Memory()
