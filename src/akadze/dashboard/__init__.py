"""The web dashboard: the queues, the limits in use and the fair shares, live; and, when
allowed, actions on jobs and queues. Needs the ``dashboard`` extra
(``pip install 'akadze[dashboard]'``).

``create_app(database_url, allow_actions=False)`` is an ASGI app (Starlette) to serve
with any ASGI server or to mount under a path of an application; ``akadze dashboard``
serves it with uvicorn. Pages: ``/`` (overview), ``/limits``, ``/fairness``, ``/jobs``,
``/jobs/{id}``, ``/schedules``; each is JSON under ``/api/...`` too (``/api/overview``
for ``/``). Actions are POSTs under ``/api/`` with the CSRF token of ``/api/session``.

Keyword options of :func:`create_app`: ``app`` (an :class:`~akadze.Akadze` app: its
schedules appear with their next fire, and actions run its transition hooks),
``basic_auth`` (``(user, password)``, or :func:`credentials_from_env`),
``allowed_hosts`` (the Host headers to answer, against DNS rebinding of a local
dashboard), ``refresh_seconds`` (how often pages refresh themselves) and
``database_timeout`` (seconds a page waits for a database connection).

No page counts the whole jobs table: see ``docs/howto/dashboard.md`` for what each
number is (exact, bounded or estimated) and for the trust model.
"""

from __future__ import annotations

from ._access import Credentials, credentials_from_env, is_loopback
from ._app import create_app

__all__ = ["Credentials", "create_app", "credentials_from_env", "is_loopback"]
