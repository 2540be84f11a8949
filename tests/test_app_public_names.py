"""The public surface: one curated, sorted ``akadze.__all__``, every name resolves, and
the list is the one docs/reference/api.md documents."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import akadze

API = Path(__file__).resolve().parent.parent / "docs" / "reference" / "api.md"
ROW = re.compile(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|", re.MULTILINE)


def test_all_is_sorted_without_duplicates() -> None:
    assert akadze.__all__ == sorted(set(akadze.__all__))


def test_every_name_resolves() -> None:
    missing = [name for name in akadze.__all__ if not hasattr(akadze, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from akadze import *", namespace)
    assert set(akadze.__all__) <= set(namespace)


def test_the_reference_lists_exactly_the_public_names() -> None:
    documented = ROW.findall(API.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)), "a name is documented twice"
    assert sorted(documented) == akadze.__all__


def test_akadze_05_names_keep_working() -> None:
    from akadze.testing import assert_enqueued, drain

    names = [
        "Akadze", "Task", "DuplicateJob", "Retry", "Snooze", "Fail", "Cancel", "current",
        "request_cancel", "Worker", "set_limit", "clear_limit", "list_limits", "pause_queue",
        "resume_queue", "requeue", "list_jobs", "queue_snapshot", "list_workers", "migrate",
        "JobSummary", "QueueSnapshot", "WorkerSummary", "LimitSummary", "JobState",
    ]
    assert [name for name in names if name not in akadze.__all__] == []
    assert callable(drain) and callable(assert_enqueued)


def test_importing_akadze_imports_no_sqlalchemy() -> None:
    code = ("import sys, akadze, akadze.testing, akadze.cli; "
            "sys.exit('sqlalchemy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
