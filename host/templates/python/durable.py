"""A durable wf-host node: asks for approval, waits for the `approve` signal,
then tells the decision.

Input: {"request": "the release"}. Output: {"decision": <the signal's
payload>, "told": "<what echo answered>"}. While it waits, the host lets go of
the node; when the signal comes, the node runs again from the start and its
first call is answered from the run's journal, not made again.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import capability, durable
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


def echo(text: str) -> str:
    """Calls `fixture.echo`; its answer's text. A failed call fails the node."""
    try:
        result = json.loads(capability.call_tool("fixture.echo", json.dumps({"text": text})))
    except Err as e:
        raise Err(wit_world.NodeError(code=ERROR_CODES[type(e.value)], message=e.value.value))
    return result["content"][0]["text"]


class WitWorld(wit_world.WitWorld):  # the class must be called WitWorld
    def run(self, input: str) -> str:  # input: JSON text; return JSON text
        args = json.loads(input)
        if not isinstance(args, dict) or not isinstance(args.get("request"), str):
            raise Err(wit_world.NodeError(code="invalid-input", message='expected {"request": "..."}'))
        echo(f"please approve {args['request']}")
        capability.log(Level.INFO, "waiting for the `approve` signal")
        try:
            # The second argument is a timeout in ms (None: none).
            decision = json.loads(durable.wait_signal("approve", None))
        except Err as e:
            code = "timeout" if isinstance(e.value, durable.WaitError_Timeout) else "unavailable"
            raise Err(wit_world.NodeError(code=code, message=e.value.value))
        told = echo(f"{args['request']}: {json.dumps(decision)}")
        return json.dumps({"decision": decision, "told": told})
