"""The reference claim: rank the whole ready set of the queue in one statement.

Same arguments, effects and result as the windowed claim (:mod:`akadze.claim._windows`),
computed the obvious way, so that tests and ``akadze bench claims`` can compare the
two. Linear in the queue length; production claims never use it.
"""

from __future__ import annotations

from .. import queries
from ..jobs import ClaimedJob
from ._steps import Request, Statement, Steps, begin, cancel_due, finish, take

# -- the reference claim ----------------------------------------------------------------


def oracle_steps(request: Request) -> Steps:
    """claim-semantics.md as one ranking statement over the whole ready set."""
    now, paused = yield from begin(request)
    if paused:
        return []
    rows = yield Statement(queries.get("claim_oracle_lock"), request.params(now), prepare=False)
    locked = [r[0] for r in rows]
    claimed: list[ClaimedJob] = []
    skip_ids: list[int] = []
    while len(claimed) < request.slots:
        params = {
            **request.params(now),
            "locked": locked,
            "skip_ids": skip_ids,
            "fair": request.fair,
            "slots": request.slots - len(claimed),
        }
        rows = yield Statement(queries.get("claim_oracle_rank"), params, prepare=False)
        planned = [r[0] for r in rows]
        if not planned:
            break
        got = yield from take(request, now, planned)
        claimed.extend(got)
        if len(got) < len(planned):
            # Someone else holds (or just changed) the missing rows: plan again
            # without them. skip_ids only grows, so this ends.
            taken = {job.id for job in got}
            skip_ids.extend(i for i in planned if i not in taken)
    cancelled = yield from cancel_due(request, now)
    return (yield from finish(cancelled, claimed))
