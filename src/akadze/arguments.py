"""Job arguments: the pydantic model of a task function's keyword arguments, and the one
path that checks arguments and makes the JSON text stored with a job.

``enqueue``, ``enqueue_many`` and a schedule's registration all check arguments here
(so whatever a schedule accepts at registration, each of its fires can enqueue), with
the same pydantic validation, the same checks of what jsonb cannot store (NUL
characters and NaN/Infinity, also inside ``Any``-typed arguments) and the same size
limit (the app's ``max_args_bytes``, see :data:`DEFAULT_PAYLOAD_BYTES`). The worker loads
stored arguments back through the model and reports invalid ones with the same
formatter (:func:`describe_validation`).

Pure code (no I/O); errors are :class:`~akadze.errors.EnqueueError` naming the
argument, with an optional ``where`` prefix (``"item 3: "`` in bulk).
"""

from __future__ import annotations

import inspect
import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pydantic
import pydantic_core

from .errors import ConfigurationError, EnqueueError

# Arguments are stored as jsonb, which has no NaN/Infinity: float fields refuse them at
# validation, and a non-finite number inside an ``Any`` field is serialized as a bare
# NaN/Infinity constant so that json_problem can find and refuse it (instead of
# pydantic's default of silently writing null).
ARGS_CONFIG = pydantic.ConfigDict(
    extra="forbid", arbitrary_types_allowed=False, allow_inf_nan=False,
    ser_json_inf_nan="constants",
)

# A NUL escape in JSON text: "\u0000" preceded by an even number of backslashes.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

# -- sizes ----------------------------------------------------------------------------------
#: The default of ``Akadze(max_args_bytes=..., max_result_bytes=...)``: the most a job's
#: arguments, and its result, may take as compact JSON (UTF-8 bytes).
DEFAULT_PAYLOAD_BYTES = 1024 * 1024
#: The most either setting may be. Jobs are rows that claims, lists and the dashboard
#: read: keep big payloads elsewhere (object storage, a table of your own) and pass a
#: reference.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
#: The schema's ceiling (migration 0008: CHECK on ``pg_column_size`` of ``args`` and
#: ``result``), whatever wrote the row. jsonb can take up to about six times the size
#: of the compact JSON text (an array of one-digit numbers), so anything akadze
#: accepts under MAX_PAYLOAD_BYTES fits under it.
STORED_CEILING_BYTES = 64 * 1024 * 1024


def check_payload_limit(value: object, name: str) -> int:
    """A size setting (``max_args_bytes``, ``max_result_bytes``): a whole number of bytes
    from 1 to MAX_PAYLOAD_BYTES. Raises ConfigurationError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= MAX_PAYLOAD_BYTES):
        raise ConfigurationError(
            f"{name} must be a whole number of bytes from 1 to {MAX_PAYLOAD_BYTES} "
            f"(8 MiB), got {value!r}"
        )
    return value


def oversize(what: str, size: int, limit: int, setting: str) -> str | None:
    """The message for a JSON text of ``size`` bytes over ``limit`` (None when it fits):
    ``"arguments are 2000000 bytes as JSON; at most 1048576 (max_args_bytes)"``. For
    enqueue here, and for the worker's results (``max_result_bytes``)."""
    if size <= limit:
        return None
    return f"{what} {size} bytes as JSON; at most {limit} ({setting})"


class HasArguments(Protocol):
    """A task as argument checking sees it (akadze.Task is one)."""

    @property
    def name(self) -> str: ...

    @property
    def args_type(self) -> Any:
        """What arguments are validated into: a TypedDict twin of the model, or the model."""


# -- the model of a signature ------------------------------------------------------------


def args_model(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    """A pydantic model of ``fn``'s keyword arguments. ``*args``/``**kwargs`` are refused:
    a job's arguments must be named and validated."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"task {name!r}: cannot read the signature: {exc}") from None
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"task {name!r}: *args and **kwargs are not supported; "
                "give every argument a name"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"task {name!r}: positional-only argument {param.name!r} is not supported"
            )
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model_name = "".join(part.capitalize() for part in name.replace(".", "_").split("_")) or "Task"
    try:
        return pydantic.create_model(
            f"{model_name}Args",
            __config__=ARGS_CONFIG,
            __module__=getattr(fn, "__module__", __name__),
            **fields,
        )
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError) as exc:
        raise ConfigurationError(
            f"task {name!r}: argument types are not supported: {exc}"
        ) from None


def args_dict_type(model: type[pydantic.BaseModel]) -> Any | None:
    """A TypedDict twin of an arguments model, for fast validation.

    Validating into plain dicts is several times faster than building model instances
    (it matters for enqueue_many of 100 000 jobs) and keeps only the arguments that
    were given, like ``exclude_unset``. Fields, constraints and the config are the
    model's own. ``None`` when the model cannot be mirrored (the model is used then).
    """
    from typing import Annotated, NotRequired

    # pydantic needs typing_extensions' TypedDict before Python 3.12
    from typing_extensions import TypedDict

    fields: dict[str, Any] = {}
    for field_name, info in model.model_fields.items():
        if info.alias is not None or info.validation_alias is not None:
            return None
        annotation: Any = info.annotation
        if info.metadata:
            annotation = Annotated[(annotation, *info.metadata)]
        fields[field_name] = annotation if info.is_required() else NotRequired[annotation]
    try:
        make_typed_dict: Any = TypedDict  # called dynamically: the fields are only known now
        typed = make_typed_dict(f"{model.__name__}Dict", fields)
        typed.__pydantic_config__ = ARGS_CONFIG  # read by pydantic for TypedDicts
        pydantic.TypeAdapter(typed)  # fails here if a field type is not supported
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError):
        return None
    return typed


# -- the one formatter -------------------------------------------------------------------


def describe_errors(task: str, exc: pydantic.ValidationError, skip: int = 0) -> tuple[str, str]:
    """A message and the first offending field of a validation error; ``skip`` leading
    location parts (the item index of a list) are left out."""
    parts: list[str] = []
    errors = exc.errors()
    first_field = ""
    for error in errors[:5]:
        loc = ".".join(str(part) for part in error.get("loc", ())[skip:]) or "(arguments)"
        first_field = first_field or loc
        kind = error.get("type", "")
        if kind == "missing":
            parts.append(f"missing argument {loc!r}")
        elif kind == "extra_forbidden":
            parts.append(f"unexpected argument {loc!r}")
        elif kind in ("dict_type", "model_type", "typed_dict_type") and loc == "(arguments)":
            parts.append("arguments must be a mapping of names to values")
        else:
            parts.append(f"argument {loc!r}: {error.get('msg', 'invalid')}")
    more = len(errors) - 5
    suffix = f" (and {more} more)" if more > 0 else ""
    return f"task {task!r}: " + "; ".join(parts) + suffix, first_field


def describe_validation(task: str, exc: pydantic.ValidationError) -> str:
    """The message of :func:`describe_errors` (stored arguments the worker refuses)."""
    return describe_errors(task, exc)[0]


# -- what jsonb cannot store ---------------------------------------------------------------


def json_problem(data: bytes) -> str | None:
    """What jsonb cannot store in this JSON text, if anything: NUL characters (PostgreSQL
    text cannot hold them) or NaN/Infinity (not JSON)."""
    if b"\\u0000" in data and _JSON_NUL.search(data):
        return "contain a NUL character (\\u0000), which PostgreSQL cannot store"
    if b"NaN" in data or b"Infinity" in data:
        try:
            json.loads(data, parse_constant=_no_constant)
        except ValueError:
            return "contain NaN or Infinity, which JSON cannot store"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _argument_with_problem(data: bytes) -> str | None:
    """The top-level argument that holds what json_problem found (for the message)."""
    try:
        loaded = json.loads(data, parse_constant=float)
    except ValueError:  # pragma: no cover - the text came from a JSON serializer
        return None
    for name, value in loaded.items():
        if json_problem(pydantic_core.to_json(name)) or json_problem(pydantic_core.to_json(value)):
            return str(name)
    return None


def _unserializable_argument(validated: Any) -> str | None:
    """The top-level argument that JSON serialization fails on (for the message)."""
    items = validated.items() if isinstance(validated, Mapping) else vars(validated).items()
    for name, value in items:
        try:
            pydantic_core.to_json(value)
        except (pydantic_core.PydanticSerializationError, ValueError, RecursionError):
            return str(name)
    return None


# -- the one validation path ---------------------------------------------------------------

_list_adapters: weakref.WeakKeyDictionary[Any, pydantic.TypeAdapter[Any]] = (
    weakref.WeakKeyDictionary()
)


def list_adapter(task: HasArguments) -> pydantic.TypeAdapter[Any]:
    """The adapter of a list of the task's arguments: enqueue_many validates all items
    in one call with it, and one enqueue is a list of one, so both take one path."""
    adapter = _list_adapters.get(task)
    if adapter is None:
        adapter = pydantic.TypeAdapter(
            list[task.args_type],  # type: ignore[name-defined]
            # A non-finite float inside an ``Any`` argument is written as a bare NaN or
            # Infinity, which json_problem finds and refuses (pydantic's default writes
            # null, silently changing the value).
            config=pydantic.ConfigDict(ser_json_inf_nan="constants"),
        )
        _list_adapters[task] = adapter
    return adapter


def serialize_args(task: HasArguments, kwargs: Mapping[str, Any], where: str = "", *,
                   max_bytes: int) -> str:
    """Check one job's arguments, at most ``max_bytes`` as JSON; return the JSON text to
    store. Raises EnqueueError."""
    adapter = list_adapter(task)
    try:
        validated = adapter.validate_python([kwargs])
    except pydantic.ValidationError as exc:
        message, first = describe_errors(task.name, exc, skip=1)
        raise EnqueueError(f"{where}{message}", field=first or None) from None
    try:
        plain = adapter.dump_python(validated, mode="json", exclude_unset=True)[0]
        data = pydantic_core.to_json(plain)
    except (pydantic_core.PydanticSerializationError, ValueError) as exc:
        name = _unserializable_argument(validated[0])
        shown = f"argument {name!r} is" if name else "arguments are"
        raise EnqueueError(
            f"{where}task {task.name!r}: {shown} not storable as JSON: {exc}",
            field=name or "args",
        ) from None
    problem = json_problem(data)
    if problem:
        name = _argument_with_problem(data)
        shown = f"argument {name!r}" if name else "arguments"
        raise EnqueueError(f"{where}task {task.name!r}: {shown} {problem}", field=name)
    _check_size(task, len(data), max_bytes, where)
    return data.decode("utf-8")


def _check_size(task: HasArguments, size: int, max_bytes: int, where: str) -> None:
    too_big = oversize("arguments are", size, max_bytes, "max_args_bytes")
    if too_big is not None:
        raise EnqueueError(f"{where}task {task.name!r}: {too_big}", field="args")


def validate_many(task: HasArguments, arg_dicts: list[Any], start: int = 0) -> list[Any]:
    """Validate the arguments of many jobs in one call (enqueue_many; items ``start``
    onwards of a batch). What only serialization can find is checked by
    :func:`dump_many`. Raises EnqueueError naming the first bad item."""
    if not arg_dicts:
        return []
    try:
        return list(list_adapter(task).validate_python(arg_dicts))
    except pydantic.ValidationError as exc:
        index = exc.errors()[0]["loc"][0]
        message, first = describe_errors(task.name, exc, skip=1)
        shown = start + index if isinstance(index, int) else index
        raise EnqueueError(f"item {shown}: {message}", field=first or None) from None


def dump_many(task: HasArguments, validated: Sequence[Any],
              arg_dicts: Sequence[Any], start: int, *, max_bytes: int) -> list[str]:
    """The JSON texts of validated arguments (items ``start`` onwards of a batch). An item
    that cannot be stored, or is over ``max_bytes``, raises the EnqueueError
    :func:`serialize_args` gives it, named by its index; ``arg_dicts`` are the items as
    given, for that message."""
    try:
        plain = list_adapter(task).dump_python(validated, mode="json", exclude_unset=True)
        data = [pydantic_core.to_json(item) for item in plain]
    except (pydantic_core.PydanticSerializationError, ValueError):
        _name_the_item(task, arg_dicts, start, start + len(validated), max_bytes)
        raise  # pragma: no cover - _name_the_item raises
    # One scan of the chunk; the per-item search runs only when something is found.
    if json_problem(b"\n".join(data)):
        for offset, item in enumerate(data):
            if json_problem(item):
                _name_the_item(task, arg_dicts, start + offset, start + offset + 1, max_bytes)
    for offset, item in enumerate(data):
        if len(item) > max_bytes:
            _check_size(task, len(item), max_bytes, f"item {start + offset}: ")
    return [item.decode("utf-8") for item in data]


def _name_the_item(task: HasArguments, arg_dicts: Sequence[Any], start: int, stop: int,
                   max_bytes: int) -> None:
    """Raise the EnqueueError of the first item in [start, stop) that cannot be stored."""
    for index in range(start, stop):
        serialize_args(task, arg_dicts[index], where=f"item {index}: ", max_bytes=max_bytes)
