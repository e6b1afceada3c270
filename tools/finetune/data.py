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
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from gpubox.errors import InvalidInputError, MissingExtraError, NotFoundError
from gpubox.tools.finetune.schemas import DatasetFormat

ROLES = {"system", "user", "assistant", "tool"}
MAX_ROWS = 5_000_000
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


Opener = Callable[[Path], BinaryIO]


def _plain_open(path: Path) -> BinaryIO:
    return path.open("rb")


def read_rows(path: Path, opener: Opener = _plain_open) -> list[dict[str, Any]]:
    """Rows of a dataset file or save_to_disk folder; files are opened through `opener` (an allowed-roots check)."""
    if path.is_dir():
        if not (path / "dataset_info.json").is_file() and not (path / "dataset_dict.json").is_file():
            raise InvalidInputError(f"{path} is a folder but not a datasets.save_to_disk folder (no dataset_info.json)")
        try:
            from datasets import DatasetDict, load_from_disk
        except ImportError as exc:
            raise MissingExtraError("Reading a save_to_disk dataset", "train", "datasets") from exc
        ds = load_from_disk(str(path))
        if isinstance(ds, DatasetDict):
            if "train" not in ds:
                raise InvalidInputError(f"{path} holds splits {list(ds)}; a 'train' split is needed")
            ds = ds["train"]
        return [dict(r) for r in ds]  # type: ignore[arg-type]
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InvalidInputError(f"{path.name}: unsupported dataset file type; use one of {', '.join(SUFFIXES)}")
    try:
        if suffix == ".jsonl":
            rows = []
            with opener(path) as fb, io.TextIOWrapper(fb, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise InvalidInputError(f"{path.name} line {n} is not valid JSON: {exc.msg}") from exc
            return rows
        if suffix == ".json":
            with opener(path) as fb:
                data = json.loads(fb.read().decode("utf-8"))
            if isinstance(data, dict):
                data = data.get("train", data.get("data"))
            if not isinstance(data, list):
                raise InvalidInputError(f"{path.name} must hold a JSON list of rows (or {{'train': [...]}})")
            return data
        if suffix == ".csv":
            with opener(path) as fb, io.TextIOWrapper(fb, encoding="utf-8", newline="") as f:
                return list(csv.DictReader(f))
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise MissingExtraError("Reading Parquet datasets", "train", "pyarrow") from exc
        with opener(path) as fb:
            return pq.read_table(fb).to_pylist()
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path.name} is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path.name} is not UTF-8 text: {exc.reason}") from exc


def _check_messages(msgs: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise InvalidInputError(f"{where}: must be a non-empty list of {{'role', 'content'}} messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidInputError(f"{where} message {i}: needs 'role' and 'content' keys")
        if m["role"] not in ROLES:
            raise InvalidInputError(f"{where} message {i}: role '{m['role']}' is not one of {sorted(ROLES)}")
        if not isinstance(m["content"], str):
            raise InvalidInputError(f"{where} message {i}: content must be a string, got {type(m['content']).__name__}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


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
        f"row 1 has fields {sorted(row)}; expected 'messages' (chat), 'prompt' + 'completion', or 'text'"
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
                    item[key] = value
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
            out.append({"text": text})
    return fmt, out


def load(path: Path, opener: Opener = _plain_open) -> tuple[DatasetFormat, list[dict[str, Any]]]:
    if not path.exists():
        raise NotFoundError(f"dataset {path} does not exist")
    return normalise(read_rows(path, opener), path.name)


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


def token_lengths(rows: list[dict[str, Any]], fmt: DatasetFormat, tokenizer: Any) -> list[int]:
    texts = [render(r, fmt, tokenizer) for r in rows[:20_000]]  # percentiles from a bounded sample
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) for ids in enc]


def percentiles(lengths: list[int]) -> dict[str, int]:
    s = sorted(lengths)

    def pick(q: float) -> int:
        return s[min(len(s) - 1, int(q * len(s)))]

    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": s[-1]}
