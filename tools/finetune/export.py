"""The merge process: `python -m gpubox.tools.finetune.export <spec.json>` (started by merge.Merger).

Loads the base in 16-bit (never 4-bit, whatever the job trained with), applies the adapter with peft, folds it in
with merge_and_unload, saves safetensors + tokenizer, then optionally writes a GGUF from the base's own GGUF
metadata. Prints 'progress i/n text' lines for the server to forward; writes result.json next to the spec (with
'error' for a failure the user can act on; anything else shows up as the process's output tail).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _progress(i: int, n: int, text: str) -> None:
    print(f"progress {i}/{n} {text}", flush=True)


def merge(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = 5 if spec["gguf_source"] else 4
    tmp = Path(spec["tmp_dir"])
    hf_tmp = tmp / "hf"
    t0 = time.perf_counter()
    _progress(0, steps, f"loading the base {Path(spec['base_hf']).name} in {spec['dtype']}")
    dtype = getattr(torch, DTYPES[spec["dtype"]])
    # no quantization_config: a QLoRA job's adapter is merged into the 16-bit weights, not the NF4 ones
    model = AutoModelForCausalLM.from_pretrained(spec["base_hf"], dtype=dtype)
    _progress(1, steps, f"applying the adapter {spec['adapter_name']}")
    peft_model = PeftModel.from_pretrained(model, spec["adapter_dir"])
    _progress(2, steps, "merging the adapter into the base weights")
    merged: Any = peft_model.merge_and_unload()
    _progress(3, steps, "saving the merged model (safetensors)")
    merged.save_pretrained(str(hf_tmp))
    tok_src = (
        spec["adapter_dir"] if (Path(spec["adapter_dir"]) / "tokenizer_config.json").is_file() else spec["base_hf"]
    )
    AutoTokenizer.from_pretrained(tok_src).save_pretrained(str(hf_tmp))
    hf_out = Path(spec["hf_out"])
    if hf_out.exists():
        raise GpuboxError(f"{hf_out} appeared while merging; pick another output_name")
    shutil.move(str(hf_tmp), str(hf_out))
    out: dict[str, Any] = {"hf_path": str(hf_out), "merge_s": round(time.perf_counter() - t0, 1)}
    if spec["gguf_source"]:
        from gpubox.tools.finetune.gguf_export import write_gguf

        _progress(4, steps, f"writing GGUF {spec['gguf']}")
        gguf_out = Path(spec["gguf_out"])
        gguf_tmp = tmp / gguf_out.name
        info = write_gguf(
            Path(spec["gguf_source"]), merged.state_dict(), gguf_tmp, spec["gguf"], name=spec["name"], log=print
        )
        shutil.move(str(gguf_tmp), str(gguf_out))
        out.update(gguf_path=str(gguf_out), gguf=info)
    _progress(steps, steps, "done")
    return out


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    result = spec_path.with_name("result.json")
    try:
        out = merge(spec)
    except GpuboxError as exc:
        hf = Path(spec["hf_out"])
        ready = f" (the merged HF folder at {hf} is complete)" if (hf / "config.json").is_file() else ""
        out = {"error": f"{exc}{ready}"}
    result.write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
