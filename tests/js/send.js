// rhea sender for the proxy tests.  Usage: node send.js PORT ADDRESS JSON_MESSAGES
// JSON_MESSAGES: [{"body": ..., "subject": ..., "application_properties": {...}}, ...]
// Prints {"accepted": n, "other": [...]} once every message is settled.
'use strict';
const rhea = require('rhea');

const [port, address, messagesText] = process.argv.slice(2);
const messages = JSON.parse(messagesText);
const container = rhea.create_container({ id: 'rhea-sender' });
let sent = 0, accepted = 0;
const other = [];

container.on('sendable', (ctx) => {
  while (ctx.sender.sendable() && sent < messages.length) {
    ctx.sender.send(messages[sent++]);
  }
});
function settled(ctx, kind) {
  if (kind === 'accepted') accepted += 1; else other.push(kind);
  if (accepted + other.length === messages.length) {
    process.stdout.write(JSON.stringify({ accepted: accepted, other: other }) + '\n');
    ctx.connection.close();
  }
}
container.on('accepted', (ctx) => settled(ctx, 'accepted'));
container.on('rejected', (ctx) => settled(ctx, 'rejected'));
container.on('released', (ctx) => settled(ctx, 'released'));
container.on('modified', (ctx) => settled(ctx, 'modified'));
container.on('connection_close', () => process.exit(0));
container.on('sender_error', (ctx) => { process.stdout.write(JSON.stringify({ error: String(ctx.sender.error) }) + '\n'); process.exit(1); });
container.on('disconnected', () => process.exit(accepted === messages.length ? 0 : 1));

container.connect({ host: '127.0.0.1', port: parseInt(port, 10), reconnect: false }).open_sender(address);
setTimeout(() => process.exit(2), 20000);
