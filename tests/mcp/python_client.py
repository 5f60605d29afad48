"""A client built on the official Python MCP SDK, against wf-host's /mcp.

Usage: python3 python_client.py URL

Lists the tools, calls `chain` with a progress callback, reads the run back,
and prints what it saw as one JSON object for the Rust test to check.
"""

import asyncio
import json
import sys

from mcp import Client


async def main(url: str) -> None:
    progress: list[list[float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append([done, total])

    async with Client(url) as client:
        tools = await client.list_tools()
        result = await client.call_tool("chain", {"text": "sdk"}, progress_callback=on_progress)
        run_id = (result.meta or {}).get("wf-host/run-id")
        run = await client.read_resource(f"wf-host://runs/{run_id}")
        record = json.loads(run.contents[0].text)
    print(
        json.dumps(
            {
                "tools": [t.name for t in tools.tools],
                "structured": result.structured_content,
                "is_error": bool(result.is_error),
                "progress": progress,
                "run_status": record["status"],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
