"""akadze.dependencies, the pure core of workflows, property-tested: cycles are found
exactly when the graph has one, and a new job starts as its parents say."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from akadze.dependencies import TERMINAL, find_cycle, start

graphs = st.dictionaries(st.integers(0, 12), st.lists(st.integers(0, 12), max_size=4),
                         max_size=12)


def _acyclic(edges: dict[int, list[int]]) -> bool:
    """Kahn's algorithm: every node can be removed once its parents are."""
    nodes = set(edges) | {p for parents in edges.values() for p in parents}
    left = {n: set(edges.get(n, ())) for n in nodes}
    while left:
        free = [n for n, parents in left.items() if not parents & set(left)]
        if not free:
            return False
        for n in free:
            del left[n]
    return True


@given(graphs)
def test_a_cycle_is_found_exactly_when_there_is_one(edges: dict[int, list[int]]) -> None:
    cycle = find_cycle(edges)
    assert (cycle is None) == _acyclic(edges)
    if cycle is not None:
        assert cycle[0] == cycle[-1] and len(cycle) >= 2
        for child, parent in itertools.pairwise(cycle):
            assert parent in edges.get(child, ())


states = st.sampled_from(["waiting", "queued", "running", *TERMINAL])


@given(st.integers(0, 5), st.lists(st.tuples(st.integers(1, 99), states), max_size=6),
       st.booleans())
def test_a_new_job_starts_as_its_parents_say(new: int, existing: list[tuple[int, str]],
                                             run_anyway: bool) -> None:
    begun = start(new, existing, run_anyway)
    pending = new + sum(1 for _, s in existing if s not in TERMINAL)
    assert begun.waiting_for == pending
    failed = [p for p, s in existing if s in ("failed", "cancelled")]
    if failed and not run_anyway:
        assert begun.cancelled_by == failed[0] and begun.state == "waiting"
    else:
        assert begun.cancelled_by is None
        assert begun.state == ("waiting" if pending else "queued")
