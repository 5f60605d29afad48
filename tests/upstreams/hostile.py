#!/usr/bin/env python3
"""A misbehaving MCP server, for testing how a client copes with a hostile upstream.

Standard library only. JSON-RPC 2.0, MCP revision 2025-06-18 (`initialize`;
any other method it does not know, e.g. the `server/discover` probe, gets
-32601).

    python3 hostile.py stdio          newline-delimited JSON-RPC on stdin/stdout
    python3 hostile.py http PORT      streamable HTTP at http://127.0.0.1:PORT/mcp
                                      (PORT 0: any free port); prints
                                      `listening on PORT` once ready

Over HTTP, POST /mcp answers a request with application/json, or with
text/event-stream where the tool streams; a notification or response gets 202;
GET /mcp gets 405 (no standalone stream), DELETE /mcp 200. A session id is
handed out on `initialize` but never checked.

Tools (arguments are optional):

- `ok`: answers "ok" at once. The control.
- `silent`: accepts the call and never answers it. Over HTTP the POST gets
  event-stream headers and then nothing, the connection held open.
- `endless`: never answers; sends notifications forever, one every `interval_ms`
  (default 1) milliseconds: over stdio on stdout, over HTTP as events of the
  call's event stream (until the client hangs up). `kind`: "message"
  (`notifications/message` logging, the default), "progress"
  (`notifications/progress` with the call's progressToken), or "both".
- `flood`: sends `count` (default 200000) notifications of `kind` as fast as it
  can, then the result ("flooded N"). Over HTTP they are events of the call's
  event stream.
- `huge`: answers with a result whose text is `mb` (default 50) MB long, one
  JSON-RPC message: one line over stdio; over HTTP an application/json body,
  or one event of an event stream when `sse` is true.

Cancellation (`notifications/cancelled`) is ignored: a hostile server does
not stop.

With HOSTILE_LOG=FILE set, every message received (method and id; a
cancellation's requestId) and the end of every stream it sends is appended
to FILE, one line each, with a timestamp.
"""

import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL = "2025-06-18"
OPTIONAL = {
    "kind": {"type": "string", "enum": ["message", "progress", "both"]},
    "count": {"type": "integer"},
    "interval_ms": {"type": "number"},
    "mb": {"type": "number"},
    "sse": {"type": "boolean"},
}
TOOLS = [
    {"name": name, "description": doc, "inputSchema": {"type": "object", "properties": OPTIONAL}}
    for name, doc in [
        ("ok", "Answers 'ok' at once."),
        ("silent", "Never answers."),
        ("endless", "Sends notifications forever, never the result."),
        ("flood", "Sends `count` notifications as fast as it can, then the result."),
        ("huge", "Answers with `mb` MB of text."),
    ]
]


def log(what):
    if os.environ.get("HOSTILE_LOG"):
        with open(os.environ["HOSTILE_LOG"], "a") as f:
            f.write(f"{time.time():.3f} {what}\n")


def received(msg):
    params = msg.get("params") or {}
    log(f"<- {msg.get('method')} id={msg.get('id')} {params.get('name') or params.get('requestId') or ''}")


def result(id, value):
    return {"jsonrpc": "2.0", "id": id, "result": value}


def error(id, code, message):
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}


def text(s):
    return {"content": [{"type": "text", "text": s}], "isError": False}


def notifications(params, seq):
    """The endless stream of notifications a tool call of `kind` sends: bytes
    of one JSON-RPC message each, numbered from `seq`."""
    args = params.get("arguments") or {}
    kind = args.get("kind", "message")
    token = (params.get("_meta") or {}).get("progressToken")
    if token is None and kind != "message":
        kind = "message"  # progress needs the call's token
    while True:
        seq += 1
        if kind == "progress" or (kind == "both" and seq % 2):
            msg = {"method": "notifications/progress",
                   "params": {"progressToken": token, "progress": seq, "message": f"step {seq}"}}
        else:
            msg = {"method": "notifications/message",
                   "params": {"level": "info", "logger": "hostile", "data": f"notification {seq}"}}
        msg["jsonrpc"] = "2.0"
        yield json.dumps(msg).encode()


def answer(msg):
    """The answer to a message other than a slow tool call, or None."""
    id, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
    if id is None or method is None:
        return None  # a notification, or a response to us
    if method == "initialize":
        return result(id, {"protocolVersion": PROTOCOL, "capabilities": {"tools": {}},
                           "serverInfo": {"name": "hostile", "version": "0.1"}})
    if method == "ping":
        return result(id, {})
    if method == "tools/list":
        return result(id, {"tools": TOOLS})
    if method == "tools/call":
        name = params.get("name")
        if name == "ok":
            return result(id, text("ok"))
        if name == "huge":
            mb = (params.get("arguments") or {}).get("mb", 50)
            return result(id, text("x" * int(mb * 1_000_000)))
        return error(id, -32602, f"unknown tool {name!r}")
    return error(id, -32601, f"method not found: {method}")


def tool(msg):
    return msg.get("params", {}).get("name") if msg.get("method") == "tools/call" else None


# --- stdio -----------------------------------------------------------------

def serve_stdio():
    out = sys.stdout.buffer
    lock = threading.Lock()

    def send(lines):
        """Writes whole lines under the lock; a closed stdout ends the server."""
        try:
            with lock:
                out.write(b"".join(line + b"\n" for line in lines))
                out.flush()
        except (BrokenPipeError, ValueError, OSError):
            log("stdout closed; exiting")
            os._exit(0)

    def call(msg):
        params, name = msg.get("params") or {}, tool(msg)
        if name == "silent":
            return
        if name == "endless":
            interval = (params.get("arguments") or {}).get("interval_ms", 1) / 1000
            for line in notifications(params, 0):
                send([line])
                time.sleep(interval)
        if name == "flood":
            count = (params.get("arguments") or {}).get("count", 200_000)
            stream, batch = notifications(params, 0), []
            for _ in range(count):
                batch.append(next(stream))
                if len(batch) == 1000:
                    send(batch)
                    batch = []
            send(batch + [json.dumps(result(msg["id"], text(f"flooded {count}"))).encode()])
            return
        reply = answer(msg)
        if reply is not None:
            send([json.dumps(reply).encode()])

    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        received(msg)
        if tool(msg):
            threading.Thread(target=call, args=(msg,), daemon=True).start()
        else:
            reply = answer(msg)
            if reply is not None:
                send([json.dumps(reply).encode()])
    log("stdin closed; exiting")


# --- streamable HTTP -------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(405)
        self.send_header("Allow", "POST, DELETE")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        if self.path.split("?")[0] != "/mcp":
            return self.plain(404, b"not found")
        try:
            msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError:
            return self.plain(400, b"bad json")
        if isinstance(msg, dict):
            received(msg)
        if isinstance(msg, list) or msg.get("id") is None or msg.get("method") is None:
            return self.plain(202, b"")
        params, name = msg.get("params") or {}, tool(msg)
        args = params.get("arguments") or {}
        if name == "silent":
            self.start_stream()
            while True:
                time.sleep(3600)
        if name == "endless":
            self.start_stream()
            interval = args.get("interval_ms", 1) / 1000
            for n, line in enumerate(notifications(params, 0)):
                if not self.event(line):
                    return log(f"endless id={msg['id']}: client hung up after {n} events")
                time.sleep(interval)
        if name == "flood":
            self.start_stream()
            count, stream = args.get("count", 200_000), notifications(params, 0)
            for n in range(count):
                if not self.event(next(stream), flush=False):
                    return log(f"flood id={msg['id']}: client hung up after {n} events")
            self.event(json.dumps(result(msg["id"], text(f"flooded {count}"))).encode())
            return
        reply = answer(msg)
        if name == "huge" and args.get("sse"):
            self.start_stream()
            self.event(json.dumps(reply).encode())
            return
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if msg.get("method") == "initialize":
            self.send_header("Mcp-Session-Id", uuid.uuid4().hex)
        self.end_headers()
        self.write(body)

    def plain(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.write(body)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.flush()

    def event(self, data, flush=True):
        """Writes one SSE `message` event; False once the client has gone."""
        return self.write(b"event: message\ndata: " + data + b"\n\n", flush)

    def write(self, data, flush=True):
        try:
            self.wfile.write(data)
            if flush:
                self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False


def serve_http(port):
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["stdio"]:
        serve_stdio()
    elif sys.argv[1:2] == ["http"] and len(sys.argv) == 3:
        serve_http(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
