// rhea producer and consumer for the replicas benchmark (bench/replicas_bench.py).
//   node parts_bench.js produce HOST PORT ADDRESS FROM COUNT PARTS USER|- PASS|- [RATE]
//     sends messages FROM .. FROM+COUNT-1 (64-byte data body, application properties part = i % PARTS
//     and i), at most RATE a second if given; prints {"t0": ms, "t1": ms, "accepted": n} once every
//     message is settled.
//   node parts_bench.js consume HOST PORT ADDRESS EXPECT SELECTOR CREDIT USER|- PASS|-
//     prints {"ready": true} once attached, then {"first": ms, "last": ms, "received": n,
//     "distinct": d} once EXPECT distinct messages arrived (each accepted).
'use strict';
const rhea = require('rhea');

const args = process.argv.slice(2);
const mode = args[0];
const host = args[1];
const port = parseInt(args[2], 10);
const address = args[3];
const container = rhea.create_container({ id: 'parts-bench-' + mode + '-' + process.pid });
function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }
function options(user, pass) {
  const o = { host: host, port: port, reconnect: false };
  if (user && user !== '-') { o.username = user; o.password = pass; }
  return o;
}

if (mode === 'produce') {
  const from = parseInt(args[4], 10);
  const count = parseInt(args[5], 10);
  const parts = parseInt(args[6], 10);
  const rate = args[9] ? parseFloat(args[9]) : 0;
  const body = rhea.message.data_section(Buffer.alloc(64, 'x'));
  let sent = 0, settled = 0, t0 = 0, timer = null;
  const conn = container.connect(options(args[7], args[8]));
  const sender = conn.open_sender({ target: { address: address } });
  const send = () => {
    timer = null;
    if (!t0) t0 = Date.now();
    while (sender.sendable() && sent < count) {
      if (rate && sent >= (Date.now() - t0) * rate / 1000) {
        timer = timer || setTimeout(send, 2);
        return;
      }
      const i = from + sent;
      sender.send({ body: body, application_properties: { part: i % parts, i: i } });
      sent += 1;
    }
  };
  container.on('sendable', send);
  container.on('accepted', () => {
    settled += 1;
    if (settled === count) {
      out({ t0: t0, t1: Date.now(), accepted: settled });
      conn.close();
    }
  });
  for (const kind of ['rejected', 'released', 'modified']) {
    container.on(kind, () => { out({ error: kind }); process.exit(1); });
  }
  container.on('connection_close', () => process.exit(0));
} else {
  const expect = parseInt(args[4], 10);
  const selector = args[5];
  const credit = parseInt(args[6], 10);
  const conn = container.connect(options(args[7], args[8]));
  const source = { address: address };
  if (selector !== '-') source.filter = rhea.filter.selector(selector);
  const receiver = conn.open_receiver({ source: source, credit_window: credit, autoaccept: true });
  const seen = new Set();
  let first = 0, last = 0, received = 0, done = false;
  container.on('receiver_open', () => out({ ready: true }));
  container.on('receiver_error', (ctx) => { out({ error: String(ctx.receiver.error) }); process.exit(1); });
  container.on('message', (ctx) => {
    const now = Date.now();
    if (!first) first = now;
    last = now;
    received += 1;
    seen.add(ctx.message.application_properties.i);
    if (!done && seen.size >= expect) {
      done = true;
      out({ first: first, last: last, received: received, distinct: seen.size });
      conn.close();
    }
  });
  container.on('connection_close', () => process.exit(0));
}
