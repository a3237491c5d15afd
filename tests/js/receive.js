// rhea receiver for the proxy tests.  Usage:
//   node receive.js PORT ADDRESS SELECTOR|- COUNT TIMEOUT_MS
// SELECTOR may also be props:{JSON} or app:{JSON} for the OASIS property filters, or sql:TEXT for the
// OASIS SQL filter (symbolic descriptor amqp:sql-filter, under the key "sql").
// Prints one JSON object per line: {"attached": {...}} or {"detached": {...}}, then {"message": {...}}
// per message (accepted), then {"done": n}.  Exits 0 once COUNT messages arrived or TIMEOUT_MS passed.
// RHEA_USER and RHEA_PASSWORD in the environment: a PLAIN login.
'use strict';
const rhea = require('rhea');

const [port, address, selector, countText, timeoutText] = process.argv.slice(2);
const count = parseInt(countText, 10);
const container = rhea.create_container({ id: 'rhea-test' });
let received = 0;
let finished = false;

function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

function finish(conn) {
  if (finished) return;
  finished = true;
  out({ done: received });
  conn.close();
  setTimeout(() => process.exit(0), 200);
}

const source = { address: address };
if (selector.startsWith('props:')) {
  // OASIS properties filter (symbolic descriptor, symbol keys) from a JSON object of string values
  const props = JSON.parse(selector.slice(6));
  source.filter = { props: rhea.types.wrap_described(rhea.types.wrap_map(props, rhea.types.wrap_symbol), 'amqp:properties-filter') };
} else if (selector.startsWith('app:')) {
  // OASIS application-properties filter (numeric descriptor 0x174)
  source.filter = { app: rhea.types.wrap_described(rhea.types.wrap_map(JSON.parse(selector.slice(4))), 0x174) };
} else if (selector.startsWith('sql:')) {
  source.filter = { sql: rhea.types.wrap_described(rhea.types.wrap_string(selector.slice(4)), 'amqp:sql-filter') };
} else if (selector !== '-') {
  source.filter = rhea.filter.selector(selector);
}

container.on('receiver_open', (ctx) => {
  const src = ctx.receiver.remote.attach.source;
  const filter = src && src.filter ? Object.keys(src.filter) : [];
  const value = src && src.filter && src.filter['jms-selector'] ? src.filter['jms-selector'].value : null;
  let caps = src && src.capabilities ? src.capabilities : [];
  if (!Array.isArray(caps)) caps = [caps];
  out({ attached: { address: src ? src.address : null, filter_keys: filter, selector: value, capabilities: caps } });
  if (count === 0) finish(ctx.connection);
});
container.on('receiver_error', (ctx) => {
  const e = ctx.receiver.error || {};
  const src = ctx.receiver.remote.attach ? ctx.receiver.remote.attach.source : undefined;
  out({ detached: { condition: e.condition, description: e.description, info: e.info || null, source_null: !src } });
  finish(ctx.connection);
});
container.on('message', (ctx) => {
  received += 1;
  const m = ctx.message;
  out({ message: { body: m.body, subject: m.subject || null, properties: m.application_properties || null } });
  if (received >= count) finish(ctx.connection);
});
container.on('disconnected', (ctx) => { if (!finished) { out({ disconnected: String(ctx.error || '') }); finish(ctx.connection); } });

const options = { host: '127.0.0.1', port: parseInt(port, 10), reconnect: false };
if (process.env.RHEA_USER) {  // a PLAIN login (the authorization tests)
  options.username = process.env.RHEA_USER;
  options.password = process.env.RHEA_PASSWORD;
}
const conn = container.connect(options);
conn.open_receiver({ source: source, credit_window: 100, autoaccept: true });
setTimeout(() => finish(conn), parseInt(timeoutText, 10));
