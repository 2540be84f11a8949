"""The ASGI app: the routes of the pages and the actions, the static files, access
control, and the pool's lifetime. Composed of collaborators with one job each that
share one :class:`~._state.Dashboard`: the readers (:mod:`._reads`), the page handlers
(:mod:`._pages`), the actions (:mod:`._actions`) and access control (:mod:`._access`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ..database import normalize_url, resolve_url
from ..errors import ConfigurationError
from . import _actions, _pages
from ._access import BasicAuth, Credentials
from ._state import Dashboard, handle

if TYPE_CHECKING:
    from ..app import Akadze


def create_app(
    database_url: str | None = None,
    allow_actions: bool = False,
    *,
    app: Akadze | None = None,
    basic_auth: Credentials | tuple[str, str] | None = None,
    allowed_hosts: Sequence[str] | None = None,
    refresh_seconds: float = 5.0,
    database_timeout: float = 5.0,
) -> Starlette:
    """The dashboard as an ASGI app (Starlette); see the package docs."""
    if database_url is None and app is not None:
        database_url = app.database_url
    url = normalize_url(database_url) if database_url is not None else resolve_url(None)
    if not isinstance(allow_actions, bool):
        raise ConfigurationError(f"allow_actions must be True or False, got {allow_actions!r}")
    for name, value, low, high in (("refresh_seconds", refresh_seconds, 0.5, 3600),
                                   ("database_timeout", database_timeout, 0.1, 600)):
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not low <= value <= high:
            raise ConfigurationError(f"{name} must be between {low:g} and {high:g} seconds, "
                                     f"got {value!r}")
    dashboard = Dashboard(url, allow_actions, refresh_seconds, app, timeout=database_timeout)
    routes: list[BaseRoute] = [
        Route(path, handle(dashboard, handler), methods=[method])
        for path, method, handler in (*_pages.ROUTES, *_actions.ROUTES)
    ]
    routes.append(Mount("/static", StaticFiles(packages=[("akadze.dashboard", "static")]),
                        name="static"))
    middleware = []
    if allowed_hosts:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    if basic_auth is not None:
        credentials = (basic_auth if isinstance(basic_auth, Credentials)
                       else Credentials(*basic_auth))
        middleware.append(Middleware(BasicAuth, credentials=credentials))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await dashboard.close()

    starlette = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    starlette.state.dashboard = dashboard
    return starlette
