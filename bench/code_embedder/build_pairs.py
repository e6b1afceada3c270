"""Build (description, code) training pairs for the code-tuned embedding adapter from public code that is NOT in
semble's benchmark: Python packages installed here (site-packages) and a few repositories in the benchmark's other
languages (brought by the tool library's `fetch`). A pair is a definition's doc comment (first sentence or two) and
the definition as gpubox's indexer shows it to the embedder (chunker.embedding_text), with the doc comment removed.

    .venv/bin/python bench/code_embedder/build_pairs.py --python torch,numpy,... --trees /tmp/corp --out pairs.jsonl
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import re
import sys
import textwrap
from pathlib import Path

from gpubox.tools.search.chunker import Chunk, chunk_text, embedding_text
from gpubox.tools.search.walker import WalkOptions, refine_language, walk

# semble's benchmark repositories (both halves and the excluded) and their Python packages: never trained on
BENCHMARK_PACKAGES = {
    "click",
    "fastapi",
    "flask",
    "requests",
    "httpx",
    "aiohttp",
    "starlette",
    "pydantic",
    "pydantic_core",
    "model2vec",
}
KINDS = {
    "function",
    "method",
    "class",
    "struct",
    "interface",
    "trait",
    "enum",
    "impl",
    "module",
    "type",
    "macro",
    "constructor",
    "protocol",
    "object",
    "record",
    "extension",
    "property",
}
_COMMENT = re.compile(r"^\s*(///?!?|/\*\*?!?|\*/|\*|#+|--+\s*\|?|\{-\|?|-\}|;;+)")
_TAGS = re.compile(r"</?[a-zA-Z][^>]*>|\{@\w+\s+([^}]*)\}|`")


def _clean(doc: str) -> str | None:
    """The first paragraph, cut to two sentences; None when too short or boilerplate."""
    para = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    para = _TAGS.sub(lambda m: m.group(1) or "", para)
    para = " ".join(para.split())
    if para.startswith(("@", ":", "TODO", "FIXME", "Copyright", "SPDX", "-*-", "noqa", "type:", "pylint")):
        return None
    sentences = re.split(r"(?<=[.!?])\s+", para)
    text = " ".join(sentences[:2])
    words = text.split()
    if len(words) < 4 or len(words) > 60 or not re.search(r"[a-zA-Z]{3}", text):
        return None
    return text


def _python_doc(c: Chunk) -> tuple[str, str] | None:
    """(docstring, chunk text without it) for a def/class chunk."""
    src = textwrap.dedent(c.text)
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return None
    doc = ast.get_docstring(node)
    first = node.body[0]
    if not doc or not isinstance(first, ast.Expr) or first.end_lineno is None:
        return None
    lines = c.text.splitlines()
    rest = lines[: first.lineno - 1] + lines[first.end_lineno :]
    if len(rest) - (first.lineno - 1) < 2:
        return None  # nothing but the docstring
    return doc, "\n".join(rest)


def _leading_doc(c: Chunk) -> tuple[str, str] | None:
    """(leading comment block, chunk text without it) for the brace languages, Ruby, Lua, Haskell, Elixir."""
    lines = c.text.splitlines()
    i = 0
    while (
        i < len(lines)
        and (not lines[i].strip() or _COMMENT.match(lines[i]))
        and not lines[i].lstrip().startswith(("#[", "#include", "#define", "#if"))
    ):
        i += 1
    if i == 0 or i >= len(lines) - 1:
        return None
    doc = "\n".join(_COMMENT.sub("", ln).strip() for ln in lines[:i])
    return doc, "\n".join(lines[i:])


def pairs_of_tree(root: Path, prefix: str, per_file: int) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for rel, lang in walk(root, WalkOptions(max_file_bytes=300_000)).files:
        if re.search(
            r"(^|/)(tests?|testing|spec|__tests__|benchmarks?|examples?|vendor|third_party)/|_test\.|test_", rel
        ):
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lang = refine_language(rel, lang, text)
        got = 0
        for c in chunk_text(text, lang):
            if got >= per_file or not c.symbol or c.kind not in KINDS:
                continue
            found = _python_doc(c) if lang == "python" else _leading_doc(c)
            if found is None:
                continue
            query = _clean(found[0])
            if query is None:
                continue
            stripped = Chunk(c.start_line, c.end_line, found[1], c.symbol, c.kind, c.parent, c.signature)
            out.append({"query": query, "code": embedding_text(rel, stripped), "lang": lang, "source": prefix})
            got += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="", help="comma-separated site-packages folders")
    ap.add_argument("--trees", type=Path, help="a folder of source trees (one per repository)")
    ap.add_argument("--per-source", type=int, default=1500)
    ap.add_argument("--per-file", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    sources = [(site / p, p) for p in args.python.split(",") if p and p not in BENCHMARK_PACKAGES]
    if args.trees:
        sources += [(d, d.name) for d in sorted(args.trees.iterdir()) if d.is_dir()]
    rng = random.Random(0)
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    for root, name in sources:
        got = pairs_of_tree(root, name, args.per_file)
        rng.shuffle(got)
        kept = 0
        for r in got:
            key = hashlib.sha1(r["query"].lower().encode()).hexdigest()
            if key in seen or kept >= args.per_source:
                continue
            seen.add(key)
            rows.append(r)
            kept += 1
        print(f"{name}: {len(got)} found, {kept} kept", flush=True)
    rng.shuffle(rows)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} pairs -> {args.out}")


if __name__ == "__main__":
    main()
