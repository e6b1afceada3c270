"""Dataset reading and validation before anything is launched.

Accepted: JSONL, JSON (a list of rows, or {"data"/"train": [...]}), CSV, Parquet, or a `datasets.save_to_disk`
folder. Formats (trl's dataset formats, https://huggingface.co/docs/trl/dataset_formats): conversational
`messages`, `prompt`/`completion` (strings or message lists), plain `text`. The first bad row stops validation
with an error naming the row and the problem, so nothing half-valid is ever trained on.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from gpubox.errors import InvalidInputError, MissingExtraError, NotFoundError
from gpubox.paths import open_inside
from gpubox.tools.finetune import saved
from gpubox.tools.finetune.schemas import DatasetFormat

ROLES = {"system", "user", "assistant", "tool"}
MAX_ROWS = saved.MAX_ROWS
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")

SAMPLED_ROWS = 20_000  # rows whose token length is measured; beyond it lengths are a sample
PIECE = 100_000  # characters given to the tokenizer in one call (token_lengths)
MEASURED = 1_000_000  # characters of one row counted; a longer row's rest is extrapolated


Opener = Callable[[Path], BinaryIO]


def _opener(roots: Sequence[Path] | None) -> Opener:
    if roots is None:  # parsing only (unit tests of the formats); the tools always pass their roots
        return lambda path: path.open("rb")
    allowed = roots
    return lambda path: open_inside(path, allowed, what="dataset")


def read_rows(path: Path, roots: Sequence[Path] | None = None) -> list[dict[str, Any]]:
    """Rows of a dataset file or save_to_disk folder. With `roots`, every file is opened through the allowed-roots
    check and a folder is checked file by file first (datasets opens its files by name, following symlinks)."""
    if path.is_dir():
        return saved.read_folder(path, roots, MAX_ROWS)
    opener = _opener(roots)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InvalidInputError(f"{path.name}: unsupported dataset file type; use one of {', '.join(SUFFIXES)}")
    try:
        if suffix == ".jsonl":
            return _read_jsonl(path, opener)
        if suffix == ".json":
            return _read_json(path, opener)
        if suffix == ".csv":
            return _read_csv(path, opener)
        return _read_parquet(path, opener)
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path.name} is not UTF-8 text: {exc.reason}; save it as UTF-8") from exc


def _json_problem(exc: ValueError | RecursionError) -> str:
    """Why json.loads refused a text, said so that the user knows what to change."""
    if isinstance(exc, RecursionError):
        return "it nests lists/objects too deeply to parse; flatten the row"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (column {exc.colno})"
    if "integer string conversion" in str(exc):  # Python refuses ints over 4300 digits (CVE-2020-10735)
        return "it holds an integer with more than 4300 digits; store such a value as a string"
    return str(exc)[:200]


def _read_jsonl(path: Path, opener: Opener) -> list[Any]:
    rows = []
    with opener(path) as fb, io.TextIOWrapper(fb, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise InvalidInputError(f"{path.name} line {n} is not valid JSON: {_json_problem(exc)}") from None
    return rows


def _read_json(path: Path, opener: Opener) -> list[Any]:
    with opener(path) as fb:
        raw = fb.read()
    try:
        data = json.loads(raw.decode("utf-8-sig"))  # a byte-order mark (Excel, Notepad) is no error
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            raise
        raise InvalidInputError(f"{path.name} is not valid JSON: {_json_problem(exc)}") from None
    if isinstance(data, dict):
        data = data.get("train", data.get("data"))
    if not isinstance(data, list):
        raise InvalidInputError(f"{path.name} must hold a JSON list of rows (or {{'train': [...]}})")
    return data


def _read_csv(path: Path, opener: Opener) -> list[Any]:
    with opener(path) as fb, io.TextIOWrapper(fb, encoding="utf-8-sig", newline="") as f:
        rows: list[Any] = []
        try:
            rows.extend(csv.DictReader(f))
        except csv.Error as exc:  # e.g. "field larger than field limit (131072)"
            raise InvalidInputError(
                f"{path.name} row {len(rows) + 1} is not readable CSV ({exc}); Python's csv reader limits a field "
                f"to {csv.field_size_limit()} characters: store long texts as JSONL or Parquet"
            ) from None
        return rows


def _read_parquet(path: Path, opener: Opener) -> list[Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtraError("Reading Parquet datasets", "train", "pyarrow") from exc
    with opener(path) as fb:
        try:
            return pq.read_table(fb).to_pylist()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InvalidInputError(
                f"{path.name} is not a readable Parquet file ({type(exc).__name__}: {str(exc)[:200]}); write it "
                "again with pandas.DataFrame.to_parquet or pyarrow, or pass JSONL"
            ) from None


def _check_messages(msgs: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise InvalidInputError(f"{where}: must be a non-empty list of {{'role', 'content'}} messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidInputError(f"{where} message {i}: needs 'role' and 'content' keys")
        if not isinstance(m["role"], str) or m["role"] not in ROLES:
            shown = m["role"] if isinstance(m["role"], str) else f"a {type(m['role']).__name__}"
            raise InvalidInputError(f"{where} message {i}: role '{shown}' is not one of {sorted(ROLES)}")
        if not isinstance(m["content"], str):
            raise InvalidInputError(f"{where} message {i}: content must be a string, got {type(m['content']).__name__}")
        out.append({"role": m["role"], "content": _unicode(m["content"], f"{where} message {i} content")})
    return out


def _unicode(text: str, where: str) -> str:
    """`text`, refused when no tokenizer can take it: a lone surrogate (JSON's "\\ud800" escape without its pair)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{where} holds invalid Unicode at character {exc.start} (a lone surrogate such as \\ud800, from a "
            "JSON escape without its pair); fix or drop that character"
        ) from None
    return text


def detect_format(row: Any) -> DatasetFormat:
    if not isinstance(row, dict):
        raise InvalidInputError(f"row 1 is a {type(row).__name__}, not an object with fields")
    if "messages" in row:
        return "messages"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    if "text" in row:
        return "text"
    raise InvalidInputError(
        f"row 1 has fields {sorted(map(str, row))}; expected 'messages' (chat), 'prompt' + 'completion', or 'text'"
    )


def normalise(rows: list[Any], source: str) -> tuple[DatasetFormat, list[dict[str, Any]]]:
    """Validate every row against the format of the first; return the rows with only the fields trl reads."""
    if not rows:
        raise InvalidInputError(f"{source} has no rows; a fine-tune needs at least one example")
    if len(rows) > MAX_ROWS:
        raise InvalidInputError(f"{source} has {len(rows)} rows, above the {MAX_ROWS} limit; subsample it first")
    fmt = detect_format(rows[0])
    out: list[dict[str, Any]] = []
    for n, row in enumerate(rows, 1):
        where = f"row {n}"
        if not isinstance(row, dict):
            raise InvalidInputError(f"{where} is a {type(row).__name__}, not an object")
        if fmt == "messages":
            if "messages" not in row:
                raise InvalidInputError(f"{where}: missing 'messages' (row 1 is chat format)")
            msgs = _check_messages(row["messages"], f"{where} 'messages'")
            if not any(m["role"] == "assistant" for m in msgs):
                raise InvalidInputError(f"{where}: no assistant message, so there is nothing to learn")
            out.append({"messages": msgs})
        elif fmt == "prompt_completion":
            item: dict[str, Any] = {}
            for key in ("prompt", "completion"):
                if key not in row or row[key] is None:
                    raise InvalidInputError(f"{where}: missing '{key}' (row 1 is prompt/completion format)")
                value = row[key]
                if isinstance(value, list):
                    item[key] = _check_messages(value, f"{where} '{key}'")
                elif isinstance(value, str):
                    item[key] = _unicode(value, f"{where} '{key}'")
                else:
                    raise InvalidInputError(
                        f"{where}: '{key}' must be a string or a message list, got {type(value).__name__}"
                    )
            if type(item["prompt"]) is not type(item["completion"]):
                raise InvalidInputError(f"{where}: 'prompt' and 'completion' must both be strings or both lists")
            out.append(item)
        else:
            text = row.get("text")
            if not isinstance(text, str) or not text.strip():
                got = (
                    "missing" if text is None else f"a {type(text).__name__}" if not isinstance(text, str) else "empty"
                )
                raise InvalidInputError(f"{where}: 'text' must be a non-empty string, it is {got}")
            out.append({"text": _unicode(text, f"{where} 'text'")})
    return fmt, out


def load(path: Path, roots: Sequence[Path] | None = None) -> tuple[DatasetFormat, list[dict[str, Any]]]:
    """Validated rows of a dataset; pass the allowed roots (the tools always do) to have every file checked."""
    if not path.exists():
        raise NotFoundError(f"dataset {path} does not exist")
    return normalise(read_rows(path, roots), path.name)


def render(row: dict[str, Any], fmt: DatasetFormat, tokenizer: Any) -> str:
    """The text the model sees for a row (chat template applied), for length statistics."""
    if fmt == "text":
        return row["text"]
    if fmt == "messages":
        return tokenizer.apply_chat_template(row["messages"], tokenize=False)
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template([*prompt, *completion], tokenize=False)
    return prompt + completion


def max_token_chars(tokenizer: Any) -> int:
    """The longest token's text in characters, a bound on the characters one token covers: a byte-level token's
    form spells each byte as one character, a SentencePiece one writes the space as one."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def cut_long(row: dict[str, Any], fmt: DatasetFormat, max_chars: int) -> dict[str, Any]:
    """`row` with its text past the first `max_chars` characters cut off, field by field in the order the model
    reads them (a message list after the message where it runs out). Cut at twice max_length tokens' worth of
    characters, a row keeps every token that truncation to max_length keeps; tokenized whole, a 50 MB row took
    12 GB of RAM in the training worker."""
    left = max_chars

    def cut_text(text: str) -> str:
        nonlocal left
        out, left = text[: max(left, 0)], left - len(text)
        return out

    def cut_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            if left <= 0 and out:  # the first message stays (cut to nothing): a list must not be empty
                break
            content = m.get("content")
            out.append({**m, "content": cut_text(content)} if isinstance(content, str) else m)
        return out

    if fmt == "text":
        return {**row, "text": cut_text(row["text"])}
    if fmt == "messages":
        return {**row, "messages": cut_messages(row["messages"])}
    cut = dict(row)
    for key in ("prompt", "completion"):
        value = row[key]
        cut[key] = cut_text(value) if isinstance(value, str) else cut_messages(value)
    return cut


def token_lengths(rows: list[dict[str, Any]], fmt: DatasetFormat, tokenizer: Any) -> list[int]:
    """Token length of each sampled row (the first SAMPLED_ROWS), tokenized at most PIECE characters per call: a
    fast tokenizer takes ~240 bytes per character of one call, so a 50 MB row in one call took 12 GB. Past
    MEASURED characters a row's length is extrapolated at its own measured rate."""
    texts = [render(r, fmt, tokenizer) for r in rows[:SAMPLED_ROWS]]
    out = [0] * len(texts)
    batches: list[list[int]] = [[]]
    size = 0
    for i, text in enumerate(texts):
        if len(text) > PIECE:
            out[i] = _long_length(text, tokenizer)
        elif size + len(text) > PIECE and batches[-1]:
            batches.append([i])
            size = len(text)
        else:
            batches[-1].append(i)
            size += len(text)
    for batch in filter(None, batches):
        enc = tokenizer([texts[i] for i in batch], add_special_tokens=False)["input_ids"]
        for i, ids in zip(batch, enc, strict=True):
            out[i] = len(ids)
    return out


def _long_length(text: str, tokenizer: Any) -> int:
    head = text[:MEASURED]
    n = sum(
        len(tokenizer(head[j : j + PIECE], add_special_tokens=False)["input_ids"]) for j in range(0, len(head), PIECE)
    )
    return n if len(text) <= MEASURED else round(n * len(text) / len(head))


def percentiles(lengths: list[int]) -> dict[str, int]:
    s = sorted(lengths)

    def pick(q: float) -> int:
        return s[min(len(s) - 1, int(q * len(s)))]

    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": s[-1]}


def stamp(path: Path) -> str:
    """The dataset file as it is now (size:mtime): a plan made for its rows holds only while this is unchanged."""
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


# chat rows that parse but are likely not what was meant; trl trains on them as they are (a ChatML template such as
# SmolLM2's renders any order), so the plan says so instead of refusing
_ODD_CHATS: tuple[tuple[str, Callable[[list[dict[str, str]]], bool]], ...] = (
    ("have a message with empty content", lambda msgs: any(not m["content"].strip() for m in msgs)),
    ("start with the assistant's message", lambda msgs: msgs[0]["role"] == "assistant"),
    ("have a system message after the first message", lambda msgs: any(m["role"] == "system" for m in msgs[1:])),
)


def chat_warnings(rows: list[dict[str, Any]], fmt: DatasetFormat) -> list[str]:
    """One line per kind of odd chat row: how many rows, and the first."""
    chats = [
        row["messages"] if fmt == "messages" else [*row["prompt"], *row["completion"]]
        for row in rows
        if fmt == "messages" or isinstance(row.get("prompt"), list)
    ]
    out = []
    for what, odd in _ODD_CHATS:
        hits = [n for n, msgs in enumerate(chats, 1) if odd(msgs)]
        if hits:
            out.append(f"{len(hits)} of {len(rows)} rows {what} (row {hits[0]} first); trained on as written")
    return out
