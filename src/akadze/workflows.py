"""Workflows at enqueue: the parents of new jobs locked and checked, the edges written,
and the new jobs that a parent had already failed cancelled. Dialogs (akadze.dialog)
that akadze.enqueue runs inside its insert; the decisions are akadze.dependencies'.

The releases themselves are not here: the trigger ``jobs_finished`` (migration 0012)
releases or cancels the children in the transaction of their parent's terminal write.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from . import dialog, queries
from .batches import Batch
from .dependencies import Start, start
from .dialog import Dialog
from .errors import EnqueueError
from .jobspec import Job, Options


def check_single(options: Options) -> None:
    """A single enqueue names its parents by id: Job items are for enqueue_many."""
    if any(isinstance(parent, Job) for parent in options.after):
        raise EnqueueError(
            "after names an akadze.Job: Job items are parents within one enqueue_many; "
            "a single enqueue names its parents by job id",
            field="after",
        )


def lock_parents(ids: Sequence[int], where: str = "") -> Dialog[dict[int, str]]:
    """Flag and lock the existing parents ``ids``; their states. An id that names no job
    is refused (EnqueueError: the caller rolls back, nothing stays inserted)."""
    wanted = sorted(set(ids))
    rows = yield from dialog.rows(queries.get("parents_lock"), {"ids": wanted})
    states = {int(job_id): str(state) for job_id, state in rows}
    missing = [i for i in wanted if i not in states]
    if missing:
        named = ", ".join(str(i) for i in missing[:5])
        raise EnqueueError(f"{where}after names jobs that do not exist: {named}",
                           field="after")
    return states


def plan_one(options: Options) -> Dialog[tuple[Start, dict[int, str]]]:
    """How a single job with ``options.after`` starts, and its parents' states."""
    parents = [p for p in options.after if isinstance(p, int)]
    states = yield from lock_parents(parents)
    return start(0, [(p, states[p]) for p in parents], options.after_policy == "run"), states


def write_one(job_id: int, options: Options, begun: Start, states: dict[int, str]
              ) -> Dialog[None]:
    """The edges of the new job ``job_id``; cancelled at once when a parent had failed."""
    parents = [p for p in options.after if isinstance(p, int)]
    yield from dialog.execute(queries.get("dependencies_insert"), {
        "child": job_id, "parents": parents, "run_anyway": options.after_policy == "run",
        "done": [states[p] in ("succeeded", "failed", "cancelled") for p in parents],
    })
    if begun.cancelled_by is not None:
        yield from dialog.execute(queries.get("dependencies_cancel"), {
            "ids": [job_id], "parents": [begun.cancelled_by]})


def _shown(ids: Iterable[int]) -> str:
    listed = sorted(ids)
    return "[" + ", ".join(str(i) for i in listed[:5]) + (", ..." if len(listed) > 5 else "") + "]"


def wanted_parents(batch: Batch, answers: Sequence[tuple[str, int]], item: int
                   ) -> set[int] | None:
    """The ids of the jobs item ``item`` of ``batch`` waits for, its item parents
    resolved by the uniqueness ``answers`` (an item answered by an existing job is that
    job); None when one of them is a row the call inserts."""
    ids = set(batch.job_parents.get(item, ()))
    for parent in batch.item_parents.get(item, ()):
        kind, to = answers[parent]
        if kind == "row":
            return None
        ids.add(to)
    return ids


def check_replaced(wanted: Mapping[int, set[int] | None]) -> Dialog[None]:
    """Refuse an ``on_duplicate="replace"`` that would change the parents of the job it
    replaces. ``wanted``: the holder's id -> the parents the replacing enqueue names
    (None: rows of its own call); a replacing enqueue that names none is not in it (the
    holder keeps its parents). Raises EnqueueError (``field="after"``)."""
    if not wanted:
        return
    rows = yield from dialog.rows(queries.get("replace_parents"), {"ids": sorted(wanted)})
    held: dict[int, set[int]] = {}
    for child, parent in rows:
        held.setdefault(int(child), set()).add(int(parent))
    for holder, names in sorted(wanted.items()):
        has = held.get(holder, set())
        if names != has:
            named = "new jobs of this call" if names is None else _shown(names)
            waits = f"waits for {_shown(has)}" if has else "waits for no job"
            raise EnqueueError(
                f'on_duplicate="replace": job {holder} holds the unique_key and {waits}; a '
                f"replace keeps the parents of the job it replaces, but after names {named} "
                "(give the same after, or none)",
                field="after",
            )


def _in_call_replaced(batch: Batch, answers: Sequence[tuple[str, int]]) -> None:
    """A row of the batch that replaced earlier items of its own call (on_duplicate=
    "replace") keeps their parents: it takes those of the last of them that has any
    when it names none, and is refused when it names others."""
    replaced: dict[int, list[int]] = {}
    for item, (kind, to) in enumerate(answers):
        if kind == "row" and to > item:
            replaced.setdefault(to, []).append(item)
    for row, earlier in replaced.items():
        named = [i for i in earlier if batch.item_parents.get(i) or batch.job_parents.get(i)]
        if not named:
            continue
        last = named[-1]
        if not (batch.item_parents.get(row) or batch.job_parents.get(row)):
            batch.item_parents[row] = list(batch.item_parents.get(last, ()))
            batch.job_parents[row] = list(batch.job_parents.get(last, ()))
            continue
        mine = (sorted(set(batch.item_parents.get(row, ()))),
                sorted(set(batch.job_parents.get(row, ()))))
        for i in named:
            if (sorted(set(batch.item_parents.get(i, ()))),
                    sorted(set(batch.job_parents.get(i, ())))) != mine:
                raise EnqueueError(
                    f'item {row}: on_duplicate="replace" replaces item {i} of this call, '
                    "whose after names other parents: a replace keeps the parents of the "
                    "job it replaces (give the same after, or none)",
                    field="after",
                )


def plan_batch(batch: Batch, answers: list[tuple[str, int]] | None) -> Dialog[None]:
    """Set how each inserted row of ``batch`` starts and which rows are parents, from
    its graph, the uniqueness ``answers`` (an item answered by an existing job is that
    job, as a parent) and the states of the existing parents (locked)."""
    rows = set(batch.inserted)
    if answers is not None:
        _in_call_replaced(batch, answers)

    def target(item: int) -> tuple[str, int]:
        return ("row", item) if answers is None else answers[item]

    in_rows: dict[int, set[int]] = {}
    in_jobs: dict[int, set[int]] = {}
    for child in rows:
        for parent in batch.item_parents.get(child, ()):
            kind, to = target(parent)
            if kind == "row" and to != child:
                in_rows.setdefault(child, set()).add(to)
            elif kind == "job":
                in_jobs.setdefault(child, set()).add(to)
        for job in batch.job_parents.get(child, ()):
            in_jobs.setdefault(child, set()).add(job)
    existing = sorted({job for jobs in in_jobs.values() for job in jobs})
    states = (yield from lock_parents(existing)) if existing else {}
    batch.starts = {
        child: start(len(in_rows.get(child, ())),
                     [(job, states[job]) for job in sorted(in_jobs.get(child, ()))],
                     batch.options_of(child).after_policy == "run")
        for child in rows if child in in_rows or child in in_jobs
    }
    batch.parent_rows = frozenset(p for parents in in_rows.values() for p in parents)
    batch.edges = [
        (child, parent, True, False) for child, parents in in_rows.items() for parent in parents
    ] + [
        (child, job, False, states[job] in ("succeeded", "failed", "cancelled"))
        for child, jobs in in_jobs.items() for job in jobs
    ]


def _edge_chunks(batch: Batch, id_of: dict[int, int]) -> Iterator[str]:
    lines = []
    for child, parent, in_call, done in batch.edges:
        run = "t" if batch.options_of(child).after_policy == "run" else "f"
        parent_id = id_of[parent] if in_call else parent
        lines.append(f"{id_of[child]}\t{parent_id}\t{run}\t{'t' if done else 'f'}\n")
        if len(lines) >= 5_000:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


def write_batch(batch: Batch, id_of: dict[int, int]) -> Dialog[None]:
    """The edges of the batch's rows (``id_of``: item index -> its job id, inserted
    already), then the cancellation of rows whose parent had already failed."""
    if not batch.edges:
        return
    yield from dialog.copy_in(queries.get("copy_dependencies"), _edge_chunks(batch, id_of))
    cancelled = [(id_of[i], s.cancelled_by) for i, s in sorted(batch.starts.items())
                 if s.cancelled_by is not None]
    if cancelled:
        yield from dialog.execute(queries.get("dependencies_cancel"), {
            "ids": [c for c, _ in cancelled], "parents": [p for _, p in cancelled]})


__all__ = ["check_replaced", "check_single", "lock_parents", "plan_batch", "plan_one",
           "wanted_parents", "write_batch", "write_one"]
