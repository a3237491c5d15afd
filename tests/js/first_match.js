// rhea receiver that times a drain or a search.  Usage:
//   node first_match.js PORT ADDRESS SELECTOR|- COUNT CREDIT TIMEOUT_MS [USER PASSWORD]
// Accepts messages until COUNT arrived (or TIMEOUT_MS passed) and prints one JSON line:
// {"received": n, "first_ms": ms to the first message, "last_ms": ms to the COUNT-th, "bodies": [first 5]}
// with times counted from the connect.
'use strict';
const rhea = require('rhea');

const [port, address, selector, countText, creditText, timeoutText, user, password] = process.argv.slice(2);
const count = parseInt(countText, 10);
const container = rhea.create_container({ id: 'rhea-timer' });
const t0 = process.hrtime.bigint();
const ms = () => Number(process.hrtime.bigint() - t0) / 1e6;
let received = 0, first = null, last = null, finished = false;
const bodies = [];

function finish(conn) {
  if (finished) return;
  finished = true;
  process.stdout.write(JSON.stringify({ received, first_ms: first, last_ms: last, bodies }) + '\n');
  conn.close();
  setTimeout(() => process.exit(0), 200);
}

const source = { address };
if (selector !== '-') source.filter = rhea.filter.selector(selector);
const options = { host: '127.0.0.1', port: parseInt(port, 10), reconnect: false };
if (user) { options.username = user; options.password = password; }
const conn = container.connect(options);
container.on('message', (ctx) => {
  received += 1;
  if (first === null) first = ms();
  if (bodies.length < 5) bodies.push(ctx.message.body);
  if (received >= count) { last = ms(); finish(ctx.connection); }
});
container.on('disconnected', () => finish(conn));
conn.open_receiver({ source, credit_window: parseInt(creditText, 10), autoaccept: true });
setTimeout(() => finish(conn), parseInt(timeoutText, 10));
