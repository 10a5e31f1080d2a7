// kvgateway client state: what docs/protocol.md's "Writing a client" says to keep, with no I/O
// and no DOM, so that it runs the same in a page, in Node and in a unit test.
//
// - parseMessage: JSON.parse of one protocol line with every engine seq exact (a decimal string,
//   whether the gateway sent a string or, older or with compat=int_seqs, a number).
// - Digest: the order-independent state digest (FNV-1a 64 per block key, summed mod 2^64),
//   kept in O(1) per event.
// - BlockState: the resident blocks of every stream with their reference counts, the stale flags,
//   the resume id, and the new state built apart and swapped in when complete.

/** The fields that carry an engine sequence number (unsigned 64-bit: beyond 2^53 as numbers). */
export const SEQ_FIELDS = ["seq", "last_seq", "previous", "first", "until", "last"];

// A seq sent as a number of 16 digits or more may exceed 2^53: quote it before JSON.parse
// rounds it. Keyed on the field name, so hashes (strings already) and token ids are untouched.
const WIDE_SEQ = /(?<!\\)"(seq|last_seq|previous|first|until|last)":(-?\d{16,})/g;

/** One protocol message from one line of JSON, seqs as decimal strings. */
export function parseMessage(line) {
  const msg = JSON.parse(exactSeqs(line));
  if (msg === null || typeof msg !== "object") throw new Error("not a JSON object");
  seqsAsStrings(msg);
  if (msg.status && typeof msg.status === "object") seqsAsStrings(msg.status);
  if (Array.isArray(msg.sources)) for (const s of msg.sources) if (s && typeof s === "object") seqsAsStrings(s);
  return msg;
}

// A batch's envelope comes before its events, which are most of its bytes and hold no seq:
// only the envelope is searched.
function exactSeqs(line) {
  const events = line.startsWith('{"type":"batch"') ? line.indexOf('"events":') : -1;
  const head = events < 0 ? line : line.slice(0, events);
  if (!WIDE_SEQ.test(head)) return line;
  WIDE_SEQ.lastIndex = 0;
  return head.replace(WIDE_SEQ, '"$1":"$2"') + (events < 0 ? "" : line.slice(events));
}

function seqsAsStrings(obj) {
  for (const name of SEQ_FIELDS) {
    if (typeof obj[name] === "number") obj[name] = seqText(obj[name]); // (a state's `last` is a boolean)
  }
}

/** A seq as the client keeps it: a decimal string (a number within 2^53 converts exactly). */
export function seqText(value) {
  if (typeof value === "string") return value;
  if (typeof value === "bigint") return value.toString();
  return Number.isSafeInteger(value) ? String(value) : BigInt(value).toString();
}

/** Seqs first..until inclusive: `count` of an `unrecovered_gap`, exact for 64-bit seqs. */
export function seqSpan(first, until) {
  return BigInt(seqText(until)) - BigInt(seqText(first)) + 1n;
}

// --- the digest ------------------------------------------------------------------------------
//
// 64-bit arithmetic in two 32-bit halves of ordinary numbers (every intermediate stays below
// 2^53): BigInt would allocate for every byte of every key.

const TWO32 = 4294967296;
const encoder = new TextEncoder();

/** FNV-1a 64 of a key's UTF-8 bytes as [high 32 bits, low 32 bits]. */
export function fnv1a64(text) {
  let hi = 0xcbf29ce4;
  let lo = 0x84222325;
  // Keys are ASCII but for an engine's exotic medium name: its UTF-8 bytes are its char codes.
  const bytes = /^[\x00-\x7f]*$/.test(text) ? text : encoder.encode(text);
  for (let i = 0; i < bytes.length; i++) {
    const byte = typeof bytes === "string" ? bytes.charCodeAt(i) : bytes[i];
    lo = (lo ^ byte) >>> 0;
    // x * 0x100000001b3 = x * 0x1b3 + (x << 40), mod 2^64
    const low = lo * 0x1b3;
    const carry = Math.floor(low / TWO32);
    hi = (hi * 0x1b3 + carry + ((lo << 8) >>> 0)) % TWO32;
    lo = low % TWO32;
  }
  return [hi, lo];
}

/** The text a block key is hashed as: `medium \n group_idx \n hash`. */
export function keyText(medium, group, hash) {
  return `${medium}\n${group}\n${hash}`;
}

/** A digest as the gateway writes it: 16 lowercase hex digits. */
export function hex64(hi, lo) {
  return hi.toString(16).padStart(8, "0") + lo.toString(16).padStart(8, "0");
}

/** The sum mod 2^64 of the elements of a set of block keys; add and remove are O(1). */
export class Digest {
  constructor() {
    this.hi = 0;
    this.lo = 0;
    this.blocks = 0;
  }

  add(key) {
    const [h, l] = fnv1a64(key);
    const lo = this.lo + l;
    this.lo = lo % TWO32;
    this.hi = (this.hi + h + (lo >= TWO32 ? 1 : 0)) % TWO32;
    this.blocks += 1;
  }

  remove(key) {
    const [h, l] = fnv1a64(key);
    const lo = this.lo - l;
    this.lo = lo < 0 ? lo + TWO32 : lo;
    this.hi = (this.hi - h - (lo < 0 ? 1 : 0) + 2 * TWO32) % TWO32;
    this.blocks -= 1;
  }

  get hex() {
    return hex64(this.hi, this.lo);
  }
}

/** The digest of a set of keys from scratch (tests, and a router checking itself in one pass). */
export function digestOf(keys) {
  const d = new Digest();
  for (const key of keys) d.add(key);
  return d.hex;
}

// --- mediums and tiers, for the digest of a `medium` filter ----------------------------------

const TIER_PREFIXES = [
  ["GPU", ["GPU", "CUDA", "HBM", "DEVICE"]],
  ["CPU", ["CPU", "HOST", "DRAM", "PINNED"]],
  ["DISK", ["DISK", "STORAGE", "SSD", "NVME", "FILE", "HDD", "FS"]],
];

/** The tier of an upper-cased medium name (docs/protocol.md, "Mediums and tiers"). */
export function tierOf(medium) {
  for (const [tier, prefixes] of TIER_PREFIXES) if (prefixes.some((p) => medium.startsWith(p))) return tier;
  return "EXTERNAL";
}

/** A predicate for the mediums a `medium` filter selects (none: every medium). */
export function mediumFilter(values) {
  if (!values || values.length === 0) return () => true;
  const wanted = values.map((v) => String(v).toUpperCase());
  const tiers = new Set(wanted.filter((v) => ["GPU", "CPU", "DISK", "EXTERNAL"].includes(v)));
  const names = new Set(wanted);
  return (medium) => names.has(medium) || tiers.has(tierOf(medium));
}

// --- the state -------------------------------------------------------------------------------

/** The key of one stream, as a map key. */
export const streamKey = (source, dpRank) => `${source}\u0000${dpRank}`;

/** One stream: its blocks (`medium\ngroup\nhash` -> refs), stale flag, digest and last seq. */
export class Stream {
  constructor(source, dpRank, stale = false) {
    this.source = source;
    this.dp_rank = dpRank;
    this.stale = stale;
    this.blocks = new Map();
    this.digest = new Digest();
    this.lastSeq = null;
  }

  clear() {
    this.blocks.clear();
    this.digest = new Digest();
    this.stale = false;
  }
}

function eventMedium(event) {
  return typeof event.medium === "string" && event.medium ? event.medium.toUpperCase() : "GPU";
}

function eventGroup(event) {
  return Number.isInteger(event.group_idx) ? event.group_idx : 0;
}

/**
 * Every stream's state, from the messages applied in order (`apply`). Options: `filters`
 * ({source, dp_rank, medium}: what the connection asked for; source and dp_rank choose the
 * streams the state must bring, medium the blocks the digest covers), `blocks` (false: keep no
 * blocks, for a client that shows counts from the hello's occupancy instead).
 */
export class BlockState {
  constructor({ filters = {}, blocks = true } = {}) {
    this.filters = filters;
    this.keepBlocks = blocks; // false: stale flags, last seqs and the resume id only (no snapshot)
    this.inDigest = mediumFilter(filters.medium);
    this.streams = new Map();
    this.epoch = null;
    this.offset = null; // the offset of the last message applied (a hello's at first)
    this.lastId = null; // where to resume
    this.next = null; // a fresh state being built: Map like `streams`, swapped in when complete
    this.pendingId = null;
    this.waiting = new Set();
    this.digestChecks = 0;
    this.digestMismatches = 0;
    this.lastMismatch = null;
  }

  /** The state is complete: no fresh state is being received. */
  get complete() {
    return this.next === null;
  }

  /** The stream of a message, created on first sight. */
  stream(source, dpRank, into = this.streams) {
    const key = streamKey(source, dpRank);
    let s = into.get(key);
    if (!s) into.set(key, (s = new Stream(source, dpRank)));
    return s;
  }

  selects(source, dpRank) {
    const { source: names, dp_rank: ranks } = this.filters;
    return (!names?.length || names.includes(source)) && (!ranks?.length || ranks.map(Number).includes(dpRank));
  }

  /** Applies one message; returns a digest check's result for a digest message, else null. */
  apply(msg, { snapshot = true } = {}) {
    switch (msg.type) {
      case "hello":
        this.hello(msg, snapshot);
        return null;
      case "state":
        this.state(msg);
        return null;
      case "batch":
      case "notice":
      case "digest":
        if (this.next !== null) this.swap(); // the fallback: live messages follow the whole state
        return this.live(msg);
      default:
        return null; // a later version's message: ignored
    }
  }

  hello(msg, snapshot) {
    const id = `${msg.epoch}:${msg.offset}`;
    this.epoch = msg.epoch;
    this.offset = msg.offset;
    if (msg.recovered) {
      this.next = null; // (a drop during a state is not resumed: never recovered)
      this.lastId = id;
      return;
    }
    const fresh = new Map();
    for (const s of msg.sources ?? []) {
      if (this.selects(s.source, s.dp_rank)) this.stream(s.source, s.dp_rank, fresh).stale = Boolean(s.stale);
    }
    this.next = fresh;
    this.pendingId = id;
    this.waiting = new Set(fresh.keys());
    if (!snapshot || this.waiting.size === 0) this.swap();
  }

  state(msg) {
    if (this.next === null) return; // only after a fresh hello
    const s = this.stream(msg.source, msg.dp_rank, this.next);
    for (const b of msg.blocks) this.set(s, keyText(b.medium, b.group_idx, b.hash), b.refs, b.medium);
    s.stale = Boolean(msg.stale);
    // A last chunk's digest (digest=SECONDS) is of every medium: comparable without a medium filter.
    if (msg.last && typeof msg.digest === "string" && !this.filters.medium?.length) {
      this.compare(s, msg.offset, msg.digest, s.digest.blocks);
    }
    if (msg.last) {
      this.waiting.delete(streamKey(msg.source, msg.dp_rank));
      if (this.waiting.size === 0) this.swap();
    }
  }

  swap() {
    this.streams = this.next;
    this.next = null;
    this.lastId = this.pendingId;
    this.pendingId = null;
    this.waiting = new Set();
  }

  live(msg) {
    let result = null;
    if (msg.type === "batch") this.batch(msg);
    else if (msg.type === "notice") this.notice(msg);
    else result = this.checkDigest(msg);
    if (typeof msg.id === "string") {
      this.lastId = msg.id;
      this.offset = msg.offset;
    }
    return result;
  }

  batch(msg) {
    const s = this.stream(msg.source, msg.dp_rank);
    s.lastSeq = msg.seq;
    if (!this.keepBlocks) return;
    for (const event of msg.events) {
      if (event.type === "AllBlocksCleared") s.clear();
      else if (event.type === "BlockStored" || event.type === "BlockRemoved") {
        const medium = eventMedium(event);
        const prefix = `${medium}\n${eventGroup(event)}\n`;
        const step = event.type === "BlockStored" ? 1 : -1;
        for (const hash of event.block_hashes ?? []) this.add(s, prefix + hash, step, medium);
      }
    }
  }

  notice(msg) {
    if (msg.source === undefined || msg.source === null) return; // a per-client notice
    if (msg.kind === "restart") this.stream(msg.source, msg.dp_rank).clear();
    else if (msg.kind === "stale") this.stream(msg.source, msg.dp_rank).stale = true;
  }

  /** Adds `step` references to a key; the digest follows the 0 <-> 1 transitions. */
  add(s, key, step, medium) {
    const refs = (s.blocks.get(key) ?? 0) + step;
    if (refs > 0) this.set(s, key, refs, medium);
    else if (s.blocks.delete(key) && this.inDigest(medium)) s.digest.remove(key); // unknown: ignored
  }

  set(s, key, refs, medium) {
    if (!s.blocks.has(key) && this.inDigest(medium)) s.digest.add(key);
    s.blocks.set(key, refs);
  }

  /** Compares the gateway's digest of a stream with ours, at the same offset. */
  checkDigest(msg) {
    if (!this.keepBlocks) return null; // nothing to compare with
    const s = this.stream(msg.source, msg.dp_rank);
    const count = msg.block_count ?? msg.blocks; // (`blocks`: the name first proposed)
    return this.compare(s, msg.offset, msg.digest, typeof count === "number" ? count : s.digest.blocks);
  }

  /** Counts a check of a stream's digest against the gateway's (and its key count). */
  compare(s, offset, digest, count) {
    const ok = s.digest.hex === digest && s.digest.blocks === count;
    this.digestChecks += 1;
    const result = { source: s.source, dp_rank: s.dp_rank, offset, ok, ours: s.digest.hex, theirs: digest };
    if (!ok) {
      this.digestMismatches += 1;
      this.lastMismatch = result;
    }
    return result;
  }

  /** The stream's resident blocks as `[medium, group_idx, hash, refs]` rows (sorted). */
  rows(source, dpRank) {
    const s = this.streams.get(streamKey(source, dpRank));
    if (!s) return [];
    return [...s.blocks].map(([key, refs]) => {
      const [medium, group, hash] = key.split("\n");
      return [medium, Number(group), hash, refs];
    });
  }

  /** Every stream with its blocks and stale flag, as plain data (for tests and display). */
  view() {
    const streams = [];
    for (const s of this.streams.values()) {
      streams.push({ source: s.source, dp_rank: s.dp_rank, stale: s.stale, digest: s.digest.hex, blocks: this.rows(s.source, s.dp_rank) });
    }
    return { offset: this.offset, complete: this.complete, lastId: this.lastId, streams };
  }
}
