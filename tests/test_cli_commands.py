"""The top-level commands: each is its module's ``command``, imported when it runs."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import click
import pytest

import akadze.bench
import akadze.cli
from akadze.cli import COMMANDS, cli


def test_every_command_module_is_listed_under_its_own_name() -> None:
    modules = {info.name for info in pkgutil.iter_modules(akadze.cli.__path__)
               if not info.name.startswith("_")}
    with_command = {name for name in modules
                    if isinstance(getattr(importlib.import_module(f"akadze.cli.{name}"),
                                          "command", None), click.Command)}
    assert set(COMMANDS) == with_command
    ctx = click.Context(cli)
    for name in COMMANDS:
        found = cli.get_command(ctx, name)
        assert found is not None and found.name == name
    assert cli.get_command(ctx, "no-such-command") is None


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)


HARNESS = sorted(info.name for info in pkgutil.iter_modules(akadze.bench.__path__))


@pytest.mark.parametrize("name", HARNESS)
def test_a_harness_module_imports_first_in_a_new_interpreter(name: str) -> None:
    # A bench module imports akadze.cli.options; the CLI's bench group imports the
    # bench modules. Importing the harness first used to end in a circular import.
    done = _fresh(f"import akadze.bench.{name}; print('imported')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_a_command_loads_only_its_own_module() -> None:
    done = _fresh(
        "import sys\n"
        "from akadze.cli import main\n"
        "code = main(['migrate', '--help'])\n"
        "print(code, sorted(m for m in sys.modules if m.startswith('akadze.cli.')"
        " or m.startswith('akadze.bench')))\n")
    assert done.returncode == 0, done.stderr
    code, _, loaded = done.stdout.strip().splitlines()[-1].partition(" ")
    assert code == "0"
    assert "akadze.cli.migrate" in loaded
    assert "akadze.bench" not in loaded and "akadze.cli.worker" not in loaded
