"""Inputs that must never turn into SQL or leak: query construction in src/, passwords
in logs and errors, malformed URLs (regressions found by the fuzz tests)."""

from __future__ import annotations

import ast
import asyncio
import logging
from pathlib import Path

import pytest

from akadze import Akadze, Worker
from akadze.database import normalize_url
from akadze.errors import ConfigurationError

SRC = Path(__file__).resolve().parents[1] / "src" / "akadze"
SECRET = "hunter2-Secret"
EXECUTORS = {"execute", "executemany", "copy", "stream", "SQL"}


def _constant(node: ast.expr) -> bool:
    """An interpolated value that is a module constant (ALL_CAPS name) or a literal."""
    if isinstance(node, ast.Constant):
        return True
    return isinstance(node, ast.Name) and node.id.isupper()


def _built(arg: ast.expr) -> bool:
    """Whether a query argument is a string built from variables."""
    if isinstance(arg, ast.JoinedStr):
        return not all(_constant(v.value) for v in arg.values
                       if isinstance(v, ast.FormattedValue))
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mod | ast.Add):
        return isinstance(arg.left, ast.Constant | ast.JoinedStr) or isinstance(
            arg.right, ast.Constant | ast.JoinedStr)
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):
        # "...".format(x) builds text; sql.SQL("...").format(...) composes safely.
        return arg.func.attr == "format" and isinstance(arg.func.value, ast.Constant)
    return False


def test_no_query_is_built_from_variables() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = (node.func.attr if isinstance(node.func, ast.Attribute)
                    else node.func.id if isinstance(node.func, ast.Name) else "")
            if name in EXECUTORS and _built(node.args[0]):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == [], "queries built from variables (use psycopg.sql): " + ", ".join(found)


def test_the_check_itself_catches_a_built_query() -> None:
    bad = ast.parse('conn.execute(f"SELECT * FROM {table}")').body[0]
    assert isinstance(bad, ast.Expr) and isinstance(bad.value, ast.Call)
    assert _built(bad.value.args[0])
    good = ast.parse('conn.execute(sql.SQL("SELECT {}").format(x))').body[0]
    assert isinstance(good, ast.Expr) and isinstance(good.value, ast.Call)
    assert not _built(good.value.args[0])


async def test_a_worker_never_logs_its_password(caplog: pytest.LogCaptureFixture) -> None:
    app = Akadze(database_url=f"postgresql://akadze:{SECRET}@127.0.0.1:1/nowhere")

    @app.task("t")
    async def t() -> None:
        return None

    caplog.set_level(logging.DEBUG)
    worker = Worker(app, poll_interval=0.05, lease=0.3)
    runner = asyncio.create_task(worker.run())
    deadline = asyncio.get_running_loop().time() + 20
    while "failed again" not in caplog.text:  # a few failed attempts, logged at DEBUG
        assert asyncio.get_running_loop().time() < deadline, caplog.text
        await asyncio.sleep(0.05)
    worker.stop()
    await asyncio.wait_for(runner, 15)
    text = caplog.text + "".join(str(r.exc_info) for r in caplog.records if r.exc_info)
    # The worker names the server it cannot reach, with the password masked.
    assert "postgresql://akadze:***@127.0.0.1:1/nowhere" in caplog.text
    assert SECRET not in text


@pytest.mark.parametrize(("url", "normalized"), [
    ("postgresql://", "postgresql://"),
    ("postgres:///db?host=/tmp", "postgresql:///db?host=/tmp"),
    ("POSTGRESQL+psycopg://u@h:5/d", "postgresql://u@h:5/d"),
])
def test_normalize_keeps_everything_but_the_scheme(url: str, normalized: str) -> None:
    assert normalize_url(url) == normalized


@pytest.mark.parametrize("url", [
    f"postgres://u:{SECRET}@[::1:1/x",
    f"postgresql://u:{SECRET}@\x80/db",
    f"postgresql://u:{SECRET}@a b/db",
])
def test_malformed_urls_are_refused_without_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        normalize_url(url)
    assert SECRET not in str(refused.value)
