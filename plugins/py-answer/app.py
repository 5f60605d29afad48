"""py-answer: a workflow node in Python.

Reads `fixture://config.json`, echoes its answer through the `fixture.echo`
tool, calls `fixture.fail` and handles the tool error it answers with.

Input:  {"skip_fail": false}   (optional; null means the defaults)
Output: {"answer": 42, "echoed": "answer is 42", "fail_handled": "tool-error: fixture failure"}

Build:  componentize-py -d wit -w node componentize app -p plugins/py-answer -o plugins/py-answer.wasm
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import capability
from wit_world.imports.capability import Level

# The WIT case name of each capability error, used as the node's error code
# when the node passes an error on.
ERROR_CODES = {
    capability.Error_NotFound: "not-found",
    capability.Error_Denied: "denied",
    capability.Error_InvalidArguments: "invalid-arguments",
    capability.Error_ToolError: "tool-error",
    capability.Error_Unavailable: "unavailable",
    capability.Error_Timeout: "timeout",
}


def node_error(code: str, message: str) -> Err:
    return Err(wit_world.NodeError(code=code, message=message))


def answer(skip_fail: bool) -> dict:
    # read-resource returns a ReadResourceResult: {"contents": [{"uri", "text"}]}.
    resource = json.loads(capability.read_resource("fixture", "fixture://config.json"))
    config = json.loads(resource["contents"][0]["text"])
    capability.log(Level.INFO, f"config says answer = {config['answer']}")

    # call-tool takes and returns JSON text; the result is a CallToolResult.
    args = {"text": f"answer is {config['answer']}"}
    result = json.loads(capability.call_tool("fixture.echo", json.dumps(args)))
    output = {"answer": config["answer"], "echoed": result["content"][0]["text"]}

    if not skip_fail:
        # A tool that answers isError arrives as Err(Error_ToolError(message)).
        try:
            capability.call_tool("fixture.fail", "{}")
            output["fail_handled"] = "no error"
        except Err as e:
            if not isinstance(e.value, capability.Error_ToolError):
                raise  # any other error (denied, unavailable, ...) fails the run
            output["fail_handled"] = f"tool-error: {e.value.value}"
    return output


class WitWorld(wit_world.WitWorld):
    def run(self, input: str) -> str:
        args = json.loads(input)
        if args is None:
            args = {}
        if not isinstance(args, dict) or not isinstance(args.get("skip_fail", False), bool):
            raise node_error("invalid-input", 'expected {"skip_fail": true|false} or null')
        try:
            return json.dumps(answer(args.get("skip_fail", False)))
        except Err as e:
            # A capability error we did not handle: pass it on with its case as the code.
            raise node_error(ERROR_CODES[type(e.value)], e.value.value)
