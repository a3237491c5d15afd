// A rhea receiver that drains: credit 5 with drain set on a selector link; prints what it got and
// its credit once the sender answered drained (see tests/proxy/test_drain.py).
const rhea = require('rhea');
const [port, address, selector] = process.argv.slice(2);
const c = rhea.connect({ port: Number(port), host: '127.0.0.1', reconnect: false });
const got = [];
const r = c.open_receiver({ source: { address, filter: rhea.filter.selector(selector) }, credit_window: 0, autoaccept: true });
const timer = setTimeout(() => { console.log(JSON.stringify({ got, timeout: true })); process.exit(1); }, 15000);
r.on('receiver_open', () => { r.drain = true; r.add_credit(5); });
r.on('message', (ctx) => got.push(ctx.message.body));
r.on('receiver_drained', () => {
  clearTimeout(timer);
  console.log(JSON.stringify({ got, credit: r.credit }));
  c.close();
});
