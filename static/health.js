// Health at a glance: what matters first about a stream, from the gateway's status, its history
// and the stream of batches. Pure functions of their arguments (no DOM, no global state).

import { fmtDur } from "./format.js";
import { reasonText } from "./reasons.js";

export const SILENT_S = 10; // a connected stream without a batch for this long is "silent"
export const RESTART_WINDOW_S = 120;
export const RESTART_STORM = 3; // restarts within the window that make a stream "restarting"
export const LAG_FRESH_S = 5; // lag is shown only while the last batch is this recent

/** Worst first: the order of the fleet table's state column and of the title. */
export const STATE_ORDER = ["down", "degraded", "restarting", "silent", "stale", "up", "unknown"];

/**
 * Restarts within the last `windowS` seconds: the counter now (v1/sources) minus the history's
 * count at the window's start (its oldest point when the gateway has not watched that long).
 * null without history or counter.
 */
export function restartsWithin(series, nowS, windowS, restartsNow) {
  if (typeof restartsNow !== "number" || !series || !series.t.length) return null;
  const since = nowS - windowS;
  let base = null;
  for (let i = series.t.length - 1; i >= 0; i--) {
    if (series.t[i] <= since) {
      base = series.restarts[i];
      break;
    }
  }
  if (base === null) base = series.restarts.find((v) => typeof v === "number") ?? 0;
  return Math.max(0, restartsNow - base);
}

/** When the stream's last batch arrived (seconds): seen on the stream here, or per the history. */
export function lastBatchAt(seenMs, series) {
  let at = typeof seenMs === "number" ? seenMs / 1000 : null;
  if (series && series.lastBatch.length) {
    const v = series.lastBatch[series.lastBatch.length - 1];
    if (v !== null && (at === null || v > at)) at = v;
  }
  return at;
}

/**
 * The state that matters first, with its reason: down > degraded > restarting > silent > stale > up.
 * `src`: the stream's v1/sources entry (may be null); `serverState`: its state, or a notice's
 * override; `ageS`: seconds since the last batch (null: none seen); `watchedS`: how long the
 * history has watched the stream (a stream that never sent is silent only after SILENT_S).
 */
export function streamHealth({ serverState, src, occ, restarts, ageS, watchedS }) {
  // `code`: the gateway's reason codes behind `reason` (for a tooltip), "" when it gave none
  const out = { state: serverState, reason: "", code: "" };
  if (serverState === "down") {
    out.reason = src && src.reason ? String(src.reason) : "not connected";
    return out;
  }
  if (serverState === "degraded") {
    const losses = Object.entries((src && src.unrecovered_by_reason) || {}).filter(([, n]) => n > 0);
    out.reason = losses.length
      ? `lost ${losses.map(([r, n]) => `${n} batches (${reasonText("unrecovered_gap", r)})`).join(", ")}`
      : "lost batches";
    out.code = losses.map(([r]) => r).join(", ");
    return out;
  }
  if (restarts !== null && restarts >= RESTART_STORM) {
    out.state = "restarting";
    out.reason = `${restarts} restarts in ${RESTART_WINDOW_S / 60} min`;
    return out;
  }
  const connected = Boolean(src && src.connected);
  if (connected && (ageS !== null ? ageS > SILENT_S : watchedS > SILENT_S)) {
    out.state = "silent";
    out.reason = ageS === null ? "no batch yet" : `no batch for ${fmtDur(ageS)}`;
    return out;
  }
  if (serverState === "stale") {
    const why = (src && src.stale_reason) || (occ && occ.stale_reason) || "";
    out.reason = `index incomplete: ${why ? reasonText("stale", why) : "events were lost"}`;
    out.code = why;
  }
  return out;
}

/** How many streams are in each state (every STATE_ORDER key present). */
export function troubleCounts(states) {
  const counts = Object.fromEntries(STATE_ORDER.map((s) => [s, 0]));
  for (const s of states) counts[s in counts ? s : "unknown"]++;
  return counts;
}

/**
 * A stream's cache at a glance, from its occupancy entry: GPU-tier `fill` (null unless every GPU
 * medium has a capacity), `turnover` (resident GPU blocks / GPU removes per second: about how long
 * a block lives; null while the cache is still filling, i.e. it removes less than a quarter of
 * what it stores), rates summed over every medium.
 */
export function cacheFacts(occ, tierOf) {
  const out = { fill: null, gpuBlocks: null, gpuCap: null, turnover: null, stores: null, removes: null };
  if (!occ) return out;
  let blocks = 0;
  let cap = 0;
  let capKnown = true;
  let any = false;
  let removesGpu = 0;
  let storesGpu = 0;
  for (const v of Object.values(occ.mediums || {})) {
    if (typeof v.stores_per_s === "number") out.stores = (out.stores ?? 0) + v.stores_per_s;
    if (typeof v.removes_per_s === "number") out.removes = (out.removes ?? 0) + v.removes_per_s;
    if (tierOf(v) !== "GPU") continue;
    any = true;
    blocks += Number(v.blocks) || 0;
    removesGpu += Number(v.removes_per_s) || 0;
    storesGpu += Number(v.stores_per_s) || 0;
    if (typeof v.capacity_blocks === "number" && v.capacity_blocks > 0) cap += v.capacity_blocks;
    else capKnown = false;
  }
  if (!any) return out;
  out.gpuBlocks = blocks;
  out.gpuCap = capKnown ? cap : null;
  out.fill = capKnown && cap > 0 ? blocks / cap : null;
  out.turnover = removesGpu > 0 && removesGpu >= 0.25 * storesGpu ? blocks / removesGpu : null;
  return out;
}
