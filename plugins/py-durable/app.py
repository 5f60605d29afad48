"""py-durable: a durable node in Python.

Does what its input lists, in order, and answers what each gave:
`{"do": [<action>, ...]}`, each action one of

- `{"call": "<connection>.<tool>", "arguments": {...}}`: the tool's text;
- `{"together": [{"call": ..., "arguments": ...}, ...]}`: calls at once
  (`call_tools`), each one's `CallToolResult` or `{"error": code}`;
- `{"sleep_ms": n}`: a durable sleep;
- `{"signal": "<name>", "timeout_ms"?: n}`: the signal's payload;
- `{"workflow": "<name>", "input": <any>}`: the child run's output, or
  `{"error": code, "message": ...}`;
- `{"clock": true}`: the wall clock, in ms (journaled: the same when the
  node runs again).

Build:  componentize-py -d wit -w node componentize app -p plugins/py-durable -o plugins/py-durable.wasm
"""

import json
import time

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import capability, durable

ERROR_CODES = {
    capability.Error_NotFound: "not-found",
    capability.Error_Denied: "denied",
    capability.Error_InvalidArguments: "invalid-arguments",
    capability.Error_ToolError: "tool-error",
    capability.Error_Unavailable: "unavailable",
    capability.Error_Timeout: "timeout",
}


def text(result: str) -> str:
    return "\n".join(c.get("text", "") for c in json.loads(result)["content"])


def act(action: dict):
    if "call" in action:
        return text(capability.call_tool(action["call"], json.dumps(action.get("arguments", {}))))
    if "together" in action:
        calls = [
            capability.ToolCall(name=c["call"], arguments=json.dumps(c.get("arguments", {})))
            for c in action["together"]
        ]
        out = []
        for result in capability.call_tools(calls):
            if isinstance(result, Ok):
                out.append(json.loads(result.value))
            else:
                out.append({"error": ERROR_CODES[type(result.value)]})
        return out
    if "sleep_ms" in action:
        durable.sleep(action["sleep_ms"])
        return None
    if "signal" in action:
        try:
            return json.loads(durable.wait_signal(action["signal"], action.get("timeout_ms")))
        except Err as e:
            code = "timeout" if isinstance(e.value, durable.WaitError_Timeout) else "unavailable"
            raise NodeFailure(code, e.value.value)
    if "workflow" in action:
        try:
            return json.loads(durable.run_workflow(action["workflow"], json.dumps(action.get("input"))))
        except Err as e:
            return {"error": e.value.code, "message": e.value.message}
    if action.get("clock") is True:
        return int(time.time() * 1000)
    raise NodeFailure("invalid-input", f"unknown action {json.dumps(action)}")


class NodeFailure(Exception):
    def __init__(self, code: str, message: str):
        self.code = code
        self.message = message


class WitWorld(wit_world.WitWorld):
    def run(self, input: str) -> str:
        try:
            return json.dumps([act(a) for a in json.loads(input)["do"]])
        except NodeFailure as e:
            raise Err(wit_world.NodeError(code=e.code, message=e.message))
        except Err as e:
            code = ERROR_CODES.get(type(e.value), "unavailable")
            raise Err(wit_world.NodeError(code=code, message=str(e.value.value)))
