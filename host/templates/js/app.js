// A wf-host node: calls the `echo` tool with the text it gets.
//
// Input: {"text": "hi"}. Output: {"echoed": "hi"}.

import capability from "wf:node/capability@0.2.0";

// Returning a string is `ok`; throwing a plain object {code, message} is
// `err`. Throwing anything else traps the node.
export function run(input) {
  const args = JSON.parse(input);
  if (typeof args?.text !== "string") {
    throw { code: "invalid-input", message: 'expected {"text": "..."}' };
  }
  capability.log("info", `echoing ${args.text.length} characters`);
  let result;
  try {
    result = JSON.parse(capability.callTool("fixture.echo", JSON.stringify({ text: args.text })));
  } catch (e) {
    // A failed call throws an Error whose `payload` is the WIT error variant,
    // e.g. {tag: "denied", val: "..."}: pass it on as the node's error.
    if (e.payload) throw { code: e.payload.tag, message: e.payload.val };
    throw e;
  }
  return JSON.stringify({ echoed: result.content[0].text });
}
