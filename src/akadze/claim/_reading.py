"""Where a windowed claim's read of a queue has got to, and the index entries its
reading statements return (:mod:`akadze.claim._windows`, :mod:`akadze.claim._groupreads`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from . import _planner as planner
from ._keystate import KeyState
from ._steps import Row

__all__ = ["Position", "Reading", "advance", "after_params", "again", "entries_of"]

# Above every smallint priority: "after" this position is the head of the queue.
_HEAD_PRIORITY = 32768
# Any time: with _HEAD_PRIORITY the first arm of a window is empty whatever it is.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Position = tuple[int, datetime, int]


@dataclass
class Reading:
    """Where a windowed read has got to (reset when a claim plans again)."""

    rows: list[planner.Row]
    # Windows: the last entry read (every entry up to it was, but for the
    # excluded keys).
    after: Position | None = None
    # Reads per group: where each group's read stopped (None: at its last row);
    # planner.View.reach.
    reach: dict[str | None, Position | None] = field(default_factory=dict)
    complete: bool = False
    window: int = 0
    excluded: frozenset[str | None] = frozenset()
    universe: frozenset[str | None] | None = None
    scanned_groups: bool = False
    group_reads: int = 0
    # Windows only: the rows read up to the last one planned (Hints.read).
    needed: int = 0
    # What a skip scan or its guard said of the number of groups: True, many;
    # False, few enough to list; None, it did not run (Hints.many_groups).
    crowded: bool | None = None
    # The keys of the entries windows read, returned or not (a window does not
    # return the entries of a limited key past its headroom, but names the key
    # with its state): how many groups the head of the queue shows.
    met: set[str | None] = field(default_factory=set)
    # Entries the windows returned (or cut), and what the claim's scans of
    # jobs_ready_free_idx have read (claim_free_read; 0: not asked), both for the
    # whole transaction (kept when a claim reads again from the head); whether
    # they were dominated, and whether a wide skip scan was tried
    # (akadze.claim._windows, DOMINATED_RATIO).
    returned: int = 0
    free_read: int = 0
    dominated: bool = False
    widened: bool = False
    # The groups presumed hopeless from the head (akadze.claim._windows,
    # PRESUME_FROM): each had at least `turn` jobs running in the queue, and
    # `top` was the highest priority of a queued row; None: no presumption.
    presumed: tuple[int, int | None] | None = None
    presumed_groups: frozenset[str] = frozenset()


def after_params(after: Position | None) -> dict[str, object]:
    if after is None:
        return {"after_priority": _HEAD_PRIORITY, "after_run_at": _EPOCH, "after_id": 0}
    neg_priority, run_at, id_ = after
    return {"after_priority": -neg_priority, "after_run_at": run_at, "after_id": id_}


def entries_of(rows: list[Row], known: KeyState) -> list[tuple[planner.Row, bool]]:
    """The index entries of a reading statement; its key-state rows (id NULL,
    after the entries) go into ``known``."""
    entries: list[tuple[planner.Row, bool]] = []
    make = planner.Row._make
    known.fresh = False
    # The open route's row first: it decides the room of the keys met.
    opened = next((r[14] for r in rows if r[0] is None and r[14] is not None), None)
    if opened is not None:
        known.open_only(opened)
    for r in rows:
        if r[0] is None:
            if r[12] is None and r[14] is None:  # a key's state (not left_out, opened)
                known.learn(r[3], r[5], r[6], r[7], r[8], r[9], r[10])
                if r[4] and r[3] is not None:
                    known.unflagged.add(r[3])  # met in the free part (its `ready`)
        else:
            entries.append((make(r[:4]), r[4]))
            if r[5] is False and r[3] is not None:
                known.unflagged.add(r[3])  # met in the free part (ready_window_parts)
    # A key met without a state row has no limits row and (fair) nothing running
    # in the queue. Keys whose state was known before the statement are skipped
    # by learn(); a key the statement left out because it was known stays as is.
    for row, _ in entries:
        key = row.key
        if (key is not None and key not in known.room and key not in known.unlimited) or (
                known.fair and key not in known.busy):
            known.learn(key, False, None, None, None, None, 0)
    return entries


def advance(reading: Reading, entries: list[tuple[planner.Row, bool]]) -> None:
    if entries:
        reading.after = entries[-1][0].position
    reading.rows.extend(e for e, ready in entries if ready)


def again(reading: Reading) -> Reading:
    """A new reading from the head (a re-plan); what a skip scan found about
    the groups stays."""
    return Reading(rows=[], universe=reading.universe, scanned_groups=reading.scanned_groups,
                   crowded=reading.crowded, returned=reading.returned,
                   dominated=reading.dominated, widened=reading.widened)
