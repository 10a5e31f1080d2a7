// "Where prefill goes": the fleet's GPU-tier stores by origin over time (hit, offloaded, refetch,
// elsewhere, new), from GET v1/history's `stored_tokens` per point (tokens since the previous
// point), so the chart is full at page load; and each stream's routing-miss share (elsewhere over
// all stored tokens of its last 5 minutes) for the fleet table. docs/operations.md says what each
// origin means. DOM-light: one section element it fills, no other state of the page.
//
// A bar sums at least two history points: a history sample taken late holds two intervals and the
// next one almost nothing, and a bar of a few hundred tokens would show shares that mean nothing.
// The legend gives each origin's share of every token the chart spans, and is a set of toggles: an
// origin switched off leaves the bars (which then split what is left), never the legend's numbers.

import { el, fmtDur, fmtInt, fmtPct, fmtTime } from "./format.js";

export const ORIGINS = ["hit", "offloaded", "refetch", "elsewhere", "new"];
const WHAT = {
  hit: "the engine already held the block: a reused prefix (engines in full report mode)",
  offloaded: "loaded back from the engine's other tier (CPU, disk)",
  refetch: "evicted by the engine within the refetch window: a capacity miss",
  elsewhere: "another engine held it: a routing miss",
  new: "the workload's own new content",
};
const RECENT_S = 300;
const BARS = 120; // at most this many bars: a bar spans 2 points, more when the history is long
const MIN_POINTS_PER_BAR = 2;
const KEPT_POINTS = 720; // an hour at 5 s

/** HH:MM:SS, as the page's other times. */
function clock(t) {
  return fmtTime(t).slice(0, 8);
}

export class PrefillView {
  constructor(root) {
    this.root = root;
    this.epoch = "";
    this.interval = 5;
    this.byT = new Map(); // t -> [tokens per origin], fleet-wide
    this.streams = new Map(); // streamKey -> [[t, tokens per origin]...] (the last RECENT_S)
    this.shown = new Set(ORIGINS); // the origins the bars split (legend toggles)
    this.built = false;
  }

  /** One v1/history answer (``full``: it replaces what was kept). ``keyOf(source, rank)``: the page's stream key. */
  applyHistory(doc, full, keyOf) {
    if (!doc || !Array.isArray(doc.streams)) return;
    if (full || doc.epoch !== this.epoch) {
      this.epoch = String(doc.epoch || "");
      this.byT.clear();
      this.streams.clear();
    }
    if (Number(doc.interval_seconds) > 0) this.interval = Number(doc.interval_seconds);
    let newest = 0;
    for (const s of doc.streams) {
      const key = keyOf(s.source, s.dp_rank);
      let recent = this.streams.get(key);
      if (!recent) this.streams.set(key, (recent = []));
      for (const p of s.points || []) {
        const st = p.stored_tokens;
        if (!st || (recent.length && p.t <= recent[recent.length - 1][0])) continue;
        const counts = ORIGINS.map((o) => Number(st[o]) || 0);
        recent.push([p.t, counts]);
        let at = this.byT.get(p.t);
        if (!at) this.byT.set(p.t, (at = ORIGINS.map(() => 0)));
        counts.forEach((n, i) => {
          at[i] += n;
        });
        if (p.t > newest) newest = p.t;
      }
    }
    for (const recent of this.streams.values()) {
      let drop = 0;
      while (drop < recent.length && recent[drop][0] <= newest - RECENT_S) drop++;
      if (drop) recent.splice(0, drop);
    }
    const ts = [...this.byT.keys()].sort((a, b) => a - b);
    for (const t of ts.slice(0, Math.max(0, ts.length - KEPT_POINTS))) this.byT.delete(t);
  }

  /** A stream's routing-miss share over its last 5 minutes (null: nothing stored). */
  missShare(key) {
    const recent = this.streams.get(key);
    if (!recent) return null;
    let all = 0;
    let miss = 0;
    for (const [, counts] of recent) {
      for (const n of counts) all += n;
      miss += counts[ORIGINS.indexOf("elsewhere")];
    }
    return all ? miss / all : null;
  }

  build() {
    this.built = true;
    const head = el("div", "section-head");
    head.append(el("h2", "", "Where prefill goes"));
    this.hint = el("span", "hint", "tokens stored into GPU caches by origin, fleet-wide");
    this.hint.dataset.testid = "prefill-span";
    head.append(this.hint);
    this.legend = el("div", "prefill-legend");
    this.legend.dataset.testid = "prefill-legend";
    this.items = {};
    for (const origin of ORIGINS) {
      const item = el("button", `prefill-item o-${origin}`);
      item.type = "button";
      item.dataset.testid = `prefill-${origin}`;
      item.dataset.tokens = "0";
      item.setAttribute("aria-pressed", "true");
      item.title = `${WHAT[origin]} (click: leave it out of the bars, or back in)`;
      const pct = el("b", "v", "–");
      const n = el("span", "n"); // the tokens: left out on a phone
      item.append(el("i", "swatch"), el("span", "name", origin), pct, n);
      item.addEventListener("click", () => this.toggle(origin));
      this.legend.append(item);
      this.items[origin] = { item, pct, n };
    }
    this.bars = el("div", "prefill-bars");
    this.bars.dataset.testid = "prefill-chart";
    this.bars.setAttribute("role", "img");
    this.axis = el("div", "prefill-axis");
    this.root.append(head, this.legend, this.bars, this.axis);
  }

  toggle(origin) {
    if (this.shown.has(origin)) {
      if (this.shown.size === 1) return; // at least one origin stays: an empty chart says nothing
      this.shown.delete(origin);
    } else {
      this.shown.add(origin);
    }
    this.items[origin].item.setAttribute("aria-pressed", String(this.shown.has(origin)));
    this.render();
  }

  /** The kept points summed into bars of ``points`` points each, aligned on time: [[t0, t1, counts]...]. */
  binned() {
    const ts = [...this.byT.keys()].sort((a, b) => a - b);
    const per = Math.max(MIN_POINTS_PER_BAR, Math.ceil(ts.length / BARS));
    const width = per * this.interval;
    const bins = new Map();
    for (const t of ts) {
      const start = Math.floor(t / width) * width;
      let bin = bins.get(start);
      if (!bin) bins.set(start, (bin = [start, start + width, ORIGINS.map(() => 0)]));
      this.byT.get(t).forEach((n, i) => {
        bin[2][i] += n;
      });
    }
    return { bins: [...bins.values()], width };
  }

  render() {
    if (!this.root) return;
    if (!this.built) this.build();
    const { bins, width } = this.binned();
    const totals = ORIGINS.map((_, i) => bins.reduce((sum, bin) => sum + bin[2][i], 0));
    const all = totals.reduce((a, b) => a + b, 0);
    ORIGINS.forEach((origin, i) => {
      const { item, pct, n } = this.items[origin];
      const tokens = totals[i];
      if (item.dataset.tokens !== String(tokens)) {
        item.dataset.tokens = String(tokens);
        pct.textContent = all ? fmtPct(tokens / all) : "–";
        n.textContent = all ? ` · ${fmtInt(tokens)}` : "";
      }
    });
    const span = bins.length ? bins[bins.length - 1][1] - bins[0][0] : 0;
    const left = ORIGINS.filter((o) => !this.shown.has(o));
    this.hint.textContent =
      `tokens stored into GPU caches by origin, fleet-wide, over the last ${fmtDur(span)}` +
      ` · a bar per ${fmtDur(width)}` +
      (left.length ? ` · bars without ${left.join(", ")}` : " · click an origin to leave it out");
    this.bars.setAttribute("aria-label", `shares of the tokens stored, a bar per ${fmtDur(width)}`);
    this.bars.replaceChildren(...bins.map((bin) => this.bar(bin)));
    this.axis.replaceChildren(
      el("span", "", bins.length ? clock(bins[0][0]) : ""),
      el("span", "", bins.length ? clock(bins[bins.length - 1][1]) : ""),
    );
    this.root.hidden = all === 0 && !bins.length;
  }

  bar([t0, t1, counts]) {
    const bar = el("div", "prefill-bar");
    const sum = counts.reduce((a, b) => a + b, 0);
    const shownSum = ORIGINS.reduce((a, o, i) => a + (this.shown.has(o) ? counts[i] : 0), 0);
    const parts = ORIGINS.map((o, i) => `${o} ${sum ? fmtPct(counts[i] / sum) : "–"}`);
    bar.title = `${clock(t0)}–${clock(t1)} · ${fmtInt(sum)} tokens\n${parts.join(" · ")}`;
    if (!shownSum) return bar;
    ORIGINS.forEach((origin, i) => {
      if (!counts[i] || !this.shown.has(origin)) return;
      const seg = el("div", `seg o-${origin}`);
      seg.style.height = `${(100 * counts[i]) / shownSum}%`;
      bar.append(seg);
    });
    return bar;
  }
}
