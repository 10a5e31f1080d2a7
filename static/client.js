// kvgateway client: one ES module for the dashboard, any page and Node (20 and later), no DOM.
//
//   import { connect } from "http://127.0.0.1:8080/client.js";   // or a copy of static/
//   const client = connect("http://127.0.0.1:8080", { token });   // snapshot=blocks, resumes
//   client.on("batch", (m) => ...); client.state.rows("llama", 0); // [[medium, group, hash, refs]]
//
// What docs/protocol.md's "Writing a client" says, once: WebSocket (SSE read with fetch when no
// WebSocket is available or it keeps failing), the hello, the state built apart and swapped in
// when complete, batches and notices applied in order, staleness, the last id kept and resumed
// after any drop with a jittered backoff, and the optional state digest checked on every digest
// message. Engine seqs are decimal strings, exact beyond 2^53 (client-state.js).
//
// Node 20 has no global WebSocket without `--experimental-websocket`: pass one
// (`{ WebSocket }`) or let the client read SSE.

import { BlockState, parseMessage } from "./client-state.js";

export * from "./client-state.js";

export const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
const FILTERS = ["source", "dp_rank", "type", "medium", "compat"];

const asList = (v) => (v === undefined || v === null ? [] : Array.isArray(v) ? v : [v]);

/** The options a client runs with, defaults filled in. */
function settle(options) {
  const o = {
    snapshot: "blocks",
    token: "",
    transport: "auto", // "auto": WebSocket, SSE after it failed to open twice; "ws"; "sse"
    digest: 0, // seconds between the gateway's digests (0: none asked)
    helloTimeoutMs: 10000,
    backoffMs: BACKOFF_MS,
    wsFailuresBeforeSse: 2,
    wsRetryAfterSseMs: 5 * 60 * 1000,
    slowWindowMs: 60000,
    ...options,
  };
  o.WebSocket = options.WebSocket ?? globalThis.WebSocket;
  o.fetch = options.fetch ?? globalThis.fetch?.bind(globalThis);
  o.filters = Object.fromEntries(FILTERS.map((name) => [name, asList(options[name])]));
  return o;
}

/**
 * A connection to a gateway that keeps `state` (a BlockState) and says what happens through
 * `on(kind, fn)`: "message", "hello", "state", "batch", "notice", "digest" (each message, after it
 * is applied), "complete" (a fresh state swapped in), "mismatch" (a digest that differs),
 * "connection" ({state, note, transport}), "transport" ({transport, why}), "auth" (401: stopped
 * until setToken() and start()), "refused" ({status, error}: a 400, stopped), "error".
 */
export class KVGatewayClient {
  constructor(base, options = {}) {
    this.base = String(base).endsWith("/") ? String(base) : `${base}/`;
    this.options = settle(options);
    this.state = new BlockState({ filters: this.options.filters, blocks: this.options.snapshot === "blocks" });
    this.transport = this.options.transport === "sse" || !this.options.WebSocket ? "sse" : "ws";
    this.connection = "idle"; // connecting | live | reconnecting | stopped
    this.note = "";
    this.said = ""; // the last connection event, not repeated
    this.everLive = false;
    this.messages = 0;
    this.reconnects = 0;
    this.listeners = new Map();
    this.current = null; // {kind, close()}
    this.timer = 0;
    this.attempt = 0;
    this.wsFailures = 0;
    this.sseSince = 0;
    this.slowCuts = [];
  }

  /** Calls `fn` for every event of `kind`; returns the function that stops it. */
  on(kind, fn) {
    if (!this.listeners.has(kind)) this.listeners.set(kind, new Set());
    this.listeners.get(kind).add(fn);
    return () => this.listeners.get(kind).delete(fn);
  }

  /** Calls the listeners of `kind`; one that throws stops neither the others nor the stream. */
  emit(kind, value) {
    for (const fn of this.listeners.get(kind) ?? []) {
      try {
        fn(value);
      } catch (err) {
        if (kind !== "error" && this.listeners.get("error")?.size) this.emit("error", err);
        else queueMicrotask(() => {
          throw err; // reported as uncaught, after the state is whole
        });
      }
    }
  }

  get lastId() {
    return this.state.lastId;
  }

  get digestMismatches() {
    return this.state.digestMismatches;
  }

  setToken(token) {
    this.options.token = token;
    this.wsFailures = 0;
    this.attempt = 0;
  }

  /** Connects (again, at once). */
  start() {
    this.stop();
    if (this.transport === "sse" && this.sseSince && Date.now() - this.sseSince > this.options.wsRetryAfterSseMs) {
      this.useTransport("ws", "");
    }
    this.setConnection(this.everLive ? "reconnecting" : "connecting", this.note);
    if (this.transport === "ws") this.openWS();
    else this.openSSE();
  }

  /** Closes the connection and stops reconnecting. */
  close() {
    this.stop();
    this.setConnection("stopped", "");
  }

  /** Drops the connection (a stall the caller noticed) and reconnects after the backoff. */
  reconnect(note) {
    this.stop();
    this.retry(note);
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = 0;
    const c = this.current;
    this.current = null;
    if (c) c.close();
  }

  setConnection(state, note) {
    const said = `${state}\n${note}\n${this.transport}`;
    if (said === this.said) return;
    this.said = said;
    this.connection = state;
    this.note = note;
    this.emit("connection", { state, note, transport: this.transport });
  }

  useTransport(transport, why) {
    this.transport = transport;
    this.wsFailures = 0;
    this.sseSince = transport === "sse" ? Date.now() : 0;
    if (why) this.emit("transport", { transport, why });
  }

  url(path) {
    const url = new URL(path, this.base);
    if (this.transport === "ws") url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const o = this.options;
    if (o.snapshot) url.searchParams.set("snapshot", o.snapshot);
    for (const [name, values] of Object.entries(o.filters)) for (const v of values) url.searchParams.append(name, String(v));
    if (o.digest) url.searchParams.set("digest", String(o.digest));
    if (o.token && this.transport === "ws") url.searchParams.set("token", o.token); // no headers on a WebSocket
    if (this.state.lastId) url.searchParams.set("last_event_id", this.state.lastId);
    return url.toString();
  }

  authHeaders() {
    return this.options.token ? { Authorization: `Bearer ${this.options.token}` } : {};
  }

  /** Schedules the next connection after the backoff (0.5 s doubling to 15 s, jittered). */
  retry(note) {
    clearTimeout(this.timer);
    const steps = this.options.backoffMs;
    const delay = Math.round(steps[Math.min(this.attempt, steps.length - 1)] * (0.75 + Math.random() * 0.5));
    this.attempt += 1;
    this.reconnects += 1;
    this.setConnection(this.everLive ? "reconnecting" : "connecting", `${note}; retry in ${(delay / 1000).toFixed(1)} s`);
    this.timer = setTimeout(() => this.start(), delay);
  }

  /**
   * The gateway cut us for falling behind. Resuming at once is right the first time (the ring
   * still holds the gap); when it keeps happening, each wait is longer, so that the client does
   * not become a reconnect loop (the attempt count is otherwise reset by every hello).
   */
  slowCut() {
    const now = Date.now();
    this.slowCuts = this.slowCuts.filter((t) => now - t < this.options.slowWindowMs);
    this.slowCuts.push(now);
    this.attempt = Math.max(this.attempt, this.slowCuts.length - 1);
    this.retry("dropped as a slow consumer");
  }

  /** Applies one line of the stream; the message (null when unreadable). */
  receive(line) {
    let msg;
    try {
      msg = parseMessage(line);
    } catch (err) {
      this.emit("error", new Error(`unreadable message: ${err.message}`));
      return null;
    }
    this.messages += 1;
    const wasComplete = this.state.complete;
    const check = this.state.apply(msg, { snapshot: this.options.snapshot === "blocks" });
    if (msg.type === "hello") this.onHello();
    if (!wasComplete && this.state.complete) this.emit("complete", this.state);
    if (check && !check.ok) this.emit("mismatch", check);
    this.emit(msg.type, msg);
    this.emit("message", msg);
    return msg;
  }

  onHello() {
    this.attempt = 0;
    this.everLive = true;
    if (this.transport === "ws") this.wsFailures = 0;
    this.setConnection("live", "");
  }

  /**
   * A connection that never brought a hello: was it the WebSocket, the gateway or the token? Only
   * a WebSocket failure while plain HTTP works counts toward falling back to SSE.
   */
  async diagnose() {
    if (this.options.diagnose) return this.options.diagnose();
    try {
      const signal = AbortSignal.timeout(this.options.helloTimeoutMs); // a half-open socket must not stall us
      const res = await this.options.fetch(new URL("v1/sources", this.base), { headers: this.authHeaders(), signal });
      if (res.status === 401 || res.status === 403) return "auth";
      return res.ok ? "ws" : "down";
    } catch {
      return "down";
    }
  }

  needAuth() {
    this.stop();
    this.setConnection("stopped", "waiting for token");
    this.emit("auth", null);
  }

  /** The WebSocket never opened (or closed before its hello): retry, fall back, or ask for a token. */
  async failedOpen(what, wsItself) {
    const why = await this.diagnose();
    if (this.current !== null || this.connection === "stopped" || this.timer) return; // taken over meanwhile
    if (why === "auth") return this.needAuth();
    if (why === "ws" && wsItself && this.options.transport === "auto" && this.options.fetch) {
      this.wsFailures += 1;
      if (this.wsFailures >= this.options.wsFailuresBeforeSse) {
        this.attempt = 0;
        this.useTransport("sse", "WebSocket unavailable: switched to SSE");
        return this.start();
      }
    }
    return this.retry(why === "down" ? "gateway unreachable" : `${what} failed to open`);
  }

  openWS() {
    const ws = new this.options.WebSocket(this.url("v1/ws"));
    let opened = false;
    let gotHello = false;
    let closed = false;
    const helloTimer = setTimeout(() => gotHello || ws.close(4000, "no hello"), this.options.helloTimeoutMs);
    const me = {
      kind: "ws",
      close() {
        closed = true;
        clearTimeout(helloTimer);
        try {
          ws.close(1000);
        } catch {
          /* already closed */
        }
      },
    };
    this.current = me;
    ws.onopen = () => {
      opened = true;
    };
    ws.onmessage = (ev) => {
      if (closed || typeof ev.data !== "string") return;
      for (const line of ev.data.split("\n")) {
        if (line && this.receive(line)?.type === "hello") gotHello = true; // a frame may hold several messages
      }
    };
    // Node 20's WebSocket reports a refused connection with an error and never a close.
    ws.onerror = () => ws.onclose({ code: 1006, reason: "" });
    ws.onclose = (ev) => {
      clearTimeout(helloTimer);
      if (closed || this.current !== me) return;
      this.current = null;
      closed = true;
      // The server closing an accepted socket on purpose (too many clients, shutting down)
      // proves that WebSocket works here: not a reason to fall back.
      const deliberate = opened && (ev.code === 1012 || ev.code === 1013);
      if (!gotHello && !deliberate) return this.failedOpen("WebSocket", true);
      if (ev.code === 1013 && gotHello) return this.slowCut();
      return this.retry(`closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`);
    };
  }

  openSSE() {
    const ctrl = new AbortController();
    const me = { kind: "sse", close: () => ctrl.abort() };
    this.current = me;
    const headers = { Accept: "text/event-stream", ...this.authHeaders() };
    const run = async () => {
      const res = await this.options.fetch(this.url("v1/events"), { headers, signal: ctrl.signal, cache: "no-store" });
      if (res.status === 401 || res.status === 403) return "auth";
      if (res.status === 400) return { status: 400, error: (await res.json().catch(() => ({}))).error ?? "HTTP 400" };
      if (!res.ok) return res.status === 503 ? "the gateway is full (HTTP 503)" : `HTTP ${res.status}`;
      return this.readSSE(res.body, ctrl);
    };
    const finish = (outcome) => {
      if (this.current !== me) return;
      this.current = null;
      if (outcome === "auth") return this.needAuth();
      if (typeof outcome === "object") {
        this.setConnection("stopped", outcome.error);
        return this.emit("refused", outcome);
      }
      if (outcome === "slow") return this.slowCut();
      return this.retry(outcome);
    };
    run().then(finish, () => (ctrl.signal.aborted && this.current !== me ? null : finish("gateway unreachable")));
  }

  /** Reads an event stream to its end: each event's `data:` is one message (its JSON has the id). */
  async readSSE(body, ctrl) {
    const timer = setTimeout(() => gotHello || ctrl.abort(), this.options.helloTimeoutMs);
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let data = [];
    let gotHello = false;
    let slow = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, end).replace(/\r$/, "");
          buffer = buffer.slice(end + 1);
          if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
          else if (line === "" && data.length) {
            const text = data.join("\n");
            data = [];
            const msg = this.receive(text);
            if (msg?.type === "hello") gotHello = true;
            if (msg?.kind === "slow_consumer") slow = true;
          } // id:, event:, retry: and ": ping" need nothing: the JSON says it all
        }
      }
    } finally {
      clearTimeout(timer);
    }
    if (slow) return "slow";
    return gotHello ? "event stream closed" : "event stream failed";
  }
}

/** A client for `base` (the gateway's URL), connected: `connect(base, options)`. */
export function connect(base, options = {}) {
  const client = new KVGatewayClient(base, options);
  client.start();
  return client;
}
