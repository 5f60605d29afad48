// The wf-host console: runs, one run's step graph, connections.
//
// Every value that comes from the server (run inputs and outputs, errors,
// logs, names) is shown with textContent or as an SVG text node, never
// parsed as HTML: a run's data is whatever its caller or its nodes made it.
//
// The token is kept in sessionStorage (this tab only) and sent as an
// Authorization header, never in a URL. The event stream is read with fetch,
// since EventSource cannot send headers.
"use strict";

(() => {
  const TOKEN_KEY = "wf-host.token";
  const WORKFLOW_KEY = "wf-host.workflow"; // the start form's last choice
  const PAGE_SIZE = 20;
  const RUN_STATUSES = ["queued", "running", "paused", "succeeded", "failed", "cancelled"];
  const STEP_STATUSES = ["pending", "running", "waiting", "succeeded", "failed", "skipped", "cancelled"];
  const SVG = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  let token = sessionStorage.getItem(TOKEN_KEY) || "";

  // ---- requests

  class Unauthorized extends Error {
    constructor() {
      super("the server wants a token");
    }
  }

  function headers(extra) {
    const h = Object.assign({}, extra);
    if (token) h.Authorization = "Bearer " + token;
    return h;
  }

  let rpcId = 0;

  // One JSON-RPC call; its result, or an Error with the server's message.
  async function rpc(method, params) {
    const response = await fetch("/rpc", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ jsonrpc: "2.0", id: ++rpcId, method, params: params || {} }),
      cache: "no-store",
      credentials: "omit",
    });
    if (response.status === 401) throw new Unauthorized();
    const text = await response.text();
    let reply;
    try {
      reply = JSON.parse(text);
    } catch {
      throw new Error(`HTTP ${response.status}: ${text}`);
    }
    if (reply.error) throw new Error(reply.error.message);
    return reply.result;
  }

  // Shows `error` in `element`, or the token form when the token is missing
  // or wrong.
  function fail(error, element) {
    if (error instanceof Unauthorized) {
      showLogin(token ? "The server refused this token." : "");
      return;
    }
    if (element) element.textContent = String(error.message || error);
  }

  // ---- the event stream

  // Follows a Server-Sent Events stream with fetch, reconnecting with
  // Last-Event-ID so that nothing is missed.
  class EventStream {
    constructor(path, lastId, onEvent, onState) {
      this.path = path;
      this.lastId = lastId;
      this.onEvent = onEvent;
      this.onState = onState;
      this.abort = new AbortController();
      this.closed = false;
      this.run();
    }

    close() {
      this.closed = true;
      this.abort.abort();
    }

    async run() {
      let delay = 1000;
      while (!this.closed) {
        try {
          const h = headers({ Accept: "text/event-stream" });
          if (this.lastId !== null) h["Last-Event-ID"] = String(this.lastId);
          const response = await fetch(this.path, {
            headers: h,
            signal: this.abort.signal,
            cache: "no-store",
            credentials: "omit",
          });
          if (response.status === 401) {
            this.onState("offline");
            fail(new Unauthorized());
            return;
          }
          if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
          this.onState("live");
          delay = 1000;
          await this.read(response.body);
        } catch (e) {
          if (this.closed) return;
        }
        this.onState("reconnecting");
        await sleep(delay);
        delay = Math.min(delay * 2, 15000);
      }
    }

    async read(body) {
      const reader = body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let kind = "message";
      let id = null;
      let data = [];
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, end).replace(/\r$/, "");
          buffer = buffer.slice(end + 1);
          if (line === "") {
            if (data.length > 0) {
              if (id !== null) this.lastId = id;
              let parsed = null;
              try {
                parsed = JSON.parse(data.join("\n"));
              } catch {
                // Not ours: skip it.
              }
              if (parsed) this.onEvent(kind, parsed);
            }
            kind = "message";
            id = null;
            data = [];
            continue;
          }
          if (line.startsWith(":")) continue; // keep-alive
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? "" : line.slice(colon + 1);
          if (text.startsWith(" ")) text = text.slice(1);
          if (field === "event") kind = text;
          else if (field === "data") data.push(text);
          else if (field === "id" && /^\d+$/.test(text)) id = Number(text);
        }
      }
    }
  }

  let stream = null;

  function setLive(state) {
    const live = $("live");
    live.dataset.state = state;
    live.textContent = state;
  }

  function onEvent(kind, event) {
    if (kind !== "step.progress") scheduleRunsRefresh();
    if (event.run_id === openRunId) scheduleRunRefresh();
  }

  // ---- little helpers

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [key, value] of Object.entries(props)) {
        if (value === undefined || value === null) continue;
        if (key === "class") node.className = value;
        else if (key === "text") node.textContent = value;
        else if (key.startsWith("data-")) node.setAttribute(key, value);
        else node[key] = value;
      }
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    for (const child of children) node.append(child);
    return node;
  }

  // A status known to the console, for class names; anything else is "unknown".
  function known(status, statuses) {
    return statuses.includes(status) ? status : "unknown";
  }

  function badge(status, statuses) {
    const s = known(status, statuses);
    return el("span", { class: "status status-" + s, "data-status": s, text: String(status) });
  }

  function when(text) {
    if (!text) return "";
    const date = new Date(text);
    return isNaN(date) ? String(text) : date.toLocaleString();
  }

  function duration(ms) {
    if (!(ms >= 0)) return "";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} m ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
    return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} m`;
  }

  // The duration between two times; a running one ticks (see `tick`).
  function durationCell(started, finished) {
    const start = Date.parse(started);
    if (isNaN(start)) return el("span", { class: "duration" });
    if (finished) {
      return el("span", { class: "duration", text: duration(Date.parse(finished) - start) });
    }
    return el("span", { class: "duration", "data-since": String(start), text: duration(Date.now() - start) });
  }

  function tick() {
    for (const node of document.querySelectorAll("[data-since]")) {
      node.textContent = duration(Date.now() - Number(node.dataset.since));
    }
  }

  function json(value) {
    return el("pre", { class: "json", text: JSON.stringify(value, null, 2) });
  }

  // Calls `fn` once, `ms` after the first of a burst of calls: a busy event
  // stream refreshes a view a few times a second, never not at all.
  function coalesce(fn, ms) {
    let timer = null;
    return () => {
      if (timer !== null) return;
      timer = setTimeout(() => {
        timer = null;
        fn();
      }, ms);
    };
  }

  // ---- views

  const VIEWS = ["login", "runs-view", "run-view", "connections-view"];

  function show(view) {
    for (const id of VIEWS) $(id).hidden = id !== view;
    $("nav-runs").classList.toggle("current", view === "runs-view" || view === "run-view");
    $("nav-connections").classList.toggle("current", view === "connections-view");
  }

  function showLogin(message) {
    if (stream) stream.close();
    stream = null;
    setLive("offline");
    $("nav").hidden = true;
    $("forget-token").hidden = true;
    $("login-error").textContent = message || "";
    show("login");
    $("token").focus();
  }

  let openRunId = null;
  let connectionsTimer = null;
  // The open run's kept events (for its timeline), and their stream.
  let runEvents = [];
  let runStream = null;

  // Per workflow, the hash of its definition in force (`host.status`).
  let definitionsInForce = {};

  async function loadDefinitions() {
    try {
      const status = await rpc("host.status");
      definitionsInForce = Object.fromEntries(
        Object.entries(status.definitions || {}).map(([name, d]) => [name, d.current]),
      );
      if (lastRun) renderRun(lastRun);
    } catch {
      // The run page works without it: Migrate stays off.
    }
  }

  function followRunEvents(id) {
    runEvents = [];
    if (runStream) runStream.close();
    const events = new EventStream(
      "/runs/" + encodeURIComponent(id) + "/events",
      null,
      (kind, event) => {
        if (id !== openRunId || kind === "step.progress") return;
        runEvents.push(event);
        if (kind === "run.finished") events.close(); // nothing follows
        scheduleTimeline();
      },
      () => {},
    );
    runStream = events;
  }

  function route() {
    if (!stream) return; // not signed in yet
    const hash = location.hash || "#/runs";
    openRunId = null;
    if (runStream) {
      runStream.close();
      runStream = null;
    }
    clearInterval(connectionsTimer);
    const run = hash.match(/^#\/runs\/(.+)$/);
    if (run) {
      openRunId = decodeURIComponent(run[1]);
      clearRun(openRunId);
      show("run-view");
      followRunEvents(openRunId);
      loadDefinitions();
      loadRun();
    } else if (hash === "#/connections") {
      show("connections-view");
      loadConnections();
      // Connections have no events: poll while they are shown.
      connectionsTimer = setInterval(loadConnections, 5000);
    } else {
      show("runs-view");
      loadRuns();
    }
  }

  // ---- runs

  let pages = [null]; // the cursor of each page seen; the first has none
  let page = 0;
  let nextCursor = null;

  async function loadRuns() {
    if ($("runs-view").hidden) return;
    const params = { limit: PAGE_SIZE };
    const workflow = $("filter-workflow").value;
    const status = $("filter-status").value;
    if (workflow) params.workflow = workflow;
    if (status) params.status = status;
    if (pages[page]) params.cursor = pages[page];
    scheduleWaitingRefresh();
    try {
      const result = await rpc("workflow.list", params);
      nextCursor = result.next_cursor || null;
      renderRuns(result.runs || []);
      $("runs-error").textContent = "";
    } catch (e) {
      fail(e, $("runs-error"));
    }
  }

  // The waiting runs and the schedules: beside the list, refreshed less
  // often; neither one failing hides the other or the runs.
  async function loadWaiting() {
    if ($("runs-view").hidden) return;
    const [waiting, status] = await Promise.allSettled([
      rpc("workflow.waiting", { limit: 50 }),
      rpc("host.status"),
    ]);
    if (waiting.status === "fulfilled") renderWaiting(waiting.value.steps || []);
    if (status.status === "fulfilled") {
      renderSchedules(status.value.schedules || []);
      renderBanner(status.value);
    }
  }

  const scheduleWaitingRefresh = coalesce(loadWaiting, 1000);

  function runLink(runId) {
    return el("a", { href: "#/runs/" + encodeURIComponent(runId), class: "run-link", text: runId });
  }

  // The wait steps waiting for a signal: what each waits for, and until when.
  function renderWaiting(steps) {
    const rows = steps.map((s) => {
      const input = s.input || {};
      return el(
        "tr",
        { "data-run-id": s.run_id, "data-step": s.step },
        el("td", null, runLink(s.run_id)),
        el("td", { text: s.workflow }),
        el("td", null, el("code", { text: s.step })),
        el("td", null, el("code", { text: String(input.signal || "") })),
        el("td", { text: when(s.since) }),
        el("td", { text: input.timeout_at ? when(input.timeout_at) : "never" }),
      );
    });
    $("waiting-body").replaceChildren(...rows);
    $("waiting-section").hidden = steps.length === 0;
  }

  // The config's schedules: the next tick, and the run the last one started.
  function renderSchedules(schedules) {
    const rows = schedules.map((s) =>
      el(
        "tr",
        { "data-workflow": s.workflow, "data-schedule": s.name },
        el("td", { text: s.workflow }),
        el("td", null, el("code", { text: s.name })),
        el("td", null, el("code", { text: s.cron })),
        el("td", { text: s.timezone }),
        el("td", { class: "next-at", text: s.next_at ? when(s.next_at) : "never" }),
        el("td", null, s.last_run_id ? runLink(s.last_run_id) : "none yet"),
      ),
    );
    $("schedules-body").replaceChildren(...rows);
    $("schedules-section").hidden = schedules.length === 0;
  }

  const scheduleRunsRefresh = coalesce(loadRuns, 300);

  function renderRuns(runs) {
    const rows = runs.map((run) =>
      el(
        "tr",
        { "data-run-id": run.run_id, "data-status": known(run.status, RUN_STATUSES) },
        el("td", null, el("a", { href: "#/runs/" + encodeURIComponent(run.run_id), class: "run-link", text: run.run_id })),
        el("td", { class: "workflow", text: run.workflow }),
        el("td", { title: run.queued_reason || "" }, badge(run.status, RUN_STATUSES)),
        el("td", { text: when(run.started_at) }),
        el("td", null, durationCell(run.started_at, run.finished_at)),
      ),
    );
    $("runs-body").replaceChildren(...rows);
    $("runs-empty").hidden = runs.length > 0;
    $("prev-page").disabled = page === 0;
    $("next-page").disabled = !nextCursor;
    $("page-number").textContent = `page ${page + 1}`;
  }

  function firstPage() {
    pages = [null];
    page = 0;
    loadRuns();
  }

  // The config's workflows in both selects. The filter keeps its choice or
  // shows all; the start form keeps a choice made earlier (in this page or,
  // through sessionStorage, before a reload) and otherwise selects the first
  // workflow: a fresh page's select is "", which matches no option and would
  // show an empty select. With no workflows at all, Start is disabled.
  // The `input_schema` of each workflow that has one (`host.status`).
  let inputSchemas = {};
  // Whether the start form's input was typed into: then it is kept.
  let inputTyped = false;

  // An input a workflow's `input_schema` accepts, for the start form: each
  // required property's default, example, constant or first allowed value,
  // else the least of its type.
  function exampleOf(schema, depth = 0) {
    if (!schema || typeof schema !== "object" || depth > 8) return null;
    if ("default" in schema) return schema.default;
    if (Array.isArray(schema.examples) && schema.examples.length > 0) return schema.examples[0];
    if ("const" in schema) return schema.const;
    if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[0];
    const type = Array.isArray(schema.type) ? schema.type[0] : schema.type || (schema.properties ? "object" : null);
    switch (type) {
      case "object": {
        const out = {};
        for (const name of schema.required || []) out[name] = exampleOf((schema.properties || {})[name], depth + 1);
        return out;
      }
      case "array":
        return Array.from({ length: schema.minItems || 0 }, () => exampleOf(schema.items, depth + 1));
      case "string":
        return "x".repeat(schema.minLength || 0);
      case "integer":
      case "number":
        if (typeof schema.minimum === "number") return schema.minimum;
        if (typeof schema.exclusiveMinimum === "number") return Math.floor(schema.exclusiveMinimum) + 1;
        return 0;
      case "boolean":
        return false;
      default:
        return null;
    }
  }

  // The start form's input for the chosen workflow, unless one was typed.
  function prefillInput() {
    if (inputTyped) return;
    const schema = inputSchemas[$("start-workflow").value];
    $("start-input").value = schema ? JSON.stringify(exampleOf(schema)) : "{}";
  }

  function fillWorkflows(names) {
    const filter = $("filter-workflow");
    const kept = filter.value;
    filter.replaceChildren(
      el("option", { value: "", text: "all" }),
      ...names.map((name) => el("option", { value: name, text: name })),
    );
    filter.value = names.includes(kept) ? kept : "";

    const start = $("start-workflow");
    const earlier = [start.value, sessionStorage.getItem(WORKFLOW_KEY)].find((name) => names.includes(name));
    start.replaceChildren(...names.map((name) => el("option", { value: name, text: name })));
    if (names.length > 0) start.value = earlier || names[0];
    start.disabled = names.length === 0;
    $("start-button").disabled = names.length === 0;
    $("start-input").disabled = names.length === 0;
    $("no-workflows").hidden = names.length > 0;
    prefillInput();
  }

  async function startRun(event) {
    event.preventDefault();
    $("start-error").textContent = "";
    $("start-result").replaceChildren();
    const workflow = $("start-workflow").value;
    if (!workflow) return; // no workflows: the button is disabled
    let input;
    try {
      input = JSON.parse($("start-input").value || "null");
    } catch (e) {
      $("start-error").textContent = "The input is not JSON: " + e.message;
      return;
    }
    $("start-button").disabled = true;
    try {
      const started = await rpc("workflow.start", { workflow, input });
      $("start-result").replaceChildren(
        "Started ",
        el("a", { href: "#/runs/" + encodeURIComponent(started.run_id), text: started.run_id }),
      );
      firstPage();
    } catch (e) {
      fail(e, $("start-error"));
    } finally {
      $("start-button").disabled = false;
    }
  }

  // ---- one run

  let selectedStep = null;
  let lastRun = null;

  async function loadRun() {
    const id = openRunId;
    if (id === null) return;
    try {
      const run = await rpc("workflow.get", { run_id: id, calls: true, logs: true });
      if (id !== openRunId) return; // another run was opened meanwhile
      $("run-error").textContent = "";
      renderRun(run);
    } catch (e) {
      fail(e, $("run-error"));
    }
  }

  const scheduleRunRefresh = coalesce(loadRun, 250);

  // The run view before `id` is loaded: nothing of the run shown before it,
  // no actions, no empty graph. A run that cannot be loaded stays so, with
  // the reason in #run-error.
  function clearRun(id) {
    selectedStep = null;
    lastRun = null;
    $("run-id").textContent = id;
    $("run-summary").replaceChildren();
    $("cancel-run").disabled = true;
    $("retry-run").disabled = true;
    $("run-error").textContent = "";
    $("run-steps").hidden = true;
    $("graph").replaceChildren();
    renderStep();
    $("run-data").replaceChildren();
  }

  function renderRun(run) {
    lastRun = run;
    $("run-id").textContent = run.run_id;
    const status = badge(run.status, RUN_STATUSES);
    status.id = "run-status";
    const summary = [
      ["Workflow", run.workflow],
      ["Status", status],
      ...(run.queued_reason ? [["Queued", run.queued_reason]] : []),
      ["Started", when(run.started_at)],
      ["Finished", when(run.finished_at)],
      ["Duration", durationCell(run.started_at, run.finished_at)],
      ["Definition", definitionCell(run)],
    ];
    $("run-summary").replaceChildren(...summary.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", null, v)]));
    $("cancel-run").disabled = run.status !== "running" && run.status !== "queued" && run.status !== "paused";
    $("pause-run").disabled = run.status !== "running";
    $("migrate-run").disabled = !olderDefinition(run);
    $("resume-run").disabled = run.status !== "paused";
    // A compensated run's undone steps would not run again: no retry.
    const compensated = (run.steps || []).some((s) => s.compensates);
    $("retry-run").disabled = compensated || !(run.status === "failed" || run.status === "cancelled");
    $("retry-run").title = compensated ? "its steps were undone (compensated): start a new run" : "";
    const steps = run.steps || [];
    if (selectedStep !== null && !steps.some((s) => s.id === selectedStep)) selectedStep = null;
    // A step that waits for someone is what the page is opened for.
    const waiting = steps.find((s) => s.status === "waiting" || (s.questions || []).length > 0);
    if (selectedStep === null && waiting) selectedStep = waiting.id;
    drawGraph(steps);
    drawTimeline();
    $("run-steps").hidden = false;
    renderStep();
    const data = [el("h3", { text: "Input" }), json(run.input)];
    if (run.output !== undefined) data.push(el("h3", { text: "Output" }), json(run.output));
    if (run.error) data.push(el("h3", { text: "Error" }), errorBox(run.error));
    $("run-data").replaceChildren(...data);
  }

  // Whether an unfinished run is on a definition older than the one in force.
  function olderDefinition(run) {
    const current = definitionsInForce[run.workflow];
    const unfinished = ["queued", "running", "paused"].includes(run.status);
    return unfinished && current && run.definition_hash && current !== run.definition_hash;
  }

  function definitionCell(run) {
    const code = el("code", { text: String(run.definition_hash || "").slice(0, 12) });
    if (!olderDefinition(run)) return code;
    const current = String(definitionsInForce[run.workflow]).slice(0, 12);
    return el("span", { id: "older-definition" }, code, ` (older: in force is ${current}; Migrate moves the run to it)`);
  }

  function errorBox(error) {
    return el("p", { class: "error-box" }, el("code", { text: String(error.code || "") }), " ", String(error.message || ""));
  }

  async function runAction(method, button) {
    if (openRunId === null) return;
    button.disabled = true;
    $("run-error").textContent = "";
    try {
      renderRun(await rpc(method, { run_id: openRunId }));
    } catch (e) {
      fail(e, $("run-error"));
    }
    loadRun();
  }

  // Steps in columns by depth (a step sits right of everything it needs),
  // edges from each need to the step.
  const NODE_W = 170;
  const NODE_H = 46;
  const GAP_X = 60;
  const GAP_Y = 18;
  const PAD = 12;

  function drawGraph(steps) {
    const byId = new Map(steps.map((s) => [s.id, s]));
    const depth = new Map();
    const depthOf = (id, trail) => {
      if (depth.has(id)) return depth.get(id);
      if (trail.has(id)) return 0; // a cycle: definitions have none, but never loop
      trail.add(id);
      const needs = (byId.get(id).needs || []).filter((n) => byId.has(n));
      const d = needs.length ? 1 + Math.max(...needs.map((n) => depthOf(n, trail))) : 0;
      depth.set(id, d);
      return d;
    };
    const columns = [];
    for (const step of steps) {
      const d = depthOf(step.id, new Set());
      (columns[d] = columns[d] || []).push(step);
    }
    const position = new Map();
    columns.forEach((column, x) =>
      column.forEach((step, y) =>
        position.set(step.id, { x: PAD + x * (NODE_W + GAP_X), y: PAD + y * (NODE_H + GAP_Y) }),
      ),
    );
    const rows = Math.max(1, ...columns.map((c) => c.length));
    const width = PAD * 2 + columns.length * NODE_W + Math.max(0, columns.length - 1) * GAP_X;
    const height = PAD * 2 + rows * NODE_H + (rows - 1) * GAP_Y;
    const graph = $("graph");
    graph.setAttribute("viewBox", `0 0 ${width} ${height}`);
    graph.setAttribute("width", width);
    graph.setAttribute("height", height);

    const defs = svg(
      "defs",
      {},
      svg(
        "marker",
        { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }),
      ),
    );
    const edges = [];
    for (const step of steps) {
      const to = position.get(step.id);
      for (const need of step.needs || []) {
        const from = position.get(need);
        if (!from) continue;
        const x1 = from.x + NODE_W;
        const y1 = from.y + NODE_H / 2;
        const x2 = to.x;
        const y2 = to.y + NODE_H / 2;
        const mid = (x1 + x2) / 2;
        edges.push(
          svg("path", {
            class: "edge",
            d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`,
            "marker-end": "url(#arrow)",
            "data-from": need,
            "data-to": step.id,
          }),
        );
      }
    }
    const nodes = steps.map((step) => {
      const p = position.get(step.id);
      const status = known(step.status, STEP_STATUSES);
      const name = step.id.length > 22 ? step.id.slice(0, 21) + "…" : step.id;
      const attempts = step.attempts === 1 ? "1 attempt" : `${step.attempts} attempts`;
      const g = svg(
        "g",
        {
          class:
            `step status-${status}` +
            (step.compensates ? " compensation" : "") +
            (step.id === selectedStep ? " selected" : ""),
          "data-step": step.id,
          "data-status": status,
          "data-attempts": step.attempts,
          transform: `translate(${p.x} ${p.y})`,
          tabindex: 0,
          role: "button",
        },
        svg("title", {}, document.createTextNode(`${step.id}: ${step.status}`)),
        svg("rect", { width: NODE_W, height: NODE_H, rx: 7 }),
        svg("text", { x: 10, y: 19, class: "step-name" }, document.createTextNode(name)),
        svg("text", { x: 10, y: 36, class: "step-meta" }, document.createTextNode(`${step.status} · ${attempts}`)),
      );
      const select = () => {
        selectedStep = step.id;
        drawGraph(steps);
        renderStep();
      };
      g.addEventListener("click", select);
      g.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          select();
        }
      });
      return g;
    });
    graph.replaceChildren(defs, ...edges, ...nodes);
  }

  // The run's life as a Gantt chart: a lane per step with a bar per attempt
  // (from its `step.started` to the next, or to `step.finished`), the time a
  // step let go of its node or waited (`step.parked` to `step.resumed`, a
  // wait step's `step.waiting`), and the run's pauses as bands. Before its
  // events come, the steps' own start and finish times.
  const LANE_H = 22;
  const LABEL_W = 150;
  const CHART_W = 640;

  const scheduleTimeline = coalesce(drawTimeline, 250);

  function drawTimeline() {
    const box = $("timeline");
    const run = lastRun;
    if (!run) return;
    const steps = run.steps || [];
    const at = (text) => Date.parse(text);
    const start = at(run.started_at);
    const events = runEvents.filter((e) => e.at && !isNaN(at(e.at)));
    const end = run.finished_at ? at(run.finished_at) : Math.max(Date.now(), ...events.map((e) => at(e.at)));
    if (isNaN(start)) return;
    const span = Math.max(end - start, 1);
    const x = (t) => LABEL_W + ((Math.min(Math.max(t, start), end) - start) / span) * CHART_W;
    const lanes = new Map(steps.map((s, i) => [s.id, i]));
    const y = (id) => 4 + lanes.get(id) * LANE_H;
    const shapes = [];
    const over = [];
    const bar = (cls, id, from, to, extra = {}) => {
      if (!lanes.has(id) || isNaN(from)) return;
      const x1 = x(from);
      const x2 = Math.max(x(isNaN(to) ? end : to), x1 + 2);
      const inset = cls === "attempt" ? 3 : 7;
      const rect = svg("rect", { class: cls, x: x1, y: y(id) + inset, width: x2 - x1, height: LANE_H - 2 * inset, "data-step": id, ...extra });
      // Waits over the attempts they happened in.
      (cls === "attempt" ? shapes : over).push(rect);
    };
    // Attempts, waits and parks, from the events in order.
    const open = new Map(); // step -> {attempt, from}
    const parked = new Map(); // "step/item" -> from
    for (const e of events) {
      const d = e.data || {};
      const t = at(e.at);
      if (e.kind === "step.started") {
        const was = open.get(d.step);
        if (was) bar("attempt", d.step, was.from, t, { "data-attempt": was.attempt });
        open.set(d.step, { attempt: d.attempt, from: t });
      } else if (e.kind === "step.waiting") {
        parked.set(`${d.step}/0`, t);
      } else if (e.kind === "step.parked") {
        parked.set(`${d.step}/${d.item || 0}`, t);
      } else if (e.kind === "step.resumed") {
        const key = `${d.step}/${d.item || 0}`;
        if (parked.has(key)) bar("park", d.step, parked.get(key), t);
        parked.delete(key);
      } else if (e.kind === "step.finished") {
        const was = open.get(d.step);
        if (was) bar("attempt", d.step, was.from, t, { "data-attempt": was.attempt, "data-status": d.status });
        open.delete(d.step);
        for (const [key, from] of parked) {
          if (key.startsWith(d.step + "/")) {
            bar("park", d.step, from, t);
            parked.delete(key);
          }
        }
      }
    }
    for (const [id, was] of open) bar("attempt", id, was.from, NaN, { "data-attempt": was.attempt });
    for (const [key, from] of parked) bar("park", key.slice(0, key.lastIndexOf("/")), from, NaN);
    if (events.length === 0) {
      for (const s of steps) if (s.started_at) bar("attempt", s.id, at(s.started_at), s.finished_at ? at(s.finished_at) : NaN);
    }
    // The run's pauses, across every lane.
    const height = 8 + steps.length * LANE_H;
    let pausedAt = null;
    const band = (from, to) =>
      shapes.unshift(svg("rect", { class: "pause", x: x(from), y: 0, width: Math.max(x(to) - x(from), 2), height }));
    for (const e of events) {
      if (e.kind === "run.paused") pausedAt = at(e.at);
      else if ((e.kind === "run.resumed" || e.kind === "run.finished") && pausedAt !== null) {
        band(pausedAt, at(e.at));
        pausedAt = null;
      }
    }
    if (pausedAt !== null) band(pausedAt, end);
    // Undoing its steps (compensation), from when it began to the run's end.
    const compensating = events.find((e) => e.kind === "run.compensating");
    if (compensating) {
      const from = at(compensating.at);
      const to = run.finished_at ? at(run.finished_at) : end;
      shapes.unshift(svg("rect", { class: "compensating", x: x(from), y: 0, width: Math.max(x(to) - x(from), 2), height }));
    }
    const labels = steps.map((s) =>
      svg("text", { x: 4, y: y(s.id) + LANE_H / 2 + 4, class: "lane-name" }, document.createTextNode(s.id)),
    );
    const width = LABEL_W + CHART_W + 8;
    box.setAttribute("viewBox", `0 0 ${width} ${height}`);
    box.setAttribute("width", width);
    box.setAttribute("height", height);
    box.replaceChildren(...labels, ...shapes, ...over);
  }

  function renderStep() {
    const box = $("step-detail");
    const step = lastRun && (lastRun.steps || []).find((s) => s.id === selectedStep);
    if (!step) {
      box.hidden = true;
      box.replaceChildren();
      return;
    }
    box.hidden = false;
    const facts = [
      ["Status", badge(step.status, STEP_STATUSES)],
      ["Attempts", String(step.attempts)],
      ["Needs", (step.needs || []).join(", ") || "nothing"],
      ["Started", when(step.started_at)],
      ["Finished", when(step.finished_at)],
      ["Duration", step.started_at ? durationCell(step.started_at, step.finished_at) : ""],
    ];
    if (step.progress) {
      const p = step.progress;
      const total = p.total !== undefined ? ` of ${p.total}` : "";
      facts.push(["Progress", `${p.progress}${total}${p.message ? " — " + p.message : ""}`]);
    }
    const parts = [
      el("h3", null, "Step ", el("code", { text: step.id })),
      el("dl", { class: "summary" }, ...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", null, v)])),
    ];
    // A step waits for a signal (a wait step, or a durable node), a time, a
    // child run or an upstream task; a step asked a question, for its answer.
    for (const what of step.status === "waiting" ? step.waiting_for || [] : []) {
      parts.push(what.signal !== undefined ? signalBox(step, what) : waitBox(what));
    }
    for (const asked of step.questions || []) parts.push(questionBox(step, asked));
    if (step.input !== undefined) parts.push(el("h4", { text: "Input" }), json(step.input));
    if (step.output !== undefined) parts.push(el("h4", { text: "Output" }), json(step.output));
    if (step.error) parts.push(el("h4", { text: "Error" }), errorBox(step.error));
    parts.push(el("h4", { text: "Logs" }), logList(step.logs || []));
    parts.push(el("h4", { text: "Journal" }), callTable(step.calls || []));
    box.replaceChildren(...parts);
  }

  // A waiting step: approve or reject it (a signal of the name it waits for,
  // with `{approved, comment}` as its payload, which becomes its output).
  const signalDrafts = new Map();

  // What a parked step waits for that no one here answers: a time, a child
  // run (linked), an upstream task.
  function waitBox(what) {
    const item = what.item ? ` (item ${what.item})` : "";
    let said;
    if (what.sleep_until !== undefined) said = ["Sleeps until ", when(what.sleep_until)];
    else if (what.child !== undefined)
      said = ["Waits for run ", runLink(String(what.child)), " of ", el("code", { text: String(what.workflow || "") })];
    else if (what.task !== undefined)
      said = ["Waits for task ", el("code", { text: String(what.task) }), " of ", el("code", { text: String(what.call || "") })];
    else said = ["Waits: ", el("code", { text: JSON.stringify(what) })];
    return el("div", { class: "wait-box" }, el("p", null, ...said, item + "."));
  }

  function signalBox(step, what) {
    const signal = String(what.signal || "");
    // What was typed survives the step's re-rendering (live updates).
    const draftKey = lastRun.run_id + "/" + step.id;
    const comment = el("textarea", { id: "signal-comment", rows: "2", placeholder: "Comment (optional)" });
    comment.value = signalDrafts.get(draftKey) || "";
    comment.addEventListener("input", () => signalDrafts.set(draftKey, comment.value));
    const error = el("span", { id: "signal-error", class: "error" });
    const send = async (approved, button) => {
      button.disabled = true;
      error.textContent = "";
      const payload = { approved, comment: comment.value };
      try {
        await rpc("workflow.signal", { run_id: lastRun.run_id, signal, payload });
        loadRun();
      } catch (e) {
        fail(e, error);
        button.disabled = false;
      }
    };
    const approve = el("button", { type: "button", id: "approve-step", text: "Approve" });
    const reject = el("button", { type: "button", id: "reject-step", text: "Reject" });
    approve.addEventListener("click", () => send(true, approve));
    reject.addEventListener("click", () => send(false, reject));
    const until = what.timeout_at ? ` until ${when(what.timeout_at)}` : "";
    return el(
      "div",
      { class: "signal-box" },
      el("p", null, "Waits for signal ", el("code", { text: signal }), until + "."),
      comment,
      el("div", { class: "actions" }, approve, " ", reject, " ", error),
    );
  }

  // A question an upstream server asked the step's call (elicitation): a
  // form rendered from its requested schema (flat, primitive fields, as MCP
  // allows), or a URL to open by hand (the console never opens it).
  // Answered with workflow.answer; the server checks the content.
  const answerDrafts = new Map();

  function questionBox(step, asked) {
    const q = asked.question || {};
    const item = asked.item || 0;
    const draftKey = `${lastRun.run_id}/${step.id}/${item}`;
    const draft = answerDrafts.get(draftKey) || {};
    answerDrafts.set(draftKey, draft);
    const error = el("span", { class: "error question-error" });
    const fields = [];
    const schema = q.requested_schema || {};
    const required = new Set(schema.required || []);
    for (const [name, prop] of Object.entries(schema.properties || {})) {
      const id = `answer-${step.id}-${item}-${name}`;
      const label = el("label", { htmlFor: id }, prop.title || name, required.has(name) ? " *" : "");
      let input;
      let read;
      if (prop.type === "boolean") {
        input = el("input", { type: "checkbox", id, name });
        input.checked = draft[name] ?? prop.default ?? false;
        input.addEventListener("change", () => (draft[name] = input.checked));
        read = () => input.checked;
      } else if (Array.isArray(prop.enum) || Array.isArray(prop.oneOf)) {
        const options = Array.isArray(prop.enum)
          ? prop.enum.map((v) => [String(v), String(v)])
          : prop.oneOf.map((o) => [String(o.const), String(o.title ?? o.const)]);
        input = el("select", { id, name }, ...options.map(([v, t]) => el("option", { value: v, text: t })));
        input.value = draft[name] ?? prop.default ?? options[0]?.[0] ?? "";
        input.addEventListener("change", () => (draft[name] = input.value));
        read = () => input.value;
      } else {
        const numeric = prop.type === "number" || prop.type === "integer";
        input = el("input", { type: numeric ? "number" : "text", id, name });
        if (prop.type === "integer") input.step = "1";
        input.value = draft[name] ?? prop.default ?? "";
        input.addEventListener("input", () => (draft[name] = input.value));
        read = () => {
          if (input.value === "" && !required.has(name)) return undefined;
          return numeric ? Number(input.value) : input.value;
        };
      }
      if (prop.description) input.title = prop.description;
      fields.push({ name, read, row: el("div", { class: "question-field" }, label, " ", input) });
    }
    const send = async (action, button) => {
      button.disabled = true;
      error.textContent = "";
      const params = { run_id: lastRun.run_id, step_id: step.id, item, action };
      if (action === "accept" && q.mode === "form") {
        const content = {};
        for (const f of fields) {
          const value = f.read();
          if (value !== undefined) content[f.name] = value;
        }
        params.content = content;
      }
      try {
        await rpc("workflow.answer", params);
        answerDrafts.delete(draftKey);
        loadRun();
      } catch (e) {
        fail(e, error);
        button.disabled = false;
      }
    };
    const accept = el("button", { type: "button", class: "answer-accept", text: q.mode === "url" ? "Done" : "Submit" });
    const decline = el("button", { type: "button", class: "answer-decline", text: "Decline" });
    const cancel = el("button", { type: "button", class: "answer-cancel", text: "Cancel" });
    accept.addEventListener("click", () => send("accept", accept));
    decline.addEventListener("click", () => send("decline", decline));
    cancel.addEventListener("click", () => send("cancel", cancel));
    const parts = [
      el("p", null, el("code", { text: `${q.connection}.${q.tool}` }), " asks: ", el("span", { class: "question-message", text: q.message || "" })),
    ];
    if (q.mode === "url") {
      parts.push(el("p", null, "Open this address yourself (the console does not open it): ", el("code", { class: "question-url", text: q.url || "" })));
    }
    return el(
      "div",
      { class: "signal-box question-box", "data-item": String(item) },
      ...parts,
      ...fields.map((f) => f.row),
      el("div", { class: "actions" }, accept, " ", decline, " ", cancel, " ", error),
    );
  }

  function logList(logs) {
    if (logs.length === 0) return el("p", { class: "muted", text: "No log records." });
    const lines = [];
    for (const entry of logs) {
      const records = Array.isArray(entry.records) ? entry.records : [];
      for (const record of records) {
        lines.push(
          el(
            "li",
            { class: "log" },
            el("span", { class: "muted", text: `attempt ${entry.attempt}, item ${entry.item} ` }),
            el("span", { class: "level", text: String(record.level || "") }),
            " ",
            el("span", { class: "message", text: String(record.message || "") }),
          ),
        );
      }
    }
    return el("ul", { class: "logs" }, ...lines);
  }

  function callTable(calls) {
    if (calls.length === 0) return el("p", { class: "muted", text: "No capability calls." });
    const head = el(
      "tr",
      null,
      ...["Attempt", "Item", "#", "Capability", "Outcome", "Duration", "At", "Arguments", "Reads before"].map((h) =>
        el("th", { text: h }),
      ),
    );
    const rows = calls.map((call) =>
      el(
        "tr",
        { class: "call" },
        el("td", { text: String(call.attempt) }),
        el("td", { text: String(call.item) }),
        el("td", { text: String(call.seq) }),
        el("td", null, el("code", { text: String(call.name) })),
        el("td", { text: call.error_code ? `${call.outcome} (${call.error_code})` : String(call.outcome) }),
        el("td", { text: duration(call.duration_us / 1000) }),
        el("td", { text: when(call.at) }),
        el("td", null, el("details", null, el("summary", { text: "show" }), json(call.arguments))),
        el("td", { class: "tape" }, tapeCell(call.tape || [])),
      ),
    );
    return el("table", { class: "calls" }, el("thead", null, head), el("tbody", null, ...rows));
  }

  // A durable node's reads of its clocks and random seed before a call, as
  // journaled (each run of the node after a wait reads the same).
  function tapeCell(tape) {
    if (tape.length === 0) return "";
    const said = tape.map((read) => {
      if (read.wall !== undefined) return `wall ${new Date(read.wall / 1e6).toISOString()}`;
      if (read.mono !== undefined) return `monotonic ${read.mono} ns`;
      if (read.seed !== undefined) return `seed ${String(read.seed).slice(0, 16)}…`;
      return JSON.stringify(read);
    });
    const counts = new Map();
    for (const read of tape) for (const kind of Object.keys(read)) counts.set(kind, (counts.get(kind) || 0) + 1);
    const summary = [...counts].map(([k, n]) => (n > 1 ? `${k} ×${n}` : k)).join(", ");
    return el("details", null, el("summary", { text: summary }), el("ol", null, ...said.map((t) => el("li", { text: t }))));
  }

  // ---- the host's health

  // A banner while the host is degraded (its state cannot be written) or
  // busy (new starts are refused), from `host.status`.
  function renderBanner(status) {
    const degraded = status.state && status.state.degraded;
    const load = status.load || {};
    let text = "";
    let kind = "";
    if (degraded) {
      kind = "degraded";
      text = "Degraded: " + degraded + ". Runs wait; new starts are refused until it passes.";
    } else if (load.busy) {
      kind = "busy";
      const runs = load.live_runs === 1 ? "1 run" : `${load.live_runs} runs`;
      text = `Busy: this host drives ${runs}, its limit (max_live_runs); new starts are refused until some end.`;
    }
    const banner = $("banner");
    banner.textContent = text;
    banner.dataset.kind = kind;
    banner.hidden = !text;
  }

  async function loadBanner() {
    try {
      renderBanner(await rpc("host.status"));
    } catch (e) {
      // The boot error or the live badge says the server is away.
    }
  }

  // ---- connections

  async function loadConnections() {
    try {
      const status = await rpc("host.status");
      renderConnections(status);
      renderBanner(status);
      $("connections-error").textContent = "";
    } catch (e) {
      fail(e, $("connections-error"));
    }
  }

  function renderConnections(status) {
    const connections = status.connections || [];
    const rows = connections.map((c) =>
      el(
        "tr",
        { "data-connection": c.id, "data-state": String(c.state) },
        el("td", null, el("code", { text: c.id })),
        el("td", { text: String(c.transport) }),
        el("td", null, el("span", { class: "conn-state conn-" + String(c.state).replace(/[^a-z-]/g, ""), text: String(c.state) })),
        el("td", { text: String(c.sessions_opened) }),
        el("td", { text: String(c.calls) }),
        el("td", { text: String(c.failures) }),
        el("td", { text: c.notifications || "—" }),
        el("td", { text: `${c.tools} tools, ${c.resources} resources, ${c.prompts} prompts` }),
        el("td", { class: "last-error", text: c.last_error || "" }),
      ),
    );
    $("connections-body").replaceChildren(...rows);
    $("connections-empty").hidden = connections.length > 0;
    const state = status.state || {};
    const facts = [
      ["Backend", state.backend],
      ["Location", state.path],
      ["Runs running", state.runs_running],
      ["Runs kept", state.runs_total],
    ];
    $("state-summary").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v ?? "") })]));
  }

  // ---- start

  async function boot() {
    $("boot-error").hidden = true;
    let status;
    try {
      status = await rpc("host.status");
    } catch (e) {
      if (e instanceof Unauthorized) {
        if (token) sessionStorage.removeItem(TOKEN_KEY);
        showLogin(token ? "The server refused this token." : "");
        token = "";
      } else {
        $("boot-error").hidden = false;
        $("boot-error").textContent = "Cannot reach the server: " + e.message;
      }
      return;
    }
    inputSchemas = status.input_schemas || {};
    renderBanner(status);
    fillWorkflows(status.workflows || []);
    $("nav").hidden = false;
    $("forget-token").hidden = !token;
    if (stream) stream.close();
    // From the newest kept event on: the list is read fresh, so only what
    // happens next matters.
    const last = status.state && Number.isInteger(status.state.last_event_id) ? status.state.last_event_id : null;
    stream = new EventStream("/events", last, onEvent, setLive);
    route();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      token = $("token").value.trim();
      $("token").value = "";
      sessionStorage.setItem(TOKEN_KEY, token);
      boot();
    });
    $("forget-token").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      token = "";
      showLogin("");
    });
    $("start-form").addEventListener("submit", startRun);
    $("start-workflow").addEventListener("change", () => {
      sessionStorage.setItem(WORKFLOW_KEY, $("start-workflow").value);
      inputTyped = false;
      prefillInput();
    });
    $("start-input").addEventListener("input", () => (inputTyped = true));
    $("filter-workflow").addEventListener("change", firstPage);
    $("filter-status").addEventListener("change", firstPage);
    $("prev-page").addEventListener("click", () => {
      if (page > 0) page -= 1;
      loadRuns();
    });
    $("next-page").addEventListener("click", () => {
      if (!nextCursor) return;
      pages[page + 1] = nextCursor;
      page += 1;
      loadRuns();
    });
    $("cancel-run").addEventListener("click", () => runAction("workflow.cancel", $("cancel-run")));
    $("retry-run").addEventListener("click", () => runAction("workflow.retry", $("retry-run")));
    $("pause-run").addEventListener("click", () => runAction("workflow.pause", $("pause-run")));
    $("resume-run").addEventListener("click", () => runAction("workflow.resume", $("resume-run")));
    $("migrate-run").addEventListener("click", () => runAction("workflow.migrate", $("migrate-run")));
    window.addEventListener("hashchange", route);
    setInterval(tick, 1000);
    setInterval(() => {
      if (!$("nav").hidden) loadBanner();
    }, 5000);
    boot();
  });
})();
