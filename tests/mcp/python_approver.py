"""A client built on the official Python MCP SDK that approves a waiting run.

Usage: python3 python_approver.py URL

Calls `deploy` (a workflow with an approval step) with an elicitation
callback that accepts, with a comment; the SDK answers the server's
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
    return types.ElicitResult(action="accept", content={"approved": True, "comment": "from python"})


async def main(url: str) -> None:
    async with Client(url, elicitation_callback=approve) as client:
        result = await client.call_tool("deploy", {"release": "py"})
    print(
        json.dumps(
            {
                "asked": asked,
                "structured": result.structured_content,
                "is_error": bool(result.is_error),
                "run_id": (result.meta or {}).get("wf-host/run-id"),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
