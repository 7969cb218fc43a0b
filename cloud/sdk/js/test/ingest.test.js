// Ingest against the real cloud: idempotency, batches, all-or-nothing
// validation; and the idempotency key ingest makes for itself.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import test from 'node:test';

import { Opgraph, OpgraphApiError } from '../index.js';
import { client, fakeServer, json, unique } from '../support/clouds.js';

test('one event sent twice under one idempotency key is stored once', async () => {
  const opgraph = client();
  const event = unique('idempotent');
  const idempotencyKey = `sdk-js-${randomUUID()}`;
  const envelope = { event, actor: { type: 'robot', id: 'amr-7' }, properties: { dock: 3 } };

  const first = await opgraph.ingest(envelope, { idempotencyKey });
  const second = await opgraph.ingest(envelope, { idempotencyKey });

  assert.equal(first.accepted, 1);
  assert.equal(first.ids.length, 1);
  assert.match(first.ids[0], /^evt_/);
  assert.deepEqual(second.ids, first.ids);
  const stored = await opgraph.events({ event });
  assert.equal(stored.length, 1);
  assert.equal(stored[0].id, first.ids[0]);
  assert.deepEqual(stored[0].actor, { type: 'robot', id: 'amr-7' });
  assert.deepEqual(stored[0].properties, { dock: 3 });
  assert.equal(stored[0].businessId, 'default');
  assert.equal(stored[0].trustTier, 'T0');
});

test('a batch of three is stored whole, every id listed', async () => {
  const opgraph = client();
  const event = unique('batch');

  const result = await opgraph.ingest([1, 2, 3].map((n) => ({ event, properties: { n } })));

  assert.equal(result.accepted, 3);
  assert.equal(result.ids.length, 3);
  assert.equal(new Set(result.ids).size, 3);
  const stored = await opgraph.events({ event });
  assert.deepEqual(stored.map((e) => e.id).sort(), [...result.ids].sort());
  assert.deepEqual(stored.map((e) => e.properties.n).sort(), [1, 2, 3]);
});

test('a batch with one invalid event is refused whole, naming its index', async () => {
  const opgraph = client();
  const event = unique('refused');

  await assert.rejects(
    opgraph.ingest([{ event }, { properties: { missing: 'event' } }, { event }]),
    (error) => {
      assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
      assert.equal(error.status, 400);
      assert.equal(error.code, 'validation_failed');
      assert.equal(error.field, 'batch[1].event');
      assert.equal(typeof error.message, 'string');
      assert.ok(error.message.length > 0);
      assert.equal(error.retryAfter, undefined);
      return true;
    },
  );
  assert.deepEqual(await opgraph.events({ event }), []);
});

test('a Date is sent as milliseconds', async () => {
  const opgraph = client();
  const event = unique('dated');
  const at = new Date(Date.now() - 60_000);

  await opgraph.ingest({ event, timestamp: at });

  const from = new Date(at.getTime() - 1);
  const [stored] = await opgraph.events({ event, from, to: Date.now() + 1 });
  assert.equal(stored.timestamp, at.getTime());
});

test('ingest makes one idempotency key per call and keeps it across retries', async () => {
  // The first request's connection is dropped before any answer: the case
  // a key exists for. The retry must carry the same key.
  const server = await fakeServer((request, response, n) => {
    if (n === 1) request.socket.destroy();
    else json(response, 202, { accepted: 1, ids: [`evt_${n}`] });
  });
  try {
    const opgraph = new Opgraph({ url: server.url, apiKey: 'og_fake', maxRetries: 2 });

    const first = await opgraph.ingest({ event: 'door.opened' });
    await opgraph.ingest({ event: 'door.opened' });

    assert.deepEqual(first, { accepted: 1, ids: ['evt_2'] });
    const keys = server.requests.map((r) => r.headers['idempotency-key']);
    assert.equal(keys.length, 3);
    assert.match(keys[0], /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.equal(keys[1], keys[0], 'the retry carries the first attempt key');
    assert.notEqual(keys[2], keys[0], 'another call has its own key');
    const sent = server.requests[0];
    assert.equal(sent.method, 'POST');
    assert.equal(sent.url, '/api/ingest');
    assert.equal(sent.headers.authorization, 'Bearer og_fake');
    assert.equal(sent.headers['content-type'], 'application/json');
    assert.equal(sent.headers['user-agent'], 'opgraph-js/0.1.0');
    assert.deepEqual(JSON.parse(sent.body), { event: 'door.opened' });
  } finally {
    await server.close();
  }
});

test('an array is sent as a batch, and the caller key as given', async () => {
  const server = await fakeServer((request, response) => {
    json(response, 202, { accepted: 2, ids: ['evt_a', 'evt_b'] });
  });
  try {
    const opgraph = new Opgraph({ url: server.url, apiKey: 'og_fake', workspace: 'ws_north' });

    await opgraph.ingest([{ event: 'a' }, { event: 'b' }], { idempotencyKey: 'mine-1' });

    const [sent] = server.requests;
    assert.deepEqual(JSON.parse(sent.body), { batch: [{ event: 'a' }, { event: 'b' }] });
    assert.equal(sent.headers['idempotency-key'], 'mine-1');
    assert.equal(sent.headers['x-opgraph-workspace-id'], 'ws_north');
  } finally {
    await server.close();
  }
});
