"""The fit / check split of decode.csv, fixed before any fitting (issue #23).

Rule: group the rows by the catalog's GPU class; inside each class, order the rows by
sha256("gpu|model|quant|context|tg_tok_s") and send every third one (positions 0, 3, 6, ...) to 'check'.
The hash makes the choice independent of the numbers a model would predict; grouping by class gives
every class check rows. `python bench/estimator_eval/decode_split.py --write` rewrites the split column;
tests/estimate/test_decode_eval.py fails if the stored column and the rule ever disagree.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from pathlib import Path

from gpubox.tools.estimate.catalog import package_catalog

HERE = Path(__file__).resolve().parent
DECODE_CSV = HERE / "decode.csv"
FIELDS = ["gpu", "model", "quant", "context", "tg_tok_s", "measured_on", "date", "split", "source"]


def row_key(row: dict[str, str]) -> str:
    text = "|".join(row[k] for k in ("gpu", "model", "quant", "context", "tg_tok_s"))
    return hashlib.sha256(text.encode()).hexdigest()


def assign_split(rows: list[dict[str, str]]) -> dict[str, str]:
    """row_key -> 'fit' or 'check'."""
    cat = package_catalog()
    by_class: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_class.setdefault(cat.gpu(r["gpu"]).gpu_class, []).append(r)
    out: dict[str, str] = {}
    for members in by_class.values():
        for i, r in enumerate(sorted(members, key=row_key)):
            out[row_key(r)] = "check" if i % 3 == 0 else "fit"
    return out


def load(path: Path = DECODE_CSV) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write(rows: list[dict[str, str]], path: Path = DECODE_CSV) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    data = load()
    split = assign_split(data)
    for r in data:
        r["split"] = split[row_key(r)]
    if "--write" in sys.argv:
        write(data)
    print({s: sum(r["split"] == s for r in data) for s in ("fit", "check")})
