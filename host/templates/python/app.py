"""A wf-host node: calls the `echo` tool with the text it gets.

Input: {"text": "hi"}. Output: {"echoed": "hi"}.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import capability
from wit_world.imports.capability import Level

# The WIT case name of each capability error: the code when the node passes
# an error on.
ERROR_CODES = {
    capability.Error_NotFound: "not-found",
    capability.Error_Denied: "denied",
    capability.Error_InvalidArguments: "invalid-arguments",
    capability.Error_ToolError: "tool-error",
    capability.Error_Unavailable: "unavailable",
    capability.Error_Timeout: "timeout",
}


class WitWorld(wit_world.WitWorld):  # the class must be called WitWorld
    def run(self, input: str) -> str:  # input: JSON text; return JSON text
        args = json.loads(input)
        if not isinstance(args, dict) or not isinstance(args.get("text"), str):
            raise Err(wit_world.NodeError(code="invalid-input", message='expected {"text": "..."}'))
        capability.log(Level.INFO, f"echoing {len(args['text'])} characters")
        try:
            result = json.loads(capability.call_tool("fixture.echo", json.dumps({"text": args["text"]})))
        except Err as e:
            raise Err(wit_world.NodeError(code=ERROR_CODES[type(e.value)], message=e.value.value))
        return json.dumps({"echoed": result["content"][0]["text"]})
