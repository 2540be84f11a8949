"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): what an
operator sees and does. Every wait is on the page's state (Playwright's expectations
retry until a deadline), never a sleep. The run also takes the screenshots of
docs/howto/dashboard.md: with AKADZE_UPDATE_SCREENSHOTS=1 it writes them there."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dashboard_data import fill, history, state_of, tasks

from akadze import Akadze

playwright_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")
from akadze.bench.dashboard_serving import serving  # noqa: E402
from akadze.dashboard import create_app  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "docs" / "howto" / "img"
expect = playwright_api.expect


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium)")
    with playwright_api.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def dash_app(app: Akadze) -> Akadze:
    tasks(app)
    return app


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(10_000)
    found = context.new_page()
    yield found
    context.close()


def run(coroutine: Any) -> Any:
    """Run akadze's async API to the end. In a thread of its own: Playwright's sync API
    keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_the_overview_shows_the_queue_the_test_filled_and_refreshes_itself(
    dash_app: Akadze, page: Any
) -> None:
    run(fill(dash_app))
    with serving(create_app(dash_app.database_url, refresh_seconds=0.5)) as base:
        page.goto(base + "/")
        row = page.locator('tr[data-queue="accounts"]')
        expect(row.locator("td").nth(1)).to_have_text("29")
        expect(row.locator("td").nth(3)).to_have_text("1")
        page.evaluate("window.notReloaded = true")
        run(dash_app.tasks["sync_account"].using(limit_key="tenant:acme").enqueue_many(
            [{"account": i} for i in range(5)]))
        expect(row.locator("td").nth(1)).to_have_text("34")  # by the refresh, in place
        assert page.evaluate("window.notReloaded") is True
        toggle = page.locator("#refresh-toggle")
        toggle.click()
        expect(toggle).to_have_attribute("aria-pressed", "true")
        page.reload()  # the pause is remembered
        expect(page.locator("body")).to_have_attribute("data-paused", "1")
        expect(toggle).to_have_text("Resume refresh")


def test_a_key_at_its_limit_is_on_the_limits_page(dash_app: Akadze, page: Any) -> None:
    run(fill(dash_app))
    with serving(create_app(dash_app.database_url)) as base:
        page.goto(base + "/limits")
        first = page.locator("table.limits tbody tr").first
        expect(first).to_have_attribute("data-key", "tenant:acme")
        expect(first).to_have_class("at-limit")
        expect(first).to_contain_text("1 / 1")
        expect(first).to_contain_text("at its limit")
        expect(page.locator('tr[data-key="tenant:globex"]')).not_to_have_class("at-limit")


def test_a_failed_jobs_error_is_on_its_page(dash_app: Akadze, page: Any) -> None:
    filled = run(fill(dash_app))
    with serving(create_app(dash_app.database_url)) as base:
        page.goto(base + "/jobs")
        page.select_option('select[name="state"]', "failed")
        page.locator("form.filters button").click()
        link = page.locator(f'tr[data-id="{filled.failed_id}"] a')
        expect(link).to_be_visible()
        link.click()
        expect(page.locator("h1")).to_contain_text(f"Job {filled.failed_id}")
        entry = page.locator(".error-entry").first
        expect(entry.locator("h3")).to_have_text("Attempt 1: ConnectionError")
        expect(entry.locator(".message")).to_have_text(
            "the payment gateway refused account 42")
        expect(entry.locator(".traceback")).to_contain_text("Traceback (most recent call last)")


def test_requeue_works_with_actions_on(dash_app: Akadze, page: Any) -> None:
    filled = run(fill(dash_app))
    asgi = create_app(dash_app.database_url, allow_actions=True, refresh_seconds=0.5)
    with serving(asgi) as base:
        page.goto(f"{base}/jobs/{filled.failed_id}")
        page.get_by_role("button", name="Requeue").click()
        expect(page.locator("#flash")).to_have_text(
            f"job {filled.failed_id} requeued: it is queued again, ready now, "
            "with a fresh set of attempts")
        expect(page.locator("h1 .state")).to_have_text("queued")
        assert state_of(dash_app.database_url, filled.failed_id) == "queued"


def test_requeue_is_refused_with_actions_off(dash_app: Akadze, page: Any) -> None:
    filled = run(fill(dash_app))
    with serving(create_app(dash_app.database_url)) as base:
        page.goto(f"{base}/jobs/{filled.failed_id}")
        expect(page.locator(".actions")).to_contain_text("Read-only")
        expect(page.get_by_role("button", name="Requeue")).to_have_count(0)
        # The request the button would send, from the page itself, with its token.
        answer = page.evaluate("""async (path) => {
            const token = document.querySelector('meta[name="csrf-token"]').content;
            const r = await fetch(path, {method: "POST", headers: {"X-CSRF-Token": token}});
            return [r.status, (await r.json()).error];
        }""", f"/api/jobs/{filled.failed_id}/requeue")
        assert answer[0] == 403 and "actions are off" in answer[1]
        assert state_of(dash_app.database_url, filled.failed_id) == "failed"


def test_basic_auth_refuses_a_wrong_password(dash_app: Akadze, browser: Any) -> None:
    asgi = create_app(dash_app.database_url, basic_auth=("ops", "correct horse"))
    with serving(asgi) as base:
        wrong = browser.new_context(http_credentials={"username": "ops", "password": "nope"})
        try:
            response = wrong.new_page().goto(base + "/")
            assert response is not None and response.status == 401
        finally:
            wrong.close()
        right = browser.new_context(
            http_credentials={"username": "ops", "password": "correct horse"})
        try:
            shown = right.new_page()
            response = shown.goto(base + "/")
            assert response is not None and response.status == 200
            expect(shown.locator("h1")).to_have_text("Overview")
        finally:
            right.close()


def _shooter(tmp_path: Path) -> Callable[[Any, str], Path]:
    folder = SHOTS if os.environ.get("AKADZE_UPDATE_SCREENSHOTS") == "1" else tmp_path

    def shoot(page: Any, name: str) -> Path:
        path = folder / f"dashboard-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return shoot


def test_every_page_for_the_docs(dash_app: Akadze, page: Any, tmp_path: Path) -> None:
    filled = run(fill(dash_app))
    run(history(dash_app))
    with psycopg.connect(dash_app.database_url, autocommit=True) as conn:
        conn.execute("ANALYZE akadze.jobs")  # so that the overview has its estimate
    shoot = _shooter(tmp_path)
    doc = (ROOT / "docs" / "howto" / "dashboard.md").read_text()
    asgi = create_app(dash_app.database_url, allow_actions=True, app=dash_app)
    with serving(asgi) as base:
        for name, path, heading, seen in [
            ("overview", "/", "Overview", 'tr[data-queue="accounts"]'),
            ("limits", "/limits", "Limits", 'tr[data-key="tenant:acme"].at-limit'),
            ("fairness", "/fairness", "Fairness", 'section[data-queue="reports"] svg.shares'),
            ("jobs", "/jobs?queue=accounts", "Jobs", "table.jobs tbody tr"),
            ("job", f"/jobs/{filled.failed_id}", f"Job {filled.failed_id}", ".traceback"),
            ("schedules", "/schedules", "Schedules", 'tr[data-schedule="nightly_report"]'),
        ]:
            page.goto(base + path)
            expect(page.locator("h1")).to_contain_text(heading)
            expect(page.locator(seen).first).to_be_visible()
            shot = shoot(page, name)
            assert shot.stat().st_size > 10_000, name
            assert f"img/dashboard-{name}.png" in doc, f"docs/howto/dashboard.md lacks {name}"
            assert (SHOTS / f"dashboard-{name}.png").exists(), "AKADZE_UPDATE_SCREENSHOTS=1"
