// The fleet table: one row per stream (up to hundreds), sortable, grouped by source, a row's card
// on demand. Rows are kept and updated in place; they move only when the order changes.

import { el, fmtDur, fmtInt, fmtPct, fmtRate, setVal } from "./format.js";
import { STATE_ORDER } from "./health.js";

const COLUMNS = ["stream", "state", "fill", "turnover", "stores", "removes", "age", "lag", "restarts", "lost", "miss"];
const OPTIONAL = new Set(["turnover", "stores", "removes", "lag", "restarts", "lost", "miss"]); // hidden on a phone

/** The value a column sorts by (null sorts last either way). */
function sortValue(f, col) {
  switch (col) {
    case "stream":
      return null;
    case "state":
      return STATE_ORDER.indexOf(f.health.state);
    case "fill":
      return f.cache.fill ?? (f.cache.gpuBlocks === null ? null : 1e12 + f.cache.gpuBlocks);
    case "turnover":
      return f.cache.turnover;
    case "stores":
      return f.cache.stores;
    case "removes":
      return f.cache.removes;
    default:
      return f[col] ?? null;
  }
}

function byStream(a, b) {
  return String(a.source).localeCompare(String(b.source)) || Number(a.rank) - Number(b.rank);
}

export function sortFacts(facts, sort) {
  const { col, dir } = sort;
  return [...facts].sort((a, b) => {
    if (col !== "stream") {
      const va = sortValue(a, col);
      const vb = sortValue(b, col);
      if (va !== vb) {
        if (va === null) return 1;
        if (vb === null) return -1;
        return (va < vb ? -1 : 1) * dir;
      }
      return byStream(a, b);
    }
    return byStream(a, b) * dir;
  });
}

export class FleetTable {
  constructor(tbody, onToggle) {
    this.tbody = tbody;
    this.rows = new Map(); // streamKey -> {tr, cells}
    this.groups = new Map(); // source -> {tr, cells}
    this.order = "";
    tbody.addEventListener("click", (ev) => {
      const tr = ev.target instanceof Element ? ev.target.closest("tr[data-key]") : null;
      if (tr) onToggle(tr.dataset.key);
    });
    tbody.addEventListener("keydown", (ev) => {
      const tr = ev.target instanceof Element ? ev.target.closest("tr[data-key]") : null;
      if (tr && (ev.key === "Enter" || ev.key === " ")) {
        ev.preventDefault();
        onToggle(tr.dataset.key);
      }
    });
  }

  row(f) {
    let r = this.rows.get(f.key);
    if (r) return r;
    const tr = el("tr", "stream-row");
    tr.dataset.key = f.key;
    tr.dataset.testid = `row-${f.source}-${f.rank}`;
    tr.tabIndex = 0;
    const cells = {};
    for (const c of COLUMNS) {
      const td = el(c === "stream" ? "th" : "td", `c-${c}${OPTIONAL.has(c) ? " opt" : ""}`);
      if (c === "stream") td.scope = "row";
      const v = el("span", c === "state" ? "badge" : "v");
      v.dataset.testid = `cell-${c}`;
      td.append(v);
      tr.append(td);
      cells[c] = v;
    }
    cells.stream.textContent = `${f.source} · dp ${f.rank}`;
    r = { tr, cells };
    this.rows.set(f.key, r);
    return r;
  }

  group(source, members) {
    let g = this.groups.get(source);
    if (!g) {
      const tr = el("tr", "group-row");
      tr.dataset.testid = `group-${source}`;
      const th = el("th", "", "");
      th.colSpan = COLUMNS.length;
      th.scope = "rowgroup";
      tr.append(th);
      g = { tr, th };
      this.groups.set(source, g);
    }
    const worst = members.reduce((w, f) => Math.min(w, STATE_ORDER.indexOf(f.health.state)), STATE_ORDER.length - 1);
    const bad = members.filter((f) => STATE_ORDER.indexOf(f.health.state) < STATE_ORDER.indexOf("up")).length;
    g.tr.dataset.state = STATE_ORDER[worst];
    const text = `${source} · ${members.length} stream${members.length === 1 ? "" : "s"}${bad ? ` · ${bad} need attention` : ""}`;
    if (g.th.textContent !== text) g.th.textContent = text;
    return g;
  }

  render(facts, sort, grouped, pinned) {
    const sorted = sortFacts(facts, sort);
    const wanted = [];
    const seen = new Set();
    if (grouped) {
      const bySource = new Map();
      for (const f of sorted) {
        if (!bySource.has(f.source)) bySource.set(f.source, []);
        bySource.get(f.source).push(f);
      }
      for (const source of [...bySource.keys()].sort()) {
        wanted.push(this.group(source, bySource.get(source)).tr);
        for (const f of bySource.get(source)) wanted.push(this.update(f, pinned, seen));
      }
    } else {
      for (const f of sorted) wanted.push(this.update(f, pinned, seen));
    }
    for (const [key, r] of this.rows) if (!seen.has(key)) this.rows.delete(key) && r.tr.remove();
    const order = wanted.map((tr) => tr.dataset.key || tr.dataset.testid).join("\u0000");
    if (order !== this.order) {
      this.order = order;
      this.tbody.replaceChildren(...wanted);
    }
  }

  update(f, pinned, seen) {
    seen.add(f.key);
    const { tr, cells } = this.row(f);
    const st = f.health.state;
    if (tr.dataset.state !== st) tr.dataset.state = st;
    tr.classList.toggle("pinned", pinned.has(f.key));
    tr.title = f.health.reason || "";
    setVal(cells.state, st);
    const c = f.cache;
    if (c.fill !== null) setVal(cells.fill, c.fill.toFixed(6), fmtPct(c.fill));
    else setVal(cells.fill, c.gpuBlocks === null ? "" : `blocks:${c.gpuBlocks}`, c.gpuBlocks === null ? "–" : `${fmtInt(c.gpuBlocks)} bl`);
    setVal(cells.turnover, c.turnover === null ? "" : c.turnover.toFixed(1), fmtDur(c.turnover));
    setVal(cells.stores, c.stores, fmtRate(c.stores));
    setVal(cells.removes, c.removes, fmtRate(c.removes));
    setVal(cells.age, f.age === null ? "" : f.age.toFixed(1), f.age === null ? "–" : `${fmtDur(f.age)} ago`);
    setVal(cells.lag, f.lag, f.lag === null ? "–" : `${f.lag.toFixed(2)} s`);
    setVal(cells.restarts, f.restarts, fmtInt(f.restarts));
    setVal(cells.lost, f.lost, fmtInt(f.lost));
    setVal(cells.miss, f.miss === null ? "" : f.miss.toFixed(4), f.miss === null ? "–" : fmtPct(f.miss));
    return tr;
  }
}
