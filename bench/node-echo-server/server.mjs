// Minimal stdio MCP server for host/benches/pool.rs: one tool, `echo {text}`.
// Uses the official @modelcontextprotocol/sdk; install with bench/setup.sh.
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const server = new McpServer({ name: "node-echo", version: "0.0.0" });

server.registerTool(
  "echo",
  { description: "Returns `text` unchanged.", inputSchema: { text: z.string() } },
  async ({ text }) => ({ content: [{ type: "text", text }] }),
);

await server.connect(new StdioServerTransport());
