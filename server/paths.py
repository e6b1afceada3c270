"""Allowed-root checks: every path a tool reads must resolve inside one of the configured roots.

Two rules keep the checks honest:
- relative paths are taken against the one allowed root, never the server's working directory (which is
  wherever the MCP host happened to start us); with several roots they are ambiguous and refused;
- errors never say where a symlink points or whether something outside the roots exists, so the tools
  cannot be used to probe the rest of the file system.

Checking a path and opening it later is a race (the file can be swapped for a symlink in between), so
`open_inside` and `read_inside` re-check at open time: they walk the path from `/` one component at a time
with O_NOFOLLOW, so a symlink that appeared anywhere on the way fails the open, and they read regular files only.
`open_inside` raises for what the user named; `read_inside` is for files a tool found itself (a repository
walk) and returns None for anything it will not read, never saying where a link points.

`~` and `~/...` mean the server user's home; `~user` forms are refused rather than expanded (they would name
another account's home, or fail on an unknown user).

Libraries handed a folder (datasets.load_from_disk, transformers' from_pretrained) open the files in it by name
and follow symlinks, so `check_tree_inside` checks every entry of such a folder, not only the folder itself.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from gpubox.errors import InvalidInputError, NotFoundError, PathNotAllowedError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO must not block; it is refused as not regular after
_AT_OPEN_CHECK = bool(_NOFOLLOW and _DIRECTORY) and os.open in os.supports_dir_fd
NAME_MAX = 255  # bytes per file name on Linux, macOS and Windows file systems (ext4, APFS, NTFS)
PATH_MAX = 4096  # Linux's limit for a whole path
# A dataset or model folder has tens to a few thousand files; walking more would let a request stall the server
TREE_MAX_ENTRIES = 20_000
TREE_MAX_DEPTH = 16


def _outside(what: str, given: str, roots: Sequence[Path]) -> PathNotAllowedError:
    shown = ", ".join(str(r) for r in roots)
    return PathNotAllowedError(
        f"{what} {given} is outside the allowed roots ({shown}). "
        "Add its directory with --allowed-root / GPUBOX_ALLOWED_ROOTS, or pass a path inside them."
    )


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _check_lengths(given: str, what: str) -> None:
    """Refuse names the kernel would refuse with ENAMETOOLONG, with a message that says which part is too long."""
    if len(given.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise InvalidInputError(f"{what} is longer than {PATH_MAX} bytes; pass a shorter path inside the allowed roots")
    for part in Path(given).parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > NAME_MAX:
            raise InvalidInputError(
                f"{what} has a path component of {size} bytes ('{part[:24]}...'); file and folder names are at most "
                f"{NAME_MAX} bytes, so pass the real, shorter name of a file inside the allowed roots"
            )


def resolve_inside(path: str | Path, roots: Sequence[Path], *, what: str = "path", must_exist: bool = True) -> Path:
    """Resolve `path` (following symlinks, collapsing ..) and require it inside a root.

    A symlink that points outside is refused even when the link itself lies inside, because reading it
    would read outside. Raises InvalidInputError (NUL byte, a name too long, ambiguous relative path, a path the
    file system cannot read), PathNotAllowedError (outside every root; the message does not reveal what is
    there) or NotFoundError (inside, missing).
    """
    given = str(path)
    if "\x00" in given:
        raise InvalidInputError(f"{what} contains a NUL byte; pass a plain path inside the allowed roots")
    _check_lengths(given, what)
    if not roots:
        raise PathNotAllowedError("no allowed roots are configured; set GPUBOX_ALLOWED_ROOTS or --allowed-root")
    resolved_roots = [Path(r).resolve() for r in roots]
    raw = _expand_home(given, what)
    if not raw.is_absolute():
        if len(resolved_roots) != 1:
            shown = ", ".join(str(r) for r in resolved_roots)
            raise InvalidInputError(
                f"relative {what} '{given}' is ambiguous with several allowed roots ({shown}); pass an absolute path"
            )
        raw = resolved_roots[0] / raw
    try:
        resolved = raw.resolve()
    except (OSError, RuntimeError):  # a symlink loop, a name too long
        raise _outside(what, given, resolved_roots) from None
    if not _inside(resolved, resolved_roots):
        raise _outside(what, given, resolved_roots)
    if must_exist:
        _require_exists(resolved, what, given)
    return resolved


def _expand_home(given: str, what: str) -> Path:
    """`~` and `~/...` are the server user's home; `~user/...` is refused (not taken as a relative name either)."""
    if given != "~" and not given.startswith("~/"):
        if given.startswith("~"):
            raise InvalidInputError(
                f"{what} '{given}' names another user's home (~user); only ~ and ~/... are expanded, so pass an "
                "absolute path inside the allowed roots"
            )
        return Path(given)
    try:
        return Path(given).expanduser()
    except RuntimeError:  # no home directory for the server's user
        raise InvalidInputError(
            f"{what} '{given}': the server's user has no home directory; pass an absolute path"
        ) from None


def _require_exists(resolved: Path, what: str, given: str) -> None:
    # Path.exists() raises on errors other than "missing" (EACCES, ENAMETOOLONG from a long symlink target), which
    # the SDK would mask; the path is inside the roots by now, so saying what went wrong reveals nothing outside
    try:
        resolved.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise NotFoundError(f"{what} {given} does not exist inside the allowed roots") from None
    except OSError as exc:
        raise InvalidInputError(
            f"{what} {given} cannot be read ({os.strerror(exc.errno or 0)}); check its permissions or pass another path"
        ) from None


def open_inside(path: str | Path, roots: Sequence[Path], *, what: str = "file") -> BinaryIO:
    """Open a regular file inside the allowed roots for binary reading, checked again at open time.

    The caller closes the returned file (use it in a `with`). A path that was swapped for a symlink, or
    is not a regular file (directory, FIFO, device), is refused without saying what it turned into.
    """
    resolved = resolve_inside(path, roots, what=what)
    if not _AT_OPEN_CHECK:  # no O_NOFOLLOW / dir_fd (Windows): re-resolve and verify right before opening
        if not _still_inside(resolved, [Path(r).resolve() for r in roots]):
            raise _outside(what, str(path), roots)
        if not resolved.is_file():
            raise InvalidInputError(f"{what} {path} is not a regular file")
        return resolved.open("rb")
    if not resolved.parts[1:]:
        raise InvalidInputError(f"{what} {path} is not a regular file")
    try:
        fd = _open_nofollow(resolved.anchor, resolved.parts[1:])
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a component became a symlink after the check
            raise _outside(what, str(path), roots) from None
        if exc.errno == errno.ENOENT:
            raise NotFoundError(f"{what} {path} does not exist inside the allowed roots") from None
        raise NotFoundError(f"{what} {path} cannot be opened ({os.strerror(exc.errno or 0)})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidInputError(f"{what} {path} is not a regular file")
    os.set_blocking(fd, True)  # opened non-blocking only so that a FIFO could not hang the open
    return os.fdopen(fd, "rb")


def read_inside(root: Path, rel: str, limit: int | None = None) -> bytes | None:
    """The bytes of `root/rel` (at most `limit`), or None when a component is a symlink, `rel` climbs out
    (`..`, empty or `.` parts), the file is not a regular file, or it cannot be read.

    For files a tool found itself under a root it already resolved with resolve_inside (a repository walk):
    reading a file that became a symlink since is refused at open time, silently.
    """
    full = root / rel
    if not _AT_OPEN_CHECK:  # no O_NOFOLLOW / dir_fd (Windows): re-resolve and check right before reading
        try:
            if not _still_inside(full, [root]) or not full.is_file():
                return None
            with full.open("rb") as fh:
                return fh.read(limit) if limit is not None else fh.read()
        except OSError:
            return None
    absolute = root if root.is_absolute() else Path(os.path.abspath(root))
    names = [*absolute.parts[1:], *rel.split("/")]
    if any(n in ("", ".", "..") for n in names):
        return None
    try:
        fd = _open_nofollow(absolute.anchor, names)
    except OSError:
        return None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:  # checked on the descriptor: os.fdopen itself refuses a directory with an exception
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            return fh.read(limit) if limit is not None else fh.read()
        except OSError:
            return None


def _still_inside(path: Path, resolved_roots: Sequence[Path]) -> bool:
    """The check right before an open where O_NOFOLLOW/dir_fd are missing: not a link, and resolving inside."""
    try:
        return not path.is_symlink() and _inside(path.resolve(), resolved_roots)
    except (OSError, RuntimeError):
        return False


def _open_nofollow(anchor: str, names: Sequence[str]) -> int:
    """A descriptor for `anchor/names...`, opened one component at a time from the anchor without following a
    symlink anywhere (ELOOP/ENOTDIR when one is there). Opened non-blocking, so a FIFO does not hang the open;
    the caller checks the file type. Raises OSError."""
    fd = os.open(anchor or "/", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        for name in names[:-1]:
            nxt = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(names[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def check_tree_inside(folder: Path, roots: Sequence[Path], *, what: str = "folder") -> None:
    """Refuse a folder (already resolved inside the roots) that holds, at any depth, a symlink resolving outside
    them, or something that is neither a regular file nor a folder (a FIFO would hang the library reading it).

    Symlinks that stay inside are followed (each real folder once), since the library follows them too. The error
    names the entry by its place in the folder and never says where the link points. Reading by the library
    happens after this check: a file swapped for a link in between is not caught (the folder's owner can write
    there anyway; only open_inside closes that race, for the files gpubox reads itself).
    """
    resolved_roots = [Path(r).resolve() for r in roots]
    seen: set[Path] = set()
    pending: list[tuple[Path, int]] = [(folder, 0)]
    count = 0
    while pending:
        current, depth = pending.pop()
        real = current.resolve()
        if real in seen:
            continue
        seen.add(real)
        for entry in _entries(current, folder, what):
            count += 1
            if count > TREE_MAX_ENTRIES:
                raise InvalidInputError(
                    f"{what} {folder} holds more than {TREE_MAX_ENTRIES} files and folders; point at the folder "
                    "that holds just the dataset or model"
                )
            if _entry_is_dir(Path(entry.path), folder, what, resolved_roots):
                if depth + 1 > TREE_MAX_DEPTH:
                    raise InvalidInputError(f"{what} {folder} nests folders more than {TREE_MAX_DEPTH} deep")
                pending.append((Path(entry.path), depth + 1))


def _entries(current: Path, folder: Path, what: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(current) as it:
            return list(it)
    except OSError as exc:
        where = current.relative_to(folder) if current != folder else "."
        raise InvalidInputError(
            f"{what} {folder}: '{where}' cannot be listed ({os.strerror(exc.errno or 0)}); check its permissions"
        ) from None


def _entry_is_dir(path: Path, folder: Path, what: str, roots: Sequence[Path]) -> bool:
    """Check one entry; True when it is a folder to walk into."""
    rel = path.relative_to(folder)
    target: Path | None
    try:
        # strict: a link loop raises here on every Python (3.13's non-strict resolve returns the loop unresolved)
        target = path.resolve(strict=True) if path.is_symlink() else path
    except FileNotFoundError:  # a dangling link: judged by where it points
        target = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop or an unreadable link: treated like one that leaves
        target = None
    try:
        mode = os.stat(target).st_mode if target is not None and target.exists() else None
    except OSError:
        target, mode = None, None
    if target is None or not _inside(target, roots):
        shown = ", ".join(str(r) for r in roots)
        raise PathNotAllowedError(
            f"{what} {folder}: '{rel}' is a symlink that resolves outside the allowed roots ({shown}); nothing was "
            "read from it. Replace the link with the file itself, or move its target inside the roots"
        )
    if mode is None:  # a link to a missing file inside the roots: the library reports it as missing
        return False
    if stat.S_ISDIR(mode):
        return True
    if not stat.S_ISREG(mode):
        raise InvalidInputError(
            f"{what} {folder}: '{rel}' is not a regular file (a FIFO, socket or device); remove it from the folder"
        )
    return False
