// rhea-promise 3 (the promise API Azure's JavaScript SDKs are built on) through `broker-filter serve`,
// as an application uses it.  Usage: node rhea_promise_conformance.js PORT QUEUE_A QUEUE_B QUEUE_C
// Prints one JSON line per scenario (see tests/proxy/test_rhea_promise.py):
//   selector: a receiver with a JMS selector on a queue holding n = 0..5 gets the ones it selects, and
//             the attach reply echoes the filter;
//   drain:    credit 5 with drain on a queue holding n = 0..5, selector `n = 1 OR n = 3 OR n = 5`: what came before
//             the drain was answered, and the credit left;
//   relay:    an awaitable sender with a null target sends to QUEUE_C by `to` (and one message with no
//             `to`); the outcomes, then what a receiver on QUEUE_C gets;
//   request_response: createRequestResponseLink (a null-target sender and a dynamic receiver on one
//             session): the reply's address, and a request answered to it through the relay.
'use strict';
const { Container, filter } = require('rhea-promise');

const [port, queueA, queueB, queueC] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const condition = (e) => (e && (e.condition || (e.innerError && e.innerError.condition))) || String(e);
setTimeout(() => { out({ timeout: true }); process.exit(1); }, 45000);

async function publish(connection, address, count) {
  const sender = await connection.createAwaitableSender({ target: { address } });
  for (let n = 0; n < count; n++) {
    await sender.send({ body: `m${n}`, application_properties: { n } });
  }
  await sender.close();
}

// What `receiver` gets until `quiet` ms pass with nothing new (at most 10 s).
function collect(receiver, quiet) {
  return new Promise((resolve) => {
    const got = [];
    let timer = setTimeout(() => resolve(got), quiet);
    const start = Date.now();
    receiver.on('message', (ctx) => {
      got.push(ctx.message.body);
      clearTimeout(timer);
      timer = setTimeout(() => resolve(got), Math.max(0, Math.min(quiet, 10000 - (Date.now() - start))));
    });
  });
}

async function selector(connection) {
  await publish(connection, queueA, 6);
  const receiver = await connection.createReceiver({
    source: { address: queueA, filter: filter.selector('n >= 3') }, credit_window: 10, autoaccept: true,
  });
  const echoed = Object.keys((receiver._link.remote.attach.source || {}).filter || {});
  const got = await collect(receiver, 1500);
  await receiver.close();
  out({ scenario: 'selector', got, echoed });
}

async function drain(connection) {
  await publish(connection, queueB, 6);
  const receiver = await connection.createReceiver({
    source: { address: queueB, filter: filter.selector('n = 1 OR n = 3 OR n = 5') }, credit_window: 0, autoaccept: true,
  });
  const got = [];
  receiver.on('message', (ctx) => got.push(ctx.message.body));
  const drained = new Promise((resolve) => receiver.on('receiver_drained', resolve));
  receiver.drain = true;
  receiver.addCredit(5);
  await drained;
  out({ scenario: 'drain', got, credit: receiver.credit });
  await receiver.close();
}

async function relay(connection) {
  const sender = await connection.createAwaitableSender({ target: {} });
  const outcomes = [];
  for (const message of [{ to: queueC, body: 'to-c' }, { body: 'no-to' }, { to: queueC, body: 'to-c-2' }]) {
    try {
      await sender.send(message);  // resolves on accepted only
      outcomes.push('accepted');
    } catch (e) {
      outcomes.push(`refused: ${condition(e)}`);
    }
  }
  await sender.close();
  const receiver = await connection.createReceiver({ source: { address: queueC }, credit_window: 10, autoaccept: true });
  const got = await collect(receiver, 1500);
  await receiver.close();
  out({ scenario: 'relay', outcomes, got });
}

async function requestResponse(connection) {
  let link;
  try {
    link = await connection.createRequestResponseLink({ target: {} }, { source: { dynamic: true }, credit_window: 10 });
  } catch (e) {
    out({ scenario: 'request_response', refused: condition(e), description: String(e.description || e.message || '') });
    return;
  }
  const source = link.receiver._link.remote.attach.source;
  if (!source || !source.address) {
    // Refused (the wire contract: a null source, then the detach with the error; rhea's null
    // terminus is an object without an address)
    const error = await new Promise((resolve) => {
      if (link.receiver._link.remote.detach) resolve(link.receiver._link.remote.detach.error);
      link.receiver.on('receiver_error', (ctx) => resolve(ctx.receiver.error));
      link.receiver.on('receiver_close', (ctx) => resolve(ctx.receiver.error));
    });
    out({ scenario: 'request_response', refused: condition(error), description: String(error && error.description) });
    await link.session.close();
    return;
  }
  const address = source.address;
  const got = new Promise((resolve) => link.receiver.on('message', (ctx) => resolve(ctx.message)));
  await link.sender.send({ to: address, body: 'request', reply_to: address, message_id: 'r1' });
  const reply = await got;
  out({ scenario: 'request_response', address, body: reply.body, reply_to: reply.reply_to });
  await link.session.close();
}

(async () => {
  const container = new Container({ id: `rhea-promise-${process.pid}` });
  const connection = await container.connect({ host: '127.0.0.1', port: Number(port), reconnect: false });
  try {
    await selector(connection);
    await drain(connection);
    await relay(connection);
    await requestResponse(connection);
  } catch (e) {
    out({ error: String(e && e.stack || e), condition: condition(e) });
  }
  await connection.close();
  process.exit(0);
})();
