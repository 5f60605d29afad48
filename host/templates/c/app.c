// A wf-host node: calls the `echo` tool with the text it gets.
//
// Input: {"text": "hi"}. Output: {"echoed": "hi"}.
//
// `wf-host build` generates the bindings (build/gen/node.h) from wit/, compiles
// every .c file of this folder with clang for wasm32-wasi and wraps the result
// into a component.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"

// The WIT case name of each capability error, indexed by its tag.
static const char *ERROR_CODES[] = {"not-found",  "denied",      "invalid-arguments",
                                    "tool-error", "unavailable", "timeout"};

// The first string value of `"text":` in compact JSON, still escaped (so it
// can go into other JSON as it is), as a new C string; or NULL.
// A larger node would use a JSON library such as cJSON.
static char *text_value(const node_string_t *json) {
    const char *key = "\"text\":\"";
    size_t n = strlen(key);
    for (size_t i = 0; i + n <= json->len; i++) {
        if (memcmp(json->ptr + i, key, n) != 0) continue;
        size_t start = i + n, end = start;
        while (end < json->len && json->ptr[end] != '"') end += json->ptr[end] == '\\' ? 2 : 1;
        if (end >= json->len) return NULL;
        char *out = malloc(end - start + 1);
        memcpy(out, json->ptr + start, end - start);
        out[end - start] = '\0';
        return out;
    }
    return NULL;
}

// Return true and set `ret` for `ok`; return false and set `err` for `err`.
bool exports_node_run(node_string_t *input, node_string_t *ret, node_node_error_t *err) {
    // `input` is the JSON text the node was given: pass it to `echo` as its
    // arguments (the host checks them against the tool's input schema).
    node_string_t name, result;
    wf_node_capability_error_t e;
    node_string_set(&name, "fixture.echo");
    bool ok = wf_node_capability_call_tool(&name, input, &result, &e);
    node_string_free(input);
    if (!ok) {
        // Pass the error on as the node's, with its WIT case name as the code.
        node_string_dup(&err->code, ERROR_CODES[e.tag]);
        err->message = e.val.not_found; // every case holds its message here; the bindings free it
        return false;
    }
    // `result` is a CallToolResult: {"content":[{"text":"hi","type":"text"}],...}
    char *text = text_value(&result);
    node_string_free(&result);
    if (!text) {
        node_string_dup(&err->code, "unexpected-result");
        node_string_dup(&err->message, "echo answered without text");
        return false;
    }
    size_t len = strlen(text) + sizeof("{\"echoed\":\"\"}");
    ret->ptr = malloc(len);
    ret->len = (size_t)snprintf((char *)ret->ptr, len, "{\"echoed\":\"%s\"}", text);
    free(text);
    return true;
}
