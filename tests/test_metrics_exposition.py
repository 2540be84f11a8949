"""Prometheus text, parsed with the Prometheus client's own parser."""

from __future__ import annotations

import threading
import urllib.request
from datetime import timedelta
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from akadze import Akadze
from akadze.cli.metrics import make_server
from akadze.control import pause_queue_sync
from akadze.metrics import render, render_sync


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def seed(app: Akadze, conn: psycopg.Connection[Any]) -> None:
    @app.task("t", queue='we"ird\\queue')
    def t() -> None:
        return None

    @app.task("u", queue="mail")
    def u() -> None:
        return None

    for _ in range(3):
        app.tasks["t"].using(limit_key="tenant-a").enqueue_sync()
    for _ in range(2):
        app.tasks["u"].using().enqueue_sync()
    conn.execute("UPDATE akadze.jobs SET run_at = now() - interval '40 seconds' "
                 "WHERE task = 'u'")
    conn.execute("UPDATE akadze.jobs SET state = 'running', worker_id = 'w1' "
                 "WHERE id = (SELECT min(id) FROM akadze.jobs WHERE task = 't')")
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                 "WHERE id = (SELECT max(id) FROM akadze.jobs WHERE task = 't')")
    conn.execute("INSERT INTO akadze.jobs (queue, task, state, finished_at) "
                 "VALUES ('mail', 'u', 'failed', now() - interval '2 hours')")
    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES ('tenant-a', 2), "
                 "('idle', 5)")
    conn.execute("INSERT INTO akadze.workers (id, host, pid, queues) "
                 "VALUES ('w1', 'box', 1, '{mail}')")
    pause_queue_sync(conn, "mail")


def test_metrics_text_parses_and_reports(app: Akadze, conn: psycopg.Connection[Any]) -> None:
    seed(app, conn)
    found = samples(render_sync(app))
    weird = 'we"ird\\queue'
    assert found[("akadze_jobs", (("queue", weird), ("state", "queued")))] == 1
    assert found[("akadze_jobs", (("queue", weird), ("state", "running")))] == 1
    assert found[("akadze_jobs", (("queue", "mail"), ("state", "failed")))] == 1
    assert found[("akadze_queue_ready_jobs", (("queue", "mail"),))] == 2
    lag = found[("akadze_queue_oldest_ready_lag_seconds", (("queue", "mail"),))]
    assert 39 <= lag < 100
    assert found[("akadze_queue_paused", (("queue", "mail"),))] == 1
    assert found[("akadze_queue_paused", (("queue", weird),))] == 0
    assert found[("akadze_jobs_finished_recent", (("queue", weird), ("state", "succeeded")))] == 1
    # Finished two hours ago: outside the one-minute window.
    assert found[("akadze_jobs_finished_recent", (("queue", "mail"), ("state", "failed")))] == 0
    assert found[("akadze_limit_running_jobs", (("key", "tenant-a"),))] == 1
    assert found[("akadze_limit_max_running", (("key", "tenant-a"),))] == 2
    assert found[("akadze_limit_running_jobs", (("key", "idle"),))] == 0
    assert found[("akadze_workers", (("alive", "true"),))] == 1
    assert found[("akadze_worker_running_jobs", (("host", "box"), ("worker", "w1")))] == 1


async def test_async_render_and_window(app: Akadze, conn: psycopg.Connection[Any]) -> None:
    seed(app, conn)
    found = samples(await render(app, window=int(timedelta(hours=3).total_seconds())))
    assert found[("akadze_jobs_finished_recent", (("queue", "mail"), ("state", "failed")))] == 1


def test_empty_database_is_valid_text(app: Akadze) -> None:
    text = render_sync(app)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["akadze_workers"].samples[0].value == 0
    assert "akadze_jobs" in families


def test_http_server_serves_metrics(database_url: str, app: Akadze,
                                    conn: psycopg.Connection[Any]) -> None:
    seed(app, conn)
    server = make_server(database_url, "127.0.0.1", 0, 60)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = reply.read().decode()
        assert samples(body)[("akadze_queue_paused", (("queue", "mail"),))] == 1
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        else:
            raise AssertionError("expected a 404")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
