"""A folder's .gitignore as git reads it, through pathspec: a byte-order mark, a rule pathspec cannot compile and
rules that would make its matcher backtrack for minutes are dealt with here, not in the walk."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpubox.paths import read_inside

# `*a*a*...*b` backtracks in pathspec's regex about name-length ** stars (8 stars: minutes on a 120-character name)
MAX_IGNORE_STARS, MAX_IGNORE_LINE = 3, 256  # single `*`s (each `**` is one path wildcard); no real rule has more


def gitignore_spec(root: Path, rel_dir: str) -> object | None:
    # read without following links: a .gitignore symlinked to a file outside the roots is ignored, so its
    # content (and whether it exists) never shows through what gets excluded
    data = read_inside(root, f"{rel_dir}/.gitignore" if rel_dir else ".gitignore", limit=1_000_000)
    if data is None:
        return None
    import pathspec

    lines = [
        line
        for line in data.decode("utf-8-sig", errors="replace").splitlines()  # a BOM hid the first rule
        if len(line) <= MAX_IGNORE_LINE and line.replace("**", "").count("*") <= MAX_IGNORE_STARS
    ]
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, re.error):  # a rule pathspec refuses ('!', '[z-a]') failed the whole index; git skips it
        return pathspec.GitIgnoreSpec.from_lines([line for line in lines if _valid_rule(pathspec, line)])


def _valid_rule(pathspec: Any, line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except (ValueError, re.error):  # '[z-a]': a bad character range
        return False
    return True


def enclosing_specs(root: Path, roots: tuple[Path, ...]) -> list[tuple[Path, object]]:
    """The .gitignore rules of the folders above `root` up to the top of the git work tree it is in (a folder
    holding `.git`), top first: git applies them to a subfolder too, and indexing one showed files git ignores.
    None outside a work tree, or when its top lies outside the allowed `roots`."""
    above: list[Path] = []
    for folder in root.parents:
        if not any(folder.is_relative_to(r) for r in roots):  # nothing outside the allowed roots is read
            return []
        above.append(folder)
        if (folder / ".git").exists():
            found = [(d, gitignore_spec(d, "")) for d in reversed(above)]
            specs = [(d, s) for d, s in found if s is not None]
            # a folder git ignores was asked for by name (a checkout under an ignored folder): index all of it
            return [] if any(_ignores(specs, d) for d in [*reversed(above[:-1]), root]) else specs
    return []


def _ignores(specs: list[tuple[Path, object]], folder: Path) -> bool:
    return any(
        folder != base and folder.is_relative_to(base) and spec.match_file(folder.relative_to(base).as_posix() + "/")  # type: ignore[attr-defined]
        for base, spec in specs
    )
