"""A stdio MCP server of revision 2025-11-25 that exits when the first request
is not `initialize` (or `ping`), as servers built on rmcp before 3.x do: they
close the connection on a `server/discover` probe instead of answering it.

Standard library only. Offers the tool `echo {text}`. When WF_INTEROP_WITNESS
names a file, each process appends the method of the first request it got.
"""

import json
import os
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


ECHO = {
    "name": "echo",
    "description": "Returns `text` unchanged.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


def main() -> None:
    first = True
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if first and method != "ping" and "id" in message:
            first = False
            witness = os.environ.get("WF_INTEROP_WITNESS")
            if witness:
                with open(witness, "a") as f:
                    f.write(method + "\n")
            if method != "initialize":
                sys.exit("expected an initialize request")
        if "id" not in message:
            continue  # a notification
        id = message["id"]
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "initialize-first", "version": "0.0.0"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": [ECHO]}
        elif method == "tools/call" and message["params"]["name"] == "echo":
            text = message["params"]["arguments"]["text"]
            result = {"content": [{"type": "text", "text": text}]}
        else:
            send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": f"unknown method {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": id, "result": result})


if __name__ == "__main__":
    main()
