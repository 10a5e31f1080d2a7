// Number and DOM helpers shared by the dashboard's modules (no dependencies).

export const intFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
export const compactFmt = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 2 });
export const rateFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

export function fmtInt(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return Math.abs(n) >= 1e6 ? compactFmt.format(n) : intFmt.format(n);
}

export function fmtRate(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return n >= 1000 ? compactFmt.format(n) : rateFmt.format(n);
}

export function fmtPct(frac) {
  if (frac === null || !Number.isFinite(frac)) return "";
  const p = frac * 100;
  return (p > 0 && p < 0.1 ? "<0.1" : p.toFixed(p < 10 ? 1 : 0)) + "%";
}

export function fmtTime(tsSeconds) {
  if (typeof tsSeconds !== "number" || !Number.isFinite(tsSeconds)) return "";
  const d = new Date(tsSeconds * 1000);
  const pad = (v, w = 2) => String(v).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** A duration for people: 42 s, 3.5 min, 2.1 h. */
export function fmtDur(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${(seconds / 60).toFixed(seconds < 600 ? 1 : 0)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

/** Set text and data-value only when they changed (keeps layout work per frame small). */
export function setVal(el, value, text) {
  if (!el) return;
  const v = value === null || value === undefined ? "" : String(value);
  if (el.dataset.value !== v) el.dataset.value = v;
  const t = text === undefined ? v : text;
  if (el.textContent !== t) el.textContent = t;
}

export function setText(el, text) {
  if (el && el.textContent !== text) el.textContent = text;
}

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}


/** An engine seq (a decimal string: exact beyond 2^53) with thousands separators, exactly. */
export function seqFmt(seq) {
  return typeof seq === "string" && /^[0-9]{1,20}$/.test(seq) ? intFmt.format(BigInt(seq)) : "–";
}
