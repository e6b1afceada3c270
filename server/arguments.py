"""A tool's arguments as the model sees and sends them: rarely needed parameters folded into one `more` object,
and names the tool does not take refused instead of silently ignored.

A tool with thirty parameters costs a model's context over a thousand tokens in tools/list before any question
is asked, though most calls set three of them. So the tools/list schema shows the parameters most calls use and
one object parameter, `more`, whose description names the rest; the full schema of every parameter is the
resource `gpubox://tools/{name}`. The tool itself keeps its full signature: a model may pass a folded parameter
inside `more` or at the top level, and the SDK validates it either way.

The SDK drops argument names a tool does not declare without a word (pydantic's default), so a misspelt
`temprature=0` would sample at the default temperature. Here it is an input error naming the close matches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from gpubox.errors import InvalidInputError, UnknownNameError

MORE = "more"
# per tool, the names other gpubox tools give what it takes under another name (infer_chat's `model` is
# infer_load's `name`, finetune_status's `job_id` is finetune_merge's `job`): a model that used one tool's name on
# the other is told which it is, since difflib finds no likeness between `model` and `name`
_MODEL_AS_NAME = {"model": "name"}
_JOB_ID = {"job": "job_id", "id": "job_id"}
_ENGINE_ID = {"engine": "engine_id", "id": "engine_id"}
SAME_THING: dict[str, dict[str, str]] = {
    "infer_load": _MODEL_AS_NAME,
    "infer_unload": _MODEL_AS_NAME,
    "infer_chat": {"name": "model"},
    "infer_complete": {"name": "model"},
    "infer_benchmark": {"name": "model"},
    "finetune_merge": {"job_id": "job", "id": "job"},
    "finetune_status": _JOB_ID,
    "finetune_cancel": _JOB_ID,
    "finetune_resume": _JOB_ID,
    "search_code": {"name": "index"},
    "search_index": {"index": "name"},
    "search_drop": {"index": "name"},
    "serve_status": _ENGINE_ID,
    "serve_stop": _ENGINE_ID,
}


def resource_uri(tool: str) -> str:
    return f"gpubox://tools/{tool}"


def fold(tool: str, schema: dict[str, Any], folded: Iterable[str]) -> dict[str, Any]:
    """`schema` with the `folded` parameters replaced by one `more` object that names them."""
    props: dict[str, Any] = schema.get("properties", {})
    hidden = [n for n in folded if n in props]
    if not hidden:
        return schema
    required = set(schema.get("required", []))
    if required & set(hidden):
        raise ValueError(f"{tool}: a required parameter cannot be folded into '{MORE}'")
    shown = {k: v for k, v in props.items() if k not in hidden}
    shown[MORE] = {
        "type": "object",
        "description": f"Rarely needed, by name: {', '.join(hidden)} (see {resource_uri(tool)})",
    }
    return {**schema, "properties": shown}


def unfold(tool: str, arguments: Mapping[str, Any], known: Iterable[str], folded: Iterable[str]) -> dict[str, Any]:
    """The arguments with `more`'s entries moved to the top level; raises InvalidInputError for a name the tool
    does not take (with the close matches), a `more` that is not an object, or a name given twice."""
    known_set, folded_list = set(known), [n for n in folded if n in known]
    args = dict(arguments)
    extra = args.pop(MORE, None) if folded_list else None
    if extra is not None:
        if not isinstance(extra, dict):
            raise InvalidInputError(
                f"'{MORE}' takes an object of settings by name, e.g. {{\"{folded_list[0]}\": ...}}; "
                f"{tool} accepts there: {', '.join(folded_list)}"
            )
        for key, value in extra.items():
            if key not in folded_list:
                hint = (
                    f"'{key}' is a top-level argument of {tool}; pass it there."
                    if key in known_set
                    else f"'{MORE}' holds only these settings of {tool}."
                )
                raise UnknownNameError("setting", str(key)[:64], folded_list, hint)
            if key in args:
                raise InvalidInputError(f"'{key}' is given twice, at the top level and in '{MORE}'; give it once")
            args[key] = value
    for key in args:
        if key not in known_set and not known_set:
            raise InvalidInputError(f"{tool} takes no arguments; call it without {key[:64]!r}")
        if key not in known_set:
            raise unknown_argument(tool, key, known_set)
    return args


def unknown_argument(tool: str, key: str, known: Iterable[str]) -> UnknownNameError:
    """The error for an argument name `tool` does not take: the close matches, and the name this tool gives the
    same thing where another tool calls it `key`."""
    known_set = set(known)
    same = SAME_THING.get(tool, {}).get(key)
    hint = f"{tool} takes it as '{same}'." if same in known_set else ""
    return UnknownNameError("argument", key[:64], known_set, hint)


def invalid_arguments(exc: ValidationError, shown: int = 5) -> str:
    """pydantic's argument errors as one line a model can act on: each argument, what it must be and what it got
    (pydantic's own text names an internal model and links its documentation on every error)."""
    parts = []
    for e in exc.errors(include_url=False)[:shown]:
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        got = "" if e["type"] == "missing" else f" (got {_short(e.get('input'))})"
        parts.append(f"{where}: {e['msg']}{got}")
    more = exc.error_count() - shown
    return "invalid arguments: " + "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value[: limit * 2])
    except (ValueError, RecursionError):  # a 5,000-digit integer or a list nested 10,000 deep: not shown whole
        text = f"a {type(value).__name__} too large or deep to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _types(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> set[str]:
    """The JSON types `schema` admits, through `$ref` and `anyOf`."""
    schema = _deref(schema, defs)
    t = schema.get("type")
    own = set(t) if isinstance(t, list) else {t} if isinstance(t, str) else set()
    return own.union(*(_types(x, defs) for x in schema.get("anyOf", []) if isinstance(x, Mapping)))


def _deref(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    target = defs.get(ref.removeprefix("#/$defs/")) if isinstance(ref, str) else None
    return target if isinstance(target, Mapping) else schema


def _branches(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    schema = _deref(schema, defs)
    subs = [_deref(x, defs) for x in schema.get("anyOf", []) if isinstance(x, Mapping)]
    return [schema, *subs]


def booleans_for_numbers(value: Any, schema: Mapping[str, Any], defs: Mapping[str, Any], where: str) -> list[str]:
    """Where in `value` a boolean stands for a number `schema` asks for: at the top, in a list's items and in an
    object's properties (`seq_len=[true]` was read as [1])."""
    if isinstance(value, bool):
        types = _types(schema, defs)
        wanted = types & {"integer", "number"} and "boolean" not in types
        return [f"{where}: a number is wanted, not {json.dumps(value)}"] if wanted else []
    found: list[str] = []
    for branch in _branches(schema, defs):
        if isinstance(value, list) and isinstance(items := branch.get("items"), Mapping):
            for i, item in enumerate(value):
                found += booleans_for_numbers(item, items, defs, f"{where}[{i}]")
            break
        if isinstance(value, dict) and isinstance(props := branch.get("properties"), Mapping):
            for key, item in value.items():
                if isinstance(sub := props.get(key), Mapping):
                    found += booleans_for_numbers(item, sub, defs, f"{where}.{key}")
            break
    return found


def no_booleans(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """pydantic's lax mode reads true as 1 for a number (max_tokens: true generated one token): refused, at any
    depth of the arguments."""
    props: Mapping[str, Any] = schema.get("properties", {})
    defs: Mapping[str, Any] = schema.get("$defs", {})
    bad = [
        w
        for k, v in arguments.items()
        if isinstance(s := props.get(k), Mapping)
        for w in booleans_for_numbers(v, s, defs, k)
    ]
    if bad:
        raise InvalidInputError("invalid arguments: " + "; ".join(bad[:5]))
