"""What root may trust when the server runs as another user.

Under root the server runs as an unprivileged user (``nobody`` by default) that owns
the data directory. Anything in that directory may have been put there by that user,
and any superuser of the server can act as it (``COPY ... TO PROGRAM``): a symbolic
link to ``/etc/shadow``, a hard link to a file of root's, a FIFO. So root touches that
directory only through a :class:`ServerDirectory`:

- the directory is opened once per operation and its owner checked; names are opened
  relative to its descriptor with ``O_NOFOLLOW``, so a link is never followed;
- a file is written by creating a new one (``O_CREAT | O_EXCL``), giving it to the
  server's user by descriptor (``fchown``, ``fchmod``) and renaming it over the old
  name: the rename replaces whatever the name was (a link, a file) and follows nothing;
- a file is read only when it is a regular file of the directory's owner, at most a
  bounded size, and opening it never blocks (``O_NONBLOCK``: a FIFO is refused).

Root's own directories (the home, the server directory and the binaries' cache) are
used by path, so :func:`others_can_change` makes sure no other user can change them:
every component belongs to root and no other user may write it, except a sticky
directory such as ``/tmp`` above the last component (there, others cannot rename or
remove root's entries).

Without root the server runs as the caller, who owns everything involved: the same
code runs and its checks pass trivially.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import grp
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from ..errors import EmbeddedServerError

READ_LIMIT = 1 << 20  # the most read from one file: pid files and log tails are small


def user_name(uid: int) -> str:
    """``nobody (uid 65534)``, or ``uid 1234`` for a uid without a name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def others_can_change(path: Path) -> str | None:
    """Why a user other than root could change what ``path`` names, or None when none
    can. Both the path as given and its resolved form are checked, component by
    component; components that do not exist yet count as root's (the launcher creates
    them), so check again after creating them."""
    path = Path(os.path.abspath(path))
    for candidate in dict.fromkeys([path, Path(os.path.realpath(path))]):
        for component in [*reversed(candidate.parents), candidate]:
            try:
                st = os.lstat(component)
            except FileNotFoundError:
                break
            if st.st_uid != 0:
                return f"{component} belongs to {user_name(st.st_uid)}"
            if stat.S_ISLNK(st.st_mode):
                continue  # root's link, in a directory only root can change
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o002:
                writer = "every user"
            elif mode & 0o020 and st.st_gid != 0:
                writer = f"the group {_group_name(st.st_gid)}"
            else:
                continue
            if mode & stat.S_ISVTX and component != candidate:
                continue  # sticky: others may add entries, not touch root's
            return f"{component} is writable by {writer} (mode {mode:04o})"
    return None


@dataclasses.dataclass(frozen=True)
class ServerDirectory:
    """A directory owned by the server's user (``uid``, ``gid``), touched only through
    descriptors (see the module docstring). The caller (root, or the server's user
    itself) may read it when it owns it too, for example a data directory it made."""

    path: Path
    uid: int
    gid: int

    @classmethod
    def create(cls, path: Path, uid: int, gid: int) -> ServerDirectory:
        """Make ``path`` (mode 0700, in a directory only the caller can change) and give
        it to the server's user."""
        os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if os.geteuid() != uid:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        return cls(path, uid, gid)

    @contextlib.contextmanager
    def _opened(self, *, writing: bool) -> Iterator[tuple[int, int]]:
        """The directory's descriptor and owner. Raises FileNotFoundError when it is
        missing, EmbeddedServerError when it cannot be opened or its owner may not be
        trusted for this use."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise EmbeddedServerError(
                f"cannot open {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            owner = os.fstat(fd).st_uid
            if owner != self.uid and (writing or owner != os.geteuid()):
                raise EmbeddedServerError(
                    f"{self.path} belongs to {user_name(owner)}, not to the server's user "
                    f"{user_name(self.uid)}"
                )
            yield fd, owner
        finally:
            os.close(fd)

    def _open_file(self, directory: int, owner: int, name: str) -> int | None:
        """``name`` opened for reading, when it is a regular file of ``owner``; None when
        there is no such name."""
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=directory,
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: the BSDs' O_NOFOLLOW
                raise self._refused(name, "it is a symbolic link") from None
            raise self._refused(name, exc.strerror or str(exc)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
            os.close(fd)
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else (
                f"it belongs to {user_name(st.st_uid)}, not to the directory's owner")
            raise self._refused(name, what)
        return fd

    def _refused(self, name: str, why: str) -> EmbeddedServerError:
        return EmbeddedServerError(f"refusing to read {self.path / name}: {why}")

    def read(self, name: str, *, offset: int = 0, limit: int = READ_LIMIT) -> str | None:
        """The text of ``name`` from byte ``offset`` on (at most ``limit`` bytes,
        undecodable bytes replaced), or None when the directory or the file is missing."""
        try:
            with self._opened(writing=False) as (directory, owner):
                fd = self._open_file(directory, owner, name)
                if fd is None:
                    return None
                with os.fdopen(fd, "rb") as f:
                    f.seek(offset)
                    return f.read(limit).decode(errors="replace")
        except FileNotFoundError:
            return None

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes, 0 when it is missing."""
        try:
            with self._opened(writing=False) as (directory, owner):
                fd = self._open_file(directory, owner, name)
                if fd is None:
                    return 0
                try:
                    return os.fstat(fd).st_size
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return 0

    def write(self, name: str, text: str, mode: int = 0o600) -> None:
        """Replace ``name`` with a new file of the server's user holding ``text``."""
        try:
            with self._opened(writing=True) as (directory, _):
                temporary = f".{name}.{secrets.token_hex(6)}"
                fd = os.open(
                    temporary,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode,
                    dir_fd=directory,
                )
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as f:
                        if os.geteuid() != self.uid:
                            os.fchown(f.fileno(), self.uid, self.gid)
                        os.fchmod(f.fileno(), mode)
                        f.write(text)
                    os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temporary, dir_fd=directory)
                    raise
        except OSError as exc:
            raise EmbeddedServerError(
                f"cannot write {self.path / name}: {exc.strerror or exc}"
            ) from None

    def remove(self, name: str) -> None:
        """Remove the name ``name`` (a file, a link or a socket; never what a link names)."""
        try:
            with self._opened(writing=False) as (directory, _):
                os.unlink(name, dir_fd=directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise EmbeddedServerError(
                f"cannot remove {self.path / name}: {exc.strerror or exc}"
            ) from None

    def names(self) -> list[str]:
        """The names in the directory (none when it is missing)."""
        try:
            with self._opened(writing=False) as (directory, _):
                return os.listdir(directory)
        except FileNotFoundError:
            return []
