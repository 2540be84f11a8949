"""The claim planner: given what a claim has read of a queue so far, decide.

Pure: plain data in, a decision out; standard library only. The I/O shell is
:mod:`akadze.claim._windows` (run by :mod:`akadze.claim._drivers`); the rules are those of
``docs/explanation/claim.md``.

The shell reads the ready rows of one queue in queue order (``priority DESC,
run_at, id``), a window at a time, leaving out the keys the planner excluded.
What it has read is therefore an exact prefix of the queue up to a boundary
position, minus the rows of excluded keys read after their exclusion. The
planner answers one of:

* :class:`NeedState`: load the limit state of these keys and/or the busy count of
  these fair groups first (they appear in rows read and were never loaded);
* :class:`Settled`: no unread row can change the result; take these ids;
* :class:`ReadMore`: read the next window of this size, leaving out these keys.

Why stopping is exact: every unread row lies after the boundary in queue order,
so it can only beat a planned row by ranking before it, and the planner stops
only when it can prove that no unread row does (see :func:`plan`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

__all__ = [
    "MAX_WINDOW",
    "Decision",
    "Limit",
    "NeedState",
    "ReadMore",
    "Row",
    "Settled",
    "View",
    "first_window",
    "headroom",
    "plan",
    "prune",
]

# A group key: a limit_key, or None for the group of jobs without one.
Key = str | None

# Windows double up to this many rows; beyond it they stay this size.
MAX_WINDOW = 8192
# In fair order a window may stop early (ReadMore.need) from this many times the
# first window on.
FAIR_CUT_FROM = 4


class Row(NamedTuple):
    """One ready job, as the claim reads it from the index (a named tuple: the
    claim makes one per index entry read, thousands in a long claim)."""

    id: int
    priority: int
    run_at: datetime
    key: Key

    @property
    def position(self) -> tuple[int, datetime, int]:
        """Sort key of queue order: priority DESC, run_at, id."""
        return (-self.priority, self.run_at, self.id)


@dataclass(frozen=True)
class Limit:
    """A limits row and what counts against it, read under the row's lock."""

    max_running: int | None
    running: int
    max_starts: int | None
    starts: int


def headroom(limit: Limit) -> int:
    """How many more jobs of the key may start now: the smaller of what each
    present policy allows, never below zero."""
    room: list[int] = []
    if limit.max_running is not None:
        room.append(limit.max_running - limit.running)
    if limit.max_starts is not None:
        room.append(limit.max_starts - limit.starts)
    if not room:
        raise ValueError("a limit needs max_running or max_starts")
    return max(0, min(room))


@dataclass(frozen=True)
class View:
    """What the claim knows.

    ``rows``: the rows read, in queue order (ready rows only). ``boundary``: the
    priority of the last index entry read (None: nothing read yet). ``complete``:
    nothing is left unread (apart from excluded keys). ``excluded``: keys left
    out of the windows since some point; the planner only ever adds to it.
    ``headroom``: limited keys with their headroom (a key another claim holds
    has 0). ``unlimited``: keys known to have no limits row. ``busy``: fair
    groups with their running jobs in this queue. ``universe``: when known, every
    group that has queued rows in the queue (a skip scan found them all); groups
    outside ``rows`` then get their own busy count instead of the floor 0.
    ``skip``: ids another claim held when we tried to take them (not ready).
    ``first``: the size of the first window, a hint (about what the last claim
    of the queue needed); 0: the default, :func:`first_window`.
    """

    slots: int
    fair: bool
    rows: Sequence[Row]
    boundary: int | None = None
    complete: bool = False
    window: int = 0
    excluded: frozenset[Key] = frozenset()
    headroom: Mapping[str, int] = field(default_factory=dict)
    unlimited: Collection[str] = frozenset()
    busy: Mapping[Key, int] = field(default_factory=dict)
    universe: frozenset[Key] | None = None
    skip: Collection[int] = frozenset()
    first: int = 0


@dataclass(frozen=True)
class Settled:
    """Take these ids, in this (claim) order."""

    take: tuple[int, ...]


@dataclass(frozen=True)
class NeedState:
    """Load these keys' limit state and these groups' busy counts, then plan again."""

    keys: tuple[str, ...] = ()
    groups: tuple[Key, ...] = ()


@dataclass(frozen=True)
class ReadMore:
    """Read the next ``window`` rows after the boundary, leaving out ``exclude``.

    ``need``: the read may stop early, after ``need`` rows that are sure to
    help: in default order, rows of keys without a limits row (or without a
    key), which are eligible; in fair order, rows that are sure to have turn 1
    (the first row read of a group without a limits row and with nothing
    running in the queue). Once that many are read the claim can settle (fair:
    with ``slots`` rows of turn 1 read, the worst planned row has turn 1 or a
    priority above every unread row). What is read is still a prefix of the
    queue, so stopping early changes what is read, never the result."""

    window: int
    exclude: frozenset[Key]
    need: int | None = None


Decision = Settled | NeedState | ReadMore


def first_window(slots: int) -> int:
    return min(MAX_WINDOW, max(1, slots) * 4)


def _next_window(view: View) -> int:
    if view.window <= 0:
        return min(MAX_WINDOW, view.first) if view.first > 0 else first_window(view.slots)
    return min(MAX_WINDOW, view.window * 2)


def _missing_state(view: View) -> NeedState | None:
    keys: dict[str, None] = {}
    groups: dict[Key, None] = {}
    for row in view.rows:
        key = row.key
        if key is not None and key not in view.headroom and key not in view.unlimited:
            keys[key] = None
        if view.fair and key not in view.busy:
            groups[key] = None
    if view.fair and view.universe is not None:
        for group in sorted(view.universe - view.excluded, key=_key_order):
            if group not in view.busy:
                groups[group] = None
    if keys or groups:
        return NeedState(tuple(keys), tuple(groups))
    return None


def _key_order(key: Key) -> tuple[bool, str]:
    return (key is None, key or "")


def _eligible(view: View) -> tuple[list[Row], Counter[str]]:
    """The limit-eligible rows read, in queue order, and how many rows of each
    limited key were read (eligible or not)."""
    seen: Counter[str] = Counter()
    eligible: list[Row] = []
    for row in view.rows:
        if row.id in view.skip:
            continue
        key = row.key
        if key is not None and key in view.headroom:
            seen[key] += 1
            if seen[key] > view.headroom[key]:
                continue
        eligible.append(row)
    return eligible, seen


def _exhausted(view: View, seen: Counter[str]) -> set[Key]:
    """Limited keys none of whose unread rows can be eligible."""
    return {key for key, room in view.headroom.items() if seen[key] >= room}


def prune(rows: Sequence[Row], room: Mapping[str, int], excluded: Collection[Key]) -> list[Row]:
    """The rows that can still matter: drops the rows of excluded limited keys
    past their headroom. Such a row is not eligible, and nothing else reads it:
    eligibility numbers a key's rows from its first, so the rows before it keep
    their numbers, and an excluded key stays excluded. Keeps a long claim from
    planning over every blocked row again and again."""
    seen: Counter[str] = Counter()
    kept: list[Row] = []
    for row in rows:
        key = row.key
        if key is not None and key in excluded and key in room:
            seen[key] += 1
            if seen[key] > room[key]:
                continue
        kept.append(row)
    return kept


def plan(view: View) -> Decision:
    """Decide what the claim does next (see the module docstring)."""
    if view.slots <= 0:
        return Settled(())
    missing = _missing_state(view)
    if missing is not None:
        return missing
    eligible, seen = _eligible(view)
    if view.fair:
        return _plan_fair(view, eligible, seen)
    # Default order: the first `slots` eligible rows. Every unread row comes
    # after every read row in queue order, so once `slots` eligible rows are
    # read, nothing unread can take their place.
    if len(eligible) >= view.slots or view.complete:
        return Settled(tuple(row.id for row in eligible[: view.slots]))
    return ReadMore(_next_window(view), view.excluded | _exhausted(view, seen),
                    need=view.slots - len(eligible))


def turns(rows: Iterable[Row], busy: Mapping[Key, int]) -> list[tuple[Row, int]]:
    """Each eligible row with its turn: busy(group) + its rank among the eligible
    rows of its group at its priority (rows in queue order)."""
    rank: Counter[tuple[Key, int]] = Counter()
    out: list[tuple[Row, int]] = []
    for row in rows:
        rank[(row.key, row.priority)] += 1
        out.append((row, busy.get(row.key, 0) + rank[(row.key, row.priority)]))
    return out


def _plan_fair(view: View, eligible: list[Row], seen: Counter[str]) -> Decision:
    turned = turns(eligible, view.busy)
    # Sort key of fair order: priority DESC, turn, run_at, id (a plain tuple:
    # this runs over every eligible row read).
    ranked = sorted(turned, key=lambda rt: (-rt[0].priority, rt[1], rt[0].run_at, rt[0].id))
    chosen = ranked[: view.slots]
    take = tuple(row.id for row, _ in chosen)
    if view.complete:
        return Settled(take)
    exhausted = _exhausted(view, seen)
    window = _next_window(view)
    # The early stop costs the window statement two probes per group it meets
    # (limits row, running jobs), so it is asked for only where a window is
    # large enough for it to pay: after several windows, typically past many
    # excluded keys.
    need = None
    if window >= FAIR_CUT_FROM * first_window(view.slots):
        need = view.slots - sum(1 for _, turn in turned if turn == 1)
    if len(chosen) < view.slots:
        # Any eligible unread row would join the claim: read on, leaving out
        # only the keys that have no eligible row left.
        return ReadMore(window, view.excluded | exhausted, need)
    last_row, last_turn = chosen[-1]
    boundary = view.boundary
    if boundary is None or last_row.priority > boundary:
        # Unread rows all have a lower priority than the worst planned row.
        return Settled(take)
    # The worst planned row is at the boundary priority p. An unread row u at p
    # comes after it in (run_at, id), so u takes its place only with a turn
    # strictly below last_turn; unread rows below p cannot. A group's next
    # eligible row at p has turn >= busy + (its eligible rows read at p) + 1.
    at_boundary: Counter[Key] = Counter(row.key for row in eligible if row.priority == boundary)
    groups_read = {row.key for row in view.rows}
    hopeless: set[Key] = set()
    settled = True
    for group in groups_read | (view.universe or frozenset()):
        if group in view.excluded or group in exhausted:
            continue
        floor = view.busy.get(group, 0) + at_boundary[group] + 1
        if floor >= last_turn:
            hopeless.add(group)
        else:
            settled = False
    if view.universe is None and last_turn > 1:
        # Groups never seen: busy >= 0, so their next turn may be as low as 1.
        settled = False
    if settled:
        return Settled(take)
    return ReadMore(window, view.excluded | exhausted | hopeless, need)
