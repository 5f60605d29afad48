"""A client built on the official Python MCP SDK that approves a waiting run.

Usage: python3 python_approver.py URL [TOOL [ARGUMENTS_JSON]]

Calls `deploy` (a workflow with an approval step; or TOOL) with an
elicitation callback that accepts: with `{answer}` when the question asks
for one (a question an upstream server asked the run), else an approval
with a comment; the SDK answers the server's
questions by itself (as `input_required` rounds on 2026-07-28, as
`elicitation/create` requests before). Prints what it saw as one JSON object
for the Rust test to check.
"""

import asyncio
import json
import sys

import mcp.types as types
from mcp import Client

asked: list[str] = []


async def approve(context, params) -> types.ElicitResult:
    asked.append(params.message)
    if "answer" in (params.requested_schema or {}).get("properties", {}):
        return types.ElicitResult(action="accept", content={"answer": "from python"})
    return types.ElicitResult(action="accept", content={"approved": True, "comment": "from python"})


async def main(url: str, tool: str, arguments: dict) -> None:
    async with Client(url, elicitation_callback=approve) as client:
        result = await client.call_tool(tool, arguments)
    print(
        json.dumps(
            {
                "asked": asked,
                "structured": result.structured_content,
                "text": [c.text for c in result.content if getattr(c, "type", None) == "text"],
                "is_error": bool(result.is_error),
                "run_id": (result.meta or {}).get("wf-host/run-id"),
            }
        )
    )


if __name__ == "__main__":
    tool = sys.argv[2] if len(sys.argv) > 2 else "deploy"
    arguments = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {"release": "py"}
    asyncio.run(main(sys.argv[1], tool, arguments))
