"""The actions: requeue, retry now and cancel a job, requeue the failed jobs matching a
filter, pause and resume a queue. Only when the app allows actions; only as POST with
the CSRF token; each answered with one clear message (JSON under /api/, else a page),
and logged. They run through akadze's public functions, so the same checks and hooks
apply as anywhere else."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

from .. import (
    DuplicateJob,
    InvalidJobState,
    get_job,
    pause_queue,
    request_cancel,
    requeue,
    resume_queue,
    retry_now,
)
from . import _model, _reads
from ._state import Dashboard, Refusal, job_id_of, json_response, wants_json

logger = logging.getLogger("akadze.dashboard")

BULK_MAX = 1_000  # failed jobs one bulk requeue takes; run it again for more
FORM_MAX = 64 * 1024


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > FORM_MAX:
        raise Refusal(413, f"the request body is over {FORM_MAX} bytes")
    text = body.decode("utf-8", errors="replace")
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            found = json.loads(text or "{}")
        except (ValueError, RecursionError):  # json.loads recurses once per level
            raise Refusal(400, "the body is not JSON (or is nested too deeply)") from None
        if not isinstance(found, dict):
            raise Refusal(400, "the body must be a JSON object")
        return {str(k): "" if v is None else str(v) for k, v in found.items()}
    return dict(parse_qsl(text, keep_blank_values=True))


def _queue(form: Mapping[str, str]) -> str:
    queue = form.get("queue", "").strip()
    if not queue or "\x00" in queue or len(queue) > 1000:
        raise Refusal(400, "give the queue to act on (a non-empty name)")
    return queue


async def job_requeue(dashboard: Dashboard, request: Request, form: Mapping[str, str]) -> str:
    job_id = job_id_of(request)
    await requeue(await dashboard.pool(), job_id, app=dashboard.app)
    return f"job {job_id} requeued: it is queued again, ready now, with a fresh set of attempts"


async def job_retry(dashboard: Dashboard, request: Request, form: Mapping[str, str]) -> str:
    job_id = job_id_of(request)
    moved = await retry_now(await dashboard.pool(), job_id)
    return f"job {job_id} is ready now" if moved else f"job {job_id} was ready already"


async def job_cancel(dashboard: Dashboard, request: Request, form: Mapping[str, str]) -> str:
    job_id = job_id_of(request)
    pool = await dashboard.pool()
    state = (await get_job(pool, job_id)).state.value
    if not await request_cancel(pool, job_id, app=dashboard.app):
        return f"job {job_id} had finished already: nothing to cancel"
    if state == "running":
        return f"cancel of job {job_id} requested: its worker is told and stops it"
    return f"job {job_id} cancelled"


async def bulk_requeue(dashboard: Dashboard, request: Request, form: Mapping[str, str]) -> str:
    where = _model.parse_filter({k: [v] for k, v in form.items() if k != "state"})
    done = skipped = 0
    async with dashboard.connection() as conn:
        ids = await _reads.failed_ids(conn, where, BULK_MAX)
        async with conn.transaction():
            for job_id in ids:
                try:
                    await requeue(conn, job_id, app=dashboard.app)
                    done += 1
                except (InvalidJobState, DuplicateJob):
                    skipped += 1  # requeued meanwhile, or its unique_key is taken
    described = ", ".join(f"{k}={v}" for k, v in where.query().items()) or "any queue"
    message = f"requeued {done} failed job{'s' if done != 1 else ''} ({described})"
    if skipped:
        message += f"; skipped {skipped} (no longer failed, or their unique_key is taken)"
    if len(ids) == BULK_MAX:
        message += f"; at most {BULK_MAX} at a time: more may match, run it again"
    return message


async def queue_pause(dashboard: Dashboard, request: Request, form: Mapping[str, str]) -> str:
    queue = _queue(form)
    if await pause_queue(await dashboard.pool(), queue):
        return f"queue {queue!r} paused: no worker claims from it; running jobs finish"
    return f"queue {queue!r} was paused already"


async def queue_resume(dashboard: Dashboard, request: Request, form: Mapping[str, str]) -> str:
    queue = _queue(form)
    if await resume_queue(await dashboard.pool(), queue):
        return f"queue {queue!r} resumed"
    return f"queue {queue!r} was not paused"


def _back(path: str | None) -> str | None:
    """The page to link back to: a path of this site only."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return None
    return path


Action = Callable[[Dashboard, Request, Mapping[str, str]], Awaitable[str]]


def action(name: str, run: Action) -> Callable[[Dashboard, Request], Awaitable[Response]]:
    async def handler(dashboard: Dashboard, request: Request) -> Response:
        form = await _form(request)
        if not dashboard.allow_actions:
            raise Refusal(403, "actions are off: this dashboard is read-only "
                               "(start it with --allow-actions, or allow_actions=True)")
        refusal = dashboard.csrf.refusal(request, form)
        if refusal is not None:
            raise Refusal(403, refusal)
        try:
            message = await run(dashboard, request, form)
        except (InvalidJobState, DuplicateJob) as exc:
            raise Refusal(409, str(exc)) from None
        client = request.client.host if request.client else "?"
        logger.info("dashboard action %s from %s: %s", name, client, message)
        if wants_json(request):
            return json_response({"ok": True, "message": message})
        return dashboard.render(request, "message.html", page="", title="Done",
                                message=message, ok=True, back=_back(form.get("back")))

    return handler


ROUTES: tuple[tuple[str, str, Callable[[Dashboard, Request], Awaitable[Response]]], ...] = (
    ("/api/jobs/{job_id}/requeue", "POST", action("requeue", job_requeue)),
    ("/api/jobs/{job_id}/retry", "POST", action("retry", job_retry)),
    ("/api/jobs/{job_id}/cancel", "POST", action("cancel", job_cancel)),
    ("/api/jobs/requeue-failed", "POST", action("requeue-failed", bulk_requeue)),
    ("/api/queues/pause", "POST", action("pause", queue_pause)),
    ("/api/queues/resume", "POST", action("resume", queue_resume)),
)
