// js-answer: a workflow node in JavaScript (jco, QuickJS backend).
//
// Reads `fixture://config.json`, echoes its answer through the `fixture.echo`
// tool, calls `fixture.fail` and handles the tool error it answers with.
//
// Input:  {"skip_fail": false}   (optional; null means the defaults)
// Output: {"answer": 42, "echoed": "answer is 42", "fail_handled": "tool-error: fixture failure"}
//
// Build:  npm run build   (jco componentize ... --backend qjs --backend-qjs-disable-async)

import capability from "wf:node/capability@0.2.0";

function answer(skipFail) {
  // readResource returns a ReadResourceResult: {"contents": [{"uri", "text"}]}.
  const resource = JSON.parse(capability.readResource("fixture", "fixture://config.json"));
  const config = JSON.parse(resource.contents[0].text);
  capability.log("info", `config says answer = ${config.answer}`);

  // callTool takes and returns JSON text; the result is a CallToolResult.
  const args = { text: `answer is ${config.answer}` };
  const result = JSON.parse(capability.callTool("fixture.echo", JSON.stringify(args)));
  const output = { answer: config.answer, echoed: result.content[0].text };

  if (!skipFail) {
    // A failed call throws an Error whose `payload` is the WIT error variant,
    // e.g. {tag: "tool-error", val: "fixture failure"}.
    try {
      capability.callTool("fixture.fail", "{}");
      output.fail_handled = "no error";
    } catch (e) {
      if (e.payload?.tag !== "tool-error") throw e; // denied, unavailable, ...: fail the run
      output.fail_handled = `tool-error: ${e.payload.val}`;
    }
  }
  return output;
}

// The export `run`. Returning a string is `ok`; throwing a plain node-error
// object {code, message} is `err`. (Throwing anything else traps the node.)
export function run(input) {
  const args = JSON.parse(input) ?? {};
  if (typeof args !== "object" || Array.isArray(args) || typeof (args.skip_fail ?? false) !== "boolean") {
    throw { code: "invalid-input", message: 'expected {"skip_fail": true|false} or null' };
  }
  try {
    return JSON.stringify(answer(args.skip_fail ?? false));
  } catch (e) {
    // A capability error we did not handle: pass it on with its case as the code.
    if (e.payload) throw { code: e.payload.tag, message: e.payload.val };
    throw { code: "internal", message: String(e) };
  }
}
