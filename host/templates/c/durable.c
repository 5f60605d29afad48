// A durable wf-host node: asks for approval, waits for the `approve` signal,
// then tells the decision.
//
// Input: {"request": "the release"}. Output: {"decision": <the signal's
// payload>, "told": "<what echo answered>"}. While it waits, the host lets go
// of the node; when the signal comes, the node runs again from the start and
// its first call is answered from the run's journal, not made again.
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

// Whether `c` is JSON whitespace.
static bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The first string value of the key `key` in `json`, still escaped (so it can
// go into other JSON as it is), as a new C string; or NULL.
// A larger node would use a JSON library such as cJSON.
static char *string_value(const node_string_t *json, const char *key) {
    const char *text = (const char *)json->ptr;
    char pattern[64];
    size_t n = (size_t)snprintf(pattern, sizeof pattern, "\"%s\"", key);
    for (size_t i = 0; i + n <= json->len; i++) {
        if (memcmp(text + i, pattern, n) != 0) continue;
        size_t at = i + n;
        while (at < json->len && space(text[at])) at++;
        if (at >= json->len || text[at] != ':') continue;
        at++;
        while (at < json->len && space(text[at])) at++;
        if (at >= json->len || text[at] != '"') continue;
        size_t start = at + 1, end = start;
        while (end < json->len && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
        if (end >= json->len) return NULL;
        char *out = malloc(end - start + 1);
        memcpy(out, text + start, end - start);
        out[end - start] = '\0';
        return out;
    }
    return NULL;
}

// JSON text as the inside of a JSON string: `"` and `\` escaped (compact JSON
// holds no raw control characters).
static char *escaped(const node_string_t *json) {
    char *out = malloc(json->len * 2 + 1);
    size_t j = 0;
    for (size_t i = 0; i < json->len; i++) {
        if (json->ptr[i] == '"' || json->ptr[i] == '\\') out[j++] = '\\';
        out[j++] = (char)json->ptr[i];
    }
    out[j] = '\0';
    return out;
}

static bool fail(node_node_error_t *err, const char *code, const char *message) {
    node_string_dup(&err->code, code);
    node_string_dup(&err->message, message);
    return false;
}

// Calls `fixture.echo` with `text` (already escaped for JSON): its answer's
// text as a new C string, or NULL with `err` set.
static char *echo(const char *text, node_node_error_t *err) {
    size_t len = strlen(text) + sizeof("{\"text\":\"\"}");
    char *json = malloc(len);
    snprintf(json, len, "{\"text\":\"%s\"}", text);
    node_string_t name, arguments, result;
    wf_node_capability_error_t e;
    node_string_set(&name, "fixture.echo");
    node_string_set(&arguments, json);
    bool ok = wf_node_capability_call_tool(&name, &arguments, &result, &e);
    free(json);
    if (!ok) {
        // Pass the error on as the node's, with its WIT case name as the code.
        node_string_dup(&err->code, ERROR_CODES[e.tag]);
        err->message = e.val.not_found; // every case holds its message here
        return NULL;
    }
    char *said = string_value(&result, "text");
    node_string_free(&result);
    if (!said) fail(err, "unexpected-result", "echo answered without text");
    return said;
}

// Return true and set `ret` for `ok`; return false and set `err` for `err`.
bool exports_node_run(node_string_t *input, node_string_t *ret, node_node_error_t *err) {
    char *request = string_value(input, "request");
    node_string_free(input);
    if (!request) return fail(err, "invalid-input", "expected {\"request\": \"...\"}");

    size_t len = strlen(request) + sizeof("please approve ");
    char *ask = malloc(len);
    snprintf(ask, len, "please approve %s", request);
    char *asked = echo(ask, err);
    free(ask);
    if (!asked) {
        free(request);
        return false;
    }
    free(asked);

    // The node is let go here until the signal comes. The second argument is
    // a timeout in ms (a uint64_t *; NULL: none).
    node_string_t signal, decision;
    wf_node_durable_wait_error_t werr;
    node_string_set(&signal, "approve");
    node_string_t message;
    node_string_set(&message, "waiting for the `approve` signal");
    wf_node_capability_log(WF_NODE_CAPABILITY_LEVEL_INFO, &message);
    if (!wf_node_durable_wait_signal(&signal, NULL, &decision, &werr)) {
        free(request);
        bool timeout = werr.tag == WF_NODE_DURABLE_WAIT_ERROR_TIMEOUT;
        node_string_dup(&err->code, timeout ? "timeout" : "unavailable");
        err->message = werr.val.timeout; // both cases hold their message here
        return false;
    }

    char *payload = escaped(&decision);
    len = strlen(request) + strlen(payload) + sizeof(": ");
    char *tell = malloc(len);
    snprintf(tell, len, "%s: %s", request, payload);
    free(payload);
    free(request);
    char *told = echo(tell, err);
    free(tell);
    if (!told) {
        node_string_free(&decision);
        return false;
    }
    len = decision.len + strlen(told) + sizeof("{\"decision\":,\"told\":\"\"}");
    ret->ptr = malloc(len);
    ret->len = (size_t)snprintf((char *)ret->ptr, len, "{\"decision\":%.*s,\"told\":\"%s\"}",
                                (int)decision.len, (const char *)decision.ptr, told);
    node_string_free(&decision);
    free(told);
    return true;
}
