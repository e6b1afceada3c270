"""finetune_merge's core: fold a finished job's LoRA adapter into a 16-bit copy of its base, save it as an HF
folder that infer_models lists, and optionally export that to GGUF for llama.cpp.

The merge itself runs in a child process (`python -m gpubox.tools.finetune.export`): loading a 7B base and
writing it out takes minutes and several GB of RAM, none of which should stay in the server; the process has a
time limit, is killed when the client cancels, and reports its stages as MCP progress. Outputs are written under
`<state_dir>/finetune/merge-tmp/` and moved into `<state_dir>/models/` when complete, so the inference registry
never sees a half-written model. The base is always reloaded in 16-bit from the job's HF folder, also for QLoRA
jobs: merging into a 4-bit base rounds the merged weights to NF4 again and corrupts outputs (peft warns about it).
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

from gpubox.child import python_module, run_child
from gpubox.errors import BusyError, CapacityError, InvalidInputError, NotFoundError
from gpubox.progress import Progress
from gpubox.settings import Settings
from gpubox.tools.finetune.gguf_export import CONVERTER_HINT, OutType, check_exportable
from gpubox.tools.finetune.service import Finetuner
from gpubox.tools.inference.registry import check_model_folder, read_json_object

Dtype = Literal["auto", "fp16", "bf16", "fp32"]
GgufOut = Literal["none", "f16", "q8_0", "f32"]
BYTES = {"fp16": 2.0, "bf16": 2.0, "fp32": 4.0, "f16": 2.0, "f32": 4.0, "q8_0": 34 / 32}  # q8_0: 32 int8 + f16 scale
ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
ST_HEADER_MAX = 100_000_000
DISK_MARGIN = 1.05
DISK_SLACK = 64 << 20


class MergeResult(BaseModel):
    name: str = Field(description="Name of the merged model in infer_models")
    job_id: str
    adapter_name: str
    method: str = Field(description="How the job trained (lora / qlora); the merge always used a 16-bit base")
    base_model: str = Field(description="The HF folder of the base the adapter was merged into")
    dtype: Literal["fp16", "bf16", "fp32"] = Field(description="Dtype of the base load and the saved weights")
    parameters: int
    hf_path: str = Field(description="Merged HF folder (safetensors + tokenizer); infer_load serves it")
    hf_size_gb: float
    gguf_path: str | None = Field(default=None, description="GGUF file for llama.cpp, when requested")
    gguf_outtype: OutType | None = None
    gguf_size_gb: float | None = None
    gguf_name: str | None = Field(default=None, description="Name of the GGUF in infer_models")
    seconds: float
    disk_free_gb: float = Field(description="Free disk before the merge")
    disk_needed_gb: float = Field(description="What the check before the merge asked for")
    next_step: str


def parameter_count(folder: Path) -> tuple[int, str | None]:
    """Parameters and stored dtype of an HF folder, from the safetensors headers alone (no weights read)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise NotFoundError(f"no *.safetensors in {folder}; the base HF folder is incomplete, plan the job again")
    total, dtype = 0, None
    for f in files:
        for t in _tensors(f):
            count = 1
            for d in t["shape"]:
                count *= int(d)
            total += count
            dtype = dtype or t.get("dtype")
    return total, dtype


def _tensors(path: Path) -> list[dict[str, Any]]:
    """The tensor entries of a safetensors header: 8-byte little-endian length, then that much JSON
    (https://huggingface.co/docs/safetensors, which caps the header at 100 MB)."""
    with path.open("rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        raw = fh.read(n) if 0 < n <= ST_HEADER_MAX else b""
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        header = None
    tensors = [t for k, t in header.items() if k != "__metadata__"] if isinstance(header, dict) else None
    ok = tensors is not None and all(
        isinstance(t, dict)
        and isinstance(t.get("shape"), list)
        and all(isinstance(d, int) and 0 <= d < 2**40 for d in t["shape"])
        for t in tensors
    )
    if not ok or tensors is None:
        raise InvalidInputError(f"{path} is not a valid safetensors file (its header does not parse); save it again")
    return tensors


class Merger:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models_dir = settings.state_dir / "models"
        self.tmp_root = settings.state_dir / "finetune" / "merge-tmp"
        self.running: str | None = None
        # injectable so a test can simulate a full disk without filling one
        self.disk_free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free

    # --- checks (no heavy imports) -------------------------------------------------------------
    def resolve_job(self, ft: Finetuner, job: str) -> dict[str, Any]:
        row = ft.store.get(job) if job.isalnum() else None
        if row is None:
            rows = [r for r in ft.store.all() if r["adapter_name"].lower() == job.lower()]
            if not rows:
                raise NotFoundError(
                    f"no fine-tuning job or adapter named '{job}'; finetune_list shows jobs and their adapter_name"
                )
            row = rows[0]
        row = ft.row(row["id"])
        if row["state"] != "completed":
            hint = (
                f"wait for it with finetune_status job_id='{row['id']}' wait_seconds=60"
                if row["state"] in ("starting", "running")
                else f"finetune_resume job_id='{row['id']}' finishes it"
            )
            raise InvalidInputError(
                f"job {row['id']} is {row['state']}, not completed; only a finished adapter merges; {hint}"
            )
        if not (ft.store.job_dir(row["id"]) / "config.json").is_file():  # its folder was removed by hand
            raise NotFoundError(
                f"job {row['id']} has no files left in {ft.store.job_dir(row['id'])}; its adapter cannot be merged"
            )
        return row

    def prepare(self, ft: Finetuner, job: str, output_name: str | None, dtype: Dtype, gguf: GgufOut) -> dict[str, Any]:
        """Validate everything and return the child process's spec; raises before anything is written."""
        row = self.resolve_job(ft, job)
        try:
            cfg = json.loads((ft.store.job_dir(row["id"]) / "config.json").read_text(encoding="utf-8"))
            cfg["base"]["hf_path"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NotFoundError(f"job {row['id']}'s config.json cannot be read ({exc}); it cannot be merged") from None
        result = json.loads(row["result"]) if row["result"] else {}
        adapter = Path(result.get("adapter_path") or cfg["adapter_dir"])
        if not (adapter / "adapter_config.json").is_file():
            if row["method"] == "full":
                raise InvalidInputError(
                    f"job {row['id']} was a full fine-tune: {adapter} already holds the whole model, there is no "
                    "adapter to merge; infer_load serves it as it is"
                )
            raise NotFoundError(f"the adapter of job {row['id']} is missing at {adapter}; it was deleted")
        base = cfg["base"]
        hf_base = Path(base["hf_path"])
        if not (hf_base / "config.json").is_file():
            raise NotFoundError(
                f"the base HF folder {hf_base} of job {row['id']} is missing; plan and run a job on that model "
                "again to rebuild it"
            )
        # a job may have trained on a user's HF folder, which can have changed since: checked file by file again
        roots = [*ft.roots, ft.base_dir, self.models_dir]
        check_model_folder(hf_base.resolve(), roots, what="base model folder")
        base_cfg = read_json_object(hf_base / "config.json", roots)
        quant = base_cfg.get("quantization_config")
        if quant:
            method = quant.get("quant_method") if isinstance(quant, dict) else quant
            raise InvalidInputError(
                f"the base {hf_base} is stored quantized ({str(method)[:40]}); "
                "merging into quantized weights corrupts outputs. Merge onto the unquantized original model"
            )
        name = output_name or f"{row['adapter_name']}-merged"
        self._check_name(name, gguf)
        params, stored = parameter_count(hf_base)
        if dtype == "auto":
            # a bf16 original stays bf16 (its range); anything else (an fp32 dequantized GGUF) goes to fp16,
            # which every backend, llama.cpp's f16 included, reads
            dtype = "bf16" if (base_cfg.get("dtype") or base_cfg.get("torch_dtype")) == "bfloat16" else "fp16"
        gguf_source = None
        if gguf != "none":
            if base["format"] != "gguf":
                gguf_source = None  # decided after the merge: the HF folder is still worth writing
            else:
                gguf_source = base["path"]
                check_exportable(Path(gguf_source))
        self.models_dir.mkdir(parents=True, exist_ok=True)
        hf_gb = params * BYTES[dtype] / 1e9
        gguf_gb = params * BYTES[gguf] / 1e9 if gguf != "none" else 0.0
        need = (hf_gb + gguf_gb) * DISK_MARGIN + DISK_SLACK / 1e9
        free = self.disk_free(self.models_dir) / 1e9
        if need > free:
            parts = f"HF {dtype} {hf_gb:.2f} GB" + (f" + GGUF {gguf} {gguf_gb:.2f} GB" if gguf_gb else "")
            raise CapacityError(
                f"not enough disk for the merge: it needs about {need:.2f} GB ({parts}, {params / 1e9:.2f}B "
                f"parameters) in {self.models_dir}, and {free:.2f} GB are free; free some space"
                + (", or merge without GGUF (gguf='none')" if gguf_gb else "")
            )
        tmp = self.tmp_root / name
        return {
            "job_id": row["id"],
            "adapter_name": row["adapter_name"],
            "method": row["method"],
            "name": name,
            "adapter_dir": str(adapter),
            "base_hf": str(hf_base),
            "base_format": base["format"],
            "stored_dtype": stored,
            "dtype": dtype,
            "parameters": params,
            "gguf": gguf,
            "gguf_source": gguf_source,
            "tmp_dir": str(tmp),
            "hf_out": str(self.models_dir / name),
            "gguf_out": str(self.models_dir / f"{name}-{gguf}.gguf") if gguf != "none" else None,
            "disk_free_gb": round(free, 3),
            "disk_needed_gb": round(need, 3),
        }

    def _check_name(self, name: str, gguf: GgufOut) -> None:
        from gpubox.tools.inference.registry import discover

        s = self.settings
        taken = discover([*s.model_dirs, self.models_dir, s.state_dir / "finetune" / "adapters"])
        names = [name] + ([f"{name}-{gguf}"] if gguf != "none" else [])
        for n in names:
            if n.lower() in taken or (self.models_dir / n).exists() or (self.models_dir / f"{n}.gguf").exists():
                raise InvalidInputError(
                    f"a model named '{n}' already exists (infer_models lists it); pick another output_name"
                )

    # --- run --------------------------------------------------------------------------------------
    async def run(self, spec: dict[str, Any], time_limit_s: float, progress: Progress) -> MergeResult:
        if self.running is not None:
            raise BusyError(f"a merge into '{self.running}' is running; one merge at a time, try again after it")
        self.running = spec["name"]
        tmp = Path(spec["tmp_dir"])
        # the file work (staging, reading the result, sizing the output, removing trees of GBs) runs off the event
        # loop; removals run shielded, so a cancelled merge still cleans up
        try:
            # the process moves the HF folder into models/ before it writes the GGUF; a merge stopped after that
            # (time limit, cancel) must not leave a half-finished model behind, so what it placed is removed
            outputs = [Path(p) for p in (spec["hf_out"], spec.get("gguf_out")) if p]
            existed = await anyio.to_thread.run_sync(_stage, tmp, spec, outputs)
            t0 = time.monotonic()
            try:
                log = await self._child(tmp, time_limit_s, progress)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_remove, [p for p in outputs if p not in existed])
                raise
            return await anyio.to_thread.run_sync(self._finish, spec, tmp, log, t0)
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_remove, [tmp])
            finally:
                self.running = None  # after the removal: the next merge of this name stages the same tmp dir

    def _finish(self, spec: dict[str, Any], tmp: Path, log: list[str], t0: float) -> MergeResult:
        out = json.loads((tmp / "result.json").read_text()) if (tmp / "result.json").is_file() else None
        if out is None:
            tail = "\n".join(log[-15:])
            raise InvalidInputError(f"the merge process failed; its last output:\n{tail}")
        if out.get("error"):
            raise InvalidInputError(out["error"])
        if spec["gguf"] != "none" and not out.get("gguf_path"):
            raise InvalidInputError(no_gguf_origin(out["hf_path"], spec["name"]))
        return self._result(spec, out, time.monotonic() - t0)

    def _result(self, spec: dict[str, Any], out: dict[str, Any], seconds: float) -> MergeResult:
        gguf_path = Path(out["gguf_path"]) if out.get("gguf_path") else None
        gguf_name = gguf_path.stem.lower() if gguf_path else None
        serve = f"infer_load name='{spec['name']}' (transformers)"
        if gguf_name:
            serve += f" or name='{gguf_name}' (llama.cpp)"
        return MergeResult(
            name=spec["name"],
            job_id=spec["job_id"],
            adapter_name=spec["adapter_name"],
            method=spec["method"],
            base_model=spec["base_hf"],
            dtype=spec["dtype"],
            parameters=spec["parameters"],
            hf_path=out["hf_path"],
            hf_size_gb=round(_size(Path(out["hf_path"])) / 1e9, 3),
            gguf_path=str(gguf_path) if gguf_path else None,
            gguf_outtype=spec["gguf"] if gguf_path else None,
            gguf_size_gb=round(gguf_path.stat().st_size / 1e9, 3) if gguf_path else None,
            gguf_name=gguf_name,
            seconds=round(seconds, 1),
            disk_free_gb=spec["disk_free_gb"],
            disk_needed_gb=spec["disk_needed_gb"],
            next_step=serve + ", then infer_chat",
        )

    async def _child(self, tmp: Path, time_limit_s: float, progress: Progress) -> list[str]:
        """Run the export process, forwarding its 'progress i/n text' lines; killed on timeout or cancel."""

        async def on_line(line: str) -> None:
            if line.startswith("progress "):
                step, _, text = line[9:].partition(" ")
                done, _, total = step.partition("/")
                await progress(float(done), float(total), text)

        cmd = python_module("gpubox.tools.finetune.export", str(tmp / "spec.json"))
        out = await run_child(cmd, time_limit_s=time_limit_s, on_line=on_line, stderr_to_stdout=True, cwd=tmp)
        if out.timed_out:
            raise CapacityError(
                f"the merge ran past time_limit_s={time_limit_s:g} s and was stopped; nothing was kept. "
                "Give it a larger time_limit_s (a 7B model takes minutes on a GPU box, longer on CPU)"
            )
        return out.lines


def _stage(tmp: Path, spec: dict[str, Any], outputs: list[Path]) -> set[Path]:
    """A fresh tmp dir holding the spec; returns the outputs that already existed (a failed merge keeps them)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "spec.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    return {p for p in outputs if p.exists()}


def _remove(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def no_gguf_origin(hf_path: str, name: str) -> str:
    return (
        f"the merged HF folder is ready at {hf_path} (infer_models lists it as '{name}'), but its base did not come "
        f"from a GGUF file, so there is no tokenizer metadata to copy and no GGUF was written; {CONVERTER_HINT}"
    )
