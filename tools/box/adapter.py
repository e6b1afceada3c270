"""Box coordinator family: box_plan (what fits now, and whether a proposed action would)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from gpubox import services
from gpubox.errors import CapacityError, InvalidInputError
from gpubox.registry import READ_ONLY, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.box.schemas import Admission, BoxPlan


def plan_action(
    state: AppState,
    load: str | None,
    context_length: int | None,
    finetune_plan_id: str | None,
    benchmark: Literal["attention", "device"] | None,
    serve: str | None = None,
) -> BoxPlan:
    asked = [a for a in (load, finetune_plan_id, benchmark, serve) if a is not None]
    if len(asked) > 1:
        raise InvalidInputError(
            "box_plan checks one action at a time: pass only one of load, finetune_plan_id, benchmark, serve"
        )
    if context_length is not None and load is None and serve is None:
        raise InvalidInputError("context_length goes with load or serve (the model whose context it sets)")
    ledger = services.ledger(state)
    if load is not None:
        p, adm, evicts = services.models(state).plan_load(load, context_length)
        if evicts:
            adm = adm.model_copy(
                update={
                    "fits": True,
                    "reason": f"fits after evicting idle models (least recently used): {', '.join(evicts)}",
                }
            )
        return BoxPlan(box=ledger.state(), action=f"infer_load {load}", admission=adm, plan=p.model_dump())
    if finetune_plan_id is not None:
        from gpubox.tools.finetune.admission import needs_of

        plan = services.finetuner(state).load_plan(finetune_plan_id)
        adm = ledger.check(needs_of(plan))
        summary = {
            "device": plan.device,
            "estimated_memory_gb": plan.estimated_memory_gb,
            "num_processes": plan.request.num_processes,
        }
        return BoxPlan(box=ledger.state(), action=f"finetune_launch {finetune_plan_id}", admission=adm, plan=summary)
    if serve is not None:
        from gpubox.tools.serve.plan import Overrides

        try:
            _base, sp, _args = services.serve(state).plan(serve, Overrides(max_model_len=context_length))
        except CapacityError as exc:  # the planner found no flags that fit: that is the answer
            adm = Admission(fits=False, needs={}, reason=str(exc))
            return BoxPlan(box=ledger.state(), action=f"serve_start {serve}", admission=adm)
        adm = ledger.check(sp.memory_gb)
        return BoxPlan(box=ledger.state(), action=f"serve_start {serve}", admission=adm, plan=sp.model_dump())
    if benchmark is not None:
        params = {"batch": 1, "causal": False, "backward": False, "device": "auto"}
        adm = ledger.check(services.bench(state).expected(benchmark, params))
        return BoxPlan(box=ledger.state(), action=f"bench_{benchmark} (defaults)", admission=adm)
    return BoxPlan(box=ledger.state())


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=READ_ONLY, title="Box memory plan")
    async def box_plan(
        ctx: Context,
        load: Annotated[str | None, Field(max_length=256, description="Model name: would infer_load fit now?")] = None,
        context_length: Annotated[int | None, Field(ge=128, le=1_048_576, description="With load or serve")] = None,
        finetune_plan_id: Annotated[
            str | None, Field(max_length=64, description="plan_id: would finetune_launch fit now?")
        ] = None,
        benchmark: Annotated[
            Literal["attention", "device"] | None, Field(description="Would this benchmark (defaults) fit now?")
        ] = None,
        serve: Annotated[str | None, Field(max_length=4096, description="Model: would serve_start fit now?")] = None,
    ) -> BoxPlan:
        """Memory per device (host, each GPU): budget, held by gpubox's work and by whom, used outside, free;
        the queue. Given one proposed action: does it fit, and if not, which calls free enough."""
        state = app_state(ctx)
        return await anyio.to_thread.run_sync(
            lambda: plan_action(state, load, context_length, finetune_plan_id, benchmark, serve)
        )
