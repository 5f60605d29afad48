// A client built on the official TypeScript MCP SDK that approves a waiting
// run: it declares elicitation, answers the server's `elicitation/create`
// with an approval and a comment, and calls `deploy` (a workflow with an
// approval step) on wf-host's /mcp. Prints what it saw as one JSON object.
//
// With TOOL (and ARGUMENTS_JSON) it calls that tool instead, and a question
// that asks for `{answer}` (one an upstream server asked the run) gets one.
//
// Usage: node approver.mjs URL [TOOL [ARGUMENTS_JSON]]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const asked = [];
const client = new Client({ name: "node-approver", version: "1.0.0" }, { capabilities: { elicitation: {} } });
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  if (request.params.requestedSchema?.properties?.answer) return { action: "accept", content: { answer: "from node" } };
  return { action: "accept", content: { approved: true, comment: "from node" } };
});
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const tool = process.argv[3] ?? "deploy";
const args = process.argv[4] ? JSON.parse(process.argv[4]) : { release: "js" };
const result = await client.callTool({ name: tool, arguments: args }, undefined, { timeout: 60000 });
console.log(
  JSON.stringify({
    asked,
    structured: result.structuredContent ?? null,
    text: (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text),
    is_error: Boolean(result.isError),
    run_id: result._meta?.["wf-host/run-id"] ?? null,
  }),
);
await client.close();
