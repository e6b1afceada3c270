"""Build the eval corpora's indexes in-process (no MCP layer) for tune_rank.py, optionally with a different
embedding text, so a chunker change can be measured before it is wired into the indexer.

    .venv/bin/python bench/search_eval/tune_index.py --state-dir DIR [--embed plain|context] [--corpus NAME ...]

plain: the indexer's own embed_text; context: tools/search/chunker.embedding_text (path, qualified name,
signature, then the code).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch import DEFAULT_CACHE, DEFAULT_DEST, QUERIES_DIR, fetch, load_specs

from gpubox.settings import Settings
from gpubox.tools.search import indexer
from gpubox.tools.search.chunker import embedding_text
from gpubox.tools.search.service import SearchService


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--embed", choices=("plain", "context"), default="context")
    ap.add_argument("--corpus", action="append")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.embed == "context":
        indexer.embed_text = embedding_text  # type: ignore[assignment]
    svc = SearchService(Settings.load(state_dir=args.state_dir, allowed_roots=[DEFAULT_DEST.resolve()]))
    for spec in load_specs(args.corpus):
        if not (QUERIES_DIR / f"{spec.name}.jsonl").exists():
            continue
        root = fetch(spec, DEFAULT_CACHE, DEFAULT_DEST)
        t0 = time.monotonic()
        name, root, progress = svc.start_index(str(root), spec.name, [], [], None)
        progress.done.wait()
        r = svc.result(name, root, progress)
        print(f"{name}: {r.state} {r.files} files {r.chunks} chunks in {time.monotonic() - t0:.0f} s {r.message}")
    svc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
