"""The claim: hand a worker the next jobs of one queue, respecting limits and fair turns.

``claim(conn, queue=..., slots=...)`` is what a worker calls; ``claim_oracle`` is the
reference claim it is tested and measured against (same arguments, effects and
result, computed by ranking the whole ready set). What a claim must return is pinned
down in ``docs/explanation/claim.md``. ``memory`` holds what each connection's last
claim of a queue learnt about it (:class:`Hints`): hints for its next claim, never a
change to its result.

This package is the claim's one door; behind it, private modules:

- ``_drivers``: the entry points and the two small drivers, sync and async, that run
  a claim's steps on a psycopg connection inside its transaction;
- ``_steps``: the step language claims are written in, and the steps both share;
- ``_windows``: the windowed claim, which reads the ready index in windows;
- ``_keystate``: what a claim knows of keys and groups, and the lock protocol;
- ``_takes``: the take, committing with its locks in one round trip, or classic;
- ``_hints``: what a connection remembers between claims;
- ``_planner``: the pure core that decides (standard library only);
- ``_ranking``: the reference claim, one ranking statement.

Its statements are the named queries of ``sql/queries/claim.sql`` and
``claim_oracle.sql``.
"""

from ._drivers import claim, claim_oracle
from ._hints import Hints, memory

__all__ = ["Hints", "claim", "claim_oracle", "memory"]
