"""The pages, each also JSON under ``/api/...``: read (one connection, one ``now``),
then render the page's template or answer the data's ``to_dict()``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from . import _model, _reads
from ._state import Dashboard, job_id_of, json_response

Reader = Callable[[Dashboard, Request, Any], Awaitable[Any]]


def _params(request: Request) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        params.setdefault(name, []).append(value)
    return params


async def read_overview(dashboard: Dashboard, request: Request, conn: Any) -> Any:
    return await _reads.overview(conn, await _reads.clock(conn))


async def read_limits(dashboard: Dashboard, request: Request, conn: Any) -> Any:
    params = request.query_params
    prefix = params.get("prefix") or None
    if prefix is not None and ("\x00" in prefix or len(prefix) > 1000):
        raise ValueError("prefix: at most 1000 characters, without NUL")
    after_key = params.get("after_key") or None
    after = None if after_key is None else (params.get("after_at_limit") == "true", after_key)
    return await _reads.limits(conn, await _reads.clock(conn), prefix=prefix, after=after)


async def read_fairness(dashboard: Dashboard, request: Request, conn: Any) -> Any:
    return await _reads.fairness(conn, await _reads.clock(conn))


async def read_jobs(dashboard: Dashboard, request: Request, conn: Any) -> Any:
    where = _model.parse_filter(_params(request))
    return await _reads.jobs(conn, await _reads.clock(conn), where)


async def read_job(dashboard: Dashboard, request: Request, conn: Any) -> Any:
    return await _reads.job(conn, await _reads.clock(conn), job_id_of(request))


async def read_schedules(dashboard: Dashboard, request: Request, conn: Any) -> Any:
    return await _reads.schedules(conn, await _reads.clock(conn), dashboard.app)


def page(name: str, template: str, title: str, reader: Reader) -> Callable[
        [Dashboard, Request], Awaitable[Response]]:
    """The HTML handler of a page."""

    async def handler(dashboard: Dashboard, request: Request) -> Response:
        try:
            async with dashboard.connection() as conn:
                data = await reader(dashboard, request, conn)
        except ValueError as exc:  # a bad filter: the page again, with the reason
            if name != "jobs":
                raise
            return dashboard.render(request, template, 400, page=name, title=title,
                                    data=None, error=str(exc), query=request.query_params)
        return dashboard.render(request, template, page=name, title=title, data=data,
                                error=None, query=request.query_params)

    return handler


def api(reader: Reader) -> Callable[[Dashboard, Request], Awaitable[Response]]:
    """The JSON handler of a page."""

    async def handler(dashboard: Dashboard, request: Request) -> Response:
        async with dashboard.connection() as conn:
            data = await reader(dashboard, request, conn)
        return json_response(data.to_dict())

    return handler


async def session(dashboard: Dashboard, request: Request) -> Response:
    """What a script needs before an action: the CSRF token, and whether actions are on."""
    return json_response({"csrf_token": dashboard.csrf.token,
                          "allow_actions": dashboard.allow_actions})


PAGES = (
    ("/", "overview", "overview.html", "Overview", read_overview),
    ("/limits", "limits", "limits.html", "Limits", read_limits),
    ("/fairness", "fairness", "fairness.html", "Fairness", read_fairness),
    ("/jobs", "jobs", "jobs.html", "Jobs", read_jobs),
    ("/jobs/{job_id}", "job", "job.html", "Job", read_job),
    ("/schedules", "schedules", "schedules.html", "Schedules", read_schedules),
)

ROUTES: tuple[tuple[str, str, Callable[[Dashboard, Request], Awaitable[Response]]], ...] = (
    *((path, "GET", page(name, template, title, reader))
      for path, name, template, title, reader in PAGES),
    *(("/api/overview" if path == "/" else "/api" + path, "GET", api(reader))
      for path, _name, _template, _title, reader in PAGES),
    ("/api/session", "GET", session),
)
