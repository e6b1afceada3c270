"""What a search query looks like: a name to look up (symbol), a sentence naming code (mixed) or plain language
(nl); its identifiers, content words and the type names its words spell (rank.py weighs the legs by it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpubox.tools.search.compounds import STOPWORDS, compound_names
from gpubox.tools.search.store import CAMEL, QUALIFIER

QueryKind = Literal["symbol", "mixed", "nl"]

# A token that can only be code: snake_case, camelCase/PascalCase with an inner capital, dotted, ::, -> or PHP's
# backslash paths, a call `f()`; `$` is a letter (JavaScript's `$ZodType`). Plain words ("command", "Option",
# "UTC") are never identifiers inside a sentence.
_TOKEN = re.compile(rf"[A-Za-z_$][\w$]*(?:(?:{QUALIFIER})[A-Za-z_$][\w$]*)*(?:\(\))?")
# how a lone name is written around it: `@JsonProperty`, `\\Monolog\\Logger`, generic arguments (`ZodType<T>`,
# `Foo<T>::bar`), a call's plain arguments (`parse(input)`), Elixir's arity (`Plug.Conn.put_status/2`)
_LEAD = re.compile(r"^(?:@|\\(?=[A-Z]))+")  # `@Json`, PHP's `\Monolog\Logger`; not an escape such as `\n`
_GENERICS = re.compile(r"<(?:[^<>]|<[^<>]*>)*>(?=$|::|\.|\(|\[)")
_PLAIN_CALL = re.compile(r"\([^()\"'\s]*\)$")  # not `warning("Retrying request")`: a pasted line, not a name
_ARITY = re.compile(r"(?<=[a-z0-9_])/\d+$")
_FILE_PATH = re.compile(r"\\.*\.[A-Za-z0-9]{1,5}$")  # src\foo\bar.py is a file, not a PHP name
_SNAKE = re.compile(r"^_*[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+_*$|^_\w+$")
_INNER_CAP = re.compile(r"[a-z0-9][A-Z]")
_QUOTED = re.compile(r"`([^`]+)`|\"([^\"]+)\"|'([^'\s][^']*[^'\s])'")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_VERSION_WORD = re.compile(r"v\d+")  # 'v1' is a word: it names a folder (paths.superseded_dirs)


@dataclass(frozen=True)
class QueryProfile:
    kind: QueryKind
    identifiers: tuple[str, ...]  # tokens only code has; the symbol leg looks these up as definitions
    words: tuple[str, ...]  # lower-cased content words (stopwords dropped), for file-name and name matching
    compounds: tuple[str, ...] = ()  # names adjacent words spell together (compound_names), lower case


def is_identifier(token: str) -> bool:
    t = token.removesuffix("()")
    qualified = re.search(QUALIFIER, t) is not None
    return bool(_SNAKE.match(t) or _INNER_CAP.search(t) or qualified or t != token) and any(c.isalpha() for c in t)


def _undress(text: str) -> str:
    """A lone name without what is written around it (`_GENERICS` ...), or "" when it is a file path."""
    bare = _GENERICS.sub("", _LEAD.sub("", text.strip("`\"'").removesuffix("()"))).removesuffix("[]")
    bare = _PLAIN_CALL.sub("", bare)
    if "." in bare or "_" in bare:  # put_status/2, Plug.Conn.get/1; not HTTP/2 or tokio/1
        bare = _ARITY.sub("", bare)
    return "" if _FILE_PATH.search(bare) else bare


def classify(query: str) -> QueryProfile:
    """'get_parameter_source' -> symbol; 'where is parseArgs called' -> mixed; 'format the help text' -> nl.

    A one-token query is a name lookup whatever its case; in a longer query only code-looking tokens (and quoted
    ones that look like code) are identifiers, so English words such as 'command' or 'error' never are."""
    text = query.strip()
    quoted = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)]
    tokens = _TOKEN.findall(text)
    idents = [t.removesuffix("()") for t in tokens if is_identifier(t)]
    idents += [q for q in quoted if _TOKEN.fullmatch(q) and q not in idents]
    bare = _undress(text)
    if _TOKEN.fullmatch(bare):
        idents = [bare]
        kind: QueryKind = "symbol"
    else:
        kind = "mixed" if idents else "nl"
    words = []
    for w in _WORD.findall(text):
        for part in [w, *CAMEL.findall(w)] if _INNER_CAP.search(w) else [w]:
            p = part.lower()
            if (len(p) > 2 or _VERSION_WORD.fullmatch(p)) and p not in STOPWORDS and p not in words:
                words.append(p)
    identifiers = tuple(dict.fromkeys(idents))
    return QueryProfile(kind, identifiers, tuple(words), compound_names(text, kind, identifiers))
