// Against the cloud limited to one request per second (burst 1): a real 429
// with its Retry-After, and the retries that wait it out. The tests of this
// file run one after the other, so they share the bucket predictably.

import assert from 'node:assert/strict';
import test from 'node:test';

import { OpgraphApiError } from '../index.js';
import { limitedClient, unique } from '../support/clouds.js';

test('without retries a burst meets 429 with Retry-After', async () => {
  const opgraph = limitedClient({ maxRetries: 0 });

  const outcomes = await Promise.allSettled([1, 2, 3, 4].map(() => opgraph.events({ limit: 1 })));

  const refused = outcomes.filter((o) => o.status === 'rejected').map((o) => o.reason);
  assert.ok(refused.length >= 3, `only ${refused.length} of 4 refused`);
  for (const error of refused) {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.status, 429);
    assert.equal(error.code, 'rate_limited');
    assert.ok(Number.isInteger(error.retryAfter) && error.retryAfter >= 1, `${error.retryAfter}`);
  }
});

test('with retries the same burst all succeeds, each event stored once', async () => {
  // Each 429 costs one retry; three calls with at most one token a second
  // need up to three, and the previous test may have emptied the bucket.
  const opgraph = limitedClient({ maxRetries: 5 });
  const event = unique('limited');

  const results = await Promise.all(
    [1, 2, 3].map((n) => opgraph.ingest({ event, properties: { n } })),
  );

  assert.ok(results.every((r) => r.accepted === 1));
  const stored = await opgraph.events({ event });
  assert.deepEqual(stored.map((e) => e.properties.n).sort(), [1, 2, 3]);
  assert.deepEqual(stored.map((e) => e.id).sort(), results.map((r) => r.ids[0]).sort());
});

test('with retries a burst of POSTs without a key waits out its 429s too', async () => {
  // A 429 is a refusal before any work: even a call that could store twice
  // (no idempotency key) is retried after it.
  const opgraph = limitedClient({ maxRetries: 5 });
  const names = [1, 2, 3].map((n) => unique(`robot-${n}`));

  const created = await Promise.all(names.map((name) => opgraph.createTrackable('robot', name)));

  assert.deepEqual(created.map((c) => c.trackable.name), names);
  const { trackables } = await opgraph.request('GET', '/api/trackables', { query: { limit: 1000 } });
  for (const name of names) {
    assert.equal(trackables.filter((t) => t.name === name).length, 1, name);
  }
});
