"""The windowed claim: read the ready index in windows until no unread row can
change the result.

Decisions are made by the pure :mod:`akadze.claim._planner`; this module turns them into
steps (:mod:`akadze.claim._steps`) and the statements of ``sql/queries/claim.sql``. What
the claim knows of keys and groups, and the lock protocol, are in
:mod:`akadze.claim._keystate`; what a connection remembers between claims in
:mod:`akadze.claim._hints`. The rules, the stop rule and the lock protocol are explained
in ``docs/explanation/claim.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..jobs import ClaimedJob, job_rows
from . import _planner as planner
from ._hints import Hints
from ._keystate import KeyState, counts, learn_counts, lock_taken, wait_first
from ._steps import (
    Batch,
    Request,
    Row,
    Statement,
    Step,
    Steps,
    Steps0,
    finish,
    key_list,
    prepared,
)
from ._takes import count_taken, take, take_committing

# -- the windowed claim -----------------------------------------------------------------

# Above every smallint priority: "after" this position is the head of the queue.
_HEAD_PRIORITY = 32768
# Any time: with _HEAD_PRIORITY the first arm of a window is empty whatever it is.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The skip scan that lists a queue's groups stops after this many keys; below
# it, the claim reads per group instead of filtering the queue.
GROUP_SCAN_BOUND = 64
# ... and it is tried only when the first window (on the server, in the claim's
# first round trip) or the rows read so far show at most this many keys (a queue
# that shows many keys in its head rarely has few in total).
GROUP_SCAN_TRY = 16

Position = tuple[int, datetime, int]

# A window leaves out remembered blocked keys (akadze.claim._hints) only from this
# many on. Finding a few blocked keys costs a claim a window at most; leaving
# them out from the first window on would also make it filter their backlogs
# where the skip scan (GROUP_SCAN_TRY) reads around them for nothing. A read per
# group leaves out any number of them for free.
MEMORY_FROM = 17
# A window that leaves out keys reads the limited part of the queue per limited
# key that is not left out (akadze.ready_window, migration 0005: "split") when
# there are at most this many such keys, and in order otherwise. -1: never.
SPLIT_MAX = 32
# The first window holds what the last claim needed (Hints.read), up to this
# many entries (the default first window is planner.first_window).
READ_HINT_MAX = 2048
# A claim without transition hooks sends its locks, its take and COMMIT in one
# round trip (akadze.claim._takes); False: the classic take (tests, benches).
COMMIT_WITH_TAKE = True


def _opening(request: Request) -> tuple[Statement, Statement]:
    """The claim's first two statements, at the head of its first round trip:
    claim_start (the queue's turn and the plan settings) and claim_sweep (due
    cancel-requested and expired rows become 'cancelled')."""
    return (prepared("claim_start", {"queue": request.queue,
                                     "synchronous_commit": request.synchronous_commit}),
            prepared("claim_sweep", request.params(), rows=job_rows))


# A step generator that returns the jobs its claim_sweep cancelled (the claim's
# first round trip) or none.
Opens = Generator[Step, Any, list[ClaimedJob]]


def _opened(known: KeyState, settings: list[Row], swept: list[ClaimedJob]) -> list[ClaimedJob]:
    known.started(settings)
    return swept


@dataclass
class _Reading:
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


def _after_params(after: Position | None) -> dict[str, object]:
    if after is None:
        return {"after_priority": _HEAD_PRIORITY, "after_run_at": _EPOCH, "after_id": 0}
    neg_priority, run_at, id_ = after
    return {"after_priority": -neg_priority, "after_run_at": run_at, "after_id": id_}


def _entries(rows: list[Row], known: KeyState) -> list[tuple[planner.Row, bool]]:
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


def _read_window(
    request: Request, known: KeyState, reading: _Reading, window: int,
    exclude: frozenset[str | None], need: int | None, first: bool = False,
) -> Opens:
    """One window. ``first``: the claim's first window, which travels with the
    claim's opening statements (:func:`_opening`) and the guarded skip scan of
    the queue's groups (claim_groups), unless the last claim saw many groups."""
    statement = _window(request, known, reading, window, exclude, need)
    if not first:
        rows = yield statement
        _apply_window(known, reading, rows, window)
        return []
    settings, swept, rows, *groups = yield Batch((*_opening(request), statement,
                                                  *_guarded_groups(request)))
    cancelled = _opened(known, settings, swept)
    _apply_window(known, reading, rows, window)
    for row in groups:
        _learn_groups(known, reading, row[0])
    return cancelled


def _window(request: Request, known: KeyState, reading: _Reading, window: int,
            exclude: frozenset[str | None], need: int | None) -> Statement:
    params = {
        **request.params(), **_after_params(reading.after), **known.params(exclude),
        "window": window, "need": need,
        **known.skip_lists(exclude), "skip_null": None in exclude,
        "split_max": SPLIT_MAX, **known.window_params(),
    }
    # Without an early stop the window needs none of its machinery.
    return prepared("claim_window" if need is not None else "claim_window_whole", params)


def _apply_window(known: KeyState, reading: _Reading, rows: list[Row], window: int) -> None:
    entries = _entries(rows, known)
    # Read to the end only if the window was not cut short (planner.ReadMore.need)
    # and still came back short of its size. `cuts`: the entries of limited keys
    # past their headroom that the window read but did not return (the cut of
    # claim_entries_cut_with_state, claim_window_judged's; null elsewhere).
    scanned, cuts = next(((r[11], r[13]) for r in rows if r[0] is not None), (0, 0))
    reading.complete = len(entries) + (cuts or 0) == scanned < window
    reading.met.update(r[3] for r in rows
                       if r[0] is not None or (r[12] is None and r[14] is None))
    _advance(reading, entries)


def _read_groups(
    request: Request, known: KeyState, reading: _Reading, window: int,
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
    _apply_group_rows(known, reading, rows, per_group, groups)


def _group_rows(request: Request, known: KeyState, reading: _Reading, window: int,
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
    per_group = (max if reading.group_reads else min)(request.slots, share)
    reading.group_reads += 1
    starts = [_after_params(_group_after(reading, key)) for key in keys]
    params = {
        **request.params(),
        **_after_params(_group_after(reading, None) if None in groups else None),
        **known.params(reading.excluded),
        "keys": keys, "null_group": None in groups, "per_group": per_group,
        "from_priority": [a["after_priority"] for a in starts],
        "from_run_at": [a["after_run_at"] for a in starts],
        "from_id": [a["after_id"] for a in starts],
    }
    return prepared("claim_group_rows", params), per_group


def _group_after(reading: _Reading, group: str | None) -> Position | None:
    after = reading.reach.get(group, reading.after)
    assert after is not None or group not in reading.reach, "a group read to its end again"
    return after


def _apply_group_rows(known: KeyState, reading: _Reading, rows: list[Row], per_group: int,
                      groups: frozenset[str | None]) -> None:
    """Each group read returned at most per_group entries after its own start:
    every entry of it is now read up to its last one returned (its reach,
    planner.View.reach), or to its end if it returned fewer."""
    entries = _entries(rows, known)
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


def _advance(reading: _Reading, entries: list[tuple[planner.Row, bool]]) -> None:
    if entries:
        reading.after = entries[-1][0].position
    reading.rows.extend(e for e, ready in entries if ready)


def _groups(request: Request, guarded: bool) -> Statement:
    """The bounded skip scan of the queue's groups (claim_groups). ``guarded``:
    only if the queue's first entries (as many as the default first window,
    however large the claim's first window is) show few groups."""
    window = planner.first_window(request.slots) if guarded else 0
    params = {"queue": request.queue, "now": request.now, "bound": GROUP_SCAN_BOUND,
              "window": window, "try": GROUP_SCAN_TRY, "fair": request.fair}
    return prepared("claim_groups", params)


def _guarded_groups(request: Request) -> tuple[Statement, ...]:
    """The guarded skip scan for a claim's first round trip; none when the
    last claim of the queue read rows of many groups (Hints.many_groups): the
    guard would only say so again, and on a queue of thousands of small keys
    whose head shows few (N/5 keys x 5) the scan would run its 64 probes for
    nothing at every claim."""
    if request.hints.many_groups:
        return ()
    return (_groups(request, guarded=True),)


def _learn_groups(known: KeyState, reading: _Reading, row: Row) -> None:
    scanned, keys, has_null, busy, null_busy = row
    if not scanned:
        reading.crowded = True  # the guard saw many groups in the head
        return
    reading.scanned_groups = True
    reading.crowded = len(keys) >= GROUP_SCAN_BOUND
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


def _scan_groups(request: Request, known: KeyState, reading: _Reading) -> Steps0:
    """Try to list every group of the queue (bounded skip scan, unguarded: with
    window 0 it always runs, and _learn_groups records that it did)."""
    rows = yield _groups(request, guarded=False)
    _learn_groups(known, reading, rows[0])


def _load_state(request: Request, known: KeyState, need: planner.NeedState) -> Steps0:
    """State the reading statements did not bring (groups found by the skip scan,
    keys met before a re-plan): counted without locks, like theirs."""
    keys = [k for k in need.keys if k not in known.room and k not in known.unlimited]
    rows = yield counts(request, keys, need.groups)
    learn_counts(known, keys, need.groups, rows)


def _remembered(request: Request, keys: Sequence[str]) -> Statement:
    # Limit state only: in fair order a remembered key that has room again gets
    # its busy count from the read that meets it (it is not in `known` until its
    # busy count is), like any key met.
    return prepared("claim_remembered", {"keys": key_list(keys), "now": request.now})


def _start_with_state(request: Request, known: KeyState, reading: _Reading,
                      first_size: int) -> Opens:
    """The first round trip of a claim that remembers many blocked keys
    (:class:`akadze.claim._hints.Memory`): its opening and the first window as
    the planner would ask for it if every remembered key were still without
    room (with the guarded skip scan), read by claim_window_judged: it leaves
    out the remembered keys that are still without room, judged on the server
    in the window's own snapshot, and names them. The claim then leaves out
    exactly those (their headroom is 0) and reads the others like any key: the
    window always stands, and no remembered key costs work here."""
    keys = request.hints.blocked
    assumed = planner.plan(planner.View(
        slots=request.slots, fair=request.fair, rows=(), headroom=dict.fromkeys(keys, 0),
        first=first_size))
    assert isinstance(assumed, planner.ReadMore)
    params = {
        **request.params(), **_after_params(None), **known.params(frozenset()),
        "window": assumed.window, "need": assumed.need,
        "skip_free": key_list(()), "skip_limited": key_list(()), "skip_null": False,
        "remembered": key_list(keys),
        # Left out of the free part too, if still full: those the last claim met
        # there (queued before their key had its limit).
        "remembered_free": key_list(k for k in keys if k in known.unflagged),
        "split_max": SPLIT_MAX, "try_open": True,
    }
    settings, swept, rows, *groups = yield Batch((
        *_opening(request), prepared("claim_window_judged", params),
        *_guarded_groups(request)))
    cancelled = _opened(known, settings, swept)
    left_out = next((r[12] for r in rows if r[0] is None and r[12] is not None), ())
    for key in left_out:
        known.room.setdefault(key, 0)
    reading.window = assumed.window
    reading.excluded = frozenset(left_out)
    _apply_window(known, reading, rows, assumed.window)
    # The skip scan's answer does not depend on the window's.
    for row in groups:
        _learn_groups(known, reading, row[0])
    return cancelled


def _start_with_heads(request: Request, known: KeyState, reading: _Reading) -> Opens:
    """The first round trip of a claim that remembers the queue's groups (a
    skip scan listed them all last time): its opening, the remembered blocked
    keys' state, and the first rows of every group of the queue but those keys,
    found by a skip scan and read as the scan finds them (claim_group_heads: a
    share of the first window each, at most ``slots``). The read stands if the
    scan listed every group (fewer than GROUP_SCAN_BOUND keys): each group read
    then has its reach, and the groups with no due row have nothing to read. A
    remembered key that has room again was not read: it joins the groups with
    nothing read yet (the planner asks for its rows). If the scan did not list
    every group, the rows are dropped (the state they brought is kept: it is
    the state) and the claim reads windows. Leaving a group out of a read per
    group costs nothing, so every remembered blocked key is left out, however
    few (MEMORY_FROM is for windows, which filter)."""
    hints = request.hints
    assert hints.groups is not None
    blocked = hints.blocked
    window = planner.first_window(request.slots)
    share = -(-window // max(1, len(hints.groups - frozenset(blocked))))
    per_group = min(request.slots, share)
    statements = [*_opening(request)]
    if blocked:
        statements.append(_remembered(request, blocked))
    statements.append(prepared("claim_group_heads", {
        **request.params(), **known.params(frozenset()), "bound": GROUP_SCAN_BOUND,
        "per_group": per_group, "skip": key_list(blocked)}))
    replies = iter((yield Batch(tuple(statements))))
    cancelled = _opened(known, next(replies), next(replies))
    if blocked:
        learn_counts(known, blocked, (), next(replies))
    rows: list[Row] = next(replies)
    # The scan's row (id and key null, `scanned` set); none for a paused queue.
    listed = next((r[11] for r in rows if r[0] is None and r[11] is not None), None)
    if listed is None or listed >= GROUP_SCAN_BOUND:
        _entries(rows, known)
        reading.crowded = listed is not None
        return cancelled
    read = frozenset(r[3] for r in rows if r[0] is not None)
    reading.scanned_groups, reading.crowded = True, False
    reading.universe = read | frozenset(blocked)
    reading.excluded = frozenset(k for k in blocked if known.room.get(k) == 0)
    reading.window, reading.group_reads = window, 1
    _apply_group_rows(known, reading, rows, per_group, read)
    return cancelled


def _reopen(request: Request, known: KeyState) -> Opens:
    """A new transaction for the rest of a claim whose committed take came back
    short: the queue's turn and the plan settings again (claim_start), and the
    sweep."""
    settings, swept = yield Batch(_opening(request))
    return _opened(known, settings, swept)


def windowed_steps(request: Request) -> Steps:
    """The windowed claim (seed-claim): read the queue in windows until the
    planner proves that nothing unread can change the result."""
    known = KeyState(request.fair)
    hints = request.hints
    known.unflagged.update(hints.unflagged)
    claimed: list[ClaimedJob] = []
    skip: set[int] = set()
    # The first round trip opens with claim_start: the queue's turn (docs/
    # explanation/claim.md, "Claims of one queue take turns"), the claim's first
    # lock, taken holding nothing; then claim_sweep. It carries the first read:
    # a window, or with few remembered groups a read per group; with many
    # remembered blocked keys, their state and a window that leaves them out.
    reading = _Reading(rows=[])
    cancelled: list[ClaimedJob] = []
    first = True
    # The first window holds what the last claim needed, and a claim's worth
    # more (a hint: a window that needs more reads on as always), larger or
    # smaller than the default. Not a multiple: where every row read brings a
    # new group, each row costs its group's state (~10 us), and 1.5x the need
    # was 20 % slower than 1x on "200 of 400 groups busy"; a fair queue whose
    # claims need 20 rows read 40 instead of 80, 15 % faster ("5% urgent").
    first_size = min(hints.read + request.slots, READ_HINT_MAX) if hints.read else 0
    if hints.groups is not None:
        # The last claim's skip scan listed every group: read each group's head
        # (each from its own position, planner.View.reach), checking the list.
        cancelled = yield from _start_with_heads(request, known, reading)
        first = False
    elif len(hints.blocked) >= MEMORY_FROM:
        cancelled = yield from _start_with_state(request, known, reading, first_size)
        first = False
    waited = False
    # Without transition hooks nothing needs the transaction after the take,
    # so the take commits: its locks, the take and COMMIT in one round trip.
    committing = COMMIT_WITH_TAKE and not request.hooks
    while len(claimed) < request.slots:
        slots = request.slots - len(claimed)
        decision: planner.Decision
        while True:
            view = planner.View(
                slots=slots, fair=request.fair, rows=reading.rows,
                after=reading.after, reach=reading.reach, complete=reading.complete,
                window=reading.window,
                excluded=reading.excluded, headroom=known.room,
                unlimited=known.unlimited, busy=known.busy, universe=reading.universe,
                skip=skip, first=first_size,
            )
            decision = planner.plan(view)
            if isinstance(decision, planner.Settled):
                if committing:
                    break  # its locks travel with the take (akadze.claim._takes)
                want = set(decision.take)
                need = Counter(
                    r.key for r in reading.rows
                    if r.id in want and r.key in known.room and r.key not in known.locked)
                if need:
                    if (yield from lock_taken(request, known, need, bool(claimed))):
                        break
                    # A headroom changed under the lock (another claim started
                    # or finished jobs of the key, or holds it): plan again.
                elif decision.take or claimed or known.locked or not known.held or waited:
                    break
                else:
                    waited = True
                    yield from wait_first(request, known)
                # From the head; the groups listed by a skip scan stay listed.
                reading = _again(reading)
                continue
            if isinstance(decision, planner.NeedState):
                yield from _load_state(request, known, decision)
                continue
            if (reading.universe is None and not reading.scanned_groups and reading.window
                    and not hints.many_groups
                    and len(reading.met) <= GROUP_SCAN_TRY):
                yield from _scan_groups(request, known, reading)
                if reading.universe is not None:
                    continue  # plan again: fair groups may need their busy counts
            reading.window = decision.window
            reading.excluded = decision.exclude
            reading.rows = planner.prune(reading.rows, known.room, reading.excluded)
            if reading.universe is not None:
                yield from _read_groups(request, known, reading, decision.window,
                                        decision.exclude)
            else:
                cancelled += yield from _read_window(
                    request, known, reading, decision.window, decision.exclude,
                    decision.need, first=first)
                first = False
        # The first read took the queue's turn (claim_start) before anything else.
        assert known.settings is not None
        planned = decision.take
        reading.needed = _needed(reading, set(planned))
        if not planned:
            break
        if committing:
            got = yield from take_committing(request, known, reading.rows, planned)
            claimed.extend(got)
            if len(got) == len(planned):
                count_taken(request, known, got)
                break
            # The guard refused (a key lost room or is held by another claim)
            # or rows were held: the transaction has ended with what it took.
            # The remaining slots are claimed in a new transaction, the
            # classic way (locks, counts and takes in a round trip each, as
            # many as it takes), which waits where a claim may wait.
            committing = False
            known = KeyState(request.fair)
            cancelled += yield from _reopen(request, known)
            reading, skip, waited = _Reading(rows=[]), set(), False
            continue
        got = yield from take(request, planned)
        claimed.extend(got)
        count_taken(request, known, got)
        if len(got) == len(planned):
            break
        # Rows another claim holds: plan the remaining slots again from the
        # head, leaving them out.
        got_ids = {job.id for job in got}
        skip.update(i for i in planned if i not in got_ids)
        reading = _again(reading)
    cancelled.sort(key=lambda job: job.id)
    if request.on_done is not None:
        # For the next claim: the keys without room now (this claim's starts
        # counted), how far its windows read to its last planned row, the
        # queue's groups.
        blocked = tuple(key for key, room in known.room.items() if room == 0)
        request.on_done(Hints(
            blocked=blocked,
            unflagged=frozenset(key for key in blocked if key in known.unflagged),
            read=reading.needed if reading.universe is None else 0,
            groups=reading.universe,
            many_groups=_many_groups(request, reading)))
    if known.settings is not None and request.hooks:
        # The hooks run with the caller's settings (no round trip: this travels
        # with the hooks' first statement). Without hooks nothing more runs in
        # the transaction, and its settings end with it.
        yield prepared("claim_plan_restore", known.settings, fetch=False)
    return (yield from finish(cancelled, claimed))


def _needed(reading: _Reading, planned: set[int]) -> int:
    """How many of the rows read come up to the last planned one (the rows read
    are in queue order). Not how many were read: a window larger than the
    claim needed must not make the next one as large."""
    return max((n for n, row in enumerate(reading.rows, 1) if row.id in planned), default=0)


def _again(reading: _Reading) -> _Reading:
    """A new reading from the head (a re-plan); what a skip scan found about
    the groups stays."""
    return _Reading(rows=[], universe=reading.universe, scanned_groups=reading.scanned_groups,
                    crowded=reading.crowded)


def _many_groups(request: Request, reading: _Reading) -> bool:
    """Hints.many_groups for the next claim: what the skip scan or its guard
    said, if it ran; else (the hint spared it) whether the head of the queue
    read still shows as many groups as the guard tolerates. So the hint lasts
    while the head looks crowded and goes when it stops (the next claim tries
    the guard again), but never lives on only because a claim read far."""
    if reading.crowded is not None:
        return reading.crowded
    head = reading.rows[:planner.first_window(request.slots)]
    return request.hints.many_groups and len({r.key for r in head}) >= GROUP_SCAN_TRY
