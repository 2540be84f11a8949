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
from typing import Any

from ..jobs import ClaimedJob, job_rows
from . import _planner as planner
from ._groupreads import (
    apply_group_rows,
    first_per_group,
    guarded_groups,
    learn_groups,
    read_groups,
    scan_groups,
)
from ._hints import Hints
from ._keystate import KeyState, counts, learn_counts, lock_taken, wait_first
from ._reading import Reading, advance, after_params, again, entries_of
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

# The skip scan that lists a queue's groups stops after this many keys; below
# it, the claim reads per group instead of filtering the queue.
GROUP_SCAN_BOUND = 64
# ... and it is tried only when the first window (on the server, in the claim's
# first round trip) or the rows read so far show at most this many keys (a queue
# that shows many keys in its head rarely has few in total).
GROUP_SCAN_TRY = 16
# A window that leaves keys out of the free part filters their entries one index
# tuple at a time: behind a key that holds most of the queue (its turns hopeless
# in fair order), a window of 160 read 90 000 entries (25 ms of a claim). When the
# claim's scans of jobs_ready_free_idx have read more than DOMINATED_RATIO entries
# per entry the windows returned, and at least DOMINATED_FROM, the windows were
# dominated. When the last claim's were too (Hints.dominated: one claim is not
# enough, the entries of a mass completion's dead rows count until a scan marks
# them dead), the claim lists the queue's groups with a skip scan of up to
# WIDE_GROUP_SCAN keys and, if that lists them all, reads per group from there
# on (a probe per group, whatever their backlogs); the next WIDE_CLAIMS claims
# read per group from the start while the list stays complete, and then windows
# again, which find out anew whether they are dominated.
DOMINATED_FROM = 4096
DOMINATED_RATIO = 8
WIDE_GROUP_SCAN = 1024
WIDE_CLAIMS = 64

# A window leaves out remembered blocked keys (akadze.claim._hints) only from this
# many on. Finding a few blocked keys costs a claim a window at most; leaving
# them out from the first window on would also make it filter their backlogs
# where the skip scan (GROUP_SCAN_TRY) reads around them for nothing. A read per
# group leaves out any number of them for free.
MEMORY_FROM = 17
# A fair claim presumes hopeless the groups its connection's last claim of the
# queue found with at least as many jobs running in the queue as the turn of its
# worst planned row (Hints.busy), when there are at least this many, and at most
# PRESUME_MAX of them: its first round trip judges which still have that many
# (claim_presume_busy, a probe each) and its first window leaves those out
# (claim_window_presumed). Without it, each busy group at the head of the queue
# cost its entry, a ready probe, a limits probe, a busy count and a row of state
# per claim ("200 of 400 groups busy": 440 rows for 20 jobs). The plan stands
# only if no row of theirs can beat its worst planned row
# (planner.presumption_holds); otherwise the claim reads again from the head.
PRESUME_FROM = 16
PRESUME_MAX = 1024
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
    start = {"queue": request.queue, "synchronous_commit": request.synchronous_commit}
    if request.not_before is not None:  # wait for that moment, then take the turn
        opening = prepared("claim_start_at", {**start, "not_before": request.not_before})
    else:
        opening = prepared("claim_start", start)
    return (opening,
            prepared("claim_sweep", request.params(), rows=job_rows))


# A step generator that returns the jobs its claim_sweep cancelled (the claim's
# first round trip) or none.
Opens = Generator[Step, Any, list[ClaimedJob]]


def _opened(known: KeyState, settings: list[Row], swept: list[ClaimedJob]) -> list[ClaimedJob]:
    known.started(settings)
    return swept


def _read_window(
    request: Request, known: KeyState, reading: Reading, window: int,
    exclude: frozenset[str | None], need: int | None, first: bool = False,
) -> Opens:
    """One window. ``first``: the claim's first window, which travels with the
    claim's opening statements (:func:`_opening`) and the guarded skip scan of
    the queue's groups (claim_groups), unless the last claim saw many groups."""
    statement = _window(request, known, reading, window, exclude, need)
    if not first:
        if _watched(reading, statement):
            rows, read = yield Batch((statement, prepared("claim_free_read", {})))
            reading.free_read = known.free_read_since(read)
        else:
            rows = yield statement
        _apply_window(known, reading, rows, window)
        return []
    scan = guarded_groups(request, GROUP_SCAN_BOUND, GROUP_SCAN_TRY)
    settings, swept, rows, *groups = yield Batch((*_opening(request), statement, *scan))
    cancelled = _opened(known, settings, swept)
    _apply_window(known, reading, rows, window)
    for row in groups:
        learn_groups(known, reading, row[0], GROUP_SCAN_BOUND)
    return cancelled


def _watched(reading: Reading, statement: Statement) -> bool:
    """Whether a window is sent with claim_free_read: one that leaves keys out of
    the free part (it filters their entries), while the queue's groups are not
    listed and no wide skip scan was tried yet."""
    params = statement.params
    skip_free = params.get("skip_free") if isinstance(params, dict) else None
    return (reading.universe is None and not reading.widened
            and bool(getattr(skip_free, "obj", None)))


def _dominated(reading: Reading) -> bool:
    """The free part's scans read mostly the entries of keys left out
    (DOMINATED_RATIO): the queue's groups are worth listing (WIDE_GROUP_SCAN)."""
    return (reading.universe is None and not reading.widened
            and reading.free_read >= DOMINATED_FROM
            and reading.free_read > DOMINATED_RATIO * reading.returned)


def _when_dominated(request: Request, known: KeyState, reading: Reading) -> Steps0:
    """After a window: if it was dominated, remember it, and if the last claim's
    were too (Hints.dominated), list the queue's groups with the wide skip scan."""
    if not _dominated(reading):
        return
    reading.dominated = True
    if request.hints.dominated:
        reading.widened = True
        yield from scan_groups(request, known, reading, WIDE_GROUP_SCAN, WIDE_GROUP_SCAN)


def _window(request: Request, known: KeyState, reading: Reading, window: int,
            exclude: frozenset[str | None], need: int | None) -> Statement:
    params = {
        **request.params(), **after_params(reading.after), **known.params(exclude),
        "window": window, "need": need,
        **known.skip_lists(exclude), "skip_null": None in exclude,
        "split_max": SPLIT_MAX, **known.window_params(),
    }
    # Without an early stop the window needs none of its machinery.
    return prepared("claim_window" if need is not None else "claim_window_whole", params)


def _apply_window(known: KeyState, reading: Reading, rows: list[Row], window: int) -> None:
    entries = entries_of(rows, known)
    # Read to the end only if the window was not cut short (planner.ReadMore.need)
    # and still came back short of its size. `cuts`: the entries of limited keys
    # past their headroom that the window read but did not return (the cut of
    # claim_entries_cut_with_state, claim_window_judged's; null elsewhere).
    scanned, cuts = next(((r[11], r[13]) for r in rows if r[0] is not None), (0, 0))
    reading.complete = len(entries) + (cuts or 0) == scanned < window
    reading.returned += len(entries) + (cuts or 0)
    reading.met.update(r[3] for r in rows
                       if r[0] is not None or (r[12] is None and r[14] is None))
    advance(reading, entries)


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


def _start_with_state(request: Request, known: KeyState, reading: Reading,
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
        **request.params(), **after_params(None), **known.params(frozenset()),
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
        *guarded_groups(request, GROUP_SCAN_BOUND, GROUP_SCAN_TRY)))
    cancelled = _opened(known, settings, swept)
    left_out = next((r[12] for r in rows if r[0] is None and r[12] is not None), ())
    for key in left_out:
        known.room.setdefault(key, 0)
    reading.window = assumed.window
    reading.excluded = frozenset(left_out)
    _apply_window(known, reading, rows, assumed.window)
    # The skip scan's answer does not depend on the window's.
    for row in groups:
        learn_groups(known, reading, row[0], GROUP_SCAN_BOUND)
    return cancelled


def _start_presuming(request: Request, known: KeyState, reading: Reading,
                     first_size: int, judge: Statement) -> Opens:
    """The first round trip of a fair claim that presumes groups hopeless
    (PRESUME_FROM): its opening, the judgement of those groups
    (claim_presume_busy), the first window without the groups judged still
    busy enough (claim_window_presumed) and the guarded skip scan. The claim
    then plans with those groups left out from the head; the loop checks the
    presumption once it has settled (planner.presumption_holds)."""
    hints = request.hints
    assumed = planner.plan(planner.View(
        slots=request.slots, fair=True, rows=(), first=first_size))
    assert isinstance(assumed, planner.ReadMore)
    params = {
        **request.params(), **after_params(None), **known.params(frozenset()),
        "window": assumed.window, "skip_limited": key_list(()), "skip_null": False,
        "split_max": SPLIT_MAX, **known.window_params(),
    }
    # With claim_free_read: a window that leaves busy groups out filters their
    # entries one at a time, and a backlog of theirs piled up at the head of the
    # queue (they get no turn while others have jobs) makes it dominated
    # (DOMINATED_RATIO), as any window that leaves keys out of the free part.
    settings, swept, judged, rows, read, *groups = yield Batch((
        *_opening(request), judge, prepared("claim_window_presumed", params),
        prepared("claim_free_read", {}),
        *guarded_groups(request, GROUP_SCAN_BOUND, GROUP_SCAN_TRY)))
    cancelled = _opened(known, settings, swept)
    _presumed(reading, hints, judged[0])
    reading.window = assumed.window
    reading.free_read = known.free_read_since(read)
    _apply_window(known, reading, rows, assumed.window)
    for row in groups:
        learn_groups(known, reading, row[0], GROUP_SCAN_BOUND)
    return cancelled


def _judge(request: Request) -> tuple[Statement, ...]:
    """claim_presume_busy for the claim's first round trip, when it presumes
    the remembered busy groups hopeless (PRESUME_FROM); none otherwise."""
    hints = request.hints
    if not (request.fair and len(hints.busy) >= PRESUME_FROM and hints.busy_turn > 0):
        return ()
    return (prepared("claim_presume_busy", {
        "groups": key_list(hints.busy), "queue": request.queue, "turn": hints.busy_turn}),)


def _presumed(reading: Reading, hints: Hints, judged: Row) -> frozenset[str]:
    """What claim_presume_busy judged: the groups the claim leaves out from the
    head (checked once it has settled: planner.presumption_holds)."""
    _, presumed, top = judged
    if presumed:
        reading.presumed_groups = frozenset(presumed)
        reading.excluded = reading.excluded | reading.presumed_groups
        reading.presumed = (hints.busy_turn, top)
    return reading.presumed_groups


def _start_with_heads(request: Request, known: KeyState, reading: Reading) -> Opens:
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
    # A list longer than the skip scan's bound came from a wide scan (DOMINATED_RATIO),
    # good for the claims Hints.wide says
    bound = WIDE_GROUP_SCAN if hints.wide else GROUP_SCAN_BOUND
    share = -(-window // max(1, len(hints.groups - frozenset(blocked))))
    per_group = first_per_group(request, share)
    statements = [*_opening(request)]
    if blocked:
        statements.append(_remembered(request, blocked))
    # The busy groups presumed hopeless (PRESUME_FROM) are judged first and
    # left out of the read like the blocked keys (claim_group_heads reads the
    # groups judged from akadze.claim_presumed).
    judge = _judge(request)
    statements.extend(judge)
    statements.append(prepared("claim_group_heads", {
        **request.params(), **known.params(frozenset()), "bound": bound,
        "per_group": per_group, "skip": key_list(blocked)}))
    replies = iter((yield Batch(tuple(statements))))
    cancelled = _opened(known, next(replies), next(replies))
    if blocked:
        learn_counts(known, blocked, (), next(replies))
    judged = _presumed(reading, hints, next(replies)[0]) if judge else frozenset()
    rows: list[Row] = next(replies)
    # The scan's row (id and key null, `scanned` set); none for a paused queue.
    listed = next((r[11] for r in rows if r[0] is None and r[11] is not None), None)
    if listed is None or listed >= bound:
        entries_of(rows, known)
        reading.crowded = listed is not None
        return cancelled
    read = frozenset(r[3] for r in rows if r[0] is not None)
    reading.scanned_groups, reading.crowded = True, False
    reading.universe = read | frozenset(blocked) | judged
    reading.excluded = frozenset(k for k in blocked if known.room.get(k) == 0) | judged
    reading.window, reading.group_reads = window, 1
    apply_group_rows(known, reading, rows, per_group, read)
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
    reading = Reading(rows=[])
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
    elif judge := _judge(request):
        cancelled = yield from _start_presuming(request, known, reading, first_size, *judge)
        first = False
        yield from _when_dominated(request, known, reading)
    # The priority and turn of the worst row of the last plan (Settled.worst).
    worst: tuple[int, int] | None = None
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
                if reading.presumed is not None and not planner.presumption_holds(
                        decision, *reading.presumed):
                    # A row of a group presumed hopeless may beat the worst
                    # planned row: from the head, without the presumption.
                    reading = again(reading)
                    continue
                worst = decision.worst
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
                reading = again(reading)
                continue
            if isinstance(decision, planner.NeedState):
                yield from _load_state(request, known, decision)
                continue
            if (reading.universe is None and not reading.scanned_groups and reading.window
                    and not hints.many_groups
                    and len(reading.met) <= GROUP_SCAN_TRY):
                yield from scan_groups(request, known, reading, GROUP_SCAN_BOUND, GROUP_SCAN_TRY)
                if reading.universe is not None:
                    continue  # plan again: fair groups may need their busy counts
            reading.window = decision.window
            reading.excluded = decision.exclude
            reading.rows = planner.prune(reading.rows, known.room, reading.excluded)
            if reading.universe is not None:
                yield from read_groups(request, known, reading, decision.window,
                                        decision.exclude)
            else:
                cancelled += yield from _read_window(
                    request, known, reading, decision.window, decision.exclude,
                    decision.need, first=first)
                first = False
                yield from _when_dominated(request, known, reading)
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
            reading, skip, waited = Reading(rows=[]), set(), False
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
        reading = again(reading)
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
            many_groups=_many_groups(request, reading),
            dominated=reading.dominated, wide=_wide(request, reading),
            **_busy_hint(known, reading, worst, claimed)))
    if known.settings is not None and request.hooks:
        # The hooks run with the caller's settings (no round trip: this travels
        # with the hooks' first statement). Without hooks nothing more runs in
        # the transaction, and its settings end with it.
        yield prepared("claim_plan_restore", known.settings, fetch=False)
    return (yield from finish(cancelled, claimed))


def _needed(reading: Reading, planned: set[int]) -> int:
    """How many of the rows read come up to the last planned one (the rows read
    are in queue order). Not how many were read: a window larger than the
    claim needed must not make the next one as large."""
    return max((n for n, row in enumerate(reading.rows, 1) if row.id in planned), default=0)


def _busy_hint(known: KeyState, reading: Reading, worst: tuple[int, int] | None,
               claimed: list[ClaimedJob]) -> dict[str, Any]:
    """Hints.busy for the next claim, in fair order: the groups the claim found
    with at least as many jobs running in the queue as the turn of its worst
    planned row, and those it presumed hopeless if they had at least that many;
    none when it did not plan all its slots. Its own starts do not count: a
    group is remembered for what the queue showed (the jobs of a claim that
    finish at once would make every next claim judge their groups for
    nothing)."""
    if not known.fair or worst is None:
        return {}
    turn = worst[1]
    started = Counter(job.limit_key for job in claimed)
    groups = [g for g, busy in known.busy.items()
              if g is not None and busy - started[g] >= turn]
    if reading.presumed is not None and reading.presumed[0] >= turn:
        groups.extend(reading.presumed_groups)
    return {"busy": tuple(dict.fromkeys(groups))[:PRESUME_MAX], "busy_turn": turn}


def _wide(request: Request, reading: Reading) -> int:
    """Hints.wide for the next claim: WIDE_CLAIMS after a wide skip scan listed
    the queue's groups, one less after a claim that read them per group from the
    start (0: the next claim reads windows, or per group only within
    GROUP_SCAN_BOUND)."""
    if reading.widened and reading.universe is not None:
        return WIDE_CLAIMS
    if reading.universe is not None and request.hints.wide:
        return request.hints.wide - 1
    return 0


def _many_groups(request: Request, reading: Reading) -> bool:
    """Hints.many_groups for the next claim: what the skip scan or its guard
    said, if it ran; else (the hint spared it) whether the head of the queue
    read still shows as many groups as the guard tolerates. So the hint lasts
    while the head looks crowded and goes when it stops (the next claim tries
    the guard again), but never lives on only because a claim read far."""
    if reading.crowded is not None:
        return reading.crowded
    head = reading.rows[:planner.first_window(request.slots)]
    return request.hints.many_groups and len({r.key for r in head}) >= GROUP_SCAN_TRY
