// The retry rules of docs/sdks.md, one test each, from local servers whose
// request counts show how often a call was sent: 429 and 503 with and
// without Retry-After, lost answers, the key `track` always carries (and,
// through a proxy that loses an answer of the real cloud, the use it
// records once), and the workspace taken from OPGRAPH_WORKSPACE_ID.

import assert from 'node:assert/strict';
import test from 'node:test';

import { Opgraph, OpgraphApiError, OpgraphTransportError } from '../index.js';
import { client, fakeServer, json, losingProxy, required, unique } from '../support/clouds.js';

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

const RATE_LIMITED = { error: { code: 'rate_limited', message: 'slow down' } };
const UNAVAILABLE = { error: { code: 'unavailable', message: 'the store is unavailable' } };

/** A fake cloud answering `refusal` to odd requests and `ok` to even ones. */
async function everyOther(status, body, headers, ok = { accepted: 1, ids: ['evt_1'] }) {
  return fakeServer((request, response, n) => {
    if (n % 2 === 1) json(response, status, body, headers);
    else json(response, 200, ok);
  });
}

function fakeClient(server, options = {}) {
  return new Opgraph({ url: server.url, apiKey: 'og_fake', ...options });
}

/** Checks an API error's status and code; returns true for assert.rejects. */
function apiError(status, code, check = () => {}) {
  return (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.status, status);
    assert.equal(error.code, code);
    check(error);
    return true;
  };
}

test('429 with Retry-After is retried for any call, an unkeyed POST too', async () => {
  const server = await everyOther(429, RATE_LIMITED, { 'Retry-After': '0' }, { ok: true });
  try {
    const opgraph = fakeClient(server);

    assert.deepEqual(await opgraph.createTrackable('robot', 'AMR-7'), { ok: true });
    assert.deepEqual(await opgraph.search('pallet'), { ok: true });

    assert.equal(server.requests.length, 4);
    assert.ok(server.requests.every((r) => r.method === 'POST'));
    assert.ok(server.requests.every((r) => r.headers['idempotency-key'] === undefined));
  } finally {
    await server.close();
  }
});

test('503 with Retry-After on a POST without a key is sent once', async () => {
  const server = await fakeServer((request, response) => {
    json(response, 503, UNAVAILABLE, { 'Retry-After': '0' });
  });
  try {
    const opgraph = fakeClient(server);
    const unavailable = apiError(503, 'unavailable', (e) => assert.equal(e.retryAfter, 0));

    await assert.rejects(opgraph.createTrackable('robot', 'AMR-7'), unavailable);
    await assert.rejects(opgraph.search('pallet'), unavailable);
    await assert.rejects(opgraph.graphql('{ events { id } }'), unavailable);
    await assert.rejects(opgraph.request('POST', '/api/keys', { body: {} }), unavailable);

    assert.equal(server.requests.length, 4, 'each call was sent once');
  } finally {
    await server.close();
  }
});

test('503 with Retry-After is retried for a GET and for keyed calls', async () => {
  const server = await everyOther(503, UNAVAILABLE, { 'Retry-After': '0' });
  try {
    const opgraph = fakeClient(server);

    await opgraph.usage();
    await opgraph.request('POST', '/api/keys', { body: {}, idempotencyKey: 'mine-1' });
    await opgraph.ingest({ event: 'door.opened' });
    await opgraph.track('AMR-7');

    const sent = server.requests.map((r) => `${r.method} ${r.url}`);
    assert.deepEqual(sent, [
      'GET /api/usage',
      'GET /api/usage',
      'POST /api/keys',
      'POST /api/keys',
      'POST /api/ingest',
      'POST /api/ingest',
      'POST /api/track',
      'POST /api/track',
    ]);
    const keys = server.requests.map((r) => r.headers['idempotency-key']);
    assert.equal(keys[2], 'mine-1');
    assert.equal(keys[3], 'mine-1');
    assert.equal(keys[5], keys[4], 'ingest retried under its key');
    assert.equal(keys[7], keys[6], 'track retried under its key');
  } finally {
    await server.close();
  }
});

test('429 or 503 without Retry-After is thrown at once, its body kept', async () => {
  const report = { status: 'fail', version: '0.1.0', checks: { store: { ok: false } } };
  const server = await fakeServer((request, response) => {
    if (request.url.startsWith('/api/health')) json(response, 503, report);
    else json(response, 429, RATE_LIMITED);
  });
  try {
    const opgraph = fakeClient(server);

    await assert.rejects(
      opgraph.health({ strict: true }),
      apiError(503, 'unavailable', (e) => {
        assert.equal(e.retryAfter, undefined);
        assert.deepEqual(e.body, report);
      }),
    );
    assert.equal(server.requests.length, 1, 'a strict health report is an answer');
    await assert.rejects(
      opgraph.ingest({ event: 'door.opened' }),
      apiError(429, 'rate_limited', (e) => assert.equal(e.retryAfter, undefined)),
    );
    assert.equal(server.requests.length, 2, 'a 429 without Retry-After is an answer too');
  } finally {
    await server.close();
  }
});

test('a Retry-After over 60 s is thrown at once', async () => {
  const server = await fakeServer((request, response) => {
    json(response, 429, { error: { code: 'rate_limited', message: 'monthly quota' } }, {
      'Retry-After': '3600',
    });
  });
  try {
    const opgraph = fakeClient(server);

    await assert.rejects(
      opgraph.events(),
      apiError(429, 'rate_limited', (e) => assert.equal(e.retryAfter, 3600)),
    );
    assert.equal(server.requests.length, 1, 'an hour is not waited out');
  } finally {
    await server.close();
  }
});

test('no answer: a GET or keyed call is retried, any other POST sent once', async () => {
  const server = await fakeServer((request) => request.socket.destroy());
  try {
    const opgraph = fakeClient(server, { maxRetries: 2 });
    const countOf = async (call) => {
      const before = server.requests.length;
      await assert.rejects(call(), OpgraphTransportError);
      return server.requests.length - before;
    };

    assert.equal(await countOf(() => opgraph.events()), 3);
    assert.equal(await countOf(() => opgraph.track('AMR-7')), 3);
    // POSTs that mostly read, but may write (persistSnapshots, mutations).
    assert.equal(await countOf(() => opgraph.search('pallet')), 1);
    assert.equal(await countOf(() => opgraph.metrics()), 1);
    assert.equal(await countOf(() => opgraph.whatsChanged()), 1);
    assert.equal(await countOf(() => opgraph.agentContext('summarize')), 1);
    assert.equal(await countOf(() => opgraph.graphql('{ events { id } }')), 1);
    assert.equal(await countOf(() => opgraph.enforce({})), 1);
    assert.equal(await countOf(() => opgraph.createTrackable('robot', 'x')), 1);
  } finally {
    await server.close();
  }
});

test('track always carries a key: one per call, kept across its retries', async () => {
  const server = await fakeServer((request, response, n) => {
    if (n === 1) request.socket.destroy();
    else json(response, 202, { accepted: 1, ids: [`evt_${n}`] });
  });
  try {
    const opgraph = fakeClient(server, { maxRetries: 2 });

    assert.deepEqual(await opgraph.track('AMR-7', { event: 'robot.used' }), {
      accepted: 1,
      ids: ['evt_2'],
    });
    await opgraph.track('AMR-7');
    await opgraph.track('AMR-7', { idempotencyKey: 'mine-2' });

    const keys = server.requests.map((r) => r.headers['idempotency-key']);
    assert.equal(keys.length, 4);
    assert.match(keys[0], UUID_V4);
    assert.equal(keys[1], keys[0], 'the retry carries the first attempt key');
    assert.notEqual(keys[2], keys[0], 'another call has its own key');
    assert.match(keys[2], UUID_V4);
    assert.equal(keys[3], 'mine-2');
    assert.deepEqual(JSON.parse(server.requests[0].body), { event: 'robot.used', code: 'AMR-7' });
  } finally {
    await server.close();
  }
});

test('a track whose answer was lost is retried under its key and recorded once', async () => {
  const opgraph = client();
  const eventName = unique('lost-track');
  const { trackable } = await opgraph.createTrackable('sensor', 'Cold room', { eventName });
  const proxy = await losingProxy(required('OPGRAPH_URL'), 1);
  try {
    const through = client({ url: proxy.url, maxRetries: 2 });

    const tracked = await through.track(trackable.code, { properties: { celsius: 4 } });

    const keys = proxy.requests.map((r) => r.headers['idempotency-key']);
    assert.equal(keys.length, 2, 'the lost answer was retried');
    assert.match(keys[0], UUID_V4);
    assert.equal(keys[1], keys[0]);
    const stored = await opgraph.events({ event: eventName });
    assert.deepEqual(
      stored.map((e) => e.id),
      tracked.ids,
      'the use is recorded once',
    );
  } finally {
    await proxy.close();
  }
});

test('the workspace comes from OPGRAPH_WORKSPACE_ID unless one is given', async () => {
  const server = await fakeServer((request, response) => json(response, 200, { events: [] }));
  const saved = process.env.OPGRAPH_WORKSPACE_ID;
  try {
    process.env.OPGRAPH_WORKSPACE_ID = 'ws_from_env';
    const fromEnv = fakeClient(server);
    const given = fakeClient(server, { workspace: 'ws_given' });
    assert.equal(fromEnv.workspace, 'ws_from_env');

    await fromEnv.events();
    await given.events();

    const sent = server.requests.map((r) => r.headers['x-opgraph-workspace-id']);
    assert.deepEqual(sent, ['ws_from_env', 'ws_given']);
    // The real cloud sees it too: another workspace is refused.
    process.env.OPGRAPH_WORKSPACE_ID = 'ws_someone_else';
    await assert.rejects(client().events({ limit: 1 }), apiError(403, 'forbidden'));
    delete process.env.OPGRAPH_WORKSPACE_ID;
    assert.equal(fakeClient(server).workspace, undefined);
  } finally {
    if (saved === undefined) delete process.env.OPGRAPH_WORKSPACE_ID;
    else process.env.OPGRAPH_WORKSPACE_ID = saved;
    await server.close();
  }
});
