// kvgateway-client.mjs: a small kvgateway client for Node.js, with no packages.
//
//   node kvgateway-client.mjs http://127.0.0.1:8080 [batches] [ws|sse|both]
//
// Node 22+ has a global WebSocket; Node 20 and 21 need `node --experimental-websocket`.
// Set KVGATEWAY_TOKEN when the gateway requires a token.
//
// Reads the hello and then `batches` batch messages (default 5) over WebSocket and over
// Server-Sent Events, and prints a JSON summary. Block hashes and engine seqs arrive as strings:
// vLLM's unsigned 64-bit hashes and TensorRT-LLM's seqs (time_ns) exceed 2^53, beyond which
// JavaScript numbers round, so keep them as strings (or BigInt) and never convert them with Number().

import http from "node:http";
import https from "node:https";

const [base = "http://127.0.0.1:8080", count = "5", which = "both"] = process.argv.slice(2);
const wanted = Number(count);
const token = process.env.KVGATEWAY_TOKEN ?? "";
const SAFE_LIMIT = 2n ** 53n;

function newSummary(transport) {
  return { transport, hello: null, batches: [], notices: 0, gaps: [], hash_types: [], above_2_53: 0, lossy_as_number: 0 };
}

// Handles one message; true once the hello and `wanted` batches are in.
function onMessage(summary, line) {
  const msg = JSON.parse(line);
  if (msg.type === "hello") {
    summary.hello = { epoch: msg.epoch, offset: msg.offset, recovered: msg.recovered };
    summary.hello.occupancy_offset = msg.occupancy === null ? null : msg.occupancy.offset;
  } else if (msg.type === "batch") {
    const hashes = msg.events.map((event) => event.block_hashes ?? null);
    for (const hash of hashes.flat().filter((h) => h !== null)) {
      if (!summary.hash_types.includes(typeof hash)) summary.hash_types.push(typeof hash);
      if (BigInt(hash) > SAFE_LIMIT) summary.above_2_53 += 1;
      if (BigInt(Number(hash)) !== BigInt(hash)) summary.lossy_as_number += 1; // what Number() would do
    }
    summary.batches.push({ id: msg.id, offset: msg.offset, source: msg.source, dp_rank: msg.dp_rank, seq: msg.seq, block_hashes: hashes });
  } else {
    summary.notices += 1; // restart, unrecovered_gap, ...: a real client acts on them (docs/protocol.md)
    if (msg.kind === "unrecovered_gap") {
      // seqs are strings: BigInt arithmetic is exact, Number() arithmetic is not beyond 2^53
      const exact = BigInt(msg.until) - BigInt(msg.first) + 1n === BigInt(msg.count);
      const asNumbers = Number(msg.until) - Number(msg.first) + 1 === msg.count;
      summary.gaps.push({ first: msg.first, until: msg.until, count: msg.count, exact, as_numbers: asNumbers });
    }
  }
  return summary.hello !== null && summary.batches.length >= wanted;
}

function viaWebSocket() {
  return new Promise((resolve, reject) => {
    if (typeof WebSocket === "undefined") {
      reject(new Error("no global WebSocket: use Node 22+, or node --experimental-websocket"));
      return;
    }
    const url = new URL("/v1/ws", base);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (token) url.searchParams.set("token", token); // browsers cannot set headers on a WebSocket
    const summary = newSummary("ws");
    const ws = new WebSocket(url);
    ws.onmessage = (event) => {
      // One text frame holds one or more messages, separated by "\n".
      for (const line of String(event.data).split("\n")) {
        if (onMessage(summary, line)) {
          ws.close(1000);
          resolve(summary);
          return;
        }
      }
    };
    ws.onerror = () => reject(new Error("websocket: connection failed or refused (401, 403, 400?)"));
    ws.onclose = (event) => reject(new Error(`websocket: closed early (${event.code} ${event.reason})`));
  });
}

function viaSSE() {
  return new Promise((resolve, reject) => {
    const url = new URL("/v1/events", base);
    const headers = { Accept: "text/event-stream" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const summary = newSummary("sse");
    const request = (url.protocol === "https:" ? https : http).get(url, { headers }, (response) => {
      response.setEncoding("utf8");
      if (response.statusCode !== 200) {
        let body = "";
        response.on("data", (chunk) => (body += chunk));
        response.on("end", () => reject(new Error(`sse: HTTP ${response.statusCode} ${body}`)));
        return;
      }
      let buffer = "";
      let data = null;
      response.on("data", (chunk) => {
        buffer += chunk;
        let end;
        while ((end = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, end).replace(/\r$/, "");
          buffer = buffer.slice(end + 1);
          if (line === "") {
            // A blank line ends an event; the JSON in data: has the id and type too.
            if (data !== null && onMessage(summary, data)) {
              request.destroy();
              resolve(summary);
              return;
            }
            data = null;
          } else if (line.startsWith("data:")) {
            data = line.slice(line.startsWith("data: ") ? 6 : 5);
          } // id:, event:, retry: and ": ping" comments need nothing more here
        }
      });
      response.on("end", () => reject(new Error("sse: the stream ended early")));
    });
    request.on("error", reject);
  });
}

const timer = setTimeout(() => {
  console.error("kvgateway-client: timed out");
  process.exit(2);
}, 30_000);
timer.unref();

const runs = { ws: [viaWebSocket], sse: [viaSSE], both: [viaWebSocket, viaSSE] }[which];
if (runs === undefined || !Number.isInteger(wanted) || wanted < 0) {
  console.error("usage: node kvgateway-client.mjs URL [batches] [ws|sse|both]");
  process.exit(2);
}
try {
  const summaries = await Promise.all(runs.map((run) => run()));
  console.log(JSON.stringify(Object.fromEntries(summaries.map((s) => [s.transport, s]))));
} catch (error) {
  console.error(`kvgateway-client: ${error.message}`);
  process.exit(1); // the other connection may still be open
}
