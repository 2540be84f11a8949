"""Uniqueness over time, decided: which job answers an enqueue that carries a
``unique_key``. A pure core (plain data in, plain data out, the standard library only),
property-tested; akadze.enqueue does the I/O around it.

A key is held by the jobs that carry it and are waiting, queued or running, and, for an
enqueue with ``unique_for``, by those that finished within that period. What an enqueue
meeting a holder does is its ``on_duplicate``:

- ``"raise"``: refused (DuplicateJob);
- ``"ignore"``: answered with the holder's id, nothing inserted;
- ``"replace"``: a holder that has not started (waiting or queued) takes the new
  arguments, and the new ``run_at`` unless ``keep_run_at``; a running holder does not
  block (a new job is inserted); a finished one within the period answers as "ignore".

The enqueuer holds a transaction-scoped lock on each key while it reads the holders and
writes (akadze.enqueue), so two enqueues of one key are decided one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

ACTIVE = ("waiting", "queued", "reserved", "running")
NOT_STARTED = ("waiting", "queued", "reserved")


@dataclass(frozen=True, slots=True)
class Holder:
    """A job that carries the key: its id, state and when it finished."""

    id: int
    state: str
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """What one enqueue asks: its key and how a duplicate is handled."""

    key: str
    on_duplicate: str = "raise"
    period: timedelta | None = None
    keep_run_at: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions of one enqueue (or one ``enqueue_many``).

    ``answers[i]``: ``("row", j)`` (item i is answered by the row inserted for item j,
    j == i for an item inserted as itself) or ``("job", id)`` (by an existing job).
    ``updates``: existing job id -> ``(item index, keep_run_at)`` whose arguments it
    takes. ``keep``: item j (inserted) -> item i whose run_at it keeps (a replace of an
    earlier item of the same call). ``duplicate``: ``(item index, key, holder id)`` of
    the first refusal, else None (the whole call is refused).
    """

    answers: list[tuple[str, int]] = field(default_factory=list)
    updates: dict[int, tuple[int, bool]] = field(default_factory=dict)
    keep: dict[int, int] = field(default_factory=dict)
    duplicate: tuple[int, str, int] | None = None

    @property
    def rows(self) -> list[int]:
        """The items inserted as themselves, in order."""
        return [i for i, (kind, j) in enumerate(self.answers) if kind == "row" and j == i]


def holds(holder: Holder, claim: Claim, now: datetime) -> bool:
    """Whether ``holder`` holds the key against ``claim`` at ``now``."""
    if holder.state in ACTIVE:
        return True
    return (claim.period is not None and holder.finished_at is not None
            and holder.finished_at >= now - claim.period)


def _newest(holders: list[Holder]) -> Holder:
    return max(holders, key=lambda h: h.id)


def plan(claims: list[Claim | None], holders: dict[str, list[Holder]], now: datetime
         ) -> Plan:
    """The decisions for the items ``claims`` (None: an item without a key), in item
    order: an earlier item holds its key against the later ones, as a queued job."""
    answers: list[tuple[str, int]] = []
    updates: dict[int, tuple[int, bool]] = {}
    keep: dict[int, int] = {}
    # key -> the item of this call that holds it (its row), once one is inserted
    in_call: dict[str, int] = {}
    for index, claim in enumerate(claims):
        if claim is None:
            answers.append(("row", index))
            continue
        row = in_call.get(claim.key)
        if row is not None:
            if claim.on_duplicate == "raise":
                return Plan(answers, updates, keep, (index, claim.key, -1))
            if claim.on_duplicate == "ignore":
                answers.append(("row", row))
                continue
            # replace: this item is inserted instead of the earlier one, which it answers for
            answers[:] = [("row", index) if a == ("row", row) else a for a in answers]
            answers.append(("row", index))
            if claim.keep_run_at:
                keep[index] = keep.pop(row, row)
            else:
                keep.pop(row, None)
            in_call[claim.key] = index
            continue
        live = [h for h in holders.get(claim.key, ()) if holds(h, claim, now)]
        if not live:
            answers.append(("row", index))
            in_call[claim.key] = index
            continue
        if claim.on_duplicate == "raise":
            return Plan(answers, updates, keep, (index, claim.key, _newest(live).id))
        pending = [h for h in live if h.state in NOT_STARTED]
        if claim.on_duplicate == "replace":
            if pending:
                target = _newest(pending).id
                updates[target] = (index, claim.keep_run_at)
                answers.append(("job", target))
                continue
            finished = [h for h in live if h.state not in ACTIVE]
            if not finished:  # only running holders: they never block a replace
                answers.append(("row", index))
                in_call[claim.key] = index
                continue
            answers.append(("job", _newest(finished).id))
            continue
        # ignore: the job that will run it, else the one that runs it, else the newest
        running = [h for h in live if h.state == "running"]
        answers.append(("job", _newest(pending or running or live).id))
    return Plan(answers, updates, keep, None)


def started(holders: dict[str, list[Holder]], ids: set[int]) -> dict[str, list[Holder]]:
    """``holders`` with the jobs ``ids`` running: a replace found them claimed before
    its update (the plan is made again, and inserts instead)."""
    return {
        key: [replace(h, state="running") if h.id in ids else h for h in found]
        for key, found in holders.items()
    }
