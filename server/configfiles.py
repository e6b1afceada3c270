"""Reading the files settings point at: the TOML config file and the bearer-token file.

Each failure is a ConfigError naming the file and the fix, never a decoder's traceback.
"""

from __future__ import annotations

import errno
import os
import tomllib
from pathlib import Path

from gpubox.errors import ConfigError


def read_token_file(path: Path) -> str:
    """The first line of a token file, stripped; ConfigError if it is unreadable, not UTF-8 or empty."""
    try:
        first = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"token_file {path} is not UTF-8 text; put the token on its first line") from None
    except OSError as exc:
        raise ConfigError(
            f"token_file {path} cannot be read ({exc.strerror}); check it exists and its permissions"
        ) from None
    if first and first[0].strip():
        return check_token(first[0].strip(), f"the token in {path}")
    raise ConfigError(f"token_file {path} is empty; put the token on its first line")


def check_token(token: str, source: str) -> str:
    """`token` when every character is printable ASCII (a space inside is sent, as a passphrase's); ConfigError
    otherwise. HTTP headers are Latin-1 and clients (httpx) refuse non-ASCII ones, so such a token would start the
    server and let no client in. Tokens must not be echoed: the message names only the first bad character's place."""
    for i, ch in enumerate(token):
        if not " " <= ch <= "~":
            what = "a tab" if ch == "\t" else f"U+{ord(ch):04X}"
            raise ConfigError(
                f"{source} has a character a client cannot send in an Authorization header (position {i + 1}: "
                f"{what}); use printable ASCII, best the "
                "RFC 6750 token68 characters (letters, digits, - . _ ~ + / and trailing =), e.g. "
                "`head -c 32 /dev/urandom | base64`"
            )
    return token


def check_toml(path: Path) -> None:
    """ConfigError naming the file when it is missing, unreadable or not TOML (pydantic-settings would raise
    tomllib's own error, a traceback at the CLI)."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise ConfigError(f"config file {path} {what}; pass an existing TOML file to --config")
    try:
        tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text; save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML ({exc}); fix it") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror or exc}); check its permissions") from None


def writable_dir(d: Path, what: str, where: str) -> Path:
    """`d`, made if missing; ConfigError naming `what` and where to set it when this user cannot write there."""
    try:
        if d.exists() and not d.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "it is a file")
        d.mkdir(parents=True, exist_ok=True)
        usable = os.access(d, os.W_OK | os.X_OK)
        why = "is not writable by this user"
    except OSError as exc:
        usable, why = False, f"cannot be made ({exc.strerror or exc})"
    if not usable:
        raise ConfigError(f"{what} {d} {why}; pass {where} a directory this user can write")
    return d
