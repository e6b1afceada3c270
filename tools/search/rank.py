"""The ranking stage of hybrid search: weighted fusion of the legs (by what the query looks like, query_kind.py),
then rules over the fused candidates (definitions over mentions, file names that match the query,
test/vendored/example paths down, files with several hits up, overlapping hits removed).

The rules follow semble's ranking stage (MinishLab, MIT, https://github.com/MinishLab/semble: symbol-query
detection, definition boosts, file-stem matches, path penalties); every constant below was tuned on the dev split
of bench/search_eval and each rule's effect is measured there (bench/results/search_ranking_ablation.md).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace

from gpubox.tools.search.exports import assigns, reexports
from gpubox.tools.search.paths import path_penalty, under
from gpubox.tools.search.query_kind import QueryProfile
from gpubox.tools.search.store import CAMEL, ChunkRow, last_part

DEFINITION_KINDS = frozenset(
    {"function", "method", "class", "type", "struct", "enum", "trait", "interface", "impl", "macro", "module"}
)
TYPE_KINDS = frozenset({"class", "type", "struct", "enum", "trait", "interface"})
CALLABLE_KINDS = frozenset({"function", "method"})
PROSE_LANGUAGES = frozenset({"markdown", "rst", "text", "yaml", "json", "toml", "html", "css"})
# query words that ask for documentation or configuration rather than code
PROSE_WORDS = frozenset({"doc", "docs", "documentation", "documented", "readme", "guide", "tutorial", "changelog"}) | {
    "manual", "config", "configuration", "yaml", "json", "toml", "markdown",
}  # fmt: skip


@dataclass(frozen=True)
class RankConfig:
    """Weights of the fusion and of each rule; `replace(DEFAULT, rule=0)` switches a rule off (the ablation)."""

    # the legs' top few ranks matter most: k=10 on bench/search_eval's dev split (+0.07 recall@5 over the customary
    # 60); on semble's tune half k=15-20 would add ~0.001-0.008 NDCG@10 but cost the labelled set recall@5
    rrf_k: int = 10
    # leg weights per query kind: a named identifier is found by its definition and by BM25; a description by
    # both BM25 and the embedding
    weights: dict[str, dict[str, float]] = field(
        default_factory=lambda: {
            "symbol": {"symbol": 2.0, "phrase": 2.0, "lexical": 1.0, "vector": 0.5},
            "mixed": {"symbol": 1.5, "phrase": 2.0, "lexical": 1.0, "vector": 0.8, "compound": 1.0},
            "nl": {"symbol": 0.0, "phrase": 2.0, "lexical": 1.0, "vector": 1.3, "compound": 1.0},
        }
    )
    definition: float = 1.0  # + this x top score when the chunk defines a named identifier
    compound: float = 0.0  # + this x top score when the chunk defines a name adjacent query words spell together
    # x the definition boost for C++'s out-of-line `MemTable::MemTable(...)`: at 0.5, with the .cc file's other
    # members around it (file coherence), it outranked the class in the header (bench/symbol_eval's shared-name set:
    # 0.980 -> 0.990 NDCG@10 at 0.25 or 0; semble's tune half unchanged)
    constructor: float = 0.25
    # + this x top score on a chunk that re-exports the name a symbol query asks for, when no candidate defines it
    # (exports.reexports: axum's `pub use axum_core::extract::FromRequest`)
    reexport: float = 1.0
    # x the definition boost of a function or method when a symbol query's name also names a type among the
    # candidates (rapidjson's `Double`: class Double, and a `Double(double)` handler method in every writer);
    # bench/symbol_eval once/shared/dressed 0.991/0.998/0.995 -> 0.993/1.000/0.998 at 0.25, semble tune half
    # unchanged; 1 = off
    type_first: float = 0.25
    # x the definition boost when the identifier sits in a sentence ('how extractors implement FromRequest'): such
    # questions often want the module around the name, not its definition, and the symbol leg still ranks the
    # definition (semble tune half +0.006 NDCG@10 at 0; the labelled dev split unchanged)
    definition_in_sentence: float = 0.0
    # + this x top score x share of a definition's name parts that the query names: off, since on the dev split it
    # cost natural-language queries 0.09-0.14 recall@5 (English words hit too many helper names); kept to measure
    name_match: float = 0.0
    stem: float = 0.5  # + this x top score x share of query words found in the file name / folder
    named_file: float = 0.5  # symbol queries: + this x top score in a file named after the identifier (Request.swift)
    coherence: float = 0.6  # + this x top score x file's share of candidate score, on the file's best chunk
    mention: float = 0.8  # x for chunks that define nothing (module code, windows) when definitions compete
    path_penalty: float = 0.3  # x for tests, vendored, generated and example code
    # x for an API's older copy (paths.superseded_dirs) unless the query names its folder: pydantic's v1/ and
    # deprecated/ copies outranked the current modules (semble tune half +0.002 NDCG@10 at 0.3-0.5)
    superseded: float = 0.5
    dedupe: bool = True  # drop a hit whose lines overlap a better hit in the same file
    # x this per chunk a file already has above it (semble's file-saturation decay): one file's ten chunks do not
    # fill the page (semble tune half: +0.018 NDCG@10); 1 = off
    saturation: float = 0.5
    # chunks per file before the decay starts: 2, as bench/search_eval's labelled set asks for one definition in a
    # file whose best chunk is often a neighbour (after 1: semble tune +0.008 NDCG@10, labelled dev recall@5 -0.15)
    saturation_after: int = 2
    # x this for documentation and config files (markdown, yaml, json, ...) unless the query asks for docs: a code
    # question wants code first (cobra's "man pages and markdown" docs outranked doc/man_docs.go); 1 = off
    prose: float = 0.3


DEFAULT = RankConfig()


@dataclass
class Scored:
    id: int
    score: float
    sources: list[str]


def fuse(lists: dict[str, list[tuple[int, float]]], profile: QueryProfile, cfg: RankConfig = DEFAULT) -> list[Scored]:
    """Weighted reciprocal-rank fusion (Cormack et al., SIGIR 2009) with weights chosen by the query's kind."""
    weights = cfg.weights[profile.kind]
    fused: dict[int, Scored] = {}
    for source, items in lists.items():
        w = weights.get(source, 1.0)
        if w <= 0:
            continue
        for rank, (i, _) in enumerate(items):
            s = fused.setdefault(i, Scored(i, 0.0, []))
            s.score += w / (cfg.rrf_k + rank + 1)
            s.sources.append(source)
    return sorted(fused.values(), key=lambda s: -s.score)


def _parts(name: str) -> list[str]:
    return [p.lower() for piece in re.split(r"[^A-Za-z0-9]+", name) for p in CAMEL.findall(piece) if len(p) > 1]


def _covers(word: str, part: str) -> bool:
    """'mappings' covers 'mapping', 'merge' covers 'merges': a shared prefix of 4+ letters counts as the same word."""
    if word == part:
        return True
    n = min(len(word), len(part))
    return n >= 4 and word[:n] == part[:n] and abs(len(word) - len(part)) <= 3


_DEF_KEYWORDS = r"(?:def|class|fn|func|function|struct|enum|trait|type|interface|impl|macro_rules!|const|let|var)"


def defines(row: ChunkRow, identifiers: tuple[str, ...]) -> bool:
    """The chunk is the named symbol's definition, or a small container whose text defines it (`fn next_token`
    inside a whole `impl Tokenizer` chunk, `func (c *Command) Find` in a Go file window)."""
    return definition_strength(row, identifiers) > 0


def definition_strength(row: ChunkRow, identifiers: tuple[str, ...], constructor: float = 0.5) -> float:
    """1 for the named symbol's definition; less for a weaker one: a name that matches only in another case when the
    query wrote capitals (`Timeout` asks for the class, not the `timeout` method), an impl/extension block (Swift's
    `extension Request` in many files, the type itself in one) and a C++ out-of-line constructor (`constructor`).
    0 when the chunk defines none."""
    if row.kind not in DEFINITION_KINDS and row.kind not in ("window", "module"):
        return 0.0
    sym = row.symbol or ""
    sym_last = last_part(sym)  # Ecto.Query, Foo::Bar: the name is the last part
    best = 0.0
    for ident in identifiers:
        last = last_part(ident)
        if sym and (sym.lower() == ident.lower() or sym_last.lower() == last.lower()):
            exact = sym == ident or sym_last == last or last.islower()
            best = max(best, constructor if _constructor(row, last) else 0.5 if not exact else 1.0)
            continue
        pattern = rf"\b{_DEF_KEYWORDS}\s+(?:\([^)]*\)\s*)?{re.escape(last)}\b|\b{re.escape(last)}\s*[:=]\s*function\b"
        if len(last) > 2 and re.search(pattern, row.text):
            best = max(best, 1.0)
    return best * (0.5 if row.kind == "impl" else 1.0)


def _constructor(row: ChunkRow, name: str) -> bool:
    """C++'s out-of-line `MemTable::MemTable(...)` (or `Foo<T>::Foo`): a member of the class the name asks for, found
    in the .cc file while the class itself is in the header (ctags-labelled C++ names: bench/symbol_eval)."""
    return (
        row.kind == "method"
        and re.search(rf"\b{re.escape(name)}\s*(?:<[^(){{}};]*>)?\s*::\s*{re.escape(name)}\s*\(", row.text) is not None
    )


def named_file(path: str, identifiers: tuple[str, ...]) -> bool:
    """The file is named after an identifier the query names (Request.swift, changeset.ex for `Changeset`)."""
    stem = path.replace("\\", "/").rsplit("/", 1)[-1].split(".")[0].lower().lstrip("_")
    return any(last_part(i).lower() == stem for i in identifiers)


def name_share(symbol: str, words: tuple[str, ...]) -> float:
    """Share of a definition's name parts (parse_config -> parse, config) that the query mentions."""
    parts = _parts(symbol)
    if len(parts) < 2 or not words:
        return 0.0
    return sum(1 for p in parts if any(_covers(w, p) for w in words)) / len(parts)


@functools.lru_cache(maxsize=16384)
def _file_parts(folder: str, stem: str) -> frozenset[str]:
    """Name parts of a file and its folder; cached because a query meets ~100 candidates from a handful of files
    (splitting them anew cost ~0.1 ms a candidate, most of the ranking stage)."""
    return frozenset(_parts(stem)) | frozenset(_parts(folder))


def stem_share(path: str, words: tuple[str, ...]) -> float:
    """Share of the query's words that name the file or its folder (md_docs.go for 'markdown docs')."""
    if not words:
        return 0.0
    folders = path.replace("\\", "/").split("/")
    return _stem_share(folders[-2] if len(folders) > 1 else "", folders[-1].split(".")[0], words)


@functools.lru_cache(maxsize=16384)
def _stem_share(folder: str, stem: str, words: tuple[str, ...]) -> float:
    parts = _file_parts(folder, stem)
    if not parts:
        return 0.0
    return sum(1 for w in words if w in parts or any(_covers(w, p) for p in parts)) / len(words)


def rerank(
    fused: list[Scored],
    rows: dict[int, ChunkRow],
    profile: QueryProfile,
    cfg: RankConfig = DEFAULT,
    superseded: frozenset[str] = frozenset(),
) -> list[Scored]:
    """Apply the ranking rules to fused candidates whose rows are known; returns them best first. `superseded`: the
    index's folders of older API copies (paths.superseded_dirs)."""
    cands = [s for s in fused if s.id in rows]
    if not cands:
        return []
    top = max(s.score for s in cands)
    out = [Scored(s.id, s.score, list(s.sources)) for s in cands]
    any_def = any(rows[s.id].kind in DEFINITION_KINDS for s in out)
    asks_prose = cfg.prose == 1.0 or any(w in PROSE_WORDS for w in profile.words)
    stems: dict[str, float] = {}  # per file, not per chunk: ~100 candidates share a handful of paths
    idents = profile.identifiers
    strengths = {s.id: definition_strength(rows[s.id], idents, cfg.constructor) if idents else 0.0 for s in out}
    defined = any(strengths.values())
    typed = cfg.type_first < 1.0 and profile.kind == "symbol" and _names_a_type(out, rows, idents)
    for s in out:
        r = rows[s.id]
        bonus = 0.0
        strength = strengths[s.id] * (cfg.type_first if typed and r.kind in CALLABLE_KINDS else 1.0)
        if strength and cfg.definition:
            bonus += cfg.definition * top * strength * (cfg.definition_in_sentence if profile.kind == "mixed" else 1.0)
        elif cfg.compound and r.symbol and r.symbol.lower() in profile.compounds:
            bonus += cfg.compound * top
        elif cfg.name_match and profile.kind != "symbol" and r.symbol and r.kind in DEFINITION_KINDS:
            share = name_share(r.symbol, profile.words)
            bonus += cfg.name_match * top * share if share >= 0.5 else 0.0
        if cfg.stem and profile.kind != "symbol":
            if r.path not in stems:
                stems[r.path] = stem_share(r.path, profile.words)
            bonus += cfg.stem * top * stems[r.path]
        elif cfg.named_file and profile.identifiers and named_file(r.path, profile.identifiers):
            bonus += cfg.named_file * top
        s.score += bonus
        if any_def and r.kind not in DEFINITION_KINDS:
            s.score *= cfg.mention
        if path_penalty(r.path):
            s.score *= cfg.path_penalty
        if cfg.superseded < 1.0 and superseded and _older_copy(r.path, superseded, profile):
            s.score *= cfg.superseded
        if r.language in PROSE_LANGUAGES and not asks_prose:
            s.score *= cfg.prose
    if cfg.reexport and profile.kind == "symbol" and not defined:
        _reexport_bonus(out, rows, profile.identifiers, cfg.reexport * top)
    if cfg.coherence:
        per_file: dict[str, float] = {}
        best: dict[str, Scored] = {}
        for s in out:
            p = rows[s.id].path
            per_file[p] = per_file.get(p, 0.0) + s.score
            if p not in best or s.score > best[p].score:
                best[p] = s
        most = max(per_file.values())
        for p, s in best.items():
            s.score += cfg.coherence * top * per_file[p] / most
    out.sort(key=lambda s: -s.score)
    if cfg.dedupe:
        out = dedupe(out, rows)
    if cfg.saturation < 1.0:
        out = saturate(out, rows, cfg.saturation, cfg.saturation_after)
    return out


def _names_a_type(out: list[Scored], rows: dict[int, ChunkRow], identifiers: tuple[str, ...]) -> bool:
    """A candidate is a type named exactly as the query writes the name: its own name, in the query's case (a class
    that merely holds a `def parse_args`, or `class Config` for the query `config`, names no type of that name)."""
    names = {last_part(i) for i in identifiers}
    return any(rows[s.id].kind in TYPE_KINDS and last_part(rows[s.id].symbol or "") in names for s in out)


def _reexport_bonus(out: list[Scored], rows: dict[int, ChunkRow], identifiers: tuple[str, ...], bonus: float) -> None:
    """A name nothing among the candidates defines (exports.reexports): the chunks that re-export it get `bonus`,
    unless some candidate binds it after all (a constant, `export const X = ...`)."""
    if any(assigns(rows[s.id], identifiers) for s in out):
        return
    for s in out:
        if reexports(rows[s.id], identifiers):
            s.score += bonus


def _older_copy(path: str, superseded: frozenset[str], profile: QueryProfile) -> bool:
    folder = under(path, superseded)
    return folder is not None and folder.rstrip("/").rsplit("/", 1)[-1] not in profile.words  # 'pydantic v1 ...'


def saturate(ranked: list[Scored], rows: dict[int, ChunkRow], decay: float, after: int = 1) -> list[Scored]:
    """Each hit's score x `decay` per better hit from the same file, not counting the first `after - 1` of them
    (after=2: a file's first two hits keep their score, its third is x decay), then re-sorted (stable)."""
    seen: dict[str, int] = {}
    for s in ranked:
        path = rows[s.id].path
        s.score *= decay ** max(0, seen.get(path, 0) - after + 1)
        seen[path] = seen.get(path, 0) + 1
    return sorted(ranked, key=lambda s: -s.score)


def dedupe(ranked: list[Scored], rows: dict[int, ChunkRow]) -> list[Scored]:
    """Keep the better of two hits whose line spans overlap in one file (a class and its own method, overlapping
    windows): the later one adds nothing a reader of the first has not seen. The kept hit inherits its sources."""
    kept: list[Scored] = []
    spans: dict[str, list[tuple[int, int, Scored]]] = {}
    for s in ranked:
        r = rows[s.id]
        hit = next((k for a, b, k in spans.get(r.path, []) if r.start_line <= b and r.end_line >= a), None)
        if hit is not None:
            hit.sources.extend(x for x in s.sources if x not in hit.sources)
            continue
        spans.setdefault(r.path, []).append((r.start_line, r.end_line, s))
        kept.append(s)
    return kept


def without(cfg: RankConfig, **changes: object) -> RankConfig:
    """A copy of `cfg` with some rules changed (ablations in bench/search_eval/tune_rank.py)."""
    return replace(cfg, **changes)  # type: ignore[arg-type]


def reweighted(cfg: RankConfig, **per_kind: dict[str, float]) -> RankConfig:
    """A copy of `cfg` with some legs' fusion weights changed for some query kinds (nl={"vector": 1.6})."""
    weights = {k: dict(v) for k, v in cfg.weights.items()}
    for kind, changes in per_kind.items():
        weights[kind].update(changes)
    return replace(cfg, weights=weights)


def fusion_only(cfg: RankConfig) -> RankConfig:
    """`cfg`'s weighted fusion with every ranking rule off (the ablations' baseline)."""
    return replace(
        cfg, definition=0, name_match=0, stem=0, named_file=0, coherence=0, mention=1, path_penalty=1,
        dedupe=False, saturation=1, prose=1,
    )  # fmt: skip
