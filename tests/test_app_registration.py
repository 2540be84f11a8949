"""The app object and task registration: no connection at construction, clear refusals."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from akadze import Akadze, ConfigurationError, EnqueueError, Task


def test_construction_opens_no_connection() -> None:
    # Nothing listens on port 1: constructing, registering and building an enqueuer work.
    app = Akadze("postgresql://user:secret@127.0.0.1:1/nowhere")

    @app.task("t")
    def t(x: int) -> None:
        pass

    t.using(priority=1, delay=3)
    assert "secret" not in repr(app)
    with pytest.raises(ConfigurationError, match="cannot connect") as refused:
        t.using().enqueue_sync(x=1)
    assert "secret" not in str(refused.value)


def test_environment_url_is_used(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.setenv("AKADZE_DATABASE_URL", database_url)
    app = Akadze()
    assert app.database_url == database_url

    @app.task("t")
    def t(x: int) -> None:
        pass

    assert t.using().enqueue_sync(x=1) >= 1


@pytest.mark.parametrize(
    "url", ["mysql://root:hunter2@db/x", "sqlite:///tmp/x.db", "http://u:hunter2@h/"]
)
def test_non_postgresql_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError, match="not a PostgreSQL URL") as refused:
        Akadze(url)
    assert "hunter2" not in str(refused.value)


def test_duplicate_names_are_refused() -> None:
    app = Akadze("postgresql://localhost/x")

    @app.task("same")
    def first() -> None:
        pass

    with pytest.raises(ConfigurationError, match="already registered"):

        @app.task("same")
        def second() -> None:
            pass

    with pytest.raises(ConfigurationError, match="already registered"):
        app.register(lambda: None, name="same")


def test_a_name_is_required() -> None:
    app = Akadze("postgresql://localhost/x")
    with pytest.raises(ConfigurationError, match="explicit name"):

        @app.task  # type: ignore[arg-type]
        def nameless() -> None:
            pass

    with pytest.raises(ConfigurationError, match="non-empty name"):
        app.register(lambda: None, name=" ")


def test_var_args_are_refused() -> None:
    app = Akadze("postgresql://localhost/x")
    with pytest.raises(ConfigurationError, match=r"\*args"):

        @app.task("star")
        def star(*names: str) -> None:
            pass

    with pytest.raises(ConfigurationError, match=r"\*\*kwargs"):

        @app.task("double")
        def double(**options: Any) -> None:
            pass

    assert app.tasks == {}


def test_bad_task_options_are_refused() -> None:
    app = Akadze("postgresql://localhost/x")
    for options in ({"priority": 99999}, {"max_attempts": 0}, {"queue": ""}, {"timeout": -1}):
        with pytest.raises(ConfigurationError):
            app.register(lambda: None, name=f"t{len(app.tasks)}", **options)


def test_register_binds_a_plain_callable(conn: Any, app: Akadze) -> None:
    class Mailer:
        def __init__(self, sender: str) -> None:
            self.sender = sender

        def send(self, to: str) -> str:
            return f"{self.sender} -> {to}"

    task = app.register(Mailer("noreply").send, name="mail.send", queue="mail")
    assert isinstance(task, Task)
    assert task(to="ada") == "noreply -> ada"  # still callable directly
    job_id = task.using().enqueue_sync(to="ada")
    assert conn.execute(
        "SELECT task, queue, args FROM akadze.jobs WHERE id = %s", (job_id,)
    ).fetchone() == ("mail.send", "mail", {"to": "ada"})
    with pytest.raises(EnqueueError, match="unexpected argument 'self'"):
        task.using().enqueue_sync(to="ada", self="x")


def test_include_imports_a_module_and_calls_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "myjobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mail.py").write_text(
        textwrap.dedent(
            """
            def send(to: str) -> None:
                pass

            def register(app):
                app.register(send, name="mail.send")
            """
        )
    )
    (package / "broken.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = Akadze("postgresql://localhost/x")
    app.include("myjobs.mail")
    assert list(app.tasks) == ["mail.send"]
    with pytest.raises(ConfigurationError, match="register"):
        app.include("myjobs.broken")
    with pytest.raises(ConfigurationError, match="cannot import"):
        app.include("myjobs.missing")
    for name in ("myjobs", "myjobs.mail", "myjobs.broken"):
        sys.modules.pop(name, None)


def test_async_and_plain_functions(app: Akadze) -> None:
    @app.task("plain")
    def plain(x: int) -> int:
        return x

    @app.task("coro")
    async def coro(x: int) -> int:
        return x

    assert not plain.is_async and coro.is_async
    assert plain.name == "plain" and plain.__name__ == "plain"
