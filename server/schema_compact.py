"""Input schemas as clients show them to the model, without what costs tokens and says nothing a model needs.

pydantic writes a `title` for every property (the name again, capitalised), spells an optional field as
`anyOf: [X, {"type": "null"}]` with `default: null`, and puts nested models in `$defs` under their class names.
What a model needs to call a tool right is the type, the meaningful bounds, the default and the enum, so:

- no titles, no null defaults, and an optional parameter is just its type: leaving it out means "the default",
  which is what a model should do (the server still accepts an explicit null);
- no guard limits: a string's `maxLength`, an array's `maxItems`, `minLength: 1` and numeric bounds of 1024 or
  more are there against hostile input, not to guide a model; nor lower bounds of 0 or 1 (counts, sizes and
  rates are not negative); the server keeps enforcing all of them and names the limit in its error;
- a `$defs` entry used once is written where it is used.

Validation is unaffected: the server validates arguments with the pydantic model, not with this schema.
"""

from __future__ import annotations

import json
from typing import Any

NULL = {"type": "null"}
GUARD_BOUND = 1024  # a numeric bound this large is a sanity limit (context lengths, token counts, ports)
DROPPED = {"maxLength", "maxItems", "additionalProperties"}
VALUES = {"const", "default", "enum", "examples"}  # data, not schema: never filtered (a null default is dropped)


def compact(schema: Any, guards: bool = False) -> Any:
    """A copy of a tool's input schema with what only the validator needs dropped (see the module docstring);
    `guards` keeps every bound (for the full schema a client reads on request)."""
    if not isinstance(schema, dict):
        return schema
    defs = schema.get("$defs", {})
    counts = {name: json.dumps(schema).count(f'"#/$defs/{name}"') for name in defs}
    inline = {name: d for name, d in defs.items() if counts[name] == 1}
    out = _compact(schema, inline, guards)
    kept = {name: _compact(d, inline, guards) for name, d in defs.items() if name not in inline}
    if kept:
        out["$defs"] = kept
    else:
        out.pop("$defs", None)
    return out


def _compact(schema: Any, inline: dict[str, Any], guards: bool) -> Any:
    if isinstance(schema, list):
        return [_compact(s, inline, guards) for s in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    name = ref.removeprefix("#/$defs/") if isinstance(ref, str) else None
    if name in inline:
        return _compact({**inline[name], **{k: v for k, v in schema.items() if k != "$ref"}}, inline, guards)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):  # parameter names, not schema keywords
            out[key] = {p: _compact(s, inline, guards) for p, s in value.items()}
        elif key in VALUES:
            if not (key == "default" and value is None):
                out[key] = value
        elif _kept(key, value, guards):
            out[key] = _compact(value, inline, guards)
    options = out.get("anyOf")
    if isinstance(options, list) and NULL in options:
        rest = [o for o in options if o != NULL]
        if len(rest) == 1 and isinstance(rest[0], dict):  # the parameter's own keys (its description) win
            out = {**rest[0], **{k: v for k, v in out.items() if k != "anyOf"}}
        else:
            out["anyOf"] = rest
    if isinstance(out.get("enum"), list):
        out["enum"] = [e for e in out["enum"] if e is not None]
    return out


def _kept(key: str, value: Any, guards: bool) -> bool:
    if key == "title" and not isinstance(value, dict):
        return False
    if key == "$defs":
        return False
    if guards:
        return True
    if key in DROPPED and not isinstance(value, dict):
        return False
    if key == "minLength" and value == 1:
        return False
    if key in ("minimum", "exclusiveMinimum") and value in (0, 1):  # counts and sizes: a model assumes that
        return False
    if key in ("maximum", "exclusiveMaximum", "minimum") and isinstance(value, int | float):
        return abs(value) < GUARD_BOUND
    return True
