"""An MCP server on the official Python SDK (`mcp` 2.x), for tests/interop.rs.

It offers what the pool's scenarios need, like the fixture in host/src/fixture/:

- tools `echo {text}`, `add {a, b}`, `sleep {ms}` (records a cancellation),
  `crash` (exits without answering), `ask {message}` (elicits `{answer}`), `ask_mid_call {message}`
  (elicits it inside the call, the pre-2026-07-28 way), `register_extra` (adds the tool `extra`
  and announces it the mcp 2.x way, `ctx.notify_tools_changed()`, which reaches
  only `subscriptions/listen` subscribers) and `call_log`;
- the resource `interop://greeting` and the prompt `greet {name}`.

`call_log` answers {"calls": [{"tool", "arguments", "protocol", "at"}],
"cancelled": [{"tool"}]}: every call before it and every call cancelled by
`notifications/cancelled`, with the protocol revision each call came in on
and when it came (Unix seconds; a `sleep` that finished has `ended` too).

    python server.py                 # stdio
    python server.py --http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp (0 picks one)

Over HTTP it prints `listening on http://127.0.0.1:PORT/mcp` on stderr once
it accepts connections.
"""

import argparse
import os
import socket
import sys
import time
from typing import Annotated

import anyio
from pydantic import BaseModel

from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve

CRASH_EXIT_CODE = 3

server = MCPServer("interop-python", version="0.0.0")
calls: list[dict] = []
cancelled: list[dict] = []


def record(tool: str, arguments: dict, ctx: Context) -> dict:
    entry = {"tool": tool, "arguments": arguments, "protocol": ctx.protocol_version, "at": time.time()}
    calls.append(entry)
    return entry


@server.tool()
def echo(text: str, ctx: Context) -> str:
    """Returns `text` unchanged."""
    record("echo", {"text": text}, ctx)
    return text


@server.tool()
def add(a: float, b: float, ctx: Context) -> str:
    """Adds two numbers; returns the sum as text."""
    record("add", {"a": a, "b": b}, ctx)
    total = a + b
    return str(int(total) if total.is_integer() else total)


@server.tool()
async def sleep(ms: int, ctx: Context) -> str:
    """Waits `ms` milliseconds; a cancelled call is recorded in call_log."""
    entry = record("sleep", {"ms": ms}, ctx)
    try:
        await anyio.sleep(ms / 1000)
    except anyio.get_cancelled_exc_class():
        cancelled.append({"tool": "sleep"})
        raise
    entry["ended"] = time.time()
    return f"slept {ms}ms"


@server.tool()
def crash(ctx: Context) -> str:
    """Exits the server process at once, without answering."""
    record("crash", {}, ctx)
    sys.stdout.flush()
    os._exit(CRASH_EXIT_CODE)


def extra(text: str = "") -> str:
    """Registered at runtime by register_extra; returns "extra: <text>"."""
    return f"extra: {text}"


@server.tool()
async def register_extra(ctx: Context) -> str:
    """Adds the tool `extra` and publishes tools list_changed (subscriptions/listen)."""
    record("register_extra", {}, ctx)
    if "extra" not in [t.name for t in await server.list_tools()]:
        server.add_tool(extra)
    await ctx.notify_tools_changed()
    return "registered"


class Answer(BaseModel):
    answer: str


def ask_answer(message: str = "What is the answer?") -> Elicit[Answer]:
    """Resolves `ask`'s answer by asking the client: mid-call before 2026-07-28,
    as an `input_required` round from it on."""
    return Elicit(message, Answer)


@server.tool()
async def ask(
    ctx: Context,
    answer: Annotated[ElicitationResult[Answer], Resolve(ask_answer)],
    message: str = "What is the answer?",
) -> str:
    """Asks the client for `{answer}` (a form elicitation); returns "answer: <answer>", "declined" or "cancelled"."""
    record("ask", {"message": message}, ctx)
    if answer.action == "accept":
        return f"answer: {answer.data.answer}"
    return "declined" if answer.action == "decline" else "cancelled"


@server.tool()
async def ask_mid_call(ctx: Context, message: str = "What is the answer?") -> str:
    """Asks the client for `{answer}` inside the call with `ctx.elicit`, as
    servers written before 2026-07-28 do; a 2026-07-28 session has no
    back-channel for it, and the call fails."""
    record("ask_mid_call", {"message": message}, ctx)
    answer = await ctx.elicit(message, Answer)
    if answer.action == "accept":
        return f"answer: {answer.data.answer}"
    return "declined" if answer.action == "decline" else "cancelled"


@server.tool()
def call_log() -> dict:
    """Every call before this one, and the cancelled ones."""
    return {"calls": list(calls), "cancelled": list(cancelled)}


@server.resource("interop://greeting", mime_type="text/plain")
def greeting() -> str:
    """A plain-text greeting."""
    return "hello from python"


@server.prompt()
def greet(name: str) -> str:
    """Asks the model to greet someone."""
    return f"Say hello to {name}."


async def serve_http(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning")

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            print(f"listening on http://127.0.0.1:{bound}/mcp", file=sys.stderr, flush=True)

    await Announcing(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    args = parser.parse_args()
    if args.http is None:
        server.run()
    else:
        anyio.run(serve_http, args.http)


if __name__ == "__main__":
    main()
