"""Loading the user's app for ``akadze worker``, ``schedules list`` and ``dashboard``.

An app is named ``MODULE:ATTRIBUTE`` (``myproject.jobs:app``) or
``PATH.py:ATTRIBUTE`` (``./myjobs.py:app``, ``src/myproject/jobs.py:app``).

How the module is found (docs/howto/worker.md says the same):

- ``MODULE``: by Python's import system, on ``sys.path`` as it is (the installed
  packages first), then in the current directory, which is added *last*: a file
  in the current directory never shadows an installed or standard module.
- ``PATH.py``: that very file. Its package is worked out from the ``__init__.py``
  files above it (``src/myproject/jobs.py`` in a package ``myproject`` is the module
  ``myproject.jobs``), and the directory above the package is added last to
  ``sys.path``, so its sibling imports work. If another module of that name comes
  first on ``sys.path``, it is refused with a line saying so.

An exception or a SyntaxError inside the user's module is shown as the user's own
traceback (the frames of the import machinery and of akadze removed), followed by
one ``akadze:`` line; it exits 2 like any app reference that does not import.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..app import Akadze

EXAMPLE = "myproject.jobs:app, or a file: ./myjobs.py:app"

# Frames of these places are not the user's: the import machinery, click, akadze.
_NOT_THEIRS = (
    str(Path(__file__).resolve().parent.parent),
    str(Path(click.__file__).resolve().parent),
    str(Path(importlib.__file__).resolve().parent),
)


def load_app(reference: str) -> Akadze:
    """The Akadze app named by ``MODULE:ATTRIBUTE`` or ``PATH.py:ATTRIBUTE``;
    ConfigurationError (one line) when it cannot be had."""
    from ..app import Akadze

    target, _, attribute = reference.rpartition(":")
    if not target or not attribute:
        suggestion = f"; did you mean {reference}:app?" if reference and ":" not in reference \
            else ""
        raise ConfigurationError(
            f"expected the app as MODULE:APP (for example {EXAMPLE}), got {reference!r}"
            + suggestion
        )
    if _is_path(target):
        module_name = _from_path(target)
    else:
        module_name = target
        _add_last(os.getcwd())
    module = _import(module_name, target)
    found = getattr(module, attribute, None)
    if not isinstance(found, Akadze):
        where = getattr(module, "__file__", None) or module_name
        kind = "nothing" if found is None else f"a {type(found).__name__}"
        raise ConfigurationError(
            f"{reference!r} is not an Akadze app: {module_name} ({where}) has {kind} named "
            f"{attribute!r}" + _shadow_hint(module_name, module)
        )
    return found


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _add_last(directory: str) -> None:
    """Make ``directory`` importable after everything already on sys.path."""
    if directory not in sys.path:
        sys.path.append(directory)


def _from_path(target: str) -> str:
    """The module name of the file ``target``, its top directory made importable."""
    path = Path(target).expanduser()
    if path.suffix != ".py":
        raise ConfigurationError(
            f"{target!r} is not a Python file: give the app as PATH.py:APP or MODULE:APP "
            f"(for example {EXAMPLE})"
        )
    if not path.is_file():
        raise ConfigurationError(f"no file {target!r} (from {os.getcwd()})")
    path = path.resolve()
    parts = [] if path.stem == "__init__" else [path.stem]
    top = path.parent
    while (top / "__init__.py").is_file():
        parts.insert(0, top.name)
        top = top.parent
    if not parts or not all(part.isidentifier() for part in parts):
        raise ConfigurationError(
            f"{target!r} cannot be imported as a module (its name, or a package above it, "
            "is not a Python identifier): rename it, or give MODULE:APP"
        )
    module_name = ".".join(parts)
    _add_last(str(top))
    loaded = sys.modules.get(module_name)
    if loaded is None:
        loaded = _import(module_name, target)
    origin = getattr(loaded, "__file__", None)
    if origin is None or Path(origin).resolve() != path:
        raise ConfigurationError(
            f"{target!r} is the module {module_name!r}, but another module of that name "
            f"comes first on sys.path ({origin or 'built in'}): rename the file"
        )
    return module_name


def _import(module_name: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigurationError(
                f"cannot import {module_name!r}: no module named {missing!r} among the "
                f"installed packages and in the current directory ({os.getcwd()}); "
                f"for a file give its path, for example ./{module_name.replace('.', '/')}.py:app"
            ) from None
        raise _failed(module_name, exc) from None
    except Exception as exc:  # the user's module raised (SyntaxError included)
        raise _failed(module_name, exc) from None


def _failed(module_name: str, exc: BaseException) -> ConfigurationError:
    """Print the user's own traceback of ``exc``; the one line that follows it."""
    click.echo(user_traceback(exc).rstrip("\n"), err=True)
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, SyntaxError):
        first = f"{exc.msg} ({Path(exc.filename or '?').name}, line {exc.lineno})"
    return ConfigurationError(
        f"importing {module_name!r} failed: {type(exc).__name__}" + (f": {first}" if first else "")
    )


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` with only the user's frames (chained exceptions too)."""
    shown = traceback.TracebackException.from_exception(exc)
    pending, seen = [shown], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list(
            [frame for frame in current.stack if _theirs(frame.filename)]
        )
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return "".join(shown.format())


def _theirs(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return False
    resolved = str(Path(filename).resolve())
    return not any(resolved == place or resolved.startswith(place + os.sep)
                   for place in _NOT_THEIRS)


def _shadow_hint(module_name: str, module: ModuleType) -> str:
    """When a file of that name in the current directory lost to another module."""
    local = Path.cwd() / (module_name.replace(".", os.sep) + ".py")
    origin = getattr(module, "__file__", None)
    if local.is_file() and (origin is None or Path(origin).resolve() != local.resolve()):
        return f"; ./{local.relative_to(Path.cwd())} is not what was imported: give its path"
    return ""
