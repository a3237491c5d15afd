// Request/reply with rhea through `broker-filter serve`.  Usage: node request_reply.js PORT REQUEST_QUEUE
// A requester (a connection of its own) attaches a receiver with a dynamic source and sends one request,
// `reply_to` the address named in the attach reply, to REQUEST_QUEUE; a responder (another connection)
// consumes the request and answers it twice: with a sender attached to `reply_to`, and with an
// anonymous-relay sender (null target) and `to` set to it.  Prints one JSON line: the reply address,
// the replies' bodies and correlation ids as the requester got them, and the responder's outcomes.
'use strict';
const rhea = require('rhea');

const [port, requestQueue] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
setTimeout(() => { out({ timeout: true }); process.exit(1); }, 25000);

const requester = rhea.create_container({ id: `requester-${process.pid}` })
  .connect({ host: '127.0.0.1', port: Number(port), reconnect: false });
const responder = rhea.create_container({ id: `responder-${process.pid}` })
  .connect({ host: '127.0.0.1', port: Number(port), reconnect: false });

const result = { address: null, replies: [], outcomes: [] };
const done = () => {
  if (result.replies.length === 2 && result.outcomes.length === 2) {
    out(result);
    requester.close();
    responder.close();
    setTimeout(() => process.exit(0), 100);
  }
};
const failed = (what) => (context) => {
  const e = (context.receiver || context.sender || context.connection || {}).error || context.error;
  out({ error: what, condition: e && e.condition, description: e && e.description });
  process.exit(1);
};

const replies = requester.open_receiver({ source: { dynamic: true }, credit_window: 10, autoaccept: true });
replies.on('receiver_error', failed('reply receiver'));
replies.on('receiver_open', (context) => {
  result.address = context.receiver.source.address;
  const requests = requester.open_sender(requestQueue);
  requests.once('sendable', (c) => c.sender.send({ body: 'ping', reply_to: result.address, message_id: 'q1' }));
});
replies.on('message', (context) => {
  result.replies.push({ body: context.message.body, correlation_id: context.message.correlation_id });
  done();
});

responder.open_receiver({ source: { address: requestQueue }, credit_window: 1, autoaccept: true })
  .on('message', (context) => {
    const request = context.message;
    const named = responder.open_sender(request.reply_to);
    named.on('sender_error', failed('named reply sender'));
    named.once('sendable', (c) => c.sender.send({ body: 'pong 1', correlation_id: request.message_id }));
    named.on('accepted', () => { result.outcomes.push('named: accepted'); done(); });
    named.on('rejected', (c) => { result.outcomes.push(`named: rejected ${c.delivery.remote_state.error.condition}`); done(); });
    const anonymous = responder.open_sender({ target: {} });
    anonymous.once('sendable', (c) => c.sender.send({ to: request.reply_to, body: 'pong 2',
                                                      correlation_id: request.message_id }));
    anonymous.on('accepted', () => { result.outcomes.push('anonymous: accepted'); done(); });
    anonymous.on('rejected', (c) => { result.outcomes.push(`anonymous: rejected ${c.delivery.remote_state.error.condition}`); done(); });
  });
