// Many rhea connections at once, for the engine's scale tests.  Usage:
//   node many_connections.js PORT COUNT [PREFIX] [LINKS] [SELECTOR]
// Opens COUNT connections (AMQP without SASL), each with a session, a receiver on "<PREFIX><i % 10>"
// (PREFIX "scale-" unless given; "-": no session and no receiver, the connection only) and credit 1;
// with LINKS, that many receivers per connection, each with the JMS selector SELECTOR if given, in
// which "{k}" stands for the receiver's number on its connection; then {"attached": n} is printed once
// every receiver's attach was answered (after the "opened" line).  Prints {"opened": n, "failed": m, "errors": {...}} once every connection opened or
// failed, then {"alive": n} for each line read on stdin, and closes everything when stdin ends,
// printing {"closed": n}.
'use strict';
const rhea = require('rhea');
const readline = require('readline');

const [port, countText, prefixArg, linksText, selectorArg] = process.argv.slice(2);
const links = linksText === undefined ? 1 : parseInt(linksText, 10);
const prefix = prefixArg === undefined ? 'scale-' : prefixArg;
const count = parseInt(countText, 10);
const container = rhea.create_container({ id: 'rhea-many' });
const connections = [];
let opened = 0;
let failed = 0;
let reported = false;
let attached = 0;
function linkAttached() {
  attached += 1;
  if (attached === count * links) out({ attached: attached });
}
const errors = {};

function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

function maybeReport() {
  if (!reported && opened + failed >= count) {
    reported = true;
    out({ opened: opened, failed: failed, errors: errors });
  }
}

function openOne(i) {
  const conn = container.connect({
    host: '127.0.0.1', port: parseInt(port, 10), reconnect: false,
    idle_time_out: 0,
  });
  conn.phase = 'opening';
  conn.on('connection_open', () => {
    conn.phase = 'open';
    opened += 1;
    if (prefix !== '-') {
      for (let k = 0; k < links; k++) {
        const source = { address: prefix + (i % 10) };
        if (selectorArg) source.filter = rhea.filter.selector(selectorArg.split('{k}').join(String(k)));
        const receiver = conn.open_receiver({ source: source, credit_window: 1 });
        if (linksText !== undefined) receiver.once('receiver_open', linkAttached);
      }
    }
    maybeReport();
  });
  const fail = (why) => {
    if (conn.phase === 'opening') {
      conn.phase = 'failed';
      failed += 1;
      errors[why] = (errors[why] || 0) + 1;
      maybeReport();
    } else if (conn.phase === 'open') {
      conn.phase = 'lost';
    }
  };
  conn.on('disconnected', (ctx) => fail(ctx.error ? String(ctx.error.code || ctx.error.message || ctx.error) : 'closed'));
  conn.on('connection_error', () => fail('connection_error'));
  connections.push(conn);
}

let next = 0;
function batch() {
  for (let k = 0; k < 200 && next < count; k++) openOne(next++);
  if (next < count) setTimeout(batch, 20);
}
batch();

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', () => out({ alive: connections.filter((c) => c.phase === 'open').length }));
rl.on('close', () => {
  let closed = 0;
  for (const c of connections) {
    if (c.phase === 'open') { c.close(); closed += 1; }
  }
  out({ closed: closed });
  setTimeout(() => process.exit(0), 1000);
});
