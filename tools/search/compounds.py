"""Names a sentence spells apart: two or three adjacent words looked up as one identifier ('JSON element' ->
JsonElement), the compound leg of hybrid search (query_kind.classify fills QueryProfile.compounds, query.compounds looks
them up)."""

from __future__ import annotations

import re
from typing import Literal

# a word, or what ends a run of words for compound_names: punctuation other than a hyphen, or a line break
_RUN_TOKEN = re.compile(r"\w+|[^\w\s'-]+|\n")
MAX_COMPOUNDS = 48  # names looked up per query (one indexed lookup each): a 2,000-character query stays cheap
_STOP = (
    "a an and are as at be by can do does for from has have how if in into is it its it's not of on or over so "
    "such than that the their them then there these this those through to was what when where which while who "
    "whose why will with without would should could one any all each every only until"
)
STOPWORDS = frozenset(_STOP.split())


def _singulars(word: str) -> list[str]:
    out = [word]
    if word.endswith("ies") and len(word) > 4:
        out.append(word[:-3] + "y")  # factories -> factory (cookies -> cookie below)
    elif word.endswith(("ses", "xes", "ches", "shes")):
        out.append(word[:-2])  # classes -> class (cases, caches, responses -> case, cache, response below)
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        out.append(word[:-1])  # handlers -> handler
    return out


def compound_names(text: str, kind: Literal["symbol", "mixed", "nl"], identifiers: tuple[str, ...]) -> tuple[str, ...]:
    """Identifiers that two or three adjacent words of a sentence spell together: 'JSON element' -> jsonelement
    (JsonElement), 'type adapter factories' -> typeadapterfactory, 'spawn blocking' -> spawn_blocking. Never across a
    stopword; three-word names first (the more specific); names the query already writes as identifiers are left to
    the symbol leg. Looked up case-insensitively by query.compounds."""
    if kind == "symbol":
        return ()
    runs: list[list[str]] = [[]]
    for m in _RUN_TOKEN.finditer(text):
        w = m.group().lower()
        if w.isascii() and w.isalnum() and w[0].isalpha() and len(w) > 1 and w not in STOPWORDS:
            runs[-1].append(w)
        else:  # a stopword, punctuation, a line break, a number, a snake_case name, a non-ASCII word
            runs.append([])
    written = {i.lower().replace("_", "") for i in identifiers}
    by_length: dict[int, list[str]] = {3: [], 2: []}
    for n, names in by_length.items():
        for run in runs:
            for i in range(len(run) - n + 1):
                head = run[i : i + n - 1]
                for last in _singulars(run[i + n - 1]):
                    if "".join(head) + last not in written:
                        names += ["".join(head) + last, "_".join([*head, last])]
    # three-word names first, but never more than a third of the budget: a long query keeps its two-word names
    three = list(dict.fromkeys(by_length[3]))[: MAX_COMPOUNDS // 3]
    return tuple(dict.fromkeys(three + by_length[2] + _capitalised(text, written)))[:MAX_COMPOUNDS]


# a capitalised word on its own: not a part of `Foo::Bar`, `Foo.bar`, `Vendor\\Pkg`, `src/Key.hs`, `Foo#bar`, `Foo<T>`
_CAPITALISED = re.compile(r"(?<![\w.:\\/#$@>])[A-Z][a-z]{2,}(?![\w.:\\/#<(])")


def _capitalised(text: str, written: set[str]) -> list[str]:
    """One capitalised word as a type's name ('how Key type is used as object field identifier' -> Key, 'Response
    type and HTTP response construction' -> Response, 'Handlers' -> handler too): looked up among types only, as the
    longer names are."""
    words = [m.group().lower() for m in _CAPITALISED.finditer(text)]
    return [s for w in words if w not in STOPWORDS for s in _singulars(w) if s not in written]
