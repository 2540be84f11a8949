"""Every ```python block in the README and docs/ runs, in order, per file.

Blocks of one file share a namespace (like a reader following the page). A block whose
first line is ``# not run`` is skipped (for fragments that need a live worker process or
an external service). The examples see ``AKADZE_DATABASE_URL`` pointing at a fresh,
migrated test database.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(path: Path) -> list[str]:
    return [b for b in BLOCK.findall(path.read_text()) if not b.startswith("# not run")]


@pytest.mark.parametrize(
    "path", [p for p in DOCS if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_examples_run(
    path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AKADZE_DATABASE_URL", database_url)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for number, block in enumerate(_blocks(path), start=1):
        code = compile(block, f"{path.name}[block {number}]", "exec")
        exec(code, namespace)
