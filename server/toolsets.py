"""Toolsets: which families (or single tools) a server exposes, so a client pays context only for what it uses.

`tools = ["gpu", "estimate", "search"]` (GPUBOX_TOOLS=gpu,estimate,search, `--tools`, or the TOML file) exposes
those families; a tool name (`infer_chat`) adds one tool. Empty: everything. Resources and prompts follow the
families that are exposed.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpubox.errors import ConfigError

FAMILIES = ("gpu", "box", "estimate", "search", "infer", "serve", "finetune", "bench")


def family_of(tool: str) -> str:
    return tool.split("_", 1)[0]


class Toolset:
    def __init__(self, chosen: Iterable[str]) -> None:
        self.chosen = [c.strip() for c in chosen if c.strip()]

    @property
    def everything(self) -> bool:
        return not self.chosen or "all" in self.chosen

    def check(self, tool_names: Iterable[str]) -> None:
        names = set(tool_names)
        unknown = [c for c in self.chosen if c != "all" and c not in FAMILIES and c not in names]
        if unknown:
            raise ConfigError(
                f"tools: unknown {', '.join(unknown)}; use families ({', '.join(FAMILIES)}) or tool names"
            )

    def exposes_tool(self, tool: str) -> bool:
        return self.everything or tool in self.chosen or family_of(tool) in self.chosen

    def families(self) -> set[str]:
        """Families with at least one exposed tool (their resources and prompts are served)."""
        if self.everything:
            return set(FAMILIES)
        return {c if c in FAMILIES else family_of(c) for c in self.chosen}
