"""What PostgreSQL can store (akadze.storable): the sanitiser of error texts and the
check of JSON results, property-tested, and against PostgreSQL itself (issue 21,
finding 1)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akadze.database import mask_password
from akadze.errors import UnstorableResult
from akadze.jobs import ClaimedJob, JobState
from akadze.outcomes import FAILED, RETRIED, decide, error_entry, to_json, unstorable
from akadze.storable import json_text_problem, storable_text

AT = datetime(2026, 1, 1, tzinfo=UTC)
HIGH, LOW = "\ud83d", "\ude00"  # the two halves of U+1F600

# Characters that matter here, often, and any other character now and then.
atoms = st.sampled_from([
    "\x00", "\ud800", "\udbff", "\udc00", "\udcff", "\udfff", HIGH, LOW, HIGH + LOW,
    "\\", "u", "0", "d", "8", "c", "f", "\\u0000", "\\ud800", "\"", "a", "é", "😀", "\n",
])
texts = st.lists(atoms | st.characters(), max_size=16).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
DB_SETTINGS = settings(max_examples=150, deadline=None,
                       suppress_health_check=[HealthCheck.function_scoped_fixture])


def unstorable_chars(text: str) -> bool:
    return "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def job() -> ClaimedJob:
    return ClaimedJob(id=7, queue="q", task="t", args={}, priority=0, run_at=AT,
                      limit_key=None, run_count=1, attempt=1, max_attempts=1)


# -- storable_text ---------------------------------------------------------------------


@given(texts)
def test_storable_text_holds_nothing_postgresql_refuses(text: str) -> None:
    stored = storable_text(text)
    assert not unstorable_chars(stored)
    stored.encode("utf-8")  # strict: valid Unicode throughout
    assert storable_text(stored) == stored  # so a second pass changes nothing


@given(texts)
def test_storable_text_leaves_storable_text_alone(text: str) -> None:
    if not unstorable_chars(text):
        assert storable_text(text) is text


@given(st.lists(st.sampled_from(["ok", " ", "\x00", "\udcff", HIGH, LOW, "😀"]), max_size=12))
def test_storable_text_escapes_exactly_what_cannot_be_stored(parts: list[str]) -> None:
    text = "".join(parts)
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    expected = "".join(
        "\\x00" if c == "\x00" else f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c
        for c in joined)
    assert storable_text(text) == expected


def test_storable_text_examples() -> None:
    assert storable_text("report-\udcff.txt") == "report-\\udcff.txt"
    assert storable_text("bad\x00input") == "bad\\x00input"
    assert storable_text(HIGH + LOW) == "😀"  # a pair is the character it encodes
    assert storable_text(LOW + HIGH) == "\\ude00\\ud83d"  # the wrong order is two lone halves


# -- json_text_problem, against PostgreSQL ----------------------------------------------


def jsonb_accepts(conn: psycopg.Connection[Any], text: str) -> bool:
    try:
        with conn.transaction():
            conn.execute("SELECT %s::text::jsonb", (text,))
    except psycopg.DataError:
        return False
    return True


@DB_SETTINGS
@given(value=json_values)
def test_the_result_check_refuses_exactly_what_jsonb_refuses(
    conn: psycopg.Connection[Any], value: Any
) -> None:
    text = json.dumps(value)  # ASCII, escapes and all: what the worker sends
    assert (json_text_problem(text) is None) == jsonb_accepts(conn, text), text


@DB_SETTINGS
@given(kind=texts, message=texts)
def test_every_error_entry_is_storable_as_jsonb(
    conn: psycopg.Connection[Any], kind: str, message: str
) -> None:
    try:
        raise ValueError(message)
    except ValueError as exc:
        entry = error_entry(job(), AT, kind, message, exc)
    assert json_text_problem(entry) is None
    assert jsonb_accepts(conn, entry), entry
    stored = json.loads(entry)
    assert stored["message"] == storable_text(mask_password(message))[:2_000]
    assert stored["error"] == storable_text(kind)
    assert "\x00" not in stored["traceback"]


def test_escaped_backslashes_are_not_escapes() -> None:
    # The text \u0000 written literally (an escaped backslash, then letters) is fine.
    assert json_text_problem(json.dumps("\\u0000 and \\ud800")) is None
    assert json_text_problem(json.dumps("\\\x00")) is not None
    assert json_text_problem('"\\\\\\u0000"') is not None  # \\ then \u0000
    assert json_text_problem(json.dumps(HIGH + LOW)) is None
    assert json_text_problem(json.dumps(HIGH + "x" + LOW)) is not None
    assert json_text_problem(json.dumps(HIGH + HIGH + LOW)) is not None
    assert json_text_problem(json.dumps(HIGH)) is not None


# -- results -----------------------------------------------------------------------------


@pytest.mark.parametrize(("result", "said"), [
    ("report-\udcff.txt", "a lone surrogate"),
    ({"files": ["a", "b\udcff"]}, "a lone surrogate"),
    ({"\udcff": 1}, "a lone surrogate"),
    ("nul\x00", "a NUL character"),
    ("x" * 2_000, "the result is 2002 bytes as JSON; at most 1000 (max_result_bytes)"),
])
def test_a_result_postgresql_cannot_store_is_an_error_naming_why(result: Any, said: str) -> None:
    with pytest.raises(UnstorableResult, match="the result"):
        to_json(result, 1_000)
    finish, _ = decide(job(), None, result, at=AT, draw=0.5, max_result_bytes=1_000)
    assert (finish.kind, finish.state, finish.result) == (FAILED, JobState.FAILED, None)
    entry = json.loads(finish.error or "")
    assert entry["error"] == "UnstorableResult"
    assert entry["message"].startswith("task 't' returned a result that cannot be stored: ")
    assert said in entry["message"]


def test_a_result_at_the_limit_is_stored() -> None:
    assert to_json("x" * 998, 1_000) == '"' + "x" * 998 + '"'
    finish, _ = decide(job(), None, "x" * 998, at=AT, draw=0.5, max_result_bytes=1_000)
    assert finish.kind == "succeeded"


def test_an_unstorable_result_spends_an_attempt_like_any_error() -> None:
    retried = ClaimedJob(id=7, queue="q", task="t", args={}, priority=0, run_at=AT,
                         limit_key=None, run_count=1, attempt=1, max_attempts=3)
    finish, _ = decide(retried, None, "\udcff", at=AT, draw=1.0)
    assert (finish.kind, finish.state, finish.delay) == (RETRIED, JobState.QUEUED, 1.0)


def test_a_refused_outcome_becomes_a_failure_keeping_its_attempt() -> None:
    finish, _ = decide(job(), None, {"ok": 1}, at=AT, draw=0.5)
    instead = unstorable(finish, AT, "PostgreSQL refused it: 23514 new row violates")
    assert (instead.kind, instead.state, instead.attempt_delta, instead.result) == (
        FAILED, JobState.FAILED, 0, None)
    entry = json.loads(instead.error or "")
    assert entry["error"] == "UnstorableOutcome"
    assert entry["message"] == ("the outcome of the run (succeeded) could not be stored: "
                                "PostgreSQL refused it: 23514 new row violates")
