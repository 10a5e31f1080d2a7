// TypeScript declarations of static/client.js (and client-state.js, which it re-exports).
//
// Each interface marked `@schema NAME` is the message `$defs/NAME` of kvgateway's JSON Schema
// (GET /v1/schema): tests/unit/protocol/test_schema_client_types.py checks it field by field (names,
// optional or required, nullable or not, types). Engine seqs are `Seq`: decimal strings, whether
// the gateway sent strings or (older, or compat=int_seqs) numbers; the client converts them exactly.

/** An engine sequence number (unsigned 64-bit), as a decimal string. */
export type Seq = string;
/** A block hash as the stream renders it: decimal digits, or lowercase hex for byte hashes. */
export type Hash = string;
export type Tier = "GPU" | "CPU" | "DISK" | "EXTERNAL";
/** Why a stream's connection is up or down, for programs. */
export type ConnectionCode =
  | "connected"
  | "disconnected"
  | "retrying"
  | "refused"
  | "unresolved"
  | "no_answer"
  | "unreachable"
  | "bind_failed"
  | "not_zeromq"
  | "never_connected"
  | "ingest_unreachable";

/** @schema hello */
export interface Hello {
  type: "hello";
  epoch: string;
  offset: number;
  recovered: boolean;
  sources: SourceStatus[];
  occupancy: object | null;
}

/** @schema source_status */
export interface SourceStatus {
  source: string;
  dp_rank: number;
  endpoint: string;
  replay: string | null;
  bind: boolean;
  state: "up" | "degraded" | "stale" | "down";
  connected: boolean;
  reason: string | null;
  reason_code: ConnectionCode | null;
  stale: boolean;
  stale_reason: "history_truncated" | "unrecovered" | "undecodable" | null;
  last_seq: Seq | null;
  lag_seconds: number | null;
  counters: Record<string, number>;
  unrecovered_by_reason: Record<string, number>;
}

/** @schema batch */
export interface Batch {
  type: "batch";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  seq: Seq;
  ts: number | null;
  events: Event[];
}

/** @schema BlockStored */
export interface BlockStored {
  type: "BlockStored";
  block_hashes: Hash[];
  parent_block_hash: Hash | null;
  token_ids: number[];
  block_size: number;
  lora_id: number | null;
  medium: string | null;
  tier: Tier;
  lora_name: string | null;
  extra_keys?: unknown[] | null;
  group_idx?: number | null;
  kv_cache_spec_kind?: string | null;
  kv_cache_spec_sliding_window?: number | null;
  [further: string]: unknown;
}

/** @schema BlockRemoved */
export interface BlockRemoved {
  type: "BlockRemoved";
  block_hashes: Hash[];
  medium: string | null;
  tier: Tier;
  group_idx?: number | null;
  [further: string]: unknown;
}

/** @schema AllBlocksCleared */
export interface AllBlocksCleared {
  type: "AllBlocksCleared";
  [further: string]: unknown;
}

/** An event this client does not know, passed on as the engine sent it. */
export interface OtherEvent {
  type: string;
  [further: string]: unknown;
}

export type Event = BlockStored | BlockRemoved | AllBlocksCleared | OtherEvent;

/** @schema notice_restart */
export interface RestartNotice {
  type: "notice";
  kind: "restart";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  seq: Seq;
  previous: Seq | null;
  reason: string;
}

/** @schema notice_unrecovered_gap */
export interface UnrecoveredGapNotice {
  type: "notice";
  kind: "unrecovered_gap";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  first: Seq;
  until: Seq;
  count: number;
  reason: "evicted" | "transit" | "no_answer" | "no_replay" | "not_sent" | "restart" | "overflow";
}

/** @schema notice_stale */
export interface StaleNotice {
  type: "notice";
  kind: "stale";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  reason: "history_truncated" | "unrecovered" | "undecodable";
  seq: Seq;
  detail: string;
}

/** @schema notice_degraded */
export interface DegradedNotice {
  type: "notice";
  kind: "degraded";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  reason: string;
  reason_code: "evicted" | "transit" | "no_answer" | "no_replay" | "not_sent" | "overflow";
}

/** @schema notice_reason */
export interface UpDownNotice {
  type: "notice";
  kind: "up" | "down";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  reason: string;
  reason_code: ConnectionCode;
}

/** @schema notice_status */
export interface StatusNotice {
  type: "notice";
  kind: "status";
  id: string;
  offset: number;
  source: string;
  dp_rank: number;
  status: SourceStatus;
}

/** @schema notice_slow_consumer */
export interface SlowConsumerNotice {
  type: "notice";
  kind: "slow_consumer";
  reason: string;
}

export type Notice =
  | RestartNotice
  | UnrecoveredGapNotice
  | StaleNotice
  | DegradedNotice
  | UpDownNotice
  | StatusNotice
  | SlowConsumerNotice;

/** @schema block */
export interface Block {
  hash: Hash;
  refs: number;
  medium: string;
  tier: Tier;
  group_idx: number;
  block_size: number | null;
}

/** @schema state */
export interface State {
  type: "state";
  offset: number;
  source: string;
  dp_rank: number;
  stale: boolean;
  blocks: Block[];
  last: boolean;
  block_sizes?: Record<string, number>;
  /** Last chunk only, on a digest=SECONDS connection: the stream's digest at `offset`, every medium. */
  digest?: string;
}

/** @schema digest */
export interface DigestMessage {
  type: "digest";
  source: string;
  dp_rank: number;
  offset: number;
  digest: string;
  /** Resident keys (distinct (medium, group_idx, hash)) the digest sums. */
  block_count: number;
}

export type Message = Hello | Batch | Notice | State | DigestMessage;

// --- client-state.js --------------------------------------------------------------------------

export const SEQ_FIELDS: readonly string[];
/** JSON.parse of one protocol line with every seq exact, as a decimal string. */
export function parseMessage(line: string): Message;
export function seqText(value: string | number | bigint): Seq;
/** until - first + 1, exact: an `unrecovered_gap`'s `count`. */
export function seqSpan(first: Seq | number, until: Seq | number): bigint;
/** FNV-1a 64 of the UTF-8 bytes of `text`, as [high 32 bits, low 32 bits]. */
export function fnv1a64(text: string): [number, number];
/** The text a block key is hashed as: `medium + "\n" + group_idx + "\n" + hash`. */
export function keyText(medium: string, group: number, hash: Hash): string;
export function hex64(hi: number, lo: number): string;
/** The digest of a set of key texts (sum of their FNV-1a 64 mod 2^64, 16 hex digits). */
export function digestOf(keys: Iterable<string>): string;
export function tierOf(medium: string): Tier;
export function mediumFilter(values: string[] | undefined): (medium: string) => boolean;
export function streamKey(source: string, dpRank: number): string;

export class Digest {
  hi: number;
  lo: number;
  /** How many keys it holds. */
  blocks: number;
  add(key: string): void;
  remove(key: string): void;
  readonly hex: string;
}

export class Stream {
  source: string;
  dp_rank: number;
  stale: boolean;
  /** keyText(medium, group_idx, hash) -> references */
  blocks: Map<string, number>;
  digest: Digest;
  lastSeq: Seq | null;
  clear(): void;
}

export interface DigestCheck {
  source: string;
  dp_rank: number;
  offset: number;
  ok: boolean;
  ours: string;
  theirs: string;
}

export interface Filters {
  source?: string[];
  dp_rank?: number[];
  type?: string[];
  medium?: string[];
  compat?: string[];
}

export class BlockState {
  constructor(options?: { filters?: Filters; blocks?: boolean });
  streams: Map<string, Stream>;
  epoch: string | null;
  offset: number | null;
  lastId: string | null;
  digestChecks: number;
  digestMismatches: number;
  lastMismatch: DigestCheck | null;
  readonly complete: boolean;
  apply(msg: Message, options?: { snapshot?: boolean }): DigestCheck | null;
  /** A stream's resident blocks as [medium, group_idx, hash, refs]. */
  rows(source: string, dpRank: number): [string, number, Hash, number][];
  view(): {
    offset: number | null;
    complete: boolean;
    lastId: string | null;
    streams: { source: string; dp_rank: number; stale: boolean; digest: string; blocks: [string, number, Hash, number][] }[];
  };
}

// --- client.js --------------------------------------------------------------------------------

export const BACKOFF_MS: number[];

export interface ClientOptions {
  /** "blocks" (default): keep every stream's blocks; null: no state messages, no blocks. */
  snapshot?: "blocks" | null;
  source?: string | string[];
  dp_rank?: number | number[];
  type?: string | string[];
  medium?: string | string[];
  compat?: string | string[];
  token?: string;
  /** "auto" (default): WebSocket, then SSE once it failed to open twice while HTTP worked. */
  transport?: "auto" | "ws" | "sse";
  /** Ask for the gateway's state digest every this many seconds (0: none). */
  digest?: number;
  /** A WebSocket class (Node 20 without --experimental-websocket: the `ws` package's, say). */
  WebSocket?: unknown;
  fetch?: typeof fetch;
  helloTimeoutMs?: number;
  backoffMs?: number[];
  wsFailuresBeforeSse?: number;
  wsRetryAfterSseMs?: number;
  slowWindowMs?: number;
  /** Why a WebSocket did not open: "ws" (its own fault), "auth" or "down". */
  diagnose?: () => Promise<"ws" | "auth" | "down">;
}

export interface ClientEvents {
  message: Message;
  hello: Hello;
  state: State;
  batch: Batch;
  notice: Notice;
  digest: DigestMessage;
  complete: BlockState;
  mismatch: DigestCheck;
  connection: { state: "connecting" | "live" | "reconnecting" | "stopped"; note: string; transport: "ws" | "sse" };
  transport: { transport: "ws" | "sse"; why: string };
  auth: null;
  refused: { status: number; error: string };
  error: Error;
}

export class KVGatewayClient {
  constructor(base: string, options?: ClientOptions);
  readonly state: BlockState;
  readonly lastId: string | null;
  readonly digestMismatches: number;
  transport: "ws" | "sse";
  connection: "idle" | "connecting" | "live" | "reconnecting" | "stopped";
  everLive: boolean;
  messages: number;
  reconnects: number;
  on<K extends keyof ClientEvents>(kind: K, fn: (value: ClientEvents[K]) => void): () => void;
  start(): void;
  /** Drops the connection, keeping the state: start() resumes from the last id. */
  stop(): void;
  close(): void;
  reconnect(note: string): void;
  setToken(token: string): void;
}

/** A client for `base`, connected. */
export function connect(base: string, options?: ClientOptions): KVGatewayClient;
