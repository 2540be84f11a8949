"""The state every handler shares (the connection pool, the templates, the settings),
rendering, and turning failures into one clear line on a page: never a traceback,
never the database password."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any

import jinja2
import markupsafe
import psycopg
import psycopg_pool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ..database import describe, mask_password
from ..errors import AkadzeError, JobNotFound
from . import _model
from ._access import Csrf

if TYPE_CHECKING:
    from ..app import Akadze

logger = logging.getLogger("akadze.dashboard")

PARTIAL_HEADER = "x-akadze-partial"
POOL_TIMEOUT = 5.0  # seconds a page waits for a connection
STATEMENT_TIMEOUT = "5s"  # a page never keeps a statement running longer
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}

Handler = Callable[["Dashboard", Request], Awaitable[Response]]


class Refusal(Exception):
    """A request the dashboard answers with a status and one line (not an akadze error:
    it never leaves the app)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Dashboard:
    """What every handler shares: the database, the templates and the settings."""

    url: str
    allow_actions: bool
    refresh_seconds: float
    app: Akadze | None
    timeout: float = POOL_TIMEOUT
    csrf: Csrf = field(default_factory=Csrf)
    templates: jinja2.Environment = field(init=False)
    _pool: psycopg_pool.AsyncConnectionPool[Any] | None = field(default=None, init=False)
    _opening: asyncio.Lock | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("akadze.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            finalize=_masked,  # every value a page shows, stored strings above all
        )
        self.templates.filters.update(
            grouped=_model.grouped, age=_model.age, percent=_model.percent,
            when=_when, short=_short,
        )

    @property
    def where(self) -> str:
        """The database, safe to show."""
        return describe(self.url)

    async def pool(self) -> psycopg_pool.AsyncConnectionPool[Any]:
        """The pool, opened at the first request (a mounted app gets no lifespan)."""
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
                    self.url, min_size=1, max_size=4, open=False, timeout=self.timeout,
                    kwargs={"autocommit": True}, configure=_configure,
                    name="akadze-dashboard",
                )
                await pool.open(wait=False)
                self._pool = pool
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        pool = await self.pool()
        async with pool.connection() as conn:
            yield conn

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    # -- answers -------------------------------------------------------------------

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        partial = request.headers.get(PARTIAL_HEADER) == "1"
        root = request.scope.get("root_path", "").rstrip("/")
        path = request.url.path[len(root):] if request.url.path.startswith(root) else "/"
        api_path = "/api/overview" if path in ("", "/") else "/api" + path
        if request.url.query and request.method == "GET":
            api_path += "?" + request.url.query
        page = self.templates.get_template(template)
        body = page.render(
            partial=partial,
            root=root,
            api_path=api_path,
            csrf_token=self.csrf.token,
            allow_actions=self.allow_actions,
            refresh_seconds=self.refresh_seconds,
            database=self.where,
            **context,
        )
        return HTMLResponse(body, status_code=status,
                            headers={**SECURITY_HEADERS, "Vary": "X-Akadze-Partial"})


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # The dashboard's statements are small and planned in a millisecond; JIT compiling
    # them (their cost estimates can pass jit_above_cost) would take tens of ms.
    await conn.execute("SET jit = off")
    await conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")


def _when(value: Any) -> str:
    """A timestamp as UTC to the second."""
    if value is None:
        return "-"
    return str(value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ"))


def _short(value: Any, size: int = 80) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= size else text[: size - 1] + "…"


def _masked(value: Any) -> Any:
    """A value a template prints, its passwords masked (akadze.database.mask_password);
    markup (the ``tojson`` filter's) stays markup."""
    if isinstance(value, markupsafe.Markup):
        return markupsafe.Markup(mask_password(str(value)))
    return mask_password(value) if isinstance(value, str) else value


class _MaskedJSON(JSONResponse):
    """JSON whose text is masked as the pages are (stored arguments, results, errors)."""

    def render(self, content: Any) -> bytes:
        return mask_password(super().render(content).decode("utf-8")).encode("utf-8")


def json_response(data: Any, status: int = 200) -> JSONResponse:
    return _MaskedJSON(data, status_code=status, headers=SECURITY_HEADERS)


def wants_json(request: Request) -> bool:
    """JSON for the API, except for a plain form post of a browser without script
    (which asks for text/html): it gets a page with the message."""
    root = request.scope.get("root_path", "").rstrip("/")
    api = request.url.path.startswith(root + "/api/")
    if request.method == "GET":
        return api
    return api and "text/html" not in request.headers.get("accept", "")


def job_id_of(request: Request) -> int:
    """The job id of the request's path; a 404 for anything but a positive bigint."""
    raw = str(request.path_params.get("job_id", ""))
    if not raw.isdigit() or not 1 <= int(raw) <= _model.ID_MAX:
        raise Refusal(404, f"no job with id {raw!r}")
    return int(raw)


def _failure(exc: Exception) -> tuple[int, str]:
    """The status and the one line a failure is answered with."""
    if isinstance(exc, Refusal):
        return exc.status, str(exc)
    if isinstance(exc, JobNotFound):
        return 404, str(exc)
    if isinstance(exc, ValueError):
        return 400, str(exc)
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return 503, "the database did not answer in time (is it up? is the URL right?)"
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName
                  | psycopg.errors.UndefinedFunction | psycopg.errors.UndefinedObject):
        return 503, "the database has no akadze schema (or an older one): run akadze migrate"
    if isinstance(exc, psycopg.Error):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return 503, f"database error: {first}"
    if isinstance(exc, AkadzeError):
        return 400, str(exc)
    raise exc


def handle(dashboard: Dashboard, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint running ``handler``; a failure is answered with one masked
    line, as JSON under /api/ and as a page elsewhere, and logged."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(dashboard, request)
        except Exception as exc:
            status, message = _failure(exc)
            message = " ".join(mask_password(message).split())
            if status >= 500:
                logger.error("dashboard: %s %s: %s", request.method, request.url.path, message)
            if wants_json(request):
                return json_response({"ok": False, "error": message}, status)
            return dashboard.render(request, "message.html", status, page="",
                                    title="Error" if status >= 500 else "Refused",
                                    message=message, ok=False, back=None)

    return endpoint
