"""akadze.uniqueness.plan, the pure decision of uniqueness over time, property-tested."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from akadze.uniqueness import Claim, Holder, holds, plan

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = ["a", "b", "c"]

claims = st.lists(st.one_of(st.none(), st.builds(
    Claim, key=st.sampled_from(KEYS), on_duplicate=st.sampled_from(["raise", "ignore", "replace"]),
    period=st.one_of(st.none(), st.sampled_from([timedelta(minutes=5), timedelta(hours=2)])),
    keep_run_at=st.booleans())), max_size=12)
holders = st.dictionaries(st.sampled_from(KEYS), st.lists(st.builds(
    Holder, id=st.integers(1, 50),
    state=st.sampled_from(["waiting", "queued", "running", "succeeded", "failed", "cancelled"]),
    finished_at=st.sampled_from([None, NOW - timedelta(minutes=1), NOW - timedelta(hours=1)]),
), max_size=3, unique_by=lambda h: h.id))


@given(claims, holders)
def test_every_answer_is_one_holder_of_its_key(items: list[Claim | None],
                                              found: dict[str, list[Holder]]) -> None:
    decided = plan(items, found, NOW)
    if decided.duplicate is not None:
        index, key, holder = decided.duplicate
        claim = items[index]
        assert claim is not None and claim.on_duplicate == "raise" and claim.key == key
        live = [h.id for h in found.get(key, ()) if holds(h, claim, NOW)]
        assert holder in live or (holder == -1 and any(
            c is not None and c.key == key for c in items[:index]))
        return
    assert len(decided.answers) == len(items)
    rows = decided.rows
    # at most one row inserted per key, and only where no live holder answers
    keys = [items[i].key for i in rows if items[i] is not None]  # type: ignore[union-attr]
    assert len(keys) == len(set(keys))
    for index, (kind, target) in enumerate(decided.answers):
        claim = items[index]
        if claim is None:
            assert (kind, target) == ("row", index)
            continue
        live = [h for h in found.get(claim.key, ()) if holds(h, claim, NOW)]
        if kind == "row":
            assert target in rows and items[target] is not None
            assert items[target].key == claim.key  # type: ignore[union-attr]
            # the first item of a key inserted despite live holders: only when they all
            # run (a replace); a later item is answered by the earlier one's row
            first = all(c is None or c.key != claim.key for c in items[:index])
            if first and target == index:
                assert all(h.state == "running" for h in live)
        else:
            assert target in [h.id for h in live]
    for target, (index, _keep) in decided.updates.items():
        claim = items[index]
        assert claim is not None and claim.on_duplicate == "replace"
        assert target in [h.id for h in found[claim.key] if h.state in ("waiting", "queued")]
