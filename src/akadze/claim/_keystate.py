"""What a claim knows about the keys and groups it meets, and the lock
protocol that keeps it exact under concurrency.

A key's limit state is first read without a lock (exact for a single claim);
before the claim takes from a limited key it locks the key's limits row and
counts again in a new statement (:func:`lock_taken`); only the first lock of a
claim, taken holding nothing, may wait (:func:`wait_first`). The rules:
``docs/explanation/claim.md`` ("Locks") and claim-semantics.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _planner as planner
from ._steps import Batch, Request, Row, Statement, Step, key_list, prepared

__all__ = ["KeyState", "counts", "learn_counts", "lock_taken", "wait_first"]


@dataclass
class KeyState:
    """What the claim learnt about keys and groups.

    ``room``: the headroom of limited keys. Read without a lock when a key is
    first met (exact for a single claim); a key the claim takes from is locked
    first and its headroom counted again under the lock (see :func:`lock_taken`),
    after which it is exact under concurrency too. ``held``: keys another claim
    held when we tried to lock them (no room for this claim).
    """

    fair: bool
    locked: set[str] = field(default_factory=set)
    held: dict[str, None] = field(default_factory=dict)  # in the order met
    unlimited: set[str] = field(default_factory=set)
    room: dict[str, int] = field(default_factory=dict)
    busy: dict[str | None, int] = field(default_factory=dict)
    settings: dict[str, str] | None = None  # as they were before the claim changed them
    # Keys with entries met in the free part of the queue (jobs.limited false).
    unflagged: set[str] = field(default_factory=set)
    # The open route (ready_window_open, migration 0018): the keys with room
    # whose limited part the windows read; every other key with a limits row
    # has no room for this claim. None: the claim's windows read the limited
    # part as the others do. `fresh`: no reading statement came back yet (the
    # only one that may take the route).
    opened: frozenset[str] | None = None
    fresh: bool = True
    # claim_start's count of the free part's entries read (claim_free_read).
    free_read_at_start: int = 0

    def started(self, rows: list[Row]) -> None:
        """The settings claim_start replaced (restored before the hooks run)."""
        self.settings = {name: rows[0][number] for number, name in enumerate(
            ("plan_cache_mode", "jit", "enable_seqscan", "enable_bitmapscan"), 1)}
        self.free_read_at_start = int(rows[0][11] or 0)

    def free_read_since(self, rows: list[Row]) -> int:
        """claim_free_read's count (its rows) since claim_start's: the free part's
        entries this claim's scans read."""
        return int(rows[0][0] or 0) - self.free_read_at_start

    def params(self, exclude: frozenset[str | None]) -> dict[str, object]:
        """The keys whose state a reading statement need not return again (the
        excluded ones it never meets: they are not sent)."""
        fair, busy = self.fair, self.busy
        known = [k for k in (*self.room, *self.unlimited)
                 if (not fair or k in busy) and k not in exclude]
        return {"known": known, "known_null": not fair or None in busy, "fair": fair}

    def skip_lists(self, exclude: frozenset[str | None]) -> dict[str, object]:
        """The exclusions of a window, per part of the queue (ready_window_parts,
        migration 0014): the limited part leaves out the excluded keys with a
        limits row; the free part the others, and those limited keys the claim
        met there (a job queued before its key's limit, whose flag is false).
        Each list may hold less than the exclusions: a window returns every
        entry of a key it does not leave out, and may return entries of keys it
        does, which the planner finds ineligible (past the key's headroom) or
        hopeless (a turn no lower than the worst planned), so the lists only
        make windows cheaper. A key at its limit whose jobs are all flagged is
        then filtered by one list, not by every part of the window."""
        room, unflagged = self.room, self.unflagged
        keys = [k for k in exclude if k is not None]
        return {"skip_limited": key_list(k for k in keys if k in room),
                "skip_free": key_list(k for k in keys if k not in room or k in unflagged)}

    def window_params(self) -> dict[str, object]:
        """The open route's parameters of a window (ready_window_open): the
        claim's first read may take it; the later windows read the same keys."""
        opened = self.opened
        return {"try_open": self.fresh and opened is None,
                "known_open": None if opened is None else key_list(sorted(opened))}

    def open_only(self, keys: Sequence[str]) -> None:
        """The first read took the open route: of the keys with a limits row,
        only ``keys`` may have room in this claim. The read's snapshot showed
        every other one at its limit (limits.running), and the windows will not
        read their limited part: any of them met elsewhere (the free part, a
        read per group) is without room, whatever a later snapshot says."""
        self.opened = frozenset(keys)
        for key in self.room:
            if key not in self.opened:
                self.room[key] = 0

    def learn(self, key: str | None, limited: bool | None, max_running: int | None,
              running: int | None, max_starts: int | None, starts: int | None,
              busy: int | None) -> None:
        if self.fair and key not in self.busy and busy is not None:
            self.busy[key] = busy
        if key is None or key in self.room or key in self.unlimited:
            return
        if not limited:
            self.unlimited.add(key)
        elif key in self.held or (self.opened is not None and key not in self.opened):
            # another claim has it (left for the next claim), or the open route
            # left its limited part unread (open_only)
            self.room[key] = 0
        else:
            self.room[key] = planner.headroom(
                planner.Limit(max_running, running or 0, max_starts, starts or 0))


def counts(request: Request, keys: Sequence[str], groups: Sequence[str | None]) -> Statement:
    params = {"keys": key_list(keys), "groups": [g for g in groups if g is not None],
              "null_group": None in groups, "queue": request.queue, "now": request.now}
    return prepared("claim_counts", params)


def learn_counts(known: KeyState, keys: Sequence[str], groups: Sequence[str | None],
                  rows: list[Row]) -> None:
    """The rows of claim_counts (kinds 'limit' and 'busy') or of claim_remembered
    ('limit', and 'blocked': the keys still without room, in one array)."""
    limited: set[str] = set()
    for kind, key, max_running, running, max_starts, starts, *blocked in rows:
        if kind == "limit":
            limited.add(key)
            known.learn(key, True, max_running, running, max_starts, starts, None)
        elif kind == "blocked":
            for full in blocked[0] or ():
                limited.add(full)
                known.room.setdefault(full, 0)
        elif key not in known.busy:
            known.busy[key] = running
    known.unlimited.update(k for k in keys if k not in limited)
    for group in groups:
        known.busy.setdefault(group, 0)


def lock_taken(
    request: Request, known: KeyState, need: dict[str, int], claimed: bool
) -> Generator[Step, Any, bool]:
    """Lock the limits rows of the keys the claim is about to take from and count
    them again in a new statement (its snapshot sees every commit made before the
    locks were granted). ``need``: how many planned rows each key has. True when
    every key still has room for them (for a single claim the counts are the
    same as the plan's; under concurrency a key may have gained room since,
    which the plan may leave unused, claim-semantics "Under concurrency"); else
    ``known`` now holds the exact figures and the claim plans again. Never
    waits: a key another claim holds gets no room here (see :func:`wait_first`)."""
    keys = list(need)
    lock, counted = yield Batch((
        prepared("claim_lock", {"keys": keys}), counts(request, keys, ())))
    got = {key: bool(locked) for key, locked, _ in lock}
    if not known.locked and not claimed and got and not any(got.values()):
        # Every key is held by another claim and we hold no limits row and no
        # job yet: this is the one lock of the claim that may wait, on the
        # first such key in queue order (we hold nothing anyone could wait
        # for: no cycle of waits).
        first = next(k for k in keys if k in got)
        waited, counted = yield Batch((
            prepared("claim_lock_first", {"keys": [first]}),
            counts(request, keys, ())))
        if waited:
            got[first] = True
    room = {key: planner.headroom(planner.Limit(max_running, running, max_starts, starts or 0))
            for _, key, max_running, running, max_starts, starts in counted}
    same = True
    for key in keys:
        if key not in got:  # its limits row went away meanwhile: unlimited now
            del known.room[key]
            known.unlimited.add(key)
            same = False
            continue
        if got[key]:
            known.locked.add(key)
            now_room = room[key]
        else:
            known.held[key] = None
            now_room = 0
        if now_room < need[key]:
            same = False
        known.room[key] = now_room
    return same


def wait_first(request: Request, known: KeyState) -> Generator[Step, Any, None]:
    """The one lock of a claim that may wait: the claim found nothing to take
    because every limited key it wanted is held by other claims, and it holds no
    limits row and no job yet. It waits for the first such key (in the order it
    met them) and counts it in a new statement; waiting holding nothing, it
    cannot close a cycle of waits. So a claim on a hot key makes progress
    instead of coming back empty, and claims that could take other rows never
    wait at all (they leave the held keys to the next claim)."""
    first = next(iter(known.held))
    waited, counted = yield Batch((
        prepared("claim_lock_first", {"keys": [first]}),
        counts(request, [first], ())))
    known.held.pop(first)
    if not waited:  # its limits row went away meanwhile: unlimited now
        known.room.pop(first, None)
        known.unlimited.add(first)
        return
    known.locked.add(first)
    for _, _, max_running, running, max_starts, starts in counted:
        known.room[first] = planner.headroom(
            planner.Limit(max_running, running, max_starts, starts or 0))
