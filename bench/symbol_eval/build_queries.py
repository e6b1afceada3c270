"""Symbol-lookup queries for code outside semble's benchmark, with universal-ctags as the ground truth.

    .venv/bin/python bench/symbol_eval/build_queries.py [--corpora /tmp/cppcorp]

semble's symbol queries are a bare name ("JsonParser", "basic_json") whose target is the file that defines it.
gpubox's C++ symbol figures trail semble's on its report half (bench/results/search_semble_report.md), and the tune
half holds one header-only C++ repository, so there was nothing to tune C++ name lookup on. This builds such
queries from repositories semble does not use (sources.json pins them, with the ctags languages of each), with a
definition finder gpubox does not contain: universal-ctags (`apt-get install universal-ctags`; it tags classes,
structs, enums, interfaces, types and function definitions, not C++ forward declarations or prototypes). A name
qualifies when ctags finds exactly one definition of it of that group (type or function) in the repository, at top,
namespace, package or module scope, outside tests, examples, benchmarks and bundled third-party code. Up to
QUERIES_PER_REPO names per repository, two thirds types and one third functions, drawn with a fixed seed, are
written to annotations/<repo>.json in semble's annotation format (query, relevant, category "symbol").
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUERIES_PER_REPO = 24
SKIP = re.compile(
    r"(?:^|/)(?i:tests?|testing|examples?|benchmarks?|bench|third_party|third-party|bundled|fuzzing|docs?|tools)/"
    r"|(?:^|/)\w*(?:Tests?|_tests?)\w*/|Tests?\.\w+$|_(?:unit)?test\.\w+$|_spec\.\w+$|_bench(?:mark)?\.cc$"
    r"|(?:^|/)test_[^/]*$"
)
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{3,}")  # an identifier (ctags' Lua `M.before_each`, `t[5]` are not)
# ctags' long kind names, over its parsers: which are types, which functions (anything else is not asked for)
TYPE_KINDS = {
    "class",
    "struct",
    "enum",
    "interface",
    "trait",
    "type",
    "typedef",
    "record",
    "object",
    "data",
    "newtype",
    "module",
    "protocol",
    "union",
}
FUNCTION_KINDS = {"function", "func", "method", "singletonMethod", "macro"}
OUTER_SCOPES = (None, "namespace", "package", "module")
C_FAMILY = ["--langmap=C++:+.h", "--kinds-C++=csfg", "--kinds-C=sfg"]  # a .h read as C++; no prototypes


# languages ctags 5.9 cannot read: top-level definitions by a regular expression per language (column 0 only, so
# members and nested types are left out), tagged as ctags would tag them
REGEX_DEFS: dict[str, tuple[str, re.Pattern[str]]] = {
    "Swift": (
        ".swift",
        re.compile(
            r"^(?:(?:public|open|internal|final|@\w+)\s+)*(?P<kind>class|struct|enum|protocol|actor|func)\s+(?P<name>\w+)",
            re.M,
        ),
    ),
    "Scala": (
        ".scala",
        re.compile(
            r"^(?:(?:final|sealed|abstract|case|private|implicit)\s+)*(?P<kind>class|trait|object|enum|def)\s+(?P<name>\w+)",
            re.M,
        ),
    ),
    "Zig": (
        ".zig",
        re.compile(
            r"^(?:pub\s+)?(?:const\s+(?P<name>\w+)\s*=\s*(?:packed\s+|extern\s+)?(?P<kind>struct|enum|union)\b"
            r"|(?:inline\s+)?(?P<fkind>fn)\s+(?P<fname>\w+))",
            re.M,
        ),
    ),
}
_REGEX_KIND = {
    "func": "function",
    "def": "function",
    "fn": "function",
    "protocol": "interface",
    "actor": "class",
    "object": "object",
    "union": "union",
}


def regex_definitions(root: Path, language: str) -> list[dict[str, object]]:
    suffix, pattern = REGEX_DEFS[language]
    out: list[dict[str, object]] = []
    for f in sorted(root.rglob(f"*{suffix}")):
        for m in pattern.finditer(f.read_text(errors="replace")):
            name, kind = m.group("name") or m.group("fname"), m.group("kind") or m.group("fkind")
            out.append({"name": name, "path": str(f.relative_to(root)), "kind": _REGEX_KIND.get(kind, kind)})
    return out


def definitions(root: Path, languages: str) -> list[dict[str, object]]:
    if languages in REGEX_DEFS:
        return regex_definitions(root, languages)
    extra = C_FAMILY if "C" in languages.split(",") or "C++" in languages.split(",") else []
    out = subprocess.run(
        ["ctags", "-R", f"--languages={languages}", *extra, "--fields=+neK", "--output-format=json", "-f", "-", "."],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tags = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [t for t in tags if t.get("kind") in TYPE_KINDS | FUNCTION_KINDS]


def queries(root: Path, seed: str, languages: str = "C,C++") -> list[dict[str, object]]:
    tags = definitions(root, languages)
    where: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for t in tags:
        group = "type" if t["kind"] in TYPE_KINDS else "function"
        where[(group, str(t["name"]))].add(str(t["path"]).removeprefix("./"))
    picked: dict[str, list[tuple[str, str]]] = {"type": [], "function": []}
    for t in tags:
        group = "type" if t["kind"] in TYPE_KINDS else "function"
        name, path = str(t["name"]), str(t["path"]).removeprefix("./")
        if t.get("scopeKind") not in OUTER_SCOPES or not NAME.fullmatch(name) or name == "main":
            continue
        if "__anon" in str(t.get("scope", "")) or SKIP.search(path) or len(where[(group, name)]) != 1:
            continue
        if (name, path) not in picked[group]:
            picked[group].append((name, path))
    rng = random.Random(f"gpubox-symbol-eval-v1/{seed}")
    n_types = min(len(picked["type"]), QUERIES_PER_REPO * 2 // 3)
    chosen = rng.sample(sorted(picked["type"]), n_types)
    chosen += rng.sample(sorted(picked["function"]), min(len(picked["function"]), QUERIES_PER_REPO - n_types))
    return [{"query": n, "relevant": [p], "secondary": [], "category": "symbol"} for n, p in chosen]


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def shared_queries(root: Path, seed: str, languages: str = "C,C++") -> list[dict[str, object]]:
    """Names that several places define (a type and its constructors, a nested class or method of the same name
    elsewhere, a re-declaration): the one type definition in the file named after the name is the target.

    The label is the naming convention (`JsonParser` -> JsonParser.java, `StrCat` -> str_cat.h), not a judgement;
    a name qualifies when ctags finds it defined in two or more files, any scope, and exactly one file whose stem
    is the name (case, `_` and `-` ignored) holds a type definition of it, outside tests and examples."""
    tags = definitions(root, languages)
    files: dict[str, set[str]] = collections.defaultdict(set)
    named: dict[str, set[str]] = collections.defaultdict(set)
    for t in tags:
        name, path = str(t["name"]), str(t["path"]).removeprefix("./")
        if not NAME.fullmatch(name) or "__anon" in str(t.get("scope", "")):
            continue
        files[name].add(path)
        if t["kind"] in TYPE_KINDS and not SKIP.search(path) and _norm(Path(path).stem) == _norm(name):
            named[name].add(path)
    picked = sorted((n, next(iter(ps))) for n, ps in named.items() if len(ps) == 1 and len(files[n]) >= 2)
    rng = random.Random(f"gpubox-symbol-eval-shared-v1/{seed}")
    chosen = rng.sample(picked, min(len(picked), QUERIES_PER_REPO))
    return [{"query": n, "relevant": [p], "secondary": [], "category": "symbol"} for n, p in chosen]


WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def prominent_queries(root: Path, seed: str, languages: str = "C,C++") -> list[dict[str, object]]:
    """The repository's most used types: semble's annotators asked for central API names (`ObjectMapper`, `Router`,
    `HandlerStack`), which many files mention, and which functions, constructors or methods may share.

    A name qualifies when ctags finds exactly one type definition of it, outside tests and examples (functions of
    the same name allowed); the QUERIES_PER_REPO / 2 named as a word in the most of the repository's tagged source
    files are asked (ties by name; `seed` unused: nothing is drawn), each labelled by the file that defines it."""
    del seed
    tags = definitions(root, languages)
    types: dict[str, set[str]] = collections.defaultdict(set)
    for t in tags:
        name, path = str(t["name"]), str(t["path"]).removeprefix("./")
        if t["kind"] in TYPE_KINDS and NAME.fullmatch(name) and "__anon" not in str(t.get("scope", "")):
            types[name].add(path)
    sources = sorted({str(t["path"]).removeprefix("./") for t in tags})
    wanted = {n for n, ps in types.items() if len(ps) == 1 and not SKIP.search(next(iter(ps)))}
    mentions: collections.Counter[str] = collections.Counter()
    for path in sources:
        mentions.update(wanted & set(WORD.findall((root / path).read_text(errors="replace"))))
    top = sorted(wanted, key=lambda n: (-mentions[n], n))[: QUERIES_PER_REPO // 2]
    return [{"query": n, "relevant": [next(iter(types[n]))], "secondary": [], "category": "symbol"} for n in top]


SETS = {
    "once": ("annotations", queries),
    "shared": ("annotations_shared", shared_queries),
    "prominent": ("annotations_prominent", prominent_queries),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", type=Path, default=Path("/tmp/cppcorp"))
    ap.add_argument(
        "--set",
        choices=sorted(SETS),
        default="once",
        help="once: names defined once; shared: several; prominent: the most used types",
    )
    args = ap.parse_args()
    sources = json.loads((HERE / "sources.json").read_text())
    folder, build = SETS[args.set]
    (HERE / folder).mkdir(exist_ok=True)
    for repo in sources["repos"]:
        items = build(args.corpora / repo["name"], repo["name"], repo.get("languages", "C,C++"))
        (HERE / folder / f"{repo['name']}.json").write_text(json.dumps(items, indent=1) + "\n")
        print(f"{repo['name']}: {len(items)} queries")


if __name__ == "__main__":
    main()
