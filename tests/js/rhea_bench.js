// rhea producer and consumer for the engine relay benchmark (bench/engine_relay_bench.py).
//   node rhea_bench.js produce PORT ADDRESS COUNT USER PASS [RATE]
//     sends COUNT messages (64-byte data body, application properties half = i % 2 and i; with RATE
//     also ts, the send time in wall-clock ms with a fraction), at most RATE a second if given (else
//     as fast as credit allows), prints {"t0": ms, "t1": ms, "accepted": n} once every message is settled.
//   node rhea_bench.js consume PORT ADDRESS EXPECT SELECTOR|- LOCAL(0|1) CREDIT USER|- PASS|-
//     prints {"ready": true} once attached, then {"first": ms, "last": ms, "received": n, "selected": m,
//     "p50_ms": x, "p99_ms": y} once EXPECT selected messages arrived (LOCAL=1: the consumer selects
//     half = 1 itself; p50/p99: receive time - ts of the selected messages).
'use strict';
const rhea = require('rhea');

const args = process.argv.slice(2);
const mode = args[0];
const port = parseInt(args[1], 10);
const address = args[2];
const container = rhea.create_container({ id: 'rhea-bench-' + mode });
function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }
// wall-clock ms with a fraction, comparable across processes on one machine
function now() { return performance.timeOrigin + performance.now(); }
function options(user, pass) {
  const o = { host: '127.0.0.1', port: port, reconnect: false };
  if (user && user !== '-') { o.username = user; o.password = pass; }
  return o;
}

if (mode === 'produce') {
  const count = parseInt(args[3], 10);
  const rate = args[6] ? parseFloat(args[6]) : 0;
  const body = rhea.message.data_section(Buffer.alloc(64, 'x'));
  let sent = 0, settled = 0, t0 = 0, timer = null;
  const conn = container.connect(options(args[4], args[5]));
  const sender = conn.open_sender(address);
  const send = () => {
    timer = null;
    if (!t0) t0 = Date.now();
    while (sender.sendable() && sent < count) {
      if (rate && sent >= (Date.now() - t0) * rate / 1000) {
        timer = timer || setTimeout(send, 1);
        return;
      }
      const props = { half: sent % 2, i: sent };
      if (rate) props.ts = now();  // (paced runs measure latency; the others carry two properties)
      sender.send({ body: body, application_properties: props });
      sent += 1;
    }
  };
  sender.on('sendable', () => { if (!timer) send(); });
  const done = () => {
    settled += 1;
    if (settled === count) {
      out({ t0: t0, t1: Date.now(), accepted: settled });
      conn.close();
    }
  };
  sender.on('accepted', done);
  sender.on('rejected', done);
  sender.on('released', done);
  sender.on('modified', done);
  conn.on('connection_close', () => process.exit(0));
  conn.on('disconnected', () => setTimeout(() => process.exit(0), 100));
} else {
  const expect = parseInt(args[3], 10);
  const selector = args[4];
  const local = args[5] === '1';
  const credit = parseInt(args[6], 10);
  const conn = container.connect(options(args[7], args[8]));
  const source = { address: address };
  if (selector !== '-') source.filter = rhea.filter.selector(selector);
  const receiver = conn.open_receiver({ source: source, credit_window: credit });
  let received = 0, selected = 0, first = 0, finished = false;
  const latencies = [];
  receiver.on('receiver_open', () => out({ ready: true }));
  receiver.on('message', (ctx) => {
    if (!first) first = Date.now();
    received += 1;
    const props = ctx.message.application_properties;
    if (!local || props.half === 1) {
      selected += 1;
      if (typeof props.ts === 'number') latencies.push(now() - props.ts);
    }
    if (selected >= expect && !finished) {
      finished = true;
      latencies.sort((a, b) => a - b);
      const at = (q) => latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * q))] : null;
      out({ first: first, last: Date.now(), received: received, selected: selected,
            p50_ms: at(0.5), p99_ms: at(0.99) });
      receiver.detach();
      setTimeout(() => conn.close(), 100);
    }
  });
  receiver.on('receiver_error', () => { out({ error: String(receiver.error && receiver.error.description) }); process.exit(1); });
  conn.on('connection_close', () => process.exit(0));
  conn.on('disconnected', () => setTimeout(() => process.exit(0), 100));
}
