// "Where prefill goes": the fleet's GPU-tier stores by origin over time (hit, offloaded, refetch,
// elsewhere, new), from GET v1/history's `stored_tokens` per point (tokens since the previous
// point), so the chart is full at page load; and each stream's routing-miss share (elsewhere over
// all stored tokens of its last 5 minutes) for the fleet table. docs/operations.md says what each
// origin means. DOM-light: one section element it fills, no other state of the page.

import { el, fmtInt, fmtPct } from "./format.js";

export const ORIGINS = ["hit", "offloaded", "refetch", "elsewhere", "new"];
const WHAT = {
  hit: "the engine already held the block (full report mode)",
  offloaded: "loaded back from another tier (CPU, disk)",
  refetch: "evicted by the engine within the refetch window: a capacity miss",
  elsewhere: "another engine held it: a routing miss",
  new: "the workload's own new content",
};
const RECENT_S = 300;
const BARS = 120; // the newest 120 points (10 minutes at 5 s)

export class PrefillView {
  constructor(root) {
    this.root = root;
    this.epoch = "";
    this.byT = new Map(); // t -> [tokens per origin], fleet-wide
    this.streams = new Map(); // streamKey -> [[t, tokens per origin]...] (the last RECENT_S)
    this.totals = ORIGINS.map(() => 0); // since the page loaded the history
    this.built = false;
  }

  /** One v1/history answer (``full``: it replaces what was kept). ``keyOf(source, rank)``: the page's stream key. */
  applyHistory(doc, full, keyOf) {
    if (!doc || !Array.isArray(doc.streams)) return;
    if (full || doc.epoch !== this.epoch) {
      this.epoch = String(doc.epoch || "");
      this.byT.clear();
      this.streams.clear();
      this.totals = ORIGINS.map(() => 0);
    }
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
          this.totals[i] += n;
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
    for (const t of ts.slice(0, Math.max(0, ts.length - 720))) this.byT.delete(t);
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
    head.append(el("span", "hint", "tokens stored into GPU caches by origin, fleet-wide · 5 s points"));
    this.legend = el("div", "prefill-legend");
    this.legend.dataset.testid = "prefill-legend";
    this.items = {};
    for (const origin of ORIGINS) {
      const item = el("span", `prefill-item o-${origin}`);
      item.dataset.testid = `prefill-${origin}`;
      item.dataset.tokens = "0";
      item.title = WHAT[origin];
      const sw = el("i", "swatch");
      const name = el("span", "name", origin);
      const v = el("b", "v", "–");
      item.append(sw, name, v);
      this.legend.append(item);
      this.items[origin] = { item, v };
    }
    this.bars = el("div", "prefill-bars");
    this.bars.dataset.testid = "prefill-chart";
    this.root.append(head, this.legend, this.bars);
  }

  render() {
    if (!this.root) return;
    if (!this.built) this.build();
    const all = this.totals.reduce((a, b) => a + b, 0);
    ORIGINS.forEach((origin, i) => {
      const { item, v } = this.items[origin];
      const n = this.totals[i];
      if (item.dataset.tokens !== String(n)) {
        item.dataset.tokens = String(n);
        v.textContent = all ? `${fmtPct(n / all)} · ${fmtInt(n)}` : "–";
      }
    });
    const ts = [...this.byT.keys()].sort((a, b) => a - b).slice(-BARS);
    const bars = ts.map((t) => {
      const counts = this.byT.get(t);
      const sum = counts.reduce((a, b) => a + b, 0);
      const bar = el("div", "prefill-bar");
      bar.title = new Date(t * 1000).toLocaleTimeString();
      if (sum) {
        ORIGINS.forEach((origin, i) => {
          if (!counts[i]) return;
          const seg = el("div", `seg o-${origin}`);
          seg.style.height = `${(100 * counts[i]) / sum}%`;
          bar.append(seg);
        });
      }
      return bar;
    });
    this.bars.replaceChildren(...bars);
    this.root.hidden = all === 0 && !ts.length;
  }
}
