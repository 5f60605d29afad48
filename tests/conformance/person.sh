#!/bin/sh
# The MCP conformance suite's client, played as a person plays it: with the
# commands a person has. It writes a config for the suite's server, then
# calls the server's tool with `wf-host run`. It runs first; when the call fails
# saying to run `wf-host auth login`, it does (following the printed URL as
# a browser would: the suite's authorization server approves at once), and
# calls again: at most 3 sign-ins, as a person would not go on for ever.
# With SIGN_IN_FIRST=1 it signs in before the first call (the README's order:
# "a person signs in once with `wf-host auth login`"), where a sign-in is
# asked for (not for client credentials).
#
# Usage (by the suite): person.sh SERVER_URL, with MCP_CONFORMANCE_SCENARIO
# and, for client credentials, MCP_CONFORMANCE_CONTEXT set; WF_HOST and
# CALL_WASM name the binary and the `call` node. The transcript goes to
# stderr, or to the file PERSON_LOG names.
set -eu
if [ -n "${PERSON_LOG:-}" ]; then
    exec 2>> "$PERSON_LOG"
fi

url=$1
wf_host=${WF_HOST:-wf-host}
call_wasm=${CALL_WASM:?CALL_WASM names plugins/call.wasm}
context=${MCP_CONFORMANCE_CONTEXT:-}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

field() {
    python3 -c 'import json, sys; print(json.loads(sys.argv[1] or "{}").get(sys.argv[2], ""))' "$context" "$1"
}

client_secret=$(field client_secret)
private_key=$(field private_key_pem)
{
    echo '[connections.server]'
    echo "url = \"$url\""
    echo '[connections.server.auth]'
    if [ -n "$private_key" ]; then
        # The key goes where a person keeps one: a file only they may read.
        (umask 077 && printf '%s\n' "$private_key" > client.pem)
        echo 'kind = "client-credentials"'
        echo "client_id = \"$(field client_id)\""
        echo 'token_endpoint_auth = "private_key_jwt"'
        echo 'private_key = { secret_file = "client.pem" }'
    elif [ -n "$client_secret" ]; then
        echo 'kind = "client-credentials"'
        echo "client_id = \"$(field client_id)\""
        echo 'client_secret = { secret = "CONFORMANCE_CLIENT_SECRET" }'
    else
        echo 'kind = "authorization-code"'
        # Used only where the authorization server takes it (SEP-991).
        echo 'client_metadata_url = "https://conformance-test.local/client-metadata.json"'
    fi
} > wf.toml
export CONFORMANCE_CLIENT_SECRET="$client_secret"

sign_ins=0
login() {
    sign_ins=$((sign_ins + 1))
    echo "person: wf-host auth login server (sign-in $sign_ins)" >&2
    : > login.out
    "$wf_host" auth login server --config wf.toml > login.out 2> login.err &
    pid=$!
    waited=0
    # The URL is stdout's whole first line.
    while [ "$(wc -l < login.out)" -lt 1 ] && kill -0 "$pid" 2> /dev/null && [ $waited -lt 300 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    if [ "$(wc -l < login.out)" -ge 1 ]; then
        # The browser: follows the authorization URL to the redirect.
        echo "person: opens $(head -n 1 login.out)" >&2
        curl -sS -L -o /dev/null "$(head -n 1 login.out)" || true
    fi
    status=0
    wait "$pid" || status=$?
    cat login.err >&2
    return $status
}

call() {
    echo "person: wf-host run call.wasm (server.test-tool)" >&2
    "$wf_host" run "$call_wasm" --config wf.toml --allow 'server.*' \
        --input '{"capability": "server.test-tool"}' > run.out 2> run.err
}

if [ "${SIGN_IN_FIRST:-}" = 1 ] && [ -z "$client_secret" ] && [ -z "$private_key" ]; then
    login || true
fi

# As a person does: run, and sign in when the error says so.
refused=0
until call; do
    cat run.err >&2
    if grep -q 'the server refused this call' run.err; then
        refused=1
    fi
    if [ $sign_ins -ge 3 ] || ! grep -q 'wf-host auth login server' run.err; then
        if [ $refused = 1 ]; then
            # What a person does when signing in again did not help (the
            # server kept refusing calls for scope): stop, with the
            # server's refusal as the answer.
            echo "person: gave up after $sign_ins sign-ins" >&2
            exit 0
        fi
        exit 1
    fi
    login
done
cat run.out
