"""Names as akadze stores them: queue names, limit keys, unique keys (and the filters
that look them up).

One rule for all of them, checked before any statement is sent: a non-empty string
without NUL (PostgreSQL text cannot hold it), valid Unicode (no lone surrogate, which
UTF-8 cannot encode) and at most :data:`KEY_MAX_BYTES` in UTF-8, because these names
sit in btree indexes whose entries must stay well under PostgreSQL's ~2700-byte limit
(queue and limit_key share one entry), and a queue's name travels as the payload of
a notification (at most 8000 bytes).

Pure code. :func:`problem` says what is wrong; each caller raises the error of its own
kind with it (EnqueueError at enqueue, ConfigurationError for an operator's action,
FilterError for a filter, LimitError for a limit).
"""

from __future__ import annotations

KEY_MAX_BYTES = 1000


def problem(value: object, field: str, *, max_bytes: int | None = KEY_MAX_BYTES) -> str | None:
    """What keeps ``value`` from being stored as ``field``, or None when nothing does.
    ``max_bytes=None`` checks everything but the length (a task name)."""
    if not isinstance(value, str):
        return f"{field} must be a string, got {type(value).__name__}"
    if not value:
        return f"{field} must not be empty"
    if "\x00" in value:
        return f"{field} must not contain a NUL character"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{field} is not valid Unicode (a lone surrogate)"
    if max_bytes is not None and size > max_bytes:
        return f"{field} is {size} bytes long in UTF-8; at most {max_bytes}"
    return None
