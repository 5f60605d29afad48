// A client built on the official TypeScript MCP SDK that approves a waiting
// run: it declares elicitation, answers the server's `elicitation/create`
// with an approval and a comment, and calls `deploy` (a workflow with an
// approval step) on wf-host's /mcp. Prints what it saw as one JSON object.
//
// Usage: node approver.mjs URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const asked = [];
const client = new Client({ name: "node-approver", version: "1.0.0" }, { capabilities: { elicitation: {} } });
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  return { action: "accept", content: { approved: true, comment: "from node" } };
});
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const result = await client.callTool({ name: "deploy", arguments: { release: "js" } }, undefined, { timeout: 60000 });
console.log(
  JSON.stringify({
    asked,
    structured: result.structuredContent ?? null,
    is_error: Boolean(result.isError),
    run_id: result._meta?.["wf-host/run-id"] ?? null,
  }),
);
await client.close();
