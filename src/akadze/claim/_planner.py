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

Reads per group (once a skip scan listed the queue's groups) extend each
group's own prefix: what is read of a group is then every row of it up to its
``reach`` (or all of it), whatever was read of the others.

Why stopping is exact: every unread row of a group lies after that group's
reach (the boundary, for a group not read per group) in queue order, so it can
only beat a planned row by ranking before it, and the planner stops only when
it can prove that no unread row does (see :func:`plan`).
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
    "presumption_holds",
    "prune",
]

# A group key: a limit_key, or None for the group of jobs without one.
Key = str | None
# Sort key of queue order: (-priority, run_at, id).
Position = tuple[int, datetime, int]

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
    def position(self) -> Position:
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

    ``rows``: the rows read, in queue order (ready rows only). ``after``: the
    position of the last index entry the windows read (None: none yet): every
    entry up to it was read, but for the excluded keys. ``reach``: for the groups
    read per group since, where each one's read stopped: every entry of the
    group up to that position was read (None: every entry of the group was).
    ``complete``: nothing is left unread (apart from excluded keys). ``excluded``: keys left
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
    after: Position | None = None
    reach: Mapping[Key, Position | None] = field(default_factory=dict)
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
    """Take these ids, in this (claim) order. ``worst``: in fair order, when
    ``slots`` rows are planned, the priority and the turn of the last of them."""

    take: tuple[int, ...]
    worst: tuple[int, int] | None = None


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
    """Limited keys none of whose unread rows can be eligible. (``seen.get``: a
    Counter's ``[]`` calls ``__missing__`` in Python for every key not read, and
    a claim remembering a thousand blocked keys asks for a thousand.)"""
    get = seen.get
    return {key for key, room in view.headroom.items() if get(key, 0) >= room}


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


def _done(view: View) -> set[Key]:
    """Groups read per group to their last row: nothing of them is left unread."""
    return {group for group, edge in view.reach.items() if edge is None}


def _edge(view: View, group: Key) -> Position | None:
    """Where the rows read of a group (not done) stop: its unread rows all come
    after this position in queue order. None: nothing was read yet."""
    return view.reach.get(group, view.after)


def _groups_read(view: View) -> set[Key]:
    return {row.key for row in view.rows} | set(view.universe or ()) | set(view.reach)


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
    # Default order: the first `slots` eligible rows. Once `slots` eligible rows
    # are read and every unread row comes after the last of them, nothing unread
    # can take their place. Read by windows, every unread row comes after every
    # read row; read per group, a group's unread rows come after its reach.
    exhausted = _exhausted(view, seen)
    if view.complete:
        return Settled(tuple(row.id for row in eligible[: view.slots]))
    stop = view.excluded | exhausted | _done(view)
    if len(eligible) >= view.slots:
        last = eligible[view.slots - 1].position
        pending = False
        behind: set[Key] = set()
        for group in _groups_read(view) - stop:
            edge = _edge(view, group)
            if edge is not None and edge >= last:
                behind.add(group)  # its unread rows all come after the last taken
            else:
                pending = True
        if view.universe is None and (view.after is None or view.after < last):
            pending = True  # groups never seen
        if not pending:
            return Settled(tuple(row.id for row in eligible[: view.slots]))
        return ReadMore(_next_window(view), stop | behind)
    return ReadMore(_next_window(view), stop, need=view.slots - len(eligible))


def turns(rows: Iterable[Row], busy: Mapping[Key, int]) -> list[tuple[Row, int]]:
    """Each eligible row with its turn: busy(group) + its rank among the eligible
    rows of its group at its priority (rows in queue order)."""
    rank: Counter[tuple[Key, int]] = Counter()
    out: list[tuple[Row, int]] = []
    for row in rows:
        rank[(row.key, row.priority)] += 1
        out.append((row, busy.get(row.key, 0) + rank[(row.key, row.priority)]))
    return out


def _beats(edge: Position | None, floor: int, last: Row, last_turn: int) -> bool:
    """Whether a group's next eligible row may rank before ``last`` (the worst
    planned row, of turn ``last_turn``): the row comes after ``edge`` in queue
    order (None: anywhere), and if it is at ``last``'s priority its turn is at
    least ``floor``."""
    if edge is None:
        return True
    priority = -edge[0]
    if priority != last.priority:
        # Unread rows of the group have a priority <= the edge's: below the
        # worst planned row's, they cannot beat it; above, they may.
        return priority > last.priority
    # At the worst planned row's priority p: an unread row u of the group beats
    # it with a lower turn, or with the same turn and an earlier (run_at, id),
    # which u after the edge can have only if the edge comes before it.
    return floor < last_turn or (floor == last_turn and edge < last.position)


def _plan_fair(view: View, eligible: list[Row], seen: Counter[str]) -> Decision:
    turned = turns(eligible, view.busy)
    # Sort key of fair order: priority DESC, turn, run_at, id (a plain tuple:
    # this runs over every eligible row read).
    ranked = sorted(turned, key=lambda rt: (-rt[0].priority, rt[1], rt[0].run_at, rt[0].id))
    chosen = ranked[: view.slots]
    take = tuple(row.id for row, _ in chosen)
    worst = (chosen[-1][0].priority, chosen[-1][1]) if len(chosen) == view.slots else None
    if view.complete:
        return Settled(take, worst)
    stop = view.excluded | _exhausted(view, seen) | _done(view)
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
        return ReadMore(window, stop, need)
    last_row, last_turn = chosen[-1]
    # The worst planned row c is at priority p with turn T. An unread row of a
    # group comes after the group's edge (where its rows read stop); at p, its
    # turn is at least busy + (the group's eligible rows read at p) + 1. A group
    # none of whose unread rows can beat c never can: c only improves.
    at_p: Counter[Key] = Counter(row.key for row in eligible
                                 if row.priority == last_row.priority)
    hopeless: set[Key] = set()
    settled = True
    for group in _groups_read(view) - stop:
        floor = view.busy.get(group, 0) + at_p[group] + 1
        if _beats(_edge(view, group), floor, last_row, last_turn):
            settled = False
        else:
            hopeless.add(group)
    if view.universe is None and _beats(view.after, 1, last_row, last_turn):
        # Groups never seen: busy >= 0, so their next turn may be as low as 1.
        settled = False
    if settled:
        return Settled(take, worst)
    return ReadMore(window, stop | hopeless, need)


def presumption_holds(settled: Settled, turn: int, top: int | None) -> bool:
    """Whether a fair plan made with groups presumed hopeless, and left out of
    every read from the head, stands. Each such group had at least ``turn`` jobs
    running in the queue, and ``top`` is the highest priority of a queued row
    (None: no row). The plan stands when it planned all its slots and none of
    those groups' rows can rank before its worst row c, at priority p with turn
    T: a row at a priority below p cannot, and one at p has a turn of at least
    busy + 1 > T when T <= ``turn``. So: every queued row is at p or below and
    T <= ``turn``, or every queued row is below p."""
    if settled.worst is None:
        return False
    priority, worst_turn = settled.worst
    if top is None or top < priority:
        return True
    return top == priority and worst_turn <= turn
