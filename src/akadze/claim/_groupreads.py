"""Reads per group: the bounded skip scan that lists a queue's groups, and the reads
of each listed group's next rows from where its own read stopped (planner.View.reach).
The windowed claim (:mod:`akadze.claim._windows`) turns to them when a skip scan lists
every group of the queue; the bounds are its own (GROUP_SCAN_BOUND, GROUP_SCAN_TRY),
passed in."""

from __future__ import annotations

from collections import Counter

from . import _planner as planner
from ._keystate import KeyState
from ._reading import Position, Reading, after_params, entries_of
from ._steps import Request, Row, Statement, Steps0, prepared

__all__ = ["apply_group_rows", "first_per_group", "guarded_groups", "learn_groups",
           "read_groups", "scan_groups"]


def read_groups(
    request: Request, known: KeyState, reading: Reading, window: int,
    exclude: frozenset[str | None],
) -> Steps0:
    assert reading.universe is not None
    groups = reading.universe - exclude
    if not groups:
        # Every group of the queue is left out: nothing to read.
        reading.complete = True
        return
    statement, per_group = _group_rows(request, known, reading, window, groups)
    rows = yield statement
    apply_group_rows(known, reading, rows, per_group, groups)


def _group_rows(request: Request, known: KeyState, reading: Reading, window: int,
                groups: frozenset[str | None]) -> tuple[Statement, int]:
    """The read of the next rows of each of ``groups`` (claim_group_rows), and
    how many it asks of each. Each group is read after its own reach, or after
    the windows' last entry if it was not read per group yet."""
    keys = sorted(k for k in groups if k is not None)
    # Each group gets a share of the window. No group can place more than
    # `slots` rows in the claim, so the first read asks for at most that many
    # (one group holding the queue: `slots` rows, not the whole window); later
    # reads (rows that were not ready for us, or groups that need more rows) for
    # at least that many.
    share = -(-window // max(1, len(groups)))
    per_group = (max(request.slots, share) if reading.group_reads
                 else first_per_group(request, share))
    reading.group_reads += 1
    starts = [after_params(_group_after(reading, key)) for key in keys]
    params = {
        **request.params(),
        **after_params(_group_after(reading, None) if None in groups else None),
        **known.params(reading.excluded),
        "keys": keys, "null_group": None in groups, "per_group": per_group,
        "from_priority": [a["after_priority"] for a in starts],
        "from_run_at": [a["after_run_at"] for a in starts],
        "from_id": [a["after_id"] for a in starts],
    }
    return prepared("claim_group_rows", params), per_group


def first_per_group(request: Request, share: int) -> int:
    """The rows a claim's first read per group asks of each group: its share of
    the window, at most `slots` (no group can place more in the claim), and in
    fair order at most T, the worst planned turn of the connection's last claim
    (Hints.busy_turn): a group's rows with turns up to T are among its first T,
    so they settle the claim if its worst turn is no higher, and a group read
    short of a row that could place is read on from its reach."""
    per_group = min(request.slots, share)
    if request.fair and request.hints.busy_turn > 0:
        per_group = min(per_group, request.hints.busy_turn)
    return per_group


def _group_after(reading: Reading, group: str | None) -> Position | None:
    after = reading.reach.get(group, reading.after)
    assert after is not None or group not in reading.reach, "a group read to its end again"
    return after


def apply_group_rows(known: KeyState, reading: Reading, rows: list[Row], per_group: int,
                      groups: frozenset[str | None]) -> None:
    """Each group read returned at most per_group entries after its own start:
    every entry of it is now read up to its last one returned (its reach,
    planner.View.reach), or to its end if it returned fewer."""
    entries = entries_of(rows, known)
    counts: Counter[str | None] = Counter(e.key for e, _ in entries)
    last = {entry.key: entry.position for entry, _ in entries}
    for group in groups:
        reading.reach[group] = last[group] if counts[group] >= per_group else None
    reading.complete = all(g in reading.reach and reading.reach[g] is None
                           for g in (reading.universe or groups) - reading.excluded)
    added = [e for e, ready in entries if ready]
    if added:
        # In queue order (the planner's rows are): a group read further than
        # the others before may have rows after those read now.
        reading.rows.extend(added)
        reading.rows.sort(key=lambda r: (-r.priority, r.run_at, r.id))


def _groups(request: Request, guarded: bool, bound: int, try_: int) -> Statement:
    """The bounded skip scan of the queue's groups (claim_groups). ``guarded``:
    only if the queue's first entries (as many as the default first window,
    however large the claim's first window is) show few groups."""
    window = planner.first_window(request.slots) if guarded else 0
    params = {"queue": request.queue, "now": request.now, "bound": bound,
              "window": window, "try": try_, "fair": request.fair}
    return prepared("claim_groups", params)


def guarded_groups(request: Request, bound: int, try_: int) -> tuple[Statement, ...]:
    """The guarded skip scan for a claim's first round trip; none when the
    last claim of the queue read rows of many groups (Hints.many_groups): the
    guard would only say so again, and on a queue of thousands of small keys
    whose head shows few (N/5 keys x 5) the scan would run its 64 probes for
    nothing at every claim."""
    if request.hints.many_groups:
        return ()
    return (_groups(request, True, bound, try_),)


def learn_groups(known: KeyState, reading: Reading, row: Row, bound: int) -> None:
    scanned, keys, has_null, busy, null_busy = row
    if not scanned:
        reading.crowded = True  # the guard saw many groups in the head
        return
    reading.scanned_groups = True
    reading.crowded = len(keys) >= bound
    if reading.crowded:
        return
    groups: set[str | None] = set(keys)
    if has_null:
        groups.add(None)
    reading.universe = frozenset(groups)
    if busy is not None:  # fair: every group's running jobs in the queue
        for key, count in zip(keys, busy, strict=True):
            known.busy.setdefault(key, count)
        if has_null:
            known.busy.setdefault(None, null_busy)


def scan_groups(request: Request, known: KeyState, reading: Reading, bound: int,
                 try_: int) -> Steps0:
    """Try to list every group of the queue (bounded skip scan, unguarded: with
    window 0 it always runs, and learn_groups records that it did)."""
    rows = yield _groups(request, False, bound, try_)
    learn_groups(known, reading, rows[0], bound)
