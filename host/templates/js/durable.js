// A durable wf-host node: asks for approval, waits for the `approve` signal,
// then tells the decision.
//
// Input: {"request": "the release"}. Output: {"decision": <the signal's
// payload>, "told": "<what echo answered>"}. While it waits, the host lets go
// of the node; when the signal comes, the node runs again from the start and
// its first call is answered from the run's journal, not made again.

import capability from "wf:node/capability@0.2.0";
import durable from "wf:node/durable@0.2.0";

// A failed call or wait throws an Error whose `payload` is the WIT error
// variant, e.g. {tag: "denied", val: "..."}: pass it on as the node's error.
function passOn(e) {
  if (e.payload) return { code: e.payload.tag, message: e.payload.val };
  return e;
}

// Calls `fixture.echo`; its answer's text.
function echo(text) {
  try {
    return JSON.parse(capability.callTool("fixture.echo", JSON.stringify({ text }))).content[0].text;
  } catch (e) {
    throw passOn(e);
  }
}

// Returning a string is `ok`; throwing a plain object {code, message} is
// `err`. Throwing anything else traps the node.
export function run(input) {
  const args = JSON.parse(input);
  if (typeof args?.request !== "string") {
    throw { code: "invalid-input", message: 'expected {"request": "..."}' };
  }
  echo(`please approve ${args.request}`);
  capability.log("info", "waiting for the `approve` signal");
  let decision;
  try {
    // The second argument is a timeout in ms (undefined: none).
    decision = JSON.parse(durable.waitSignal("approve", undefined));
  } catch (e) {
    throw passOn(e);
  }
  const told = echo(`${args.request}: ${JSON.stringify(decision)}`);
  return JSON.stringify({ decision, told });
}
