"""scripts/check_structure.py on small made-up packages: every rule it enforces fails
when broken, and a package that keeps them passes. (CI runs it on src/akadze itself.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_structure.py"


def tree(root: Path, files: dict[str, str]) -> Path:
    """A source root holding ``akadze/`` with these files (path -> text)."""
    for name, text in {"akadze/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def check(root: Path) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True,
                          text=True, timeout=60, check=False, cwd=root)
    assert done.stderr == ""
    return done.returncode, done.stdout.splitlines()


def test_a_package_that_keeps_the_rules_passes(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "akadze/jobs.py": "import json\n",
        "akadze/claim/__init__.py": "from ._drivers import claim\n",
        "akadze/claim/_drivers.py": "from .. import jobs\nfrom ._steps import step\n",
        "akadze/claim/_steps.py": "from ..jobs import json\nstep = 1\n",
        "akadze/worker.py": "from .claim import claim\n" + "x = 1\n" * 599,
    })
    assert check(root) == (0, [])


def test_a_cycle_through_a_late_import_is_reported_at_the_import_that_starts_it(
    tmp_path: Path,
) -> None:
    root = tree(tmp_path, {
        "akadze/app.py": "from . import tasks\n",
        "akadze/tasks.py": "def late():\n    from .app import thing\n    return thing\n",
    })
    assert check(root) == (1, [
        "akadze/app.py:1: import cycle akadze.app -> akadze.tasks -> akadze.app"])


def test_type_checking_imports_count_and_a_group_is_reported_once(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "akadze/worker.py": "from . import execution\n",
        "akadze/execution.py": "from . import leases\n",
        "akadze/leases.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from .execution import Run\n"
            "    from .worker import Worker\n"),
    })
    code, lines = check(root)
    assert code == 1
    assert lines == [
        "akadze/execution.py:1: import cycle akadze.execution -> akadze.leases"
        " -> akadze.execution (its group also holds akadze.worker)"]


def test_a_subpackage_and_absolute_imports_are_followed(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "akadze/claim/__init__.py": "from ._drivers import claim\n",
        "akadze/claim/_drivers.py": "import akadze.embedded.load\nclaim = 1\n",
        "akadze/embedded/__init__.py": "",
        "akadze/embedded/load.py": "from akadze import claim\n",
    })
    code, lines = check(root)
    assert code == 1
    assert lines == [
        "akadze/claim/__init__.py:1: import cycle akadze.claim -> akadze.claim._drivers"
        " -> akadze.embedded.load -> akadze.claim"]


def test_a_module_over_600_lines_is_reported(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "akadze/big.py": "x = 1\n" * 601,
        "akadze/fine.py": "x = 1\n" * 600,
        "akadze/sql/queries/long.sql": "-- a query\n" * 2000,
    })
    assert check(root) == (1, ["akadze/big.py: 601 lines, over the 600 of a module"])


def test_a_private_module_is_imported_only_through_its_package(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "akadze/claim/__init__.py": "from ._windows import steps\n",
        "akadze/claim/_windows.py": "steps = 1\n",
        "akadze/claim/_drivers.py": "from ._windows import steps\n",
        "akadze/worker.py": "x = 1\nfrom .claim._windows import steps\n",
        "akadze/_shared.py": "",
        "akadze/cli/__init__.py": "from .. import _shared\n",
    })
    assert check(root) == (1, [
        "akadze/worker.py:2: imports akadze.claim._windows, a private module of akadze.claim"
        " (import akadze.claim instead)"])


def test_only_the_cli_and_the_harness_import_the_harness(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "akadze/bench/__init__.py": "",
        "akadze/bench/demo.py": "from . import queries\n",
        "akadze/bench/queries.py": "",
        "akadze/cli/__init__.py": "",
        "akadze/cli/demo.py": "from ..bench import demo\n",
        "akadze/worker.py": "import json\n\ndef late():\n    from .bench import demo\n",
    })
    assert check(root) == (1, [
        "akadze/worker.py:4: imports akadze.bench.demo: only the CLI and the harness itself"
        " import akadze.bench"])


def test_a_root_without_the_package_is_bad_usage(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == "" and "no akadze/ package" in done.stderr
