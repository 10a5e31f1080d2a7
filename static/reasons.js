// The gateway's reason codes (docs/protocol.md: notices, /v1/sources) as words for people. The code
// itself is kept in the element's title, for whoever greps the docs or the logs.

const TEXT = {
  stale: {
    history_truncated: "the engine no longer held the start of its history",
    unrecovered: "batches were lost",
    undecodable: "a batch could not be decoded",
  },
  unrecovered_gap: {
    evicted: "gone from the engine's replay buffer",
    transit: "dropped on the way from the engine",
    no_answer: "the replay socket did not answer",
    no_replay: "no replay endpoint",
    not_sent: "never sent by the engine",
    restart: "around an engine restart",
    overflow: "too much arrived during a replay",
  },
  restart: {
    identity: "another engine process",
    seq_reset: "its sequence started again",
    window: "its sequence went back too far",
    reconnect: "its sequence went back after a reconnect",
    cleared: "its sequence went back with a cache clear",
    jump: "its sequence leapt forward",
  },
};
TEXT.down = { not_zeromq: "the endpoint does not speak ZeroMQ: is it the engine's HTTP port?" };
TEXT.degraded = TEXT.unrecovered_gap;

/**
 * A reason code of a notice `kind` (stale, unrecovered_gap, restart, degraded) as words; a code
 * this page does not know loses its underscores (a newer gateway's code still reads as words).
 */
export function reasonText(kind, code) {
  const s = String(code ?? "");
  const known = TEXT[kind];
  return (known && Object.hasOwn(known, s) && known[s]) || s.replaceAll("_", " ");
}

const KINDS = { unrecovered_gap: "batches lost", slow_consumer: "client too slow" };

/** A notice's kind as words (the kind itself stays in data-kind). */
export function kindText(kind) {
  const s = String(kind ?? "");
  return (Object.hasOwn(KINDS, s) && KINDS[s]) || s.replaceAll("_", " ");
}
