"""Input schemas as clients show them to the model, without what costs tokens and says nothing new.

pydantic writes a `title` for every property (the name again, capitalised), spells an optional field as
`anyOf: [X, {"type": "null"}]` with `default: null`, and puts nested models in `$defs` under their class names.
The same constraints fit in less: JSON Schema's own `type: [X, "null"]` for optional scalars, no titles, no null
defaults. Validation is unaffected: the server validates arguments with the pydantic model, not this schema.
"""

from __future__ import annotations

from typing import Any

NULL = {"type": "null"}


def compact(schema: Any) -> Any:
    """A copy of `schema` with property titles and null defaults dropped and `anyOf [X, null]` folded into X."""
    if isinstance(schema, list):
        return [compact(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: compact(v) for k, v in schema.items() if k != "title" and not (k == "default" and v is None)}
    options = out.get("anyOf")
    if isinstance(options, list) and NULL in options:
        rest = [o for o in options if o != NULL]
        if len(rest) == 1 and isinstance(rest[0].get("type"), str) and "anyOf" not in rest[0]:
            merged = {**{k: v for k, v in out.items() if k != "anyOf"}, **rest[0]}
            merged["type"] = [rest[0]["type"], "null"]
            if "enum" in merged:
                merged["enum"] = [*merged["enum"], None]
            return merged
    return out
