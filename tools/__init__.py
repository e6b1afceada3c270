"""gpubox.tools: one package per tool family, each registering its tools in
`<family>/adapter.py`; the tuple in families() is the registry."""

from __future__ import annotations

from types import ModuleType


def families() -> tuple[ModuleType, ...]:
    """Every family module, each exposing `register(mcp)`. Importing them loads no heavy library."""
    from gpubox.tools.bench import adapter as bench
    from gpubox.tools.box import adapter as box
    from gpubox.tools.estimate import adapter as estimate
    from gpubox.tools.finetune import adapter as finetune
    from gpubox.tools.gpu import adapter as gpu
    from gpubox.tools.inference import adapter as inference
    from gpubox.tools.search import adapter as search
    from gpubox.tools.serve import adapter as serve

    return (gpu, box, estimate, search, inference, serve, finetune, bench)
