// rhea against `broker-filter serve` with the embedded broker.  Usage:
//   node embedded_scenarios.js PORT PREFIX
// Runs each scenario in turn and prints one JSON line per scenario: {"scenario": name, ...results}.
'use strict';
const rhea = require('rhea');

const [port, prefix] = process.argv.slice(2);
const container = rhea.create_container({ id: 'rhea-embedded-' + prefix });

function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

function opened(link) {
  return new Promise((resolve, reject) => {
    link.once(link.is_receiver() ? 'receiver_open' : 'sendable', () => resolve(link));
    link.once(link.is_receiver() ? 'receiver_error' : 'sender_error', (ctx) => reject(new Error(String(ctx.receiver ? ctx.receiver.error : ctx.sender.error))));
  });
}

function collect(receiver, count, timeoutMs) {
  return new Promise((resolve) => {
    const got = [];
    const timer = setTimeout(() => resolve(got), timeoutMs);
    receiver.on('message', (ctx) => {
      got.push(ctx.message.body);
      if (got.length === count) { clearTimeout(timer); setTimeout(() => resolve(got), 300); }
    });
  });
}

function sendAll(conn, address, messages) {
  return new Promise((resolve) => {
    const sender = conn.open_sender({ target: { address } });
    let settled = 0;
    const outcomes = [];
    sender.on('accepted', () => { outcomes.push('accepted'); if (++settled === messages.length) { sender.close(); resolve(outcomes); } });
    sender.on('rejected', (ctx) => { outcomes.push('rejected:' + (ctx.delivery.remote_state && ctx.delivery.remote_state.error ? ctx.delivery.remote_state.error.condition : '')); if (++settled === messages.length) { sender.close(); resolve(outcomes); } });
    sender.once('sendable', () => { for (const m of messages) sender.send(m); });
  });
}

function receiverOn(conn, address, opts = {}) {
  const source = { address };
  if (opts.capabilities) source.capabilities = opts.capabilities;
  if (opts.selector) source.filter = rhea.filter.selector(opts.selector);
  return conn.open_receiver({ source, credit_window: opts.credit || 0, autoaccept: true, name: opts.name });
}

async function main() {
  const conn = container.connect({ host: '127.0.0.1', port: parseInt(port, 10) });
  await new Promise((resolve) => conn.once('connection_open', resolve));

  // topic: every subscriber gets a copy
  {
    const a = await opened(receiverOn(conn, `${prefix}.t`, { capabilities: ['topic'] }));
    const b = await opened(receiverOn(conn, `multicast://${prefix}.t`));
    a.add_credit(10); b.add_credit(10);
    const ga = collect(a, 2, 4000), gb = collect(b, 2, 4000);
    await sendAll(conn, `multicast://${prefix}.t`, [{ body: 't1' }, { body: 't2' }]);
    out({ scenario: 'topic', a: await ga, b: await gb });
  }
  // wildcards
  {
    const all = await opened(receiverOn(conn, `multicast://${prefix}.news.#`));
    const sport = await opened(receiverOn(conn, `multicast://${prefix}.news.*.sport`));
    all.add_credit(10); sport.add_credit(10);
    const gAll = collect(all, 3, 4000), gSport = collect(sport, 1, 4000);
    await sendAll(conn, `multicast://${prefix}.news.uk`, [{ body: 'uk' }]);
    await sendAll(conn, `multicast://${prefix}.news.uk.sport`, [{ body: 'uk.sport' }]);
    await sendAll(conn, `multicast://${prefix}.news`, [{ body: 'news' }]);
    out({ scenario: 'wildcards', all: await gAll, sport: await gSport });
  }
  // queue selector: the oldest matches, the rest stays
  {
    const colors = ['blue', 'red', 'green', 'red', 'blue', 'red'];
    await sendAll(conn, `${prefix}.q`, colors.map((c, i) => ({ body: i, application_properties: { color: c } })));
    const red = await opened(receiverOn(conn, `${prefix}.q`, { selector: "color = 'red'" }));
    const echo = red.remote.attach.source.filter;
    const gRed = collect(red, 3, 4000);
    red.add_credit(10);
    const redGot = await gRed;
    const rest = await opened(receiverOn(conn, `${prefix}.q`));
    const gRest = collect(rest, 3, 4000);
    rest.add_credit(10);
    out({ scenario: 'selector', red: redGot, rest: await gRest, echo: echo ? Object.keys(echo) : [] });
  }
  // competing consumers on one queue
  {
    const a = await opened(receiverOn(conn, `${prefix}.cc`));
    const b = await opened(receiverOn(conn, `${prefix}.cc`));
    const ga = collect(a, 2, 3000), gb = collect(b, 2, 3000);
    a.add_credit(2); b.add_credit(2);
    await sendAll(conn, `${prefix}.cc`, [0, 1, 2, 3].map((i) => ({ body: i })));
    out({ scenario: 'competing', a: await ga, b: await gb });
  }
  // fully qualified queue name
  {
    await sendAll(conn, `${prefix}.fq::one`, [{ body: 'to-one' }]);
    await sendAll(conn, `${prefix}.fq::two`, [{ body: 'to-two' }]);
    const two = await opened(receiverOn(conn, `${prefix}.fq::two`));
    const g = collect(two, 1, 3000);
    two.add_credit(5);
    out({ scenario: 'fqqn', two: await g });
  }
  conn.close();
  setTimeout(() => process.exit(0), 100);
}

main().catch((e) => { out({ error: String(e && e.stack || e) }); process.exit(1); });
