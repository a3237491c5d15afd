// rhea clients for the client-features benchmark (bench/client_features_bench.py): a producer on a
// sender with a target address or on an anonymous-relay sender, and a consumer with a credit window
// or one that pulls with drain.
//   node rhea_features_bench.js produce PORT ADDRESS COUNT named|anonymous
//     sends COUNT messages (64-byte data body, application properties half = i % 2 and i), as fast as
//     credit allows; named: the sender's target is ADDRESS; anonymous: the sender's target is null
//     (`target: {}`) and each message's `to` is ADDRESS.  Prints {"t0": ms, "t1": ms, "accepted": n,
//     "other": m} once every message is settled (other: rejected, released or modified).
//   node rhea_features_bench.js consume PORT ADDRESS COUNT window|drain CREDIT
//     window: a receiver with credit_window CREDIT (rhea tops it up as messages arrive);
//     drain: a receiver with credit_window 0 that pulls: add_credit(CREDIT) with drain set, and once
//     the pull is over the next one, until COUNT messages arrived.  A pull is over on
//     `receiver_drained` (the sender's drained answer, when it had fewer messages than credit) or
//     when its credit is used up by messages (then no answer comes: nothing is left to drain).
//     Messages are accepted.  Prints {"t0": ms, "t1": ms, "received": n, "pulls": p, "drained": d}
//     once COUNT arrived (t0: the receiver attached and its first credit went out; pulls: credit
//     grants made; drained: pulls the drained answer ended), or {"error": ..., and the counts so far}
//     if nothing happens for 10 s.
'use strict';
const rhea = require('rhea');

const [mode, portArg, address, countArg, kind, creditArg] = process.argv.slice(2);
const port = parseInt(portArg, 10);
const count = parseInt(countArg, 10);
const container = rhea.create_container({ id: 'rhea-features-' + mode + '-' + process.pid });
function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }
const conn = container.connect({ host: '127.0.0.1', port: port, reconnect: false });
conn.on('connection_close', () => process.exit(0));
conn.on('disconnected', () => setTimeout(() => process.exit(0), 100));

let progress = Date.now();
let state = () => ({});
const watchdog = setInterval(() => {
  if (Date.now() - progress > 10000) {
    out(Object.assign({ error: 'no progress for 10 s' }, state()));
    process.exit(1);
  }
}, 1000);

if (mode === 'produce') {
  const anonymous = kind === 'anonymous';
  const body = rhea.message.data_section(Buffer.alloc(64, 'x'));
  const sender = conn.open_sender(anonymous ? { target: {} } : address);
  let sent = 0, accepted = 0, other = 0, t0 = 0;
  state = () => ({ sent: sent, accepted: accepted, other: other });
  sender.on('sendable', () => {
    if (!t0) t0 = Date.now();
    while (sender.sendable() && sent < count) {
      const message = { body: body, application_properties: { half: sent % 2, i: sent } };
      if (anonymous) message.to = address;
      sender.send(message);
      sent += 1;
    }
  });
  const settled = (ok) => {
    progress = Date.now();
    if (ok) accepted += 1; else other += 1;
    if (accepted + other === count) {
      clearInterval(watchdog);
      out({ t0: t0, t1: Date.now(), accepted: accepted, other: other });
      conn.close();
    }
  };
  sender.on('accepted', () => settled(true));
  sender.on('rejected', () => settled(false));
  sender.on('released', () => settled(false));
  sender.on('modified', () => settled(false));
  sender.on('sender_error', () => { out({ error: String(sender.error && sender.error.description) }); process.exit(1); });
} else if (mode === 'consume') {
  const credit = parseInt(creditArg, 10);
  const drain = kind === 'drain';
  const receiver = conn.open_receiver({ source: { address: address }, credit_window: drain ? 0 : credit });
  let received = 0, pulls = 0, drained = 0, t0 = 0, finished = false, pulling = false;
  state = () => ({ received: received, pulls: pulls, drained: drained, credit: receiver.credit });
  const pull = () => {
    pulls += 1;
    pulling = true;
    receiver.drain = true;
    receiver.add_credit(Math.min(credit, count - received));
  };
  receiver.on('receiver_open', () => {
    t0 = Date.now();
    if (drain) pull();
  });
  receiver.on('receiver_drained', () => {
    progress = Date.now();
    if (!pulling) return;  // (an answer to a pull its messages already ended)
    pulling = false;
    drained += 1;
    if (!finished && received < count) pull();
  });
  receiver.on('message', () => {
    progress = Date.now();
    received += 1;
    if (drain && pulling && receiver.credit === 0) {
      pulling = false;
      if (received < count) pull();
    }
    if (received >= count && !finished) {
      finished = true;
      clearInterval(watchdog);
      out({ t0: t0, t1: Date.now(), received: received, pulls: pulls, drained: drained });
      receiver.detach();
      setTimeout(() => conn.close(), 100);
    }
  });
  receiver.on('receiver_error', () => { out({ error: String(receiver.error && receiver.error.description) }); process.exit(1); });
} else {
  out({ error: 'unknown mode ' + mode });
  process.exit(2);
}
