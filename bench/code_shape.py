"""The shape of gpubox's product code (server, tools, resources, prompts) at a checkout, for before/after tables:
repeated code (the `duplicates` tool, when it is on PATH), the longest functions, the longest parameter lists
and the modules over 400 lines.

    .venv/bin/python bench/code_shape.py [--repo DIR] [--label TEXT]

`--repo` is a checkout (e.g. `git worktree add /tmp/old REV`); default: this one.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

PRODUCT = ("server", "tools", "resources", "prompts")


def functions(repo: Path) -> list[tuple[int, int, str]]:
    """(lines, parameters, 'path:name') for every function of the product code."""
    out = []
    for folder in PRODUCT:
        for path in sorted((repo / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    params = len(node.args.args) + len(node.args.kwonlyargs) + len(node.args.posonlyargs)
                    params -= int(bool(node.args.args) and node.args.args[0].arg in ("self", "cls"))
                    out.append((lines, params, f"{path.relative_to(repo)}:{node.name}"))
    return out


def long_modules(repo: Path) -> list[tuple[int, str]]:
    sizes = [(len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(repo)))
             for f in PRODUCT for p in (repo / f).rglob("*.py")]  # fmt: skip
    return sorted((s for s in sizes if s[0] > 400), reverse=True)


def duplicate_pairs(repo: Path) -> str:
    """The `duplicates` tool's count line over a copy holding only the product folders."""
    tool = shutil.which("duplicates")
    if tool is None:
        return "not measured (the duplicates tool is not on PATH)"
    with tempfile.TemporaryDirectory() as tmp:
        for folder in PRODUCT:
            shutil.copytree(repo / folder, Path(tmp) / folder, ignore=shutil.ignore_patterns("__pycache__"))
        first = subprocess.run([tool, "--repo", tmp, "--most", "1"], capture_output=True, text=True).stdout
    m = re.match(r"(\d+) pairs of places \((\d+) files read\)", first)
    return f"{m.group(1)} pairs in {m.group(2)} files" if m else first.splitlines()[0]


def report(repo: Path, label: str) -> str:
    fns = functions(repo)
    rows = [f"## {label}", "", f"- repeated code (pairs of 6+ alike lines): {duplicate_pairs(repo)}"]
    rows.append(f"- functions: {len(fns)}; over 60 lines: {sum(1 for f in fns if f[0] > 60)}")
    rows += ["", "| longest functions | lines |", "|---|---|"]
    rows += [f"| `{name}` | {n} |" for n, _, name in sorted(fns, reverse=True)[:8]]
    rows += ["", "| longest parameter lists | parameters |", "|---|---|"]
    rows += [f"| `{name}` | {p} |" for _, p, name in sorted(fns, key=lambda f: -f[1])[:6]]
    rows += ["", "| modules over 400 lines | lines |", "|---|---|"]
    rows += [f"| `{name}` | {n} |" for n, name in long_modules(repo)] or ["| (none) | |"]
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--label", default="this checkout")
    args = ap.parse_args()
    print(report(args.repo, args.label))


if __name__ == "__main__":
    main()
