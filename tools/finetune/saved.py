"""Reading a `datasets.save_to_disk` folder without letting it read anything outside the allowed roots.

`datasets.load_from_disk` opens `state.json`, `dataset_info.json` and the Arrow files that `state.json` names,
following symlinks, and joins those names onto the folder as given ("../x.arrow" or "/etc/x" climb out);
a DatasetDict folder names its split folders in `dataset_dict.json` the same way. So before handing the folder
over, every entry in it is checked against the roots (server/paths.check_tree_inside) and every name these JSON
files give must be a plain file or folder name inside it. Whatever datasets then raises on a broken folder
becomes an InvalidInputError naming the folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError, InvalidInputError, MissingExtraError
from gpubox.paths import NAME_MAX, check_tree_inside, open_inside

MAX_ROWS = 5_000_000
JSON_MAX_BYTES = 16 * 1024 * 1024  # state.json / dataset_dict.json are a few KB; bound what is parsed
STATE = "state.json"
INFO = "dataset_info.json"
DICT = "dataset_dict.json"


def is_saved_folder(path: Path) -> bool:
    """The same test datasets.load_from_disk makes: a Dataset folder, or else a DatasetDict folder."""
    return ((path / INFO).is_file() and (path / STATE).is_file()) or (path / DICT).is_file()


def read_folder(path: Path, roots: Sequence[Path] | None, max_rows: int = MAX_ROWS) -> list[dict[str, Any]]:
    """Rows of the folder's dataset, or of its 'train' split; checked first when `roots` is given."""
    if not is_saved_folder(path):
        raise InvalidInputError(
            f"{path} is a folder but not a datasets.save_to_disk folder (no {INFO} + {STATE}, nor {DICT}); "
            "pass the folder save_to_disk wrote, or a .jsonl/.json/.csv/.parquet file"
        )
    if roots is not None:
        check_folder(path, roots)
    try:
        from datasets import DatasetDict, load_from_disk
    except ImportError as exc:
        raise MissingExtraError("Reading a save_to_disk dataset", "train", "datasets") from exc
    try:
        ds = load_from_disk(str(path))
        if isinstance(ds, DatasetDict):
            if "train" not in ds:
                raise InvalidInputError(f"{path} holds splits {list(ds)}; a 'train' split is needed")
            ds = ds["train"]
        if len(ds) > max_rows:
            raise InvalidInputError(f"{path.name} has {len(ds)} rows, above the {max_rows} limit; subsample it first")
        return [dict(r) for r in ds]  # type: ignore[arg-type]
    except GpuboxError:
        raise
    except Exception as exc:  # a hostile or half-written folder fails anywhere inside datasets/pyarrow
        raise InvalidInputError(
            f"{path} is not a readable datasets.save_to_disk folder ({type(exc).__name__}: {str(exc)[:200]}); "
            "save it again with Dataset.save_to_disk, or export the rows to JSONL"
        ) from None


def check_folder(path: Path, roots: Sequence[Path]) -> None:
    """Refuse a folder that would make datasets read outside the roots; see the module docstring."""
    if "::" in str(path):  # fsspec (which datasets opens paths with) reads "a::b" as a chain of file systems
        raise InvalidInputError(f"dataset folder {path} has '::' in its path; rename it")
    check_tree_inside(path, roots, what="dataset folder")
    if (path / INFO).is_file() and (path / STATE).is_file():
        _check_state(path, roots)
        return
    splits = _json_object(path / DICT, roots).get("splits")
    if not isinstance(splits, list) or not splits:
        raise InvalidInputError(f"{path / DICT} must have a non-empty 'splits' list; save the DatasetDict again")
    for split in splits:
        folder = path / _plain_name(split, path / DICT, "split")
        if not folder.is_dir():
            raise InvalidInputError(f"{path / DICT} names split '{split}', but {folder} is not a folder")
        _check_state(folder, roots)


def _check_state(folder: Path, roots: Sequence[Path]) -> None:
    state = _json_object(folder / STATE, roots)
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise InvalidInputError(f"{folder / STATE} has no '_data_files' list; save the dataset again")
    for item in files:
        name = _plain_name(item.get("filename") if isinstance(item, dict) else None, folder / STATE, "data file")
        if not (folder / name).is_file():
            raise InvalidInputError(f"{folder / STATE} names data file '{name}', which is not in {folder}")


def _plain_name(value: Any, source: Path, kind: str) -> str:
    """A name datasets will join onto the folder: one path component, so it cannot leave the folder."""
    ok = (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and not any(c in value for c in "/\\\x00")
        and "::" not in value
        and len(value.encode("utf-8", "surrogateescape")) <= NAME_MAX
    )
    if not ok:
        shown = repr(value)[:80]
        raise InvalidInputError(
            f"{source} names {kind} {shown}, which is not a plain file name inside the folder; "
            "datasets would read it from elsewhere. Save the dataset again with save_to_disk"
        )
    return value


def _json_object(path: Path, roots: Sequence[Path]) -> dict[str, Any]:
    with open_inside(path, roots, what="dataset file") as fh:
        raw = fh.read(JSON_MAX_BYTES + 1)
    if len(raw) > JSON_MAX_BYTES:
        raise InvalidInputError(f"{path} is over {JSON_MAX_BYTES // 2**20} MiB; save the dataset again")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidInputError(f"{path} is not valid JSON ({type(exc).__name__}); save the dataset again") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path} must hold a JSON object; save the dataset again")
    return data
