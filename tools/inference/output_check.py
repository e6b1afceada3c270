"""Check generated JSON against the schema the caller asked for, with regexes that cannot freeze the server.

The grammar enforces the schema's shape, not every keyword: llama-cpp-python's converter ignores numeric bounds,
`uniqueItems`, `not`, and merges `allOf` as if every part were an object, so a constrained generation can still
break the schema (`{"type": "integer", "minimum": 0.5, "maximum": 0.7}` produced 692). The output is therefore
validated with `jsonschema` and a violation is an error that names it and keeps the text, never a success.

`pattern` and `patternProperties` are matched with the `regex` module under a time limit and with the GIL
released: Python's `re` would hold the GIL through a catastrophically backtracking pattern such as `^(a+)+$`,
stalling every other client of the server.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from gpubox.errors import InvalidInputError, OutputRejectedError

REGEX_TIMEOUT_S = 1.0
SHOWN_CHARS = 400


def not_json(who: str, exc: ValueError, stop: list[str] | None) -> InvalidInputError:
    """A JSON-constrained output that ended ("stop") before its JSON did: a stop sequence cut it where one was given
    (raising max_tokens would not help then); else it was cut short."""
    fix = (
        f"a stop sequence ({', '.join(repr(s[:20]) for s in stop[:5])}) ended it first: call again without `stop` "
        "(the schema ends the answer)"
        if stop
        else "raise max_tokens"
    )
    return InvalidInputError(f"{who} output is not valid JSON ({exc}); {fix}")


def check_output(schema: dict[str, Any], value: Any, text: str) -> None:
    """Raise OutputRejectedError naming the first violation of `schema` by `value` (parsed from `text`)."""
    from jsonschema.exceptions import best_match

    validator = _validator_for(schema)(schema)
    try:
        error = best_match(validator.iter_errors(value))
    except (TimeoutError, ArithmeticError, ValueError) as exc:  # a regex timeout, a huge number against a bound
        raise _rejected(f"it could not be checked: {type(exc).__name__}: {exc}", text) from None
    if error is None:
        return
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    raise _rejected(f"at {where}: {message} (keyword {error.validator!r})", text)


def _rejected(problem: str, text: str) -> OutputRejectedError:
    shown = text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"... ({len(text)} characters)"
    return OutputRejectedError(
        f"the model's output does not satisfy json_schema {problem}. Output: {shown!r}. The grammar enforces the "
        "schema's structure but not numeric bounds, uniqueItems, not, or allOf across types; retry with another "
        "seed or temperature, or state the constraint structurally (an enum, a pattern, a smaller maxItems)."
    )


def _search(pattern: str, instance: str) -> bool:
    import regex

    try:
        return regex.search(_compiled(pattern), instance, timeout=REGEX_TIMEOUT_S, concurrent=True) is not None
    except TimeoutError:
        raise TimeoutError(f"pattern {pattern!r} took over {REGEX_TIMEOUT_S} s on the output") from None


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    import regex

    # ECMA-262 (JSON Schema's dialect) has ASCII \d and \w
    return regex.compile(pattern, regex.ASCII | regex.VERSION0)


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, props: dict[str, Any], instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, sub in props.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, sub, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    known, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [k for k in instance if k not in known and not any(_search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif extra is False and extras:
        yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")


def _validator_for(schema: dict[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, validators

    base = validators.validator_for(schema, default=Draft202012Validator)
    return _extended(base)


@functools.cache
def _extended(base: Any) -> Any:
    from jsonschema import validators

    return validators.extend(
        base,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )
