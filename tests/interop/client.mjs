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

if (cmd.op === "ledger_key") {
  console.log(JSON.stringify(`${ledgerToken(cmd.run_id)}.${ledgerToken(cmd.batch_id)}`));
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
    default:
      throw new Error(`unknown op ${cmd.op}`);
  }
  console.log(JSON.stringify(result));
} finally {
  await nc.close();
}
