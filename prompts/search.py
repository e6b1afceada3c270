"""explain_code: answer a question about a codebase from search results."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def register(mcp: MCPServer[Any]) -> None:
    @mcp.prompt(title="Explain code")
    def explain_code(
        question: Annotated[str, Field(description="What to explain, e.g. 'how are tokens refreshed?'")],
        index: Annotated[str, Field(description="Index name (search_list shows them)")] = "",
    ) -> str:
        """Explain part of a codebase by searching it first, citing files and lines."""
        where = f" in index '{index}'" if index else ""
        return (
            f"Answer this question about the codebase{where}: {question}\n\n"
            "1. Call `search_code` with the question (mode hybrid), and again with any identifiers you meet.\n"
            "2. Read the hits' snippets; page with `offset` if the first hits do not answer it.\n"
            "3. Explain how the code works, citing every claim as path:start_line-end_line.\n"
            "4. Say plainly what the search did not show rather than guessing."
        )
