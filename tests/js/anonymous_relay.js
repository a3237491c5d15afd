// rhea anonymous relay through `broker-filter serve`.  Usage: node anonymous_relay.js PORT ADDR_A ADDR_B
// Sends on a sender with a null target: one message to each address, one without `to`; prints one
// JSON line per outcome ({"i": n, "outcome": ..., "condition": ...}) and {"offered": [...]}.
'use strict';
const rhea = require('rhea');

const [port, a, b] = process.argv.slice(2);
const container = rhea.create_container({ id: 'rhea-relay-' + process.pid });
function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

const conn = container.connect({ port: Number(port), host: '127.0.0.1', reconnect: false });
conn.on('connection_open', (ctx) => {
  const caps = ctx.connection.remote.open.offered_capabilities;
  out({ offered: caps === undefined ? [] : [].concat(caps).map(String) });
});
const sender = conn.open_sender({ target: {} });
const messages = [{ to: a, body: 'to-a' }, { body: 'no-to' }, { to: b, body: 'to-b' }];
let settled = 0;
function done(i, outcome, error) {
  out({ i, outcome, condition: error ? error.condition : null });
  if (++settled === messages.length) conn.close();
}
sender.on('accepted', (ctx) => done(ctx.delivery.bf_i, 'accepted'));
sender.on('rejected', (ctx) => done(ctx.delivery.bf_i, 'rejected', ctx.delivery.remote_state && ctx.delivery.remote_state.error));
sender.on('released', (ctx) => done(ctx.delivery.bf_i, 'released'));
sender.on('sender_error', (ctx) => { out({ error: String(ctx.sender.error) }); conn.close(); });
sender.once('sendable', () => { messages.forEach((m, i) => { const d = sender.send(m); d.bf_i = i; }); });
setTimeout(() => { out({ timeout: true }); process.exit(1); }, 15000).unref();  // (not what keeps it running)
