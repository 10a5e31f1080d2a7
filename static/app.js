// kvgateway dashboard: plain ES module, no build step, works offline (uPlot is vendored).
//
// Where each number comes from (one source per fact):
// - Resident blocks/tokens per stream and medium, fleet totals, capacity: the gateway's occupancy
//   snapshot. hello.occupancy on a connection that was not recovered, then GET v1/occupancy every
//   1 s. A browser cannot rebuild the snapshot from batches (it would need the reference-counted
//   hash sets), so it never tries.
// - Charts and the health history (fill, rates, restarts, batch age): GET v1/history, the series
//   the gateway samples every 5 s for the last hour. Fetched whole on every hello (so a new tab or
//   a reconnect draws full charts at once), then every 5 s with since=<last t>. A new epoch (the
//   gateway restarted) starts the series again. The gateway's rates agree with /metrics, do not
//   spike when a reconnect replays missed batches, and keep coming while this tab sleeps.
// - Health at a glance (down > degraded > restarting > silent > stale > up): the state from
//   v1/sources, restarts within RESTART_WINDOW_S (the counter now minus the history's), and the
//   time since the stream's last batch (batches seen on the stream, or the history's age).
// - Past CARDS_MAX streams the page shows a sortable fleet table (grouped by source); a row's
//   card opens on demand.
// - State badges and counters (gaps, replays, unrecovered, restarts, decode errors): GET
//   v1/sources every 2 s, and hello.sources. Notices from the stream update a badge at once
//   (the next poll confirms) and flash the card.
// - Live tail: batches and notices from the stream (WebSocket v1/ws, or SSE v1/events after the
//   WebSocket failed to open twice while plain HTTP worked; WebSocket is tried again on a
//   reconnect 5 minutes later). One row per event; the newest 200 rows that pass the client-side
//   filters are in the DOM. Reconnects back off (0.5 s doubling to 15 s, jittered) and resume
//   with last_event_id; a hello with recovered=false brings a fresh snapshot, and the tail gets
//   a separator row saying so.
// - Token: a 401 on any request shows an inline form; the token is kept in sessionStorage (this
//   tab only) and sent as "Authorization: Bearer" (fetch) or ?token= (WebSocket, SSE).
//
// Rendering: messages and poll results only change in-memory state and mark it dirty; one
// requestAnimationFrame callback renders whatever is dirty (the tail at most ~8 times a second),
// so a 1,000 batches/s stream costs a JSON.parse per message and one paint per frame.
//
// URLs are relative to the page, so the dashboard also works behind a path prefix.
// Block hashes are strings in the protocol and are never converted to numbers here.

const OCC_POLL_MS = 1000;
const SOURCES_POLL_MS = 2000;
const FETCH_TIMEOUT_MS = 4000;
const CHART_WINDOW_S = 1800;
const HISTORY_POLL_MS = 5000;
const ANALYTICS_POLL_MS = 10000;
const HISTORY_POINTS_MAX = 10000; // as the gateway: a whole-history fetch asks for a coarser step beyond this
const CARDS_MAX = 6; // more streams than this: the fleet table, cards on demand
const CARD_MIN_PX = 330;
const TAIL_ROWS = 200; // rows in the DOM
const TAIL_BUFFER = 3000; // events kept in memory (for re-filtering)
const TAIL_TYPE_RATE = 6; // events per second and type kept for the tail: filters keep minutes
const NOTICES_KEPT = 300; // notices have their own list: events never push them out
const NOTICES_SHOWN = 6;
const TAIL_MIN_INTERVAL_MS = 200; // the tail and the header counters repaint at most 5 times a second
const HASHES_SHOWN = 3;
const TOKEN_KEY = "kvgateway.token";
const NOTICE_FLASH_MS = 4000;
const STALL_MS = 20000;
const MEDIUM_ORDER = ["GPU", "CPU", "CPU_PINNED", "STORAGE", "DISK", "EXTERNAL"];
// The gateway's tiers (docs/protocol.md): every medium belongs to one; events and snapshots carry it.
const TIERS = ["GPU", "CPU", "DISK", "EXTERNAL"];
const COUNTERS = ["gaps", "missed", "replayed", "unrecovered", "restarts", "decode_errors", "duplicates", "batches"];

// ---------------------------------------------------------------------------------------------
// small helpers

import { compactFmt, el, fmtDur, fmtInt, fmtPct, fmtRate, fmtTime, intFmt, seqFmt, setText, setVal } from "./format.js";
import {
  LAG_FRESH_S,
  RESTART_WINDOW_S,
  STATE_ORDER,
  cacheFacts,
  lastBatchAt,
  restartsWithin,
  streamHealth,
  troubleCounts,
} from "./health.js";
import { FleetTable } from "./fleet-table.js";
import { PrefillView } from "./prefill.js";
import { kindText, reasonText } from "./reasons.js";
import { KVGatewayClient, parseMessage } from "./client.js";

const $ = (sel, root = document) => root.querySelector(sel);
const tid = (name, root = document) => root.querySelector(`[data-testid="${name}"]`);

function shortHash(h) {
  const s = String(h);
  return s.length > 8 ? s.slice(0, 8) + "…" : s;
}

/** A medium as the dashboard groups it: upper case, absent = GPU (engines before media existed). */
function normMedium(m) {
  return m === null || m === undefined || m === "" ? "GPU" : String(m).toUpperCase();
}

/** The tier the gateway gave a medium (snapshot entries and events carry it); GPU when absent. */
function tierOf(x) {
  return x && TIERS.includes(x.tier) ? x.tier : "GPU";
}

function mediumRank(m) {
  const i = MEDIUM_ORDER.indexOf(m);
  return i < 0 ? MEDIUM_ORDER.length : i;
}

function sortMediums(list) {
  return [...list].sort((a, b) => mediumRank(a) - mediumRank(b) || a.localeCompare(b));
}

const streamKey = (source, rank) => `${source}\u0000${rank}`;
const prefill = new PrefillView(tid("prefill")); // "where prefill goes" (static/prefill.js)

// ---------------------------------------------------------------------------------------------
// state

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  needAuth: false,
  authRejected: false,

  conn: "connecting", // connecting | live | reconnecting
  connNote: "",
  transport: "ws", // ws | sse
  epoch: "",
  offset: null,
  everLive: false,

  occupancy: null, // last snapshot {offset, streams, totals}
  occAt: 0, // Date.now() when it arrived
  occError: null, // {text, detail} of the last failed poll, null once one succeeds
  sources: null, // [{source, dp_rank, state, ...}]
  sourcesAt: 0,
  sourcesError: null,

  overrides: new Map(), // streamKey -> {state, until} from notices, until the next sources poll
  notices: new Map(), // streamKey -> {kind, at}
  history: new Map(), // streamKey -> series from v1/history (see applyHistory)
  historyEpoch: "",
  historyLastT: 0,
  historyWantFull: true,
  historyRequestFull: false,
  lastBatch: new Map(), // streamKey -> Date.now() of the last batch seen on the stream
  analytics: null, // last GET v1/analytics
  analyticsBy: new Map(), // streamKey -> its entry
  noticeList: [], // newest last, at most NOTICES_KEPT
  tailBuckets: new Map(), // event type -> {tokens, at}: the tail's per-type rate limit
  tailSkipped: 0,
  view: "", // "" = automatic (cards up to CARDS_MAX streams), or "cards" / "table"
  pinned: new Set(), // streamKeys whose card is open in table view
  sort: { col: "stream", dir: 1 },
  grouped: true,

  tail: new Array(TAIL_BUFFER), // ring of entries
  tailHead: 0, // number of entries ever pushed
  tailClearedAt: 0, // entries before this index are hidden
  tailRendered: 0, // tailHead at the last tail render
  tailFilterKey: "",
  tailPaused: false,
  tailHover: false,
  knownSources: new Set(),
  knownMediums: new Set(),
  mediumTiers: new Map(), // medium name -> its tier, as the gateway said

  msgCount: 0,
  msgTotal: 0, // messages received since the page loaded
  lastMessageAt: 0,
  msgRate: 0,
  msgRateAt: performance.now(),

  dirty: { conn: true, counters: true, occ: true, sources: true, tail: true, charts: true, filters: true, notices: true },
};

let frameRequested = false;
function invalidate(part) {
  state.dirty[part] = true;
  if (!frameRequested) {
    frameRequested = true;
    requestAnimationFrame(renderFrame);
  }
}

// ---------------------------------------------------------------------------------------------
// HTTP polls

/** A 401 or 403; `token`: the one the request carried (an answer about an old token is no news). */
class AuthError extends Error {
  constructor(message, token) {
    super(message);
    this.token = token;
  }
}

/** A failed poll, said for people ("the gateway did not answer within 4 s"); `detail`: the browser's own words. */
class FetchProblem extends Error {
  constructor(message, detail = "") {
    super(message);
    this.detail = detail;
  }
}

function authHeaders() {
  return state.token ? { Authorization: `Bearer ${state.token}` } : {};
}

async function getJSON(path) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), FETCH_TIMEOUT_MS);
  const token = state.token;
  let res;
  try {
    res = await fetch(new URL(path, document.baseURI), {
      headers: { Accept: "application/json", ...authHeaders() },
      cache: "no-store",
      signal: ctrl.signal,
    });
    if (res.status === 401 || res.status === 403) throw new AuthError(`HTTP ${res.status}`, token);
    if (!res.ok) throw new FetchProblem(`the gateway answered HTTP ${res.status}; retrying`);
    return parseMessage(await res.text()); // JSON.parse with every seq exact (a decimal string)
  } catch (err) {
    if (err instanceof AuthError || err instanceof FetchProblem) throw err;
    // the browser's words ("signal is aborted without reason", "Failed to fetch") mean nothing to people
    const detail = String((err && err.message) || err);
    if (ctrl.signal.aborted) {
      throw new FetchProblem(`the gateway did not answer within ${FETCH_TIMEOUT_MS / 1000} s; retrying`, detail);
    }
    if (res) throw new FetchProblem("the gateway's answer was cut off or unreadable; retrying", detail);
    throw new FetchProblem("the gateway cannot be reached; retrying", detail);
  } finally {
    clearTimeout(timer);
  }
}

/** What a failed poll shows: the sentence, and the browser's own words for the tooltip. */
function problemOf(what, err) {
  return { text: `${what}: ${(err && err.message) || err}`, detail: (err && err.detail) || "" };
}

function onAuthRequired() {
  if (!state.needAuth) {
    state.authRejected = Boolean(state.token);
    state.needAuth = true;
    client.stop();
    state.connNote = "waiting for token";
    invalidate("conn");
  }
}

/**
 * One request at a time, every intervalMs. now() while a request is in flight asks for the next
 * one as soon as it ends: a second timer then would start a second chain of polls for good.
 */
function poller(path, intervalMs, onData, onError) {
  let timer = 0;
  let inFlight = false;
  let again = false;
  const tick = async () => {
    timer = 0;
    inFlight = true;
    again = false;
    if (!state.needAuth) {
      try {
        onData(await getJSON(typeof path === "function" ? path() : path));
      } catch (err) {
        // A 401 for a token the user has replaced meanwhile says nothing of the new one: ask again.
        if (!(err instanceof AuthError)) onError(err);
        else if (err.token === state.token) onAuthRequired();
        else again = true;
      }
    }
    inFlight = false;
    timer = setTimeout(tick, again ? 0 : intervalMs);
  };
  return {
    start() {
      if (!timer && !inFlight) timer = setTimeout(tick, 0);
    },
    now() {
      if (inFlight) {
        again = true;
        return;
      }
      clearTimeout(timer);
      timer = setTimeout(tick, 0);
    },
  };
}

const occPoller = poller(
  "v1/occupancy",
  OCC_POLL_MS,
  (data) => {
    applyOccupancy(data);
    state.occError = null;
  },
  (err) => {
    state.occError = problemOf("occupancy", err);
    invalidate("occ");
  },
);

const analyticsPoller = poller(
  "v1/analytics",
  ANALYTICS_POLL_MS,
  (data) => {
    if (!data || !Array.isArray(data.streams)) return;
    state.analytics = data;
    state.analyticsBy = new Map(data.streams.map((a) => [streamKey(a.source, a.dp_rank), a]));
    invalidate("occ");
  },
  () => {
    /* optional: the cards just keep the last figures */
  },
);

const historyPoller = poller(
  historyPath,
  HISTORY_POLL_MS,
  (data) => applyHistory(data, state.historyRequestFull),
  () => {
    /* the charts keep what they have; the next poll asks again */
  },
);

const sourcesPoller = poller(
  "v1/sources",
  SOURCES_POLL_MS,
  (data) => {
    applySources(data && data.sources);
    state.sourcesError = null;
  },
  (err) => {
    state.sourcesError = problemOf("engines", err);
    invalidate("sources");
  },
);

function applyOccupancy(occ, fromHello = false) {
  if (!occ || !Array.isArray(occ.streams)) return;
  state.occupancy = occ;
  state.occAt = Date.now();
  for (const s of occ.streams) {
    state.knownSources.add(s.source);
    for (const [m, v] of Object.entries(s.mediums || {})) {
      if (!state.knownMediums.has(m) || state.mediumTiers.get(m) !== tierOf(v)) invalidate("filters");
      state.knownMediums.add(m);
      state.mediumTiers.set(m, tierOf(v));
    }
  }
  invalidate("occ");
  invalidate("filters");
}

function applySources(list) {
  if (!Array.isArray(list)) return;
  state.sources = list;
  state.sourcesAt = Date.now();
  state.overrides.clear();
  for (const s of list) state.knownSources.add(s.source);
  invalidate("sources");
  invalidate("filters");
}

function historyPath() {
  state.historyRequestFull = state.historyWantFull || !state.historyLastT;
  if (!state.historyRequestFull) return `v1/history?since=${state.historyLastT}`;
  // a whole hour for a big fleet: fewer points per stream (the step is a multiple of 5 s)
  const streams = Math.max(1, (state.sources || []).length);
  const step = 5 * Math.max(1, Math.ceil((streams * 720) / HISTORY_POINTS_MAX));
  return step > 5 ? `v1/history?step=${step}` : "v1/history";
}

function newSeries() {
  return { t: [], occ: [], fill: [], stores: [], removes: [], restarts: [], lastBatch: [], lag: [], state: [] };
}

/** The chart's occupancy value of a point: the GPU fill in % where capacity is known, else GPU blocks. */
function pointOcc(p) {
  let blocks = 0;
  let cap = 0;
  let capKnown = true;
  let any = false;
  for (const [m, v] of Object.entries(p.mediums || {})) {
    if ((state.mediumTiers.get(m) || (m === "GPU" ? "GPU" : "")) !== "GPU" || !v) continue;
    any = true;
    blocks += v.blocks;
    if (typeof v.fill === "number" && v.fill > 0) cap += v.blocks / v.fill;
    else if (v.blocks > 0 || v.fill === null) capKnown = false;
  }
  if (!any) return { occ: null, fill: null };
  const fill = capKnown && cap > 0 ? (blocks / cap) * 100 : capKnown && blocks === 0 ? 0 : null;
  return { occ: fill === null ? blocks : fill, fill };
}

function applyHistory(doc, full) {
  if (!doc || !Array.isArray(doc.streams)) return;
  prefill.applyHistory(doc, full, streamKey);
  state.historyWantFull = false;
  if (full || doc.epoch !== state.historyEpoch) {
    state.history.clear();
    state.historyEpoch = String(doc.epoch || "");
    state.historyLastT = 0;
  }
  let newest = state.historyLastT;
  for (const s of doc.streams) {
    const key = streamKey(s.source, s.dp_rank);
    let h = state.history.get(key);
    if (!h) state.history.set(key, (h = newSeries()));
    for (const p of s.points || []) {
      if (h.t.length && p.t <= h.t[h.t.length - 1]) continue;
      let stores = null;
      let removes = null;
      for (const v of Object.values(p.mediums || {})) {
        if (typeof v.stores_per_s === "number") stores = (stores ?? 0) + v.stores_per_s;
        if (typeof v.removes_per_s === "number") removes = (removes ?? 0) + v.removes_per_s;
      }
      const o = pointOcc(p);
      h.t.push(p.t);
      h.occ.push(o.occ);
      h.fill.push(o.fill);
      h.stores.push(stores);
      h.removes.push(removes);
      h.restarts.push(typeof p.restarts === "number" ? p.restarts : null);
      h.lastBatch.push(typeof p.batch_age_seconds === "number" ? p.t - p.batch_age_seconds : null);
      h.lag.push(p.lag_seconds ?? null);
      h.state.push(p.state || "unknown");
      if (p.t > newest) newest = p.t;
    }
    const cutoff = newest - 3600;
    let drop = 0;
    while (drop < h.t.length && h.t[drop] < cutoff) drop++;
    if (drop) for (const k of Object.keys(h)) h[k].splice(0, drop);
  }
  state.historyLastT = newest;
  invalidate("charts");
  invalidate("occ");
}

// ---------------------------------------------------------------------------------------------
// the stream: static/client.js (WebSocket, SSE after the WebSocket failed to open twice while
// plain HTTP worked, reconnects with backoff and resume); the page only listens

const client = new KVGatewayClient(document.baseURI, {
  snapshot: null, // counts come from hello.occupancy and the polls: the page keeps no blocks
  token: state.token,
  transport: "WebSocket" in window ? "auto" : "sse",
  diagnose: diagnoseFailedOpen,
});

client.on("connection", ({ state: value, note, transport }) => {
  if (value !== "stopped") state.conn = value; // stopped: waiting for a token, said by onAuthRequired
  state.connNote = note;
  state.transport = transport;
  state.everLive = client.everLive;
  invalidate("conn");
});
client.on("transport", ({ why }) => addSeparator(why));
client.on("auth", () => onAuthRequired());
client.on("message", handleMessage);

function setConn(value, note = "") {
  if (state.conn !== value || state.connNote !== note) {
    state.conn = value;
    state.connNote = note;
    invalidate("conn");
  }
}

/**
 * A WebSocket that never opened: was it the WebSocket, the gateway or the token? Only a
 * WebSocket failure while plain HTTP works counts toward falling back to SSE.
 */
async function diagnoseFailedOpen() {
  try {
    await getJSON("v1/sources");
    return "ws";
  } catch (err) {
    if (err instanceof AuthError) return "auth";
    return "down";
  }
}

// ---------------------------------------------------------------------------------------------
// messages

function handleMessage(msg) {
  state.msgCount++;
  state.msgTotal++;
  state.lastMessageAt = Date.now();
  switch (msg.type) {
    case "batch":
      onBatch(msg);
      break;
    case "notice":
      onNotice(msg);
      break;
    case "hello":
      onHello(msg);
      break;
    default:
      break; // unknown message types are ignored (forward compatibility)
  }
}

function noteId(msg) {
  if (typeof msg.offset === "number") state.offset = msg.offset; // (the client keeps the resume id)
}

function onHello(msg) {
  const newEpoch = state.epoch && msg.epoch !== state.epoch;
  const hadHistory = state.tailHead > 0;
  state.epoch = String(msg.epoch ?? "");
  if (typeof msg.offset === "number") state.offset = msg.offset;
  if (Array.isArray(msg.sources)) applySources(msg.sources);
  if (!msg.recovered) {
    if (msg.occupancy) applyOccupancy(msg.occupancy, true);
    if (hadHistory) addSeparator(newEpoch ? "gateway restarted: fresh snapshot" : "resumed without recovery: fresh snapshot");
  } else if (hadHistory) {
    addSeparator("reconnected: missed messages recovered");
  }
  // The snapshot in hello is complete; refresh the rest right away too, and the charts' history
  // whole (what this page missed while disconnected, or everything for a new epoch).
  if (newEpoch) state.lastBatch.clear();
  state.historyWantFull = true;
  occPoller.now();
  sourcesPoller.now();
  historyPoller.now();
}

function pushTail(entry) {
  entry.n = state.tailHead;
  state.tail[state.tailHead % TAIL_BUFFER] = entry;
  state.tailHead++;
}

function onBatch(msg) {
  noteId(msg);
  const events = Array.isArray(msg.events) ? msg.events : [];
  const source = String(msg.source ?? "");
  const rank = msg.dp_rank ?? 0;
  const ts = typeof msg.ts === "number" ? msg.ts : Date.now() / 1000;
  const now = Date.now();
  state.lastBatch.set(streamKey(source, rank), now);
  for (const ev of events) {
    if (!ev || typeof ev !== "object") continue;
    const type = String(ev.type ?? "unknown");
    const hasMedium = type === "BlockStored" || type === "BlockRemoved";
    const tier = hasMedium ? tierOf(ev) : "";
    if (!tailAdmits(`${type}/${tier}`, now)) continue;
    const medium = hasMedium ? normMedium(ev.medium) : "";
    if (medium && !state.knownMediums.has(medium)) {
      state.knownMediums.add(medium);
      state.mediumTiers.set(medium, tier);
      invalidate("filters");
    }
    pushTail({
      kind: "event",
      type,
      source,
      rank,
      seq: msg.seq,
      offset: msg.offset,
      ts,
      medium,
      tier,
      hashes: Array.isArray(ev.block_hashes) ? ev.block_hashes : null,
      parent: ev.parent_block_hash ?? null,
      tokens: tokenCount(ev),
      blockSize: typeof ev.block_size === "number" ? ev.block_size : null,
      lora: ev.lora_name ?? ev.lora_id ?? null,
    });
  }
  if (!state.knownSources.has(source)) {
    state.knownSources.add(source);
    invalidate("filters");
  }
  invalidate("tail");
  invalidate("counters");
}

/**
 * The tail keeps at most TAIL_TYPE_RATE events per second of each type and tier (a token bucket
 * per kind), so at hundreds of events per second its buffer still spans minutes and every filter
 * finds rows: CPU stores are not crowded out by the far more frequent GPU ones.
 */
function tailAdmits(kind, now) {
  let b = state.tailBuckets.get(kind);
  if (!b) state.tailBuckets.set(kind, (b = { tokens: TAIL_TYPE_RATE, at: now }));
  b.tokens = Math.min(TAIL_TYPE_RATE, b.tokens + ((now - b.at) / 1000) * TAIL_TYPE_RATE);
  b.at = now;
  if (b.tokens < 1) {
    state.tailSkipped++;
    return false;
  }
  b.tokens -= 1;
  return true;
}

/**
 * Tokens of a BlockStored: its token_ids; a placeholder (offloaded blocks announced without their
 * tokens: token_ids empty) holds block_hashes x block_size tokens all the same. null: unknown.
 */
function tokenCount(ev) {
  const n = Array.isArray(ev.token_ids) ? ev.token_ids.length : null;
  if (n) return n;
  const blocks = Array.isArray(ev.block_hashes) ? ev.block_hashes.length : 0;
  if (blocks && typeof ev.block_size === "number" && ev.block_size > 0) return blocks * ev.block_size;
  return n === 0 && blocks === 0 ? 0 : null;
}

const NOTICE_STATE = { up: "up", down: "down", degraded: "degraded", stale: "stale" };

/**
 * A status notice: the stream's /v1/sources entry as it is now. It replaces that stream's entry
 * (no poll needed for it) and is not listed with the notices: it says what changed, not an event.
 */
function onStatus(msg) {
  const status = msg.status;
  if (!status || typeof status !== "object" || !Array.isArray(state.sources)) return;
  const key = streamKey(String(status.source), status.dp_rank ?? 0);
  const i = state.sources.findIndex((s) => streamKey(String(s.source), s.dp_rank ?? 0) === key);
  if (i >= 0) state.sources[i] = status;
  else state.sources.push(status);
  state.overrides.delete(key);
  state.knownSources.add(String(status.source));
  invalidate("sources");
  invalidate("counters");
}

function onNotice(msg) {
  noteId(msg);
  if (msg.kind === "status") {
    onStatus(msg);
    return;
  }
  const kind = String(msg.kind ?? "notice");
  const hasStream = msg.source !== undefined && msg.source !== null;
  const source = hasStream ? String(msg.source) : "";
  const rank = msg.dp_rank ?? 0;
  const detail = noticeDetail(kind, msg);
  const entry = {
    kind: "notice",
    type: "notice",
    notice: kind,
    source,
    rank: hasStream ? rank : null,
    offset: msg.offset,
    ts: typeof msg.ts === "number" ? msg.ts : Date.now() / 1000,
    medium: "",
    detail,
    code: typeof msg.reason === "string" ? msg.reason : "",
  };
  pushTail(entry);
  state.noticeList.push(entry);
  if (state.noticeList.length > NOTICES_KEPT) state.noticeList.splice(0, state.noticeList.length - NOTICES_KEPT);
  invalidate("notices");
  if (hasStream) {
    const key = streamKey(source, rank);
    state.notices.set(key, { kind, at: Date.now(), detail, code: entry.code });
    if (NOTICE_STATE[kind]) state.overrides.set(key, NOTICE_STATE[kind]);
    invalidate("sources");
    setTimeout(() => invalidate("sources"), NOTICE_FLASH_MS + 50);
  }
  if (kind === "slow_consumer") setConn(state.conn, "server reports this client is too slow");
  invalidate("tail");
  invalidate("counters");
}

/** A notice's own fields as one readable line (restart: seq/previous; gap: the lost range). */
function noticeDetail(kind, msg) {
  const parts = [];
  // engine seqs are decimal strings (exact beyond 2^53: TensorRT-LLM's are time_ns); shown as sent
  if (kind === "restart" && typeof msg.seq === "string") {
    parts.push(msg.previous === null || msg.previous === undefined ? `from seq ${msg.seq}` : `seq ${msg.previous} → ${msg.seq}`);
  } else if (kind === "unrecovered_gap" && typeof msg.first === "string") {
    parts.push(`lost seq ${msg.first}–${msg.until} (${msg.count})`);
  }
  // reason_code repeats the reason for programs. (The dashboard does not ask for compat=gap_last:
  // its gap notices have `until` and no deprecated `last`.)
  const known = new Set(["type", "id", "offset", "kind", "source", "dp_rank", "reason", "reason_code", "seq", "previous", "first", "until", "count"]);
  for (const [k, v] of Object.entries(msg)) {
    if (known.has(k) || v === null || typeof v === "object") continue;
    parts.push(`${k}=${v}`);
  }
  if (typeof msg.reason === "string" && msg.reason) parts.push(reasonText(kind, msg.reason));
  return parts.join(" · ");
}

function addSeparator(text) {
  const entry = { kind: "sep", type: "sep", text, ts: Date.now() / 1000, source: "", medium: "" };
  pushTail(entry);
  state.noticeList.push(entry); // kept with the notices: what happened to the connection
  invalidate("notices");
  invalidate("tail");
}

// ---------------------------------------------------------------------------------------------
// rendering

function renderFrame() {
  frameRequested = false;
  const d = state.dirty;
  const now = performance.now();
  if (d.conn || (d.counters && now - lastCountersRender >= TAIL_MIN_INTERVAL_MS)) {
    d.conn = false;
    d.counters = false;
    lastCountersRender = now;
    renderConn();
  } else if (d.counters) {
    invalidate("counters"); // later, coalesced
  }
  if (d.filters) {
    d.filters = false;
    renderFilters();
  }
  if (d.occ || d.sources) {
    d.occ = false;
    d.sources = false;
    renderFleet();
  }
  if (d.charts) {
    d.charts = false;
    renderCharts();
    prefill.render();
  }
  if (d.notices) {
    d.notices = false;
    renderNotices();
  }
  if (d.tail) {
    if (now - lastTailRender >= TAIL_MIN_INTERVAL_MS) {
      d.tail = false;
      lastTailRender = now;
      renderTail();
    } else {
      invalidate("tail"); // try again next frame
    }
  }
}
let lastTailRender = 0;
let lastCountersRender = 0;

// --- connection bar

function renderConn() {
  const box = tid("conn-state");
  box.dataset.value = state.conn;
  let text = state.conn;
  if (state.needAuth) text = "waiting for token";
  else if (state.connNote && state.conn !== "live") text = `${state.conn}: ${state.connNote}`;
  else if (state.connNote && state.conn === "live") text = `live · ${state.connNote}`;
  setText($(".conn-text", box), text);
  setVal(tid("transport"), state.transport);
  setVal(tid("offset"), state.offset, state.offset === null ? "–" : intFmt.format(state.offset));
  setVal(tid("epoch"), state.epoch, state.epoch ? state.epoch.slice(0, 8) : "–");
  setVal(tid("msg-rate"), state.msgRate, fmtRate(state.msgRate));

  const form = tid("auth-form");
  if (form.hidden === state.needAuth) {
    form.hidden = !state.needAuth;
    if (state.needAuth) setTimeout(() => tid("token-input").focus(), 0);
  }
  tid("auth-error").hidden = !state.authRejected;
}

// --- totals and cards

/** The rows of the fleet: one per stream known from occupancy or sources. */
function streamRows() {
  const rows = new Map();
  for (const s of (state.occupancy && state.occupancy.streams) || []) {
    rows.set(streamKey(s.source, s.dp_rank), { source: s.source, rank: s.dp_rank, occ: s, src: null });
  }
  for (const s of state.sources || []) {
    const key = streamKey(s.source, s.dp_rank);
    const row = rows.get(key) || { source: s.source, rank: s.dp_rank, occ: null, src: null };
    row.src = s;
    rows.set(key, row);
  }
  return [...rows.entries()].sort(([, a], [, b]) =>
    String(a.source).localeCompare(String(b.source)) || Number(a.rank) - Number(b.rank),
  );
}

function streamState(key, row) {
  const override = state.overrides.get(key);
  if (override) return override;
  if (row.src && row.src.state) return String(row.src.state);
  if (row.occ) return row.occ.stale ? "stale" : "unknown";
  return "unknown";
}

/** Everything the page shows about one stream, computed once per frame. */
function streamFacts(key, row) {
  const series = state.history.get(key) || null;
  const nowS = Date.now() / 1000;
  const src = row.src;
  const at = lastBatchAt(state.lastBatch.get(key), series);
  const age = at === null ? null : Math.max(0, nowS - at);
  const restartsNow = src && src.counters ? src.counters.restarts : null;
  const restarts = restartsWithin(series, nowS, RESTART_WINDOW_S, restartsNow);
  const watchedS = series && series.t.length ? nowS - series.t[0] : 0;
  const serverState = streamState(key, row);
  const health = streamHealth({ serverState, src, occ: row.occ, restarts, ageS: age, watchedS });
  // A lag kept from the last batch of a silent or down stream means nothing: shown only while fresh.
  const lagFresh = src && src.connected && typeof src.lag_seconds === "number" && age !== null && age <= LAG_FRESH_S;
  return {
    key,
    row,
    source: row.source,
    rank: row.rank,
    health,
    cache: cacheFacts(row.occ, tierOf),
    age,
    lag: lagFresh ? src.lag_seconds : null,
    restarts,
    lost: src && src.counters && typeof src.counters.unrecovered === "number" ? src.counters.unrecovered : null,
    miss: prefill.missShare(key),
  };
}

function tableMode(n) {
  return state.view ? state.view === "table" : n > CARDS_MAX;
}

function renderFleet() {
  const rows = streamRows();
  const facts = rows.map(([key, row]) => streamFacts(key, row));
  renderTotals(facts);
  const table = tableMode(rows.length);
  for (const b of document.querySelectorAll(".view-switch [data-view]")) {
    b.setAttribute("aria-pressed", String((b.dataset.view === "table") === table));
  }
  tid("fleet-table-wrap").hidden = !table;
  document.body.classList.toggle("table-view", table);
  if (table) fleetTable.render(facts, state.sort, state.grouped, state.pinned);
  renderCards(table ? facts.filter((f) => state.pinned.has(f.key)) : facts, table);
  renderTitle(facts);
  renderUpdated();
}

const BASE_TITLE = document.title;
const FAVICON_COLORS = { ok: "#3fb968", warn: "#e0a526", bad: "#f0524f", idle: "#8a97a8" };
let faviconLevel = "";

/** The tab's title and icon carry the trouble, so a background tab shows it. */
function renderTitle(facts) {
  const counts = troubleCounts(facts.map((f) => f.health.state));
  const bad = ["down", "restarting", "silent", "degraded", "stale"].filter((k) => counts[k]).map((k) => `${counts[k]} ${k}`);
  let title = BASE_TITLE;
  let level = facts.length ? "ok" : "idle";
  if (state.everLive && state.conn !== "live") {
    title = `⚠ gateway ${state.conn} · kvgateway`;
    level = "bad";
  } else if (bad.length) {
    title = `${counts.down ? "✖" : "⚠"} ${bad.join(", ")} · kvgateway`;
    level = counts.down || counts.restarting ? "bad" : "warn";
  }
  if (document.title !== title) document.title = title;
  if (faviconLevel !== level) {
    faviconLevel = level;
    const svg = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><circle cx="8" cy="8" r="7" fill="${FAVICON_COLORS[level]}"/></svg>`;
    const link = tid("favicon");
    link.href = `data:image/svg+xml,${encodeURIComponent(svg)}`;
    link.dataset.value = level;
  }
}

function renderTotals(facts) {
  const counts = troubleCounts(facts.map((f) => f.health.state));
  for (const k of ["up", "down", "degraded", "stale", "silent", "restarting"]) setVal(tid(`streams-${k}`), counts[k]);
  renderFleetFacts(state.occupancy && state.occupancy.fleet, state.analytics && state.analytics.prefixes);

  const occ = state.occupancy;
  const totalsEl = tid("totals");
  const off = occ && typeof occ.offset === "number" ? String(occ.offset) : "";
  if (totalsEl.dataset.offset !== off) totalsEl.dataset.offset = off;
  // fleet totals by tier (GPU, CPU, DISK, EXTERNAL), each naming the engines' mediums it sums
  const tiers = (occ && occ.tiers) || {};
  const box = tid("total-tiers");
  const shown = TIERS.filter((t) => t in tiers);
  const want = shown.join("\u0000");
  if (box.dataset.tiers !== want) {
    box.dataset.tiers = want;
    box.replaceChildren(...shown.map(buildTotalTile));
  }
  for (const t of shown) {
    const v = tiers[t] || {};
    const tile = box.querySelector(`[data-tier="${CSS.escape(t)}"]`);
    setVal(tid(`total-${t}-blocks`, tile), v.blocks, fmtInt(v.blocks));
    setVal(tid(`total-${t}-tokens`, tile), v.tokens, fmtInt(v.tokens));
    const names = Array.isArray(v.mediums) ? v.mediums.map(String) : [];
    // the engines' own medium names, unless the only one is the tier's name (said once, in the tag)
    const own = names.length === 1 && names[0] === t ? [] : names;
    setVal(tid(`total-${t}-mediums`, tile), own.join(" "), own.join(" · "));
    const cap = typeof v.capacity_blocks === "number" && v.capacity_blocks > 0 ? v.capacity_blocks : null;
    setVal(tid(`total-${t}-capacity`, tile), cap, cap === null ? "capacity unknown" : `of ${fmtInt(cap)} blocks`);
    const frac = cap === null ? null : v.blocks / cap;
    setVal(tid(`total-${t}-fraction`, tile), frac === null ? "" : frac.toFixed(6), fmtPct(frac));
    setBar($(".bar", tile), frac);
  }
}

function buildTotalTile(t) {
  const tile = el("div", "tile");
  tile.dataset.tier = t;
  tile.dataset.testid = `total-${t}`;
  const head = el("div", "tile-head");
  const name = el("span", "tile-name");
  const meds = el("span", "tile-mediums");
  meds.dataset.testid = `total-${t}-mediums`;
  name.append(el("span", "medium-tag", t), meds);
  head.append(name);
  const frac = el("span", "tile-frac");
  frac.dataset.testid = `total-${t}-fraction`;
  head.append(frac);
  const nums = el("div", "tile-nums");
  const b = el("span", "big");
  b.dataset.testid = `total-${t}-blocks`;
  const tk = el("span", "mid");
  tk.dataset.testid = `total-${t}-tokens`;
  const g1 = el("span", "grp");
  g1.append(b, el("span", "unit", "blocks"));
  const g2 = el("span", "grp");
  g2.append(tk, el("span", "unit", "tokens"));
  nums.append(g1, g2);
  const cap = el("div", "tile-cap");
  cap.dataset.testid = `total-${t}-capacity`;
  const bar = el("div", "bar");
  bar.append(el("span", "bar-fill"));
  tile.append(head, nums, bar, cap);
  return tile;
}

function setBar(bar, frac) {
  if (!bar) return;
  const known = frac !== null && Number.isFinite(frac);
  bar.classList.toggle("unknown", !known);
  const fill = bar.firstElementChild;
  const pct = known ? Math.max(0, Math.min(1, frac)) * 100 : 0;
  const w = `${pct.toFixed(2)}%`;
  if (fill.style.width !== w) fill.style.width = w;
  bar.classList.toggle("hot", known && frac >= 0.95);
}

const cards = new Map(); // streamKey -> {root, refs, chart, mediums}

const fleetTable = new FleetTable(tid("fleet-rows"), (key) => {
  if (state.pinned.has(key)) state.pinned.delete(key);
  else state.pinned.add(key);
  invalidate("occ");
  invalidate("charts");
});

/**
 * Blocks held by more than one engine (the gateway's fleet facts in v1/occupancy, when it has
 * them): how much the fleet caches twice, i.e. whether routing spreads the same prefixes.
 */
function renderFleetFacts(fleet, prefixes) {
  const box = tid("fleet-facts");
  const parts = [];
  if (fleet && typeof fleet.distinct_blocks === "number" && typeof fleet.shared_blocks === "number") {
    const frac = fleet.distinct_blocks > 0 ? fleet.shared_blocks / fleet.distinct_blocks : null;
    parts.push(`${fmtInt(fleet.shared_blocks)} of ${fmtInt(fleet.distinct_blocks)} distinct blocks held by more than one engine (${fmtPct(frac) || "0%"})`);
  } else if (fleet === null) {
    parts.push("blocks held by more than one engine: counting…"); // v1/occupancy's fleet is null while counted
  }
  if (prefixes && typeof prefixes.mean_engines === "number" && prefixes.engines > 1) {
    parts.push(
      `prefix spread: each prompt's first block is on ${prefixes.mean_engines.toFixed(2)} of the ${prefixes.engines} engines that are up, on average (1 = perfect affinity)`,
    );
  }
  box.hidden = parts.length === 0;
  setVal(box, prefixes && prefixes.mean_engines !== undefined ? prefixes.mean_engines : "", parts.join(" · "));
}

/** One line of the gateway's cache analytics for a card: is this engine thrashing? */
function analyticsLine(key) {
  const a = state.analyticsBy.get(key);
  if (!a) return "";
  const parts = [];
  const gpu = a.tiers && a.tiers.GPU;
  if (gpu && gpu.sampled_lifetimes) {
    const p50 = gpu.lifetime_p50_le_seconds;
    parts.push(`GPU block lifetime ${p50 === null ? "> 1 h" : `p50 ≤ ${fmtDur(p50)}`}`);
  }
  if (gpu && gpu.refetch_ratio !== null && gpu.refetch_ratio !== undefined) {
    parts.push(`refetched within 60 s: ${fmtPct(gpu.refetch_ratio) || "0%"}`);
  }
  if (typeof a.offloaded_share === "number" && a.offloaded_share > 0) parts.push(`offloaded ${fmtPct(a.offloaded_share)}`);
  return parts.join(" · ");
}

function renderCards(facts, table) {
  const grid = tid("cards");
  const keep = new Set();
  let prev = null;
  for (const { key, row, ...f } of facts) {
    keep.add(key);
    let card = cards.get(key);
    if (!card) {
      card = buildCard(key, row);
      cards.set(key, card);
    }
    // keep DOM order = sorted order, moving only what is out of place
    const expectedNext = prev ? prev.nextElementSibling : grid.firstElementChild;
    if (expectedNext !== card.root) grid.insertBefore(card.root, expectedNext);
    prev = card.root;
    updateCard(key, card, row, f);
  }
  for (const [key, card] of cards) {
    if (!keep.has(key)) {
      if (card.chart) card.chart.destroy();
      card.root.remove();
      cards.delete(key);
    }
  }
  const empty = tid("cards-empty");
  empty.hidden = facts.length > 0 || table;
  if (facts.length === 0 && !empty.isConnected) grid.append(empty);
  layoutCards(grid, facts.length);
}

/**
 * As many columns as fit (at least CARD_MIN_PX each), never more than there are cards, and the
 * last card spans what its row leaves: no holes at any width.
 */
function layoutCards(grid, n) {
  const width = grid.clientWidth;
  const fit = Math.max(1, Math.floor((width + 12) / (CARD_MIN_PX + 12)));
  const cols = Math.max(1, Math.min(n, fit));
  const tmpl = `repeat(${cols}, minmax(0, 1fr))`;
  if (grid.style.gridTemplateColumns !== tmpl) grid.style.gridTemplateColumns = tmpl;
  const list = [...cards.values()].map((c) => c.root).filter((r) => r.parentElement === grid);
  list.forEach((r, i) => {
    const rest = n % cols;
    const span = i === list.length - 1 && rest ? `span ${cols - rest + 1}` : "";
    if (r.style.gridColumn !== span) r.style.gridColumn = span;
  });
}

function buildCard(key, row) {
  const root = document.getElementById("card-template").content.firstElementChild.cloneNode(true);
  root.dataset.testid = `card-${row.source}-${row.rank}`;
  root.dataset.source = String(row.source);
  root.dataset.dpRank = String(row.rank);
  $(".card-source", root).textContent = String(row.source);
  $(".card-rank", root).textContent = `dp ${row.rank}`;
  const refs = {};
  for (const node of root.querySelectorAll("[data-testid]")) refs[node.dataset.testid] = node;
  const card = { root, refs, chart: null, chartBox: refs.chart, mediums: "", mediumRefs: new Map() };
  makeChart(key, card);
  return card;
}

function updateCard(key, card, row, f) {
  const { refs } = card;
  const st = f.health.state;
  setVal(refs.state, st);
  if (card.root.dataset.state !== st) card.root.dataset.state = st;
  setVal(refs.health, f.health.reason);
  refs.health.hidden = !f.health.reason;
  const code = f.health.code ? `gateway reason: ${f.health.code}` : "";
  if (refs.health.title !== code) refs.health.title = code;
  renderHeadline(refs, f.cache);
  const line = analyticsLine(key);
  setText(refs.analytics, line);
  refs.analytics.hidden = !line;
  setVal(refs["batch-age"], f.age === null ? "" : f.age.toFixed(1), f.age === null ? "–" : `${fmtDur(f.age)} ago`);
  const src = row.src;
  const occ = row.occ;
  setText(refs.endpoint, src ? String(src.endpoint ?? "") : "");
  const reason = src && src.reason ? String(src.reason) : "";
  setVal(refs.reason, reason);
  // a down card says why once: in its health line, when that line says it already
  refs.reason.hidden = !reason || f.health.reason.includes(reason);
  refs.endpoint.title = src && src.replay ? `replay: ${src.replay}` : "no replay endpoint";
  setVal(refs["last-seq"], src ? src.last_seq : null, src && src.last_seq !== null && src.last_seq !== undefined ? seqFmt(src.last_seq) : "–");
  const lag = f.lag;
  setVal(refs.lag, lag, lag === null ? "–" : lag < 10 ? `${lag.toFixed(2)} s` : `${fmtInt(lag)} s`);
  refs.lag.parentElement.classList.toggle("dim-item", lag === null);
  const counters = (src && src.counters) || {};
  for (const c of COUNTERS) {
    const v = typeof counters[c] === "number" ? counters[c] : null;
    setVal(refs[c], v, fmtInt(v));
    const parent = refs[c].parentElement;
    parent.classList.toggle("nonzero", v !== null && v > 0);
  }
  card.root.classList.toggle("is-stale", Boolean(occ && occ.stale));

  updateMediums(card, occ);
  // a chart of nothing (an engine that never sent a block while the gateway watched) is clutter
  const h = state.history.get(key);
  const drawn = Boolean(h && (h.occ.some((v) => v) || h.stores.some((v) => v)));
  refs.chart.hidden = !drawn;
  refs["chart-occ-label"].parentElement.hidden = !drawn;

  // last notice
  const n = state.notices.get(key);
  const ln = refs["last-notice"];
  if (n) {
    ln.hidden = false;
    setVal(ln, n.kind, `${kindText(n.kind)} at ${fmtTime(n.at / 1000).slice(0, 8)}${n.detail ? " · " + n.detail : ""}`);
    ln.title = n.code ? `gateway reason: ${n.code}` : "";
    ln.dataset.kind = n.kind;
    card.root.classList.toggle("flash", Date.now() - n.at < NOTICE_FLASH_MS);
  } else if (!ln.hidden) {
    ln.hidden = true;
  }
}

/** The card's rows per medium (the engine's own names, grouped by tier) and its rate legend. */
function updateMediums(card, occ) {
  const { refs } = card;
  // the engine's own medium names, grouped by tier (GPU, CPU, DISK, EXTERNAL)
  const mediumTier = (m) => tierOf(occ.mediums[m]);
  const mediums = occ
    ? sortMediums(Object.keys(occ.mediums || {})).sort(
        (a, b) => TIERS.indexOf(mediumTier(a)) - TIERS.indexOf(mediumTier(b)),
      )
    : [];
  const want = mediums.map((m) => `${m}\u0001${mediumTier(m)}`).join("\u0000");
  if (card.mediums !== want) {
    card.mediums = want;
    card.mediumRefs.clear();
    const rows = mediums.map((m) => {
      const r = buildMediumRow(m, mediumTier(m));
      card.mediumRefs.set(m, r);
      return r.row;
    });
    if (rows.length === 0) rows.push(el("div", "medium-empty", occ ? "no resident blocks" : "no occupancy data"));
    refs.mediums.replaceChildren(...rows);
  }
  let stores = null;
  let removes = null;
  for (const m of mediums) {
    const v = occ.mediums[m] || {};
    const r = card.mediumRefs.get(m);
    setVal(r.blocks, v.blocks, fmtInt(v.blocks));
    setVal(r.tokens, v.tokens, fmtInt(v.tokens));
    const cap = typeof v.capacity_blocks === "number" && v.capacity_blocks > 0 ? v.capacity_blocks : null;
    const frac = cap === null ? null : v.blocks / cap;
    setVal(r.capacity, cap, cap === null ? "" : `${fmtPct(frac)} of ${fmtInt(cap)}`);
    r.bar.hidden = cap === null;
    setBar(r.bar, frac);
    if (typeof v.stores_per_s === "number") stores = (stores ?? 0) + v.stores_per_s;
    if (typeof v.removes_per_s === "number") removes = (removes ?? 0) + v.removes_per_s;
  }
  setVal(refs["stores-rate"], stores, fmtRate(stores));
  setVal(refs["removes-rate"], removes, fmtRate(removes));
}

/**
 * The card's headline: the GPU fill where its capacity is known (a full prefix cache is normal);
 * otherwise the cache turnover, about how long a block lives (resident blocks / removes per
 * second); otherwise the resident blocks.
 */
function renderHeadline(refs, c) {
  let value = "";
  let text = "–";
  let label = "";
  if (c.fill !== null) {
    value = `fill:${c.fill.toFixed(6)}`;
    text = fmtPct(c.fill) || "0%";
    label = `GPU full · ${fmtInt(c.gpuBlocks)} of ${fmtInt(c.gpuCap)} blocks`;
  } else if (c.turnover !== null) {
    value = `turnover:${c.turnover.toFixed(1)}`;
    text = fmtDur(c.turnover);
    label = `a GPU block lives about this long · ${fmtInt(c.gpuBlocks)} blocks, capacity unknown`;
  } else if (c.gpuBlocks !== null) {
    value = `blocks:${c.gpuBlocks}`;
    text = fmtInt(c.gpuBlocks);
    label = "GPU blocks · capacity unknown, no evictions yet";
  }
  setVal(refs.headline, value, text);
  setText(refs["headline-label"], label);
  refs.headline.parentElement.hidden = value === ""; // no big dash for a stream without figures
}

function buildMediumRow(m, tier) {
  const row = el("div", "medium-row");
  row.dataset.medium = m;
  row.dataset.tier = tier;
  const tag = el("span", "medium-tag", m);
  tag.title = `tier ${tier}`;
  if (tier !== m) {
    const tt = el("span", "tier-tag", tier);
    tt.dataset.testid = `tier-${m}`;
    tag.append(tt);
  }
  const blocks = el("span", "num");
  blocks.dataset.testid = `blocks-${m}`;
  const bu = el("span", "unit", "blocks");
  const tokens = el("span", "num dim");
  tokens.dataset.testid = `tokens-${m}`;
  const tu = el("span", "unit", "tokens");
  const capacity = el("span", "cap");
  capacity.dataset.testid = `capacity-${m}`;
  const bar = el("div", "bar small");
  bar.append(el("span", "bar-fill"));
  row.append(tag, blocks, bu, tokens, tu, capacity, bar);
  return { row, blocks, tokens, capacity, bar };
}

function renderUpdated() {
  const parts = [];
  if (state.occAt) {
    const age = (Date.now() - state.occAt) / 1000;
    parts.push(age < 2 ? "updated just now" : `updated ${fmtInt(age)} s ago`);
  } else {
    parts.push("waiting for data…");
  }
  const problem = state.occError || state.sourcesError;
  const err = problem ? problem.text : "";
  if (err) parts.push(err);
  const u = tid("updated");
  setText(u, parts.join(" · "));
  const title = problem && problem.detail ? `the browser said: ${problem.detail}` : "";
  if (u.title !== title) u.title = title;
  const stale = Boolean(err) || (state.occAt && Date.now() - state.occAt > 5000);
  u.classList.toggle("error", Boolean(stale));
  document.body.classList.toggle("data-stale", Boolean(stale));
  const banner = tid("banner");
  const bannerText = err && state.conn !== "live" ? "The gateway is unreachable: numbers below are the last ones received." : "";
  banner.hidden = !bannerText;
  setText(banner, bannerText);
}

// --- charts

const css = getComputedStyle(document.documentElement);
const cssVar = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
const COLORS = {
  occ: cssVar("--accent", "#5aa9ff"),
  stores: cssVar("--stores", "#4cc38a"),
  removes: cssVar("--removes", "#f0883e"),
  axis: cssVar("--muted", "#8b949e"),
  grid: cssVar("--grid", "rgba(255,255,255,0.06)"),
};

const CHART_HEIGHT = 120;

/** uPlot options of one card's chart: occupancy (fill % or blocks, left) and rates (right). */
function chartOptions(width, card) {
  const axis = {
    stroke: COLORS.axis,
    grid: { stroke: COLORS.grid, width: 1 },
    ticks: { show: false },
    font: "10px system-ui, sans-serif",
  };
  return {
    width,
    height: CHART_HEIGHT,
    padding: [6, 4, 0, 0],
    legend: { show: false },
    cursor: { points: { size: 5 }, drag: { x: false, y: false } },
    scales: {
      x: {
        time: true,
        // as much history as the gateway has, up to the window (at least 2 minutes): full from the start
        range: (u) => {
          const now = Date.now() / 1000;
          const first = u.data[0].length ? u.data[0][0] : now;
          const span = Math.min(CHART_WINDOW_S, Math.max(120, now - first));
          return [now - span, now];
        },
      },
      occ: { range: (u, min, max) => (card.occIsFill ? [0, 100] : [0, max > 0 ? niceMax(max) : 1]) },
      rate: { range: (u, min, max) => [0, max > 0 ? niceMax(max) : 1] },
    },
    axes: [
      { ...axis, size: 22, space: 60, values: (u, splits) => timeTicks(splits) },
      {
        ...axis,
        scale: "occ",
        size: 40,
        space: 24,
        values: (u, splits) => splits.map((v) => (card.occIsFill ? `${v}%` : fmtRate(v))),
      },
      { ...axis, scale: "rate", side: 1, size: 40, space: 24, grid: { show: false }, values: (u, splits) => splits.map((v) => fmtRate(v)) },
    ],
    series: [
      {},
      { label: "occupancy", scale: "occ", stroke: COLORS.occ, width: 1.5, fill: COLORS.occ + "22", points: { show: false } },
      { label: "stored/s", scale: "rate", stroke: COLORS.stores, width: 1.25, points: { show: false } },
      { label: "removed/s", scale: "rate", stroke: COLORS.removes, width: 1.25, dash: [4, 3], points: { show: false } },
    ],
  };
}

/**
 * A time axis' labels: HH:MM:SS when the ticks are less than a whole minute apart (a short span:
 * HH:MM alone would repeat, 11:51 11:51 11:52), else HH:MM.
 */
function timeTicks(splits) {
  const seconds = splits.some((v) => v % 60 !== 0);
  return splits.map((v) => fmtTime(v).slice(0, seconds ? 8 : 5));
}

function niceMax(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v * 1.05 <= m * p) return m * p;
  return 10 * p;
}

function makeChart(key, card) {
  if (typeof window.uPlot !== "function") return;
  const width = Math.max(200, card.chartBox.clientWidth || 300);
  card.occIsFill = true;
  card.chart = new window.uPlot(chartOptions(width, card), chartData(key, card), card.chartBox);
  card.chartWidth = width;
}

/** The card's chart data from the gateway's history; occupancy is the fill (%) when every point has one. */
function chartData(key, card) {
  const h = state.history.get(key);
  if (!h) return [[], [], [], []];
  const isFill = h.fill.length > 0 && h.fill.every((v) => v !== null);
  if (card.occIsFill !== isFill) {
    card.occIsFill = isFill;
    setText(card.refs["chart-occ-label"], isFill ? "GPU fill %" : "GPU blocks");
  }
  return [h.t, h.occ, h.stores, h.removes];
}

function renderCharts() {
  for (const [key, card] of cards) {
    if (!card.chart) continue;
    const w = card.chartBox.clientWidth;
    if (w > 0 && Math.abs(w - card.chartWidth) > 1) {
      card.chartWidth = w;
      card.chart.setSize({ width: w, height: CHART_HEIGHT });
    }
    card.chart.setData(chartData(key, card));
  }
}

const resizeObserver = new ResizeObserver(() => {
  invalidate("charts");
  invalidate("occ"); // the cards' columns
});
resizeObserver.observe(tid("cards"));

// --- live tail

function tailFilter() {
  return {
    source: tid("filter-source").value,
    type: tid("filter-type").value,
    medium: tid("filter-medium").value,
  };
}

function passes(entry, f) {
  if (entry.kind === "sep") return true;
  if (f.source) {
    const [src, rank] = f.source.split("\u0000");
    if (entry.source !== src) return false;
    if (rank !== undefined && String(entry.rank) !== rank) return false;
  }
  if (f.type && entry.type !== f.type) return false;
  // as on the server: a tier name matches the whole tier, any other name that medium only; a cache
  // reset clears every medium, so it passes every medium filter
  if (f.medium && entry.type !== "AllBlocksCleared") {
    const hit = TIERS.includes(f.medium) ? entry.tier === f.medium : entry.medium === f.medium;
    if (!hit) return false;
  }
  return true;
}

function renderTail() {
  const list = tid("tail");
  const f = tailFilter();
  const fkey = `${f.source}|${f.type}|${f.medium}|${state.tailClearedAt}`;
  const head = state.tailHead;
  const oldest = Math.max(state.tailClearedAt, head - TAIL_BUFFER);
  const frozen = state.tailPaused || state.tailHover;
  const shown = Math.min(head - state.tailClearedAt, TAIL_BUFFER);
  const oldestEntry = shown > 0 ? state.tail[oldest % TAIL_BUFFER] : null;
  const span = oldestEntry ? fmtDur(Date.now() / 1000 - oldestEntry.ts) : "";
  setText(tid("tail-count"), `${intFmt.format(shown)} events buffered${span ? ` · last ${span}` : ""}`);
  const sampled = state.tailSkipped ? `at most ${TAIL_TYPE_RATE} events/s of each type kept (${fmtInt(state.tailSkipped)} skipped)` : "";
  setText(
    tid("tail-status"),
    state.tailPaused ? "paused: new events are buffered, not shown" : state.tailHover ? "paused while the pointer is over the tail" : sampled,
  );
  tid("tail-status").classList.toggle("info", !state.tailPaused && !state.tailHover);
  if (frozen && fkey === state.tailFilterKey) return;
  if (f.type === "notice") {
    // notices have their own list: never pushed out by events
    const rows = [];
    for (let i = state.noticeList.length - 1; i >= 0 && rows.length < TAIL_ROWS; i--) {
      const e = state.noticeList[i];
      if (e.n >= state.tailClearedAt && passes(e, f)) rows.push(buildTailRow(e));
    }
    state.tailFilterKey = fkey;
    state.tailRendered = head;
    list.replaceChildren(...(rows.length ? rows : [el("li", "tail-empty", "No notices.")]));
    return;
  }

  const rebuild = fkey !== state.tailFilterKey || head - state.tailRendered >= TAIL_BUFFER;
  const from = rebuild ? oldest : Math.max(state.tailRendered, oldest);
  // newest first: collect up to TAIL_ROWS matching entries walking backwards
  const fresh = [];
  for (let n = head - 1; n >= from && fresh.length < TAIL_ROWS; n--) {
    const e = state.tail[n % TAIL_BUFFER];
    if (e && passes(e, f)) fresh.push(e);
  }
  state.tailRendered = head;
  state.tailFilterKey = fkey;
  if (rebuild || fresh.length >= TAIL_ROWS) {
    const frag = document.createDocumentFragment();
    for (const e of fresh) frag.append(buildTailRow(e));
    list.replaceChildren(frag);
  } else if (fresh.length) {
    const frag = document.createDocumentFragment();
    for (const e of fresh) frag.append(buildTailRow(e));
    list.prepend(frag);
    while (list.childElementCount > TAIL_ROWS) list.lastElementChild.remove();
  }
  if (!list.firstElementChild) {
    const empty = el("li", "tail-empty", state.tailHead > state.tailClearedAt ? "No events match the filters." : "No events yet.");
    list.replaceChildren(empty);
  } else if (list.lastElementChild.classList.contains("tail-empty") && list.childElementCount > 1) {
    list.lastElementChild.remove();
  }
}

/** The newest notices, above the tail: they stay in view whatever the event rate. */
function renderNotices() {
  const list = tid("notices");
  const items = state.noticeList.slice(-NOTICES_SHOWN).reverse();
  setText(tid("notice-count"), state.noticeList.length ? `${intFmt.format(state.noticeList.length)} kept` : "none");
  list.replaceChildren(...items.map((e) => buildTailRow(e)));
  list.hidden = items.length === 0;
}

function hashChip(h, cls = "hash") {
  const s = String(h);
  const b = el("button", cls, shortHash(s));
  b.type = "button";
  b.dataset.hash = s;
  b.title = `${s} (click to copy)`;
  return b;
}

function buildTailRow(e) {
  const li = el("li", "tail-row");
  li.dataset.testid = "tail-row";
  li.dataset.type = e.type;
  if (e.kind === "sep") {
    li.className = "tail-row sep";
    li.append(el("span", "t", fmtTime(e.ts)), el("span", "sep-text", e.text));
    return li;
  }
  li.dataset.source = e.source;
  if (e.rank !== null && e.rank !== undefined) li.dataset.dpRank = String(e.rank);
  if (e.medium) li.dataset.medium = e.medium;
  if (e.tier) li.dataset.tier = e.tier;
  if (e.offset !== undefined) li.dataset.offset = String(e.offset);
  const stream = e.source ? `${e.source}${e.rank !== null && e.rank !== undefined ? "/" + e.rank : ""}` : "gateway";
  li.append(el("span", "t", fmtTime(e.ts)), el("span", "s", stream));
  if (e.kind === "notice") {
    li.classList.add("notice", `notice-${e.notice}`);
    li.dataset.kind = e.notice;
    const d = el("span", "d", e.detail || "");
    if (e.code) d.title = `gateway reason: ${e.code}`;
    li.append(el("span", "ty", kindText(e.notice)), d);
    return li;
  }
  const tyShort = { BlockStored: "stored", BlockRemoved: "removed", AllBlocksCleared: "cleared" }[e.type] || e.type;
  const ty = el("span", `ty ty-${tyShort}`, tyShort);
  ty.title = e.type;
  li.append(ty);
  li.append(el("span", "m", e.medium || ""));
  const d = el("span", "d");
  if (e.type === "AllBlocksCleared") {
    d.append(el("span", "dim", "all blocks cleared"));
  } else if (e.hashes) {
    const n = e.hashes.length;
    d.append(el("span", "count", `${n}×`));
    for (const h of e.hashes.slice(0, HASHES_SHOWN)) d.append(hashChip(h));
    if (n > HASHES_SHOWN) {
      const more = el("button", "more", `+${n - HASHES_SHOWN}`);
      more.type = "button";
      more.title = "show all hashes";
      more.dataset.more = "1";
      d.append(more);
    }
    if (e.parent !== null && e.parent !== undefined) {
      d.append(el("span", "dim", "parent"));
      d.append(hashChip(e.parent, "hash parent"));
    }
    if (e.tokens !== null) d.append(el("span", "dim", `${e.tokens} tok`));
  }
  if (e.seq !== undefined) {
    const seq = el("span", "q", `#${e.seq}`);
    seq.title = `engine seq ${e.seq}, gateway offset ${e.offset}`;
    li.append(d, seq);
  } else {
    li.append(d);
  }
  li._entry = e;
  return li;
}

// --- filters

function renderFilters() {
  const srcSel = tid("filter-source");
  const ranks = new Map();
  for (const [, row] of streamRows()) {
    if (!ranks.has(row.source)) ranks.set(row.source, new Set());
    ranks.get(row.source).add(row.rank);
  }
  for (const s of state.knownSources) if (!ranks.has(s)) ranks.set(s, new Set());
  const opts = [["", "all"]];
  for (const s of [...ranks.keys()].sort()) {
    opts.push([s, s]);
    const rs = [...ranks.get(s)].sort((a, b) => a - b);
    if (rs.length > 1) for (const r of rs) opts.push([`${s}\u0000${r}`, `${s} · dp ${r}`]);
  }
  setOptions(srcSel, opts);
  // tiers first (a tier name filters the whole tier), then the engines' own names that are not tier names
  const meds = sortMediums(state.knownMediums);
  const tiers = TIERS.filter((t) => meds.some((m) => state.mediumTiers.get(m) === t));
  const named = meds.filter((m) => !TIERS.includes(m)).map((m) => [m, `${m} (${state.mediumTiers.get(m) || "?"})`]);
  setOptions(tid("filter-medium"), [["", "all"], ...tiers.map((t) => [t, `${t} tier`]), ...named]);
}

function setOptions(sel, opts) {
  const sig = opts.map((o) => o.join("\u0002")).join("\u0001");
  if (sel.dataset.sig === sig) return;
  sel.dataset.sig = sig;
  const current = sel.value;
  sel.replaceChildren(
    ...opts.map(([v, label]) => {
      const o = el("option", "", label);
      o.value = v;
      return o;
    }),
  );
  sel.value = opts.some((o) => o[0] === current) ? current : "";
}

// ---------------------------------------------------------------------------------------------
// interactions

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      /* fall through to the legacy path */
    }
  }
  const ta = document.createElement("textarea");
  ta.value = text;
  ta.setAttribute("readonly", "");
  ta.style.position = "fixed";
  ta.style.top = "-1000px";
  document.body.append(ta);
  ta.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch {
    ok = false;
  }
  ta.remove();
  return ok;
}

let toastTimer = 0;
function toast(text, sticky = false) {
  const t = tid("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (t.hidden = true), sticky ? 8000 : 2200);
}

tid("tail").addEventListener("click", async (ev) => {
  const target = ev.target instanceof Element ? ev.target : null;
  if (!target) return;
  const hashEl = target.closest("[data-hash]");
  if (hashEl) {
    const full = hashEl.dataset.hash;
    const ok = await copyText(full);
    hashEl.classList.add("copied");
    setTimeout(() => hashEl.classList.remove("copied"), 900);
    const t = tid("toast");
    t.dataset.value = full;
    if (ok) toast(`Copied ${full}`);
    else toast(`Copy failed; hash: ${full}`, true);
    return;
  }
  const more = target.closest("[data-more]");
  if (more) {
    const row = more.closest(".tail-row");
    const e = row && row._entry;
    if (!e || !e.hashes) return;
    const frag = document.createDocumentFragment();
    for (const h of e.hashes.slice(HASHES_SHOWN)) frag.append(hashChip(h));
    more.replaceWith(frag);
  }
});

const tailEl = tid("tail");
tailEl.addEventListener("pointerenter", (ev) => {
  if (ev.pointerType === "mouse") {
    state.tailHover = true;
    invalidate("tail");
  }
});
tailEl.addEventListener("pointerleave", () => {
  state.tailHover = false;
  invalidate("tail");
});

for (const name of ["filter-source", "filter-type", "filter-medium"]) {
  tid(name).addEventListener("change", () => {
    lastTailRender = 0;
    invalidate("tail");
  });
}

for (const b of document.querySelectorAll(".view-switch [data-view]")) {
  b.addEventListener("click", () => {
    state.view = b.dataset.view;
    invalidate("occ");
    invalidate("charts");
  });
}

for (const th of document.querySelectorAll(".fleet-table th[data-sort]")) {
  th.tabIndex = 0;
  const sortBy = () => {
    const col = th.dataset.sort;
    state.sort = { col, dir: state.sort.col === col ? -state.sort.dir : 1 };
    for (const other of document.querySelectorAll(".fleet-table th[data-sort]")) {
      const mine = other.dataset.sort === state.sort.col;
      other.setAttribute("aria-sort", mine ? (state.sort.dir > 0 ? "ascending" : "descending") : "none");
    }
    invalidate("occ");
  };
  th.addEventListener("click", sortBy);
  th.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      sortBy();
    }
  });
}

tid("group-by-source").addEventListener("change", (ev) => {
  state.grouped = ev.currentTarget.checked;
  invalidate("occ");
});

tid("tail-pause").addEventListener("click", (ev) => {
  state.tailPaused = !state.tailPaused;
  ev.currentTarget.setAttribute("aria-pressed", String(state.tailPaused));
  ev.currentTarget.textContent = state.tailPaused ? "Resume" : "Pause";
  invalidate("tail");
});

tid("tail-clear").addEventListener("click", () => {
  state.tailClearedAt = state.tailHead;
  state.tailRendered = state.tailHead;
  lastTailRender = 0;
  invalidate("tail");
});

tid("auth-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = tid("token-input");
  const token = input.value.trim();
  if (!token) return;
  state.token = token;
  try {
    sessionStorage.setItem(TOKEN_KEY, token);
  } catch {
    /* storage disabled: keep it in memory */
  }
  input.value = "";
  state.needAuth = false;
  state.authRejected = false;
  state.connNote = "";
  client.setToken(token);
  invalidate("conn");
  occPoller.now();
  sourcesPoller.now();
  client.start();
});

// a once-a-second tick: message rate, "updated n s ago", flashing cards expiring
setInterval(() => {
  const now = performance.now();
  const dt = (now - state.msgRateAt) / 1000;
  state.msgRate = dt > 0 ? state.msgCount / dt : 0;
  state.msgCount = 0;
  state.msgRateAt = now;
  invalidate("conn");
  invalidate("occ");
  // A background tab runs no animation frames: its title and icon are kept up to date from here.
  if (document.hidden) renderTitle(streamRows().map(([key, row]) => streamFacts(key, row)));
  // Watchdog: a stream that says nothing while plain HTTP to the gateway fails too is probably a
  // dead TCP connection the browser has not noticed (no protocol pings reach page scripts).
  const quietMs = Date.now() - Math.max(state.lastMessageAt, state.occAt);
  if (client.current && state.conn === "live" && state.occError && quietMs > STALL_MS) client.reconnect("connection stalled");
}, 1000);

// ---------------------------------------------------------------------------------------------
// start

occPoller.start();
sourcesPoller.start();
historyPoller.start();
analyticsPoller.start();
if (!state.needAuth) client.start();
invalidate("tail");

// For debugging from the console (not an API).
window.kvgatewayDashboard = { state, client };
