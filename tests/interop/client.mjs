// An independent JetStream client (nats.js v3) for tests/test_interop_js.py.
// Usage: node client.mjs '<json command>'; prints one JSON result line. Bytes travel as base64.
import { connect, headers } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";

const cmd = JSON.parse(process.argv[2]);
const b64 = (s) => new Uint8Array(Buffer.from(s || "", "base64"));
const text = (s) => new TextEncoder().encode(s);

function hdrs(pairs) {
  if (!pairs || pairs.length === 0) return undefined;
  const h = headers();
  for (const [k, v] of pairs) h.append(k, v); // a repeated name is sent as repeated lines
  return h;
}

function allHeaders(h) {
  const out = {};
  if (h) for (const k of h.keys()) out[k] = h.values(k);
  return out;
}

// The ledger key format of docs/contracts.md, written from its description.
function ledgerToken(value) {
  let out = "";
  for (const ch of value) {
    if (/^[A-Za-z0-9_-]$/.test(ch)) out += ch;
    else for (const b of new TextEncoder().encode(ch)) out += "=" + b.toString(16).toUpperCase().padStart(2, "0");
  }
  return out;
}

// CRC-32 (IEEE 802.3: reflected polynomial 0xEDB88320, initial value and final xor 0xFFFFFFFF), as
// docs/contracts.md names it for the counts shard of a batch.
function crc32(bytes) {
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc ^= b;
    for (let i = 0; i < 8; i++) crc = (crc >>> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return (crc ^ 0xffffffff) >>> 0;
}

const countsKey = (runId, batchId) =>
  `${ledgerToken(runId)}./counts.${crc32(new TextEncoder().encode(batchId)) % 16}`;

// A run's counts shard after one of its batches went from `old` (null: just recorded) to `rec`
// (docs/contracts.md, "Counts"): a snapshot of the shard's batches.
function counted(counts, runId, shard, old, rec, now) {
  const c = counts ? structuredClone(counts) : { run_id: runId, shard, batches: 0,
    states: { published: 0, in_progress: 0, consumed: 0, failed: 0 },
    messages: { published: 0, in_progress: 0, consumed: 0, failed: 0 },
    attempts: 0, claims: 0, streams: [], failed: [], next_deadline: null, updated_at: now };
  if (old === null) c.batches += 1;
  else { c.states[old.state] -= 1; c.messages[old.state] -= old.count; }
  c.states[rec.state] = (c.states[rec.state] || 0) + 1;
  c.messages[rec.state] = (c.messages[rec.state] || 0) + rec.count;
  c.attempts += (rec.attempts || 0) - (old ? old.attempts || 0 : 0);
  if (rec.state === "in_progress" && (old === null || old.claim_id !== rec.claim_id)) c.claims += 1;
  if (!c.streams.includes(rec.stream)) c.streams = [...c.streams, rec.stream].sort();
  if (rec.state === "in_progress" && rec.deadline &&
      (!c.next_deadline || Date.parse(rec.deadline) < Date.parse(c.next_deadline))) c.next_deadline = rec.deadline;
  if (!c.states.in_progress) c.next_deadline = null;
  c.failed = c.failed.filter((f) => f.batch_id !== rec.batch_id);
  if (rec.state === "failed" && c.failed.length < 10) {
    c.failed.push({ batch_id: rec.batch_id, stream: rec.stream, first_seq: rec.first_seq ?? null,
      last_seq: rec.last_seq ?? null, count: rec.count, attempts: rec.attempts || 0,
      last_error: rec.last_error ? rec.last_error.slice(0, 200) : rec.last_error ?? null });
  }
  c.updated_at = now;
  return c;
}

if (cmd.op === "ledger_key") {
  console.log(JSON.stringify(`${ledgerToken(cmd.run_id)}.${ledgerToken(cmd.batch_id)}`));
  process.exit(0);
}
if (cmd.op === "ledger_counts_key") {
  console.log(JSON.stringify(countsKey(cmd.run_id, cmd.batch_id)));
  process.exit(0);
}

const nc = await connect({ servers: cmd.servers, timeout: 5000 });
try {
  const js = jetstream(nc);
  let result;
  switch (cmd.op) {
    case "atomic_batch": {
      // [{subject, data_b64 | json, headers: [[k, v], ...]}]; the msg id only on the first message
      const msgs = cmd.messages.map((m) => ({ ...m, data: m.json !== undefined ? text(JSON.stringify(m.json)) : b64(m.data_b64) }));
      const [first, ...rest] = msgs;
      const last = rest.length ? rest.pop() : null;
      const opts = { headers: hdrs(first.headers) };
      if (cmd.msg_id) opts.msgID = cmd.msg_id;
      const batch = await js.startBatch(first.subject, first.data, opts);
      for (const m of rest) batch.add(m.subject, m.data, { headers: hdrs(m.headers) });
      const ack = last ? await batch.commit(last.subject, last.data, { headers: hdrs(last.headers) })
        : await batch.commit(first.subject, undefined);
      result = { stream: ack.stream, seq: ack.seq, batch: ack.batch, count: ack.count };
      break;
    }
    case "publish": {
      const ack = await js.publish(cmd.subject, cmd.json !== undefined ? text(JSON.stringify(cmd.json)) : b64(cmd.data_b64),
        { headers: hdrs(cmd.headers), ...(cmd.msg_id ? { msgID: cmd.msg_id } : {}) });
      result = { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate };
      break;
    }
    case "get": {
      const jsm = await jetstreamManager(nc);
      result = [];
      for (let seq = cmd.first; seq <= cmd.last; seq++) {
        const sm = await jsm.streams.getMessage(cmd.stream, { seq });
        result.push({ seq: sm.seq, subject: sm.subject, data_b64: Buffer.from(sm.data).toString("base64"),
          headers: allHeaders(sm.header) });
      }
      break;
    }
    case "kv_get": {
      const kv = await new Kvm(nc).open(cmd.bucket);
      const e = await kv.get(cmd.key);
      result = e ? { value: e.json(), revision: e.revision } : null;
      break;
    }
    case "kv_update": {
      const kv = await new Kvm(nc).open(cmd.bucket);
      result = { revision: await kv.update(cmd.key, JSON.stringify(cmd.value), cmd.revision) };
      break;
    }
    case "kv_create": {
      const kv = await new Kvm(nc).open(cmd.bucket);
      result = { revision: await kv.create(cmd.key, JSON.stringify(cmd.value)) };
      break;
    }
    case "ledger_write": {
      // one record change of docs/contracts.md: the record and its counts shard in one atomic batch, each
      // compare-and-set on the revision it was read at (0: must not exist)
      const kv = await new Kvm(nc).open(cmd.bucket);
      const key = `${ledgerToken(cmd.value.run_id)}.${ledgerToken(cmd.value.batch_id)}`;
      const ckey = countsKey(cmd.value.run_id, cmd.value.batch_id);
      const [entry, centry] = [await kv.get(key), await kv.get(ckey)];
      const old = entry && entry.operation === "PUT" ? entry.json() : null;
      const counts = centry && centry.operation === "PUT" ? centry.json() : null;
      const shard = Number(ckey.split(".").pop());
      const next = counted(counts, cmd.value.run_id, shard, old, cmd.value, new Date().toISOString());
      const expect = (e) => ({ headers: hdrs([["Nats-Expected-Last-Subject-Sequence", String(e ? e.revision : 0)]]) });
      const batch = await js.startBatch(`$KV.${cmd.bucket}.${key}`, text(JSON.stringify(cmd.value)), expect(entry));
      const ack = await batch.commit(`$KV.${cmd.bucket}.${ckey}`, text(JSON.stringify(next)), expect(centry));
      result = { seq: ack.seq, count: ack.count };
      break;
    }
    default:
      throw new Error(`unknown op ${cmd.op}`);
  }
  console.log(JSON.stringify(result));
} finally {
  await nc.close();
}
