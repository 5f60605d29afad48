// js-durable: a durable node in JavaScript (jco, QuickJS backend).
//
// Does what its input lists, in order, and answers what each gave:
// {"do": [<action>, ...]}, each action one of
//
// - {"call": "<connection>.<tool>", "arguments": {...}}: the tool's text;
// - {"together": [{"call": ..., "arguments": ...}, ...]}: calls at once
//   (callTools), each one's CallToolResult or {"error": code};
// - {"sleep_ms": n}: a durable sleep;
// - {"signal": "<name>", "timeout_ms"?: n}: the signal's payload;
// - {"workflow": "<name>", "input": <any>}: the child run's output, or
//   {"error": code, "message": ...};
// - {"clock": true}: the wall clock, in ms (journaled: the same when the node
//   runs again).
//
// Build:  npm run build   (jco componentize ... --backend qjs --backend-qjs-disable-async)

import capability from "wf:node/capability@0.2.0";
import durable from "wf:node/durable@0.2.0";

const text = (result) => JSON.parse(result).content.map((c) => c.text ?? "").join("\n");

function act(action) {
  if (action.call !== undefined) {
    return text(capability.callTool(action.call, JSON.stringify(action.arguments ?? {})));
  }
  if (action.together !== undefined) {
    const calls = action.together.map((c) => ({ name: c.call, arguments: JSON.stringify(c.arguments ?? {}) }));
    // Each result is {tag: "ok", val} or {tag: "err", val: {tag: <case>, val: message}}.
    return capability.callTools(calls).map((r) => (r.tag === "ok" ? JSON.parse(r.val) : { error: r.val.tag }));
  }
  if (action.sleep_ms !== undefined) {
    durable.sleep(action.sleep_ms); // a WIT u64 is a plain number in the QuickJS backend
    return null;
  }
  if (action.signal !== undefined) {
    const timeout = action.timeout_ms; // undefined: no timeout
    try {
      return JSON.parse(durable.waitSignal(action.signal, timeout));
    } catch (e) {
      // e.payload is the wait-error: {tag: "timeout" | "unavailable", val: message}.
      if (e.payload) throw { code: e.payload.tag, message: e.payload.val };
      throw e;
    }
  }
  if (action.workflow !== undefined) {
    try {
      return JSON.parse(durable.runWorkflow(action.workflow, JSON.stringify(action.input ?? null)));
    } catch (e) {
      // e.payload is the run-error: {runId, code, message}.
      if (e.payload) return { error: e.payload.code, message: e.payload.message };
      throw e;
    }
  }
  if (action.clock === true) {
    return Date.now();
  }
  throw { code: "invalid-input", message: `unknown action ${JSON.stringify(action)}` };
}

export function run(input) {
  try {
    return JSON.stringify(JSON.parse(input).do.map(act));
  } catch (e) {
    if (e.code !== undefined && e.message !== undefined && !(e instanceof Error)) throw e;
    if (e.payload) throw { code: e.payload.tag, message: e.payload.val };
    throw { code: "internal", message: String(e) };
  }
}
