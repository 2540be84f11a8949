"""Tasks: named functions whose keyword arguments are validated by a pydantic model
built from the function's signature."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pydantic

from .errors import ConfigurationError, EnqueueError

if TYPE_CHECKING:
    from .app import Akadze
    from .enqueue import Enqueuer

R = TypeVar("R")
TaskFunction = Callable[..., Any]
BackoffFunction = Callable[[int], timedelta]

PRIORITY_MIN, PRIORITY_MAX = -32768, 32767
MAX_ATTEMPTS_MAX = 2**31 - 1


def _check_priority(value: object, field: str = "priority") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnqueueError(f"{field} must be an integer, got {value!r}", field=field)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise EnqueueError(
            f"{field} must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {value}", field=field
        )
    return value


def _check_max_attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnqueueError(f"max_attempts must be an integer, got {value!r}", field="max_attempts")
    if not 1 <= value <= MAX_ATTEMPTS_MAX:
        raise EnqueueError(
            f"max_attempts must be between 1 and {MAX_ATTEMPTS_MAX}, got {value}",
            field="max_attempts",
        )
    return value


# Arguments are stored as jsonb, which has no NaN/Infinity: float fields refuse them at
# validation, and a non-finite number inside an ``Any`` field is serialized as a bare
# NaN/Infinity constant so that enqueue can find and refuse it (instead of pydantic's
# default of silently writing null).
_ARGS_CONFIG = pydantic.ConfigDict(
    extra="forbid", arbitrary_types_allowed=False, allow_inf_nan=False,
    ser_json_inf_nan="constants",
)


def args_dict_type(model: type[pydantic.BaseModel]) -> Any | None:
    """A TypedDict twin of an arguments model, for fast enqueue validation.

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
        typed.__pydantic_config__ = _ARGS_CONFIG  # read by pydantic for TypedDicts
        pydantic.TypeAdapter(typed)  # fails here if a field type is not supported
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError):
        return None
    return typed


def args_model(fn: TaskFunction, name: str) -> type[pydantic.BaseModel]:
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
            __config__=_ARGS_CONFIG,
            __module__=getattr(fn, "__module__", __name__),
            **fields,
        )
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError) as exc:
        raise ConfigurationError(
            f"task {name!r}: argument types are not supported: {exc}"
        ) from None


class Task(Generic[R]):
    """A registered task. Calling it runs the function directly (handy in tests);
    ``task.using(session=...).enqueue(**kwargs)`` queues a job."""

    def __init__(
        self,
        app: Akadze,
        fn: TaskFunction,
        *,
        name: str,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        backoff: BackoffFunction | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"task {name!r}: {fn!r} is not callable")
        if not isinstance(queue, str) or not queue:
            raise ConfigurationError(f"task {name!r}: queue must be a non-empty string")
        try:
            _check_max_attempts(max_attempts)
            _check_priority(priority)
        except EnqueueError as exc:
            raise ConfigurationError(f"task {name!r}: {exc}") from None
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"task {name!r}: timeout must be positive")
        if backoff is not None and not callable(backoff):
            raise ConfigurationError(f"task {name!r}: backoff must be callable")
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout: float | None = timeout
        self.priority = priority
        self.backoff = backoff
        self.is_async = inspect.iscoroutinefunction(fn)
        self.args_model = args_model(fn, name)
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def using(
        self,
        *,
        session: Any = None,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        limit_key: str | None = None,
        expires_at: datetime | None = None,
        meta: Mapping[str, Any] | None = None,
        queue: str | None = None,
    ) -> Enqueuer:
        """Options for the next enqueue (see :class:`akadze.enqueue.Enqueuer`); options
        left out take the task's defaults. Raises EnqueueError for a bad option."""
        from .enqueue import Enqueuer

        return Enqueuer(
            self, session=session, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, unique_key=unique_key, limit_key=limit_key,
            expires_at=expires_at, meta=meta, queue=queue,
        )

    @functools.cached_property
    def args_type(self) -> Any:
        """What enqueue validates arguments into: a TypedDict twin of ``args_model``
        (plain dicts of the given arguments), or the model itself."""
        return args_dict_type(self.args_model) or self.args_model

    @functools.cached_property
    def args_adapter(self) -> pydantic.TypeAdapter[Any]:
        return pydantic.TypeAdapter(self.args_type)

    def validate_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Validate enqueue arguments; return their JSON form. Raises EnqueueError."""
        try:
            model = self.args_model.model_validate(kwargs)
        except pydantic.ValidationError as exc:
            raise EnqueueError(
                _describe_validation(self.name, exc), field=_first_field(exc)
            ) from None
        return model.model_dump(mode="json", exclude_unset=True)

    def load_args(self, stored: dict[str, Any]) -> dict[str, Any]:
        """Validate stored JSON arguments before a run; return the call's keyword arguments."""
        model = self.args_model.model_validate(stored)
        return {name: getattr(model, name) for name in type(model).model_fields}

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"


def _first_field(exc: pydantic.ValidationError) -> str | None:
    for error in exc.errors():
        if error.get("loc"):
            return ".".join(str(part) for part in error["loc"])
    return None


def _describe_validation(task: str, exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = ".".join(str(part) for part in error.get("loc", ())) or "(arguments)"
        kind = error.get("type", "")
        if kind == "missing":
            parts.append(f"missing argument {loc!r}")
        elif kind == "extra_forbidden":
            parts.append(f"unexpected argument {loc!r}")
        else:
            parts.append(f"argument {loc!r}: {error.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    suffix = f" (and {more} more)" if more > 0 else ""
    return f"task {task!r}: " + "; ".join(parts) + suffix
