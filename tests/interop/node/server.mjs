// An MCP server on the official TypeScript SDK (@modelcontextprotocol/sdk), for
// tests/interop.rs. It offers what the pool's scenarios need, like the fixture
// in host/src/fixture/:
//
// - tools `echo {text}`, `add {a, b}`, `sleep {ms}` (records a cancellation),
//   `crash` (exits without answering), `ask {message}` (elicits `{answer}`
//   with elicitation/create), `register_extra` (adds the tool `extra`
//   to this session, which sends notifications/tools/list_changed) and
//   `call_log`;
// - task tools (MCP 2025-11-25 tasks, `execution.taskSupport: "required"`: a
//   plain tools/call gets an error, a call with `task` gets a CreateTaskResult
//   and the client polls tasks/get, fetches tasks/result, may tasks/cancel):
//   `task_sleep {ms}` (completes with "slept <ms>" after `ms` milliseconds; a
//   tasks/cancel before then is recorded in call_log) and `task_ask {message}`
//   (goes input_required and asks for `{answer}` with elicitation/create, which
//   reaches the client on its tasks/result request, with
//   `_meta["io.modelcontextprotocol/related-task"]`; completes with
//   "answer: <answer>", "declined" or "cancelled");
// - the resource `interop://greeting` and the prompt `greet {name}`.
//
// `call_log` answers {"calls": [{"tool", "arguments", "session"}],
// "cancelled": [{"tool", "session"}], "sessions": n}: every call before it, every
// call cancelled by notifications/cancelled (or, for task_sleep, by tasks/cancel),
// and how many sessions (initialize handshakes) this process served.
//
//   node server.mjs                 # stdio
//   node server.mjs --http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp (0 picks one)
//
// Over HTTP it prints `listening on http://127.0.0.1:PORT/mcp` on stderr once it
// accepts connections.
import { randomUUID } from "node:crypto";
import http from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { InMemoryTaskMessageQueue, InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const CRASH_EXIT_CODE = 3;
const calls = [];
const cancelled = [];
let sessions = 0;

const text = (t) => ({ content: [{ type: "text", text: String(t) }] });
// Suggested to clients (and used by the SDK's tasks/result wait) so a task's end is seen soon.
const TASK_POLL_INTERVAL_MS = 100;

// The SDK's in-memory task store, which also runs a hook when tasks/cancel
// marks a task cancelled (the SDK answers tasks/cancel itself), and whose ttl
// timers do not keep the process alive.
class TaskStore extends InMemoryTaskStore {
  onCancel = new Map(); // task id -> () => void
  unrefTimers() {
    for (const timer of this.cleanupTimers?.values() ?? []) timer.unref?.();
  }
  async createTask(...args) {
    const task = await super.createTask(...args);
    this.unrefTimers();
    return task;
  }
  async storeTaskResult(taskId, ...rest) {
    await super.storeTaskResult(taskId, ...rest);
    this.onCancel.delete(taskId);
    this.unrefTimers();
  }
  async updateTaskStatus(taskId, status, ...rest) {
    await super.updateTaskStatus(taskId, status, ...rest);
    this.unrefTimers();
    if (status === "cancelled") {
      const hook = this.onCancel.get(taskId);
      this.onCancel.delete(taskId);
      hook?.();
    }
  }
}

// One McpServer per session: its tool list (and `extra`) is the session's own.
function newServer() {
  const session = ++sessions;
  const taskStore = new TaskStore();
  const server = new McpServer(
    { name: "interop-node", version: "0.0.0" },
    {
      capabilities: {
        tools: { listChanged: true },
        tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
      },
      taskStore,
      taskMessageQueue: new InMemoryTaskMessageQueue(),
    },
  );
  const record = (tool, args) => calls.push({ tool, arguments: args, session });
  let registeredExtra = null;

  server.registerTool(
    "echo",
    { description: "Returns `text` unchanged.", inputSchema: { text: z.string() } },
    async (args) => (record("echo", args), text(args.text)),
  );
  server.registerTool(
    "ask",
    {
      description: 'Asks the client for `{answer}` (elicitation/create); returns "answer: <answer>", "declined" or "cancelled".',
      inputSchema: { message: z.string().optional() },
    },
    async (args, extra) => {
      record("ask", args);
      const result = await server.server.elicitInput(
        {
          mode: "form",
          message: args.message ?? "What is the answer?",
          requestedSchema: { type: "object", properties: { answer: { type: "string" } }, required: ["answer"] },
        },
        { relatedRequestId: extra.requestId },
      );
      if (result.action === "accept") return text(`answer: ${result.content.answer}`);
      return text(result.action === "decline" ? "declined" : "cancelled");
    },
  );
  server.registerTool(
    "add",
    { description: "Adds two numbers; returns the sum as text.", inputSchema: { a: z.number(), b: z.number() } },
    async (args) => (record("add", args), text(args.a + args.b)),
  );
  server.registerTool(
    "sleep",
    {
      description: "Waits `ms` milliseconds; a cancelled call is recorded in call_log.",
      inputSchema: { ms: z.number().int() },
    },
    async (args, extra) => {
      record("sleep", args);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, args.ms);
        extra.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          cancelled.push({ tool: "sleep", session });
          resolve();
        });
      });
      return text(`slept ${args.ms}ms`);
    },
  );
  server.registerTool(
    "crash",
    { description: "Exits the server process at once, without answering." },
    async () => {
      record("crash", {});
      process.exit(CRASH_EXIT_CODE);
    },
  );
  server.registerTool(
    "register_extra",
    { description: "Adds the tool `extra` to this session; the SDK sends notifications/tools/list_changed." },
    async () => {
      record("register_extra", {});
      if (!registeredExtra) {
        registeredExtra = server.registerTool(
          "extra",
          { description: "Registered at runtime by register_extra.", inputSchema: { text: z.string().optional() } },
          async (args) => text(`extra: ${args.text ?? ""}`),
        );
      }
      return text("registered");
    },
  );
  server.registerTool(
    "call_log",
    { description: "Every call before this one, the cancelled ones and the number of sessions." },
    async () => {
      const log = { calls: [...calls], cancelled: [...cancelled], sessions };
      return { ...text(JSON.stringify(log)), structuredContent: log };
    },
  );
  // tasks/get and tasks/result are answered by the SDK from the task store; these are what the type asks for.
  const taskLookups = {
    getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
    getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
  };
  server.experimental.tasks.registerToolTask(
    "task_sleep",
    {
      description: 'A task (taskSupport "required") that completes with "slept <ms>" after `ms` milliseconds; a tasks/cancel before then is recorded in call_log.',
      inputSchema: { ms: z.number().int() },
      execution: { taskSupport: "required" },
    },
    {
      createTask: async (args, extra) => {
        record("task_sleep", args);
        const store = extra.taskStore;
        const task = await store.createTask({ ttl: extra.taskRequestedTtl, pollInterval: TASK_POLL_INTERVAL_MS });
        const timer = setTimeout(() => {
          store.storeTaskResult(task.taskId, "completed", text(`slept ${args.ms}`)).catch(() => {});
        }, args.ms);
        timer.unref(); // like the store's ttl timers: a task does not keep a stdio server whose client left alive
        taskStore.onCancel.set(task.taskId, () => {
          clearTimeout(timer);
          cancelled.push({ tool: "task_sleep", session });
        });
        return { task };
      },
      ...taskLookups,
    },
  );
  server.experimental.tasks.registerToolTask(
    "task_ask",
    {
      description:
        'A task (taskSupport "required") that asks the client for `{answer}` (elicitation/create, delivered on tasks/result while the task is input_required); completes with "answer: <answer>", "declined" or "cancelled".',
      inputSchema: { message: z.string().optional() },
      execution: { taskSupport: "required" },
    },
    {
      createTask: async (args, extra) => {
        record("task_ask", args);
        const store = extra.taskStore;
        const task = await store.createTask({ ttl: extra.taskRequestedTtl, pollInterval: TASK_POLL_INTERVAL_MS });
        const { taskId } = task;
        // Started after the CreateTaskResult is sent, so the client hears of the task first.
        setImmediate(async () => {
          try {
            await store.updateTaskStatus(taskId, "input_required");
            // With relatedTask the SDK queues the request for the task; tasks/result sends it.
            // The SDK (1.32.2) leaves the request's timeout running when the answer comes
            // back through the task queue, and would send notifications/cancelled for the
            // answered request when it fires (60 s on); so it is cleared here, by the id the
            // request takes.
            const requestId = server.server._requestMessageId;
            let result;
            try {
              result = await server.server.elicitInput(
                {
                  mode: "form",
                  message: args.message ?? "What is the answer?",
                  requestedSchema: { type: "object", properties: { answer: { type: "string" } }, required: ["answer"] },
                },
                { relatedTask: { taskId } },
              );
            } finally {
              server.server._cleanupTimeout?.(requestId);
              server.server._responseHandlers?.delete(requestId);
            }
            await store.updateTaskStatus(taskId, "working");
            const answer =
              result.action === "accept" ? `answer: ${result.content.answer}` : result.action === "decline" ? "declined" : "cancelled";
            await store.storeTaskResult(taskId, "completed", text(answer));
          } catch (e) {
            // A cancelled task stays cancelled; anything else fails the task.
            await store
              .storeTaskResult(taskId, "failed", { ...text(`task_ask failed: ${e?.message ?? e}`), isError: true })
              .catch(() => {});
          }
        });
        return { task };
      },
      ...taskLookups,
    },
  );
  server.registerResource(
    "greeting",
    "interop://greeting",
    { description: "A plain-text greeting.", mimeType: "text/plain" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "text/plain", text: "hello from node" }] }),
  );
  server.registerPrompt(
    "greet",
    { description: "Asks the model to greet someone.", argsSchema: { name: z.string() } },
    async ({ name }) => ({
      messages: [{ role: "user", content: { type: "text", text: `Say hello to ${name}.` } }],
    }),
  );
  return server;
}

async function serveHttp(port) {
  const transports = new Map(); // session id -> transport
  const httpServer = http.createServer(async (req, res) => {
    try {
      if (!req.url.startsWith("/mcp")) {
        res.writeHead(404).end();
        return;
      }
      let body;
      if (req.method === "POST") {
        const chunks = [];
        for await (const chunk of req) chunks.push(chunk);
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      }
      const id = req.headers["mcp-session-id"];
      let transport = id ? transports.get(id) : undefined;
      if (!transport) {
        if (id || !isInitializeRequest(body)) {
          res.writeHead(id ? 404 : 400, { "content-type": "application/json" });
          res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "no such session" }, id: null }));
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (sid) => transports.set(sid, transport),
        });
        transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
        await newServer().connect(transport);
      }
      await transport.handleRequest(req, res, body);
    } catch (e) {
      console.error("request failed:", e);
      if (!res.headersSent) res.writeHead(500).end();
    }
  });
  httpServer.listen(port, "127.0.0.1", () => {
    const { port } = httpServer.address();
    console.error(`listening on http://127.0.0.1:${port}/mcp`);
  });
}

const i = process.argv.indexOf("--http");
if (i >= 0) {
  await serveHttp(Number(process.argv[i + 1] ?? 0));
} else {
  await newServer().connect(new StdioServerTransport());
}
