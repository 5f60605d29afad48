"""Minimal stdio MCP server for host/benches/pool.rs: one tool, `echo {text}`.

Uses the official `mcp` package: `MCPServer` in mcp 2.x, `FastMCP` in mcp 1.x.
Install with `bench/setup.sh` (a venv at bench/python-echo-server/.venv).
"""

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as Server

server = Server("python-echo")


@server.tool()
def echo(text: str) -> str:
    """Returns `text` unchanged."""
    return text


if __name__ == "__main__":
    server.run()  # stdio
