"""The dashboard's pure core: bounded counts, throughput buckets, shares of starts and
the jobs list's filters, computed from plain rows. Standard library only; no I/O."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

STATES = ("waiting", "queued", "reserved", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")
ID_MAX = 2**63 - 1


def grouped(value: int) -> str:
    """``10000`` as ``10 000`` (a space between thousands, as the pages print counts)."""
    return f"{value:,}".replace(",", " ")


@dataclass(frozen=True)
class Count:
    """A count that stopped at a bound: ``exact`` False means "at least ``value``"."""

    value: int
    exact: bool = True

    @property
    def text(self) -> str:
        return grouped(self.value) + ("" if self.exact else "+")

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.value, "exact": self.exact}


def bounded_sum(parts: Iterable[int], cap: int) -> Count:
    """The sum of counts each stopped at ``cap``: exact unless a part reached the cap."""
    values = list(parts)
    return Count(sum(values), all(v < cap for v in values))


# -- throughput ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """Finishes in one bucket of time, ``ago`` buckets back from now (0: the latest).
    ``counts`` is None when the sample did not reach back over the whole bucket."""

    ago: int
    counts: Mapping[str, int] | None

    @property
    def total(self) -> int | None:
        return None if self.counts is None else sum(self.counts.values())


@dataclass(frozen=True)
class Throughput:
    """A queue's finishes over the last ``len(buckets)`` buckets, oldest bucket first.

    ``covered`` is the span the sample reached back over (the whole span unless the
    sample stopped at its cap); ``finished`` counts its finishes by state in that span.
    """

    bucket_seconds: int
    buckets: tuple[Bucket, ...]
    covered: timedelta
    finished: Mapping[str, int]
    sampled: bool

    @property
    def per_minute(self) -> float:
        seconds = self.covered.total_seconds()
        return 0.0 if seconds <= 0 else sum(self.finished.values()) * 60 / seconds

    @property
    def peak(self) -> int:
        return max((b.total or 0 for b in self.buckets), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket_seconds": self.bucket_seconds,
            "buckets": [
                {"ago": b.ago, "counts": None if b.counts is None else dict(b.counts)}
                for b in self.buckets
            ],
            "covered_seconds": self.covered.total_seconds(),
            "finished": dict(self.finished),
            "per_minute": round(self.per_minute, 2),
            "sampled": self.sampled,
        }


def throughput(
    rows: Iterable[Sequence[Any]],
    now: datetime,
    *,
    buckets: int,
    bucket_seconds: int,
    cap: int,
) -> dict[str, Throughput]:
    """Per queue, from rows (queue, state, bucket, count, oldest finish) of a sample of
    at most ``cap`` finishes within the last ``buckets * bucket_seconds`` seconds.

    A full sample (``cap`` rows) reached back only to its oldest finish: the buckets
    before it and the one it falls in are left unknown rather than undercounted.
    """
    rows = list(rows)
    span = timedelta(seconds=buckets * bucket_seconds)
    sampled = sum(int(r[3]) for r in rows) >= cap
    covered = span
    if sampled and rows:
        covered = min(span, max(now - min(r[4] for r in rows), timedelta(0)))
    full = int(covered.total_seconds() // bucket_seconds)  # buckets wholly covered
    per_queue: dict[str, dict[int, dict[str, int]]] = {}
    finished: dict[str, dict[str, int]] = {}
    for queue, state, bucket, count, _oldest in rows:
        index = int(bucket)
        if not 0 <= index < buckets:
            continue
        per_queue.setdefault(queue, {}).setdefault(index, {})
        per_queue[queue][index][state] = per_queue[queue][index].get(state, 0) + int(count)
        totals = finished.setdefault(queue, {})
        totals[state] = totals.get(state, 0) + int(count)
    out: dict[str, Throughput] = {}
    for queue, by_bucket in per_queue.items():
        series = tuple(
            Bucket(ago, dict(by_bucket.get(ago, {})) if ago < full or not sampled else None)
            for ago in reversed(range(buckets))
        )
        out[queue] = Throughput(bucket_seconds, series, covered, finished[queue], sampled)
    return out


def empty_throughput(buckets: int, bucket_seconds: int) -> Throughput:
    series = tuple(Bucket(ago, {}) for ago in reversed(range(buckets)))
    return Throughput(bucket_seconds, series, timedelta(seconds=buckets * bucket_seconds),
                      {}, False)


# -- fairness --------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A fair group of a queue (its limit key; None: the jobs without a key)."""

    key: str | None
    running: int
    starts: int
    share: float  # of the queue's starts in the span, 0..1
    waiting: Count | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "running": self.running,
            "starts": self.starts,
            "share": round(self.share, 4),
            "waiting": None if self.waiting is None else self.waiting.to_dict(),
        }


@dataclass(frozen=True)
class Shares:
    """One queue's groups: the listed ones, and what the others add up to."""

    queue: str
    groups: tuple[Group, ...]
    total_starts: int
    total_groups: int  # groups with starts in the span
    other_starts: int
    running: int
    waiting_groups: Count = field(default_factory=lambda: Count(0))

    @property
    def other_share(self) -> float:
        return 0.0 if not self.total_starts else self.other_starts / self.total_starts

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "groups": [g.to_dict() for g in self.groups],
            "total_starts": self.total_starts,
            "groups_with_starts": self.total_groups,
            "other_starts": self.other_starts,
            "running": self.running,
            "waiting_groups": self.waiting_groups.to_dict(),
        }


def shares(
    queue: str,
    top_starts: Sequence[tuple[str | None, int]],
    total_starts: int,
    total_groups: int,
    running: Mapping[str | None, int],
    waiting_keys: Sequence[str | None],
    *,
    rows: int,
) -> Shares:
    """The groups to list for ``queue``: those with the most starts, those running and
    those waiting (starved ones included), at most ``rows``, by starts then running.
    ``top_starts`` are the groups with the most starts (key, starts); ``running`` the
    running jobs per group; ``waiting_keys`` groups that have ready jobs."""
    starts = dict(top_starts)
    keys: dict[str | None, None] = dict.fromkeys([*starts, *running, *waiting_keys])

    def order(key: str | None) -> tuple[int, int, bool, str]:
        return (-starts.get(key, 0), -running.get(key, 0), key is None, key or "")

    listed = sorted(keys, key=order)[:rows]
    groups = tuple(
        Group(key, running.get(key, 0), starts.get(key, 0),
              starts.get(key, 0) / total_starts if total_starts else 0.0)
        for key in listed
    )
    shown = sum(g.starts for g in groups)
    return Shares(queue, groups, total_starts, total_groups, max(total_starts - shown, 0),
                  sum(running.values()))


# -- the jobs list's filters -------------------------------------------------------------


@dataclass(frozen=True)
class JobFilter:
    """The filters of the jobs list, checked; ``before`` is the keyset cursor."""

    queue: str | None = None
    states: tuple[str, ...] = ()
    task: str | None = None
    limit_key: str | None = None
    meta: Mapping[str, Any] | None = None
    id: int | None = None
    before: int | None = None

    def params(self) -> dict[str, Any]:
        """The query parameters of dashboard_jobs (and of the bulk requeue)."""
        return {
            "queue": self.queue,
            "states": list(self.states) or None,
            "task": self.task,
            "limit_key": self.limit_key,
            "meta": None if not self.meta else json.dumps(dict(self.meta), allow_nan=False),
        }

    def query(self, **change: Any) -> dict[str, str]:
        """The filter as URL query parameters (what the page links carry)."""
        values = {
            "queue": self.queue,
            "state": ",".join(self.states) or None,
            "task": self.task,
            "limit_key": self.limit_key,
            "meta": None if not self.meta else json.dumps(dict(self.meta), sort_keys=True),
            "id": None if self.id is None else str(self.id),
            "before": None if self.before is None else str(self.before),
        }
        values.update(change)
        return {k: v for k, v in values.items() if v not in (None, "")}

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "states": list(self.states), "task": self.task,
                "limit_key": self.limit_key, "meta": None if self.meta is None else
                dict(self.meta), "id": self.id, "before": self.before}


def _text(name: str, value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    if "\x00" in value or len(value) > 1000:
        raise ValueError(f"{name}: at most 1000 characters, without NUL")
    return value.strip()


def _positive_id(name: str, value: str | None) -> int | None:
    text = _text(name, value)
    if text is None:
        return None
    if not text.isdigit() or not 1 <= int(text) <= ID_MAX:
        raise ValueError(f"{name} must be a positive job id, got {text!r}")
    return int(text)


def parse_meta(values: Sequence[str]) -> dict[str, Any] | None:
    """``{"tenant": "acme"}`` (a JSON object) or ``tenant=acme`` pairs (string values,
    comma-separated or repeated): the jobs whose meta contains all of them."""
    meta: dict[str, Any] = {}
    for raw in values:
        text = _text("meta", raw)
        if text is None:
            continue
        if text.startswith("{"):
            try:
                found = json.loads(text, parse_constant=_no_constant)
            except ValueError as exc:
                raise ValueError(f"meta is not a JSON object: {exc}") from None
            if not isinstance(found, dict):
                raise ValueError("meta must be a JSON object")
            meta.update(found)
            continue
        for pair in text.split(","):
            key, equals, value = pair.partition("=")
            if not equals or not key.strip():
                raise ValueError(f"meta: {pair.strip()!r} is not key=value")
            meta[key.strip()] = value.strip()
    return meta or None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def parse_filter(params: Mapping[str, Sequence[str]]) -> JobFilter:
    """The filter of a request's query parameters (each name mapped to its values).
    Raises ValueError naming the parameter that is wrong."""

    def one(name: str) -> str | None:
        values = params.get(name) or ()
        return values[-1] if values else None

    states: list[str] = []
    for raw in params.get("state") or ():
        for item in raw.split(","):
            item = item.strip()
            if not item:
                continue
            if item not in STATES:
                raise ValueError(f"unknown state {item!r} (known: {', '.join(STATES)})")
            if item not in states:
                states.append(item)
    return JobFilter(
        queue=_text("queue", one("queue")),
        states=tuple(states),
        task=_text("task", one("task")),
        limit_key=_text("limit_key", one("limit_key")),
        meta=parse_meta(params.get("meta") or ()),
        id=_positive_id("id", one("id")),
        before=_positive_id("before", one("before")),
    )


# -- presentation helpers -------------------------------------------------------------


def age(delta: timedelta | None) -> str:
    """``42s``, ``3m 05s``, ``2h 10m``, ``3d 4h``: how long, for people."""
    if delta is None:
        return "-"
    seconds = delta.total_seconds()
    if seconds < 0:
        return "in " + age(-delta)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def percent(value: float) -> str:
    if value <= 0 or math.isnan(value):
        return "0%"
    if value < 0.01:
        return "<1%"
    return f"{value * 100:.0f}%"
