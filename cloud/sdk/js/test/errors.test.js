// Errors and retries: the API's 401 and 403 from the real cloud, the
// settings refused at construction, and transport failures (a closed port,
// a server that never answers, an answer that is not JSON) with the retries
// each allows.

import assert from 'node:assert/strict';
import test from 'node:test';

import { Opgraph, OpgraphApiError, OpgraphError, OpgraphTransportError } from '../index.js';
import { client, closedPort, fakeServer, json, required, unique } from '../support/clouds.js';

/** Checks an API error's status, code and field; returns true for assert.rejects. */
function apiError(status, code, field) {
  return (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.ok(error instanceof OpgraphError);
    assert.equal(error.status, status);
    assert.equal(error.code, code);
    assert.equal(error.field, field);
    return true;
  };
}

test('a wrong key is 401 unauthorized', async () => {
  const opgraph = client({ apiKey: 'og_not_a_key_of_this_cloud' });
  await assert.rejects(opgraph.events(), apiError(401, 'unauthorized', undefined));
});

test('a read-only key may read but not ingest', async () => {
  const admin = client();
  const created = await admin.request('POST', '/api/keys', {
    body: { name: unique('read-only'), scopes: ['read'] },
  });
  assert.match(created.apiKey, /^og_/);
  assert.deepEqual(created.key.scopes, ['read']);
  const reader = client({ apiKey: created.apiKey });

  await assert.rejects(reader.ingest({ event: unique('forbidden') }), apiError(403, 'forbidden'));
  assert.ok(Array.isArray(await reader.events({ limit: 1 })));
});

test('without settings the client reads OPGRAPH_URL and OPGRAPH_API_KEY', async () => {
  const opgraph = new Opgraph();
  assert.equal(opgraph.url, required('OPGRAPH_URL').replace(/\/+$/, ''));
  const usage = await opgraph.usage();
  assert.match(usage.workspaceId, /^ws_/);
});

test('bad settings are a TypeError at construction', () => {
  const url = 'http://127.0.0.1:1';
  assert.throws(() => new Opgraph({ url: 'ftp://example.com' }), TypeError);
  assert.throws(() => new Opgraph({ url: 'not a url' }), TypeError);
  assert.throws(() => new Opgraph({ url, apiKey: 'og_a\nX-Evil: 1' }), TypeError);
  assert.throws(() => new Opgraph({ url, apiKey: 'og_a\r' }), TypeError);
  assert.throws(() => new Opgraph({ url, apiKey: 'og_a', workspace: 'ws_a\n' }), TypeError);
  assert.throws(() => new Opgraph({ url, timeoutMs: 0 }), TypeError);
  assert.throws(() => new Opgraph({ url, maxRetries: -1 }), TypeError);
  assert.throws(() => new Opgraph({ url, maxRetries: 1.5 }), TypeError);
  const prefixed = new Opgraph({ url: 'https://example.com/opgraph/' });
  assert.equal(prefixed.url, 'https://example.com/opgraph');
});

test('an empty or blank setting counts as not given, and so does an empty variable', async () => {
  const server = await fakeServer((request, response) => json(response, 200, { events: [] }));
  const names = ['OPGRAPH_URL', 'OPGRAPH_API_KEY', 'OPGRAPH_WORKSPACE_ID'];
  const saved = names.map((name) => [name, process.env[name]]);
  try {
    process.env.OPGRAPH_URL = `${server.url}/`;
    process.env.OPGRAPH_API_KEY = 'og_from_env';
    process.env.OPGRAPH_WORKSPACE_ID = 'ws_from_env';
    for (const blank of ['', '   ', '\t\r\n']) {
      const opgraph = new Opgraph({ url: blank, apiKey: blank, workspace: blank });
      assert.equal(opgraph.url, server.url);
      assert.equal(opgraph.workspace, 'ws_from_env');
      await opgraph.events();
    }
    assert.equal(server.requests.length, 3);
    for (const { headers } of server.requests) {
      assert.equal(headers.authorization, 'Bearer og_from_env');
      assert.equal(headers['x-opgraph-workspace-id'], 'ws_from_env');
    }

    // An empty variable is unset too: the default URL, and no key or
    // workspace header at all (not an empty one).
    for (const empty of ['', ' ']) {
      for (const name of names) process.env[name] = empty;
      const bare = new Opgraph({ url: empty, apiKey: empty, workspace: empty });
      assert.equal(bare.url, 'http://127.0.0.1:8080');
      assert.equal(bare.workspace, undefined);
      await new Opgraph({ url: server.url, apiKey: empty, workspace: empty }).events();
      const { headers } = server.requests.at(-1);
      assert.equal(headers.authorization, undefined);
      assert.equal(headers['x-opgraph-workspace-id'], undefined);
    }
  } finally {
    for (const [name, value] of saved) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    await server.close();
  }
});

test('a closed port is a transport error after the retries of a read', async () => {
  const port = await closedPort();
  let attempts = 0;
  const counting = (...args) => {
    attempts += 1;
    return fetch(...args);
  };
  const opgraph = new Opgraph({
    url: `http://127.0.0.1:${port}`,
    apiKey: 'og_none',
    timeoutMs: 1000,
    maxRetries: 2,
    fetch: counting,
  });

  await assert.rejects(opgraph.events(), (error) => {
    assert.ok(error instanceof OpgraphTransportError, `not a transport error: ${error}`);
    assert.ok(error instanceof OpgraphError);
    assert.ok(error.cause !== undefined, 'the runtime error is kept as cause');
    assert.match(error.message, /GET \/api\/events/);
    return true;
  });
  assert.equal(attempts, 3);

  // A write with an idempotency key cannot store twice: as repeatable as a GET.
  attempts = 0;
  const keyed = { body: { kind: 'robot', name: 'x' }, idempotencyKey: 'k-1' };
  await assert.rejects(opgraph.request('POST', '/api/trackables', keyed), OpgraphTransportError);
  assert.equal(attempts, 3);

  // A write without an idempotency key could store twice: one attempt only.
  attempts = 0;
  await assert.rejects(
    opgraph.request('POST', '/api/trackables', { body: { kind: 'robot', name: 'x' } }),
    OpgraphTransportError,
  );
  assert.equal(attempts, 1);
});

test('no answer within the timeout is a transport error, retried for a read', async () => {
  const server = await fakeServer(() => {
    // Never answers.
  });
  try {
    const opgraph = new Opgraph({
      url: server.url,
      apiKey: 'og_fake',
      timeoutMs: 150,
      maxRetries: 1,
    });
    await assert.rejects(opgraph.usage(), (error) => {
      assert.ok(error instanceof OpgraphTransportError, `not a transport error: ${error}`);
      assert.match(error.message, /within 150 ms/);
      return true;
    });
    assert.equal(server.requests.length, 2);
  } finally {
    await server.close();
  }
});

test('a 2xx answer that is not JSON is a transport error', async () => {
  const server = await fakeServer((request, response) => {
    response.writeHead(200, { 'Content-Type': 'text/html' });
    response.end('<html>a captive portal</html>');
  });
  try {
    const opgraph = new Opgraph({ url: server.url, apiKey: 'og_fake', maxRetries: 0 });
    await assert.rejects(opgraph.health(), OpgraphTransportError);
  } finally {
    await server.close();
  }
});

test('an error answer is not retried; one without the error shape has a code', async () => {
  const server = await fakeServer((request, response) => {
    response.writeHead(502, { 'Content-Type': 'text/html' });
    response.end('<html>bad gateway</html>');
  });
  try {
    const opgraph = new Opgraph({ url: server.url, apiKey: 'og_fake' });
    await assert.rejects(opgraph.events(), apiError(502, 'http_502', undefined));
    assert.equal(server.requests.length, 1);
  } finally {
    await server.close();
  }

  let attempts = 0;
  const opgraph = client({
    fetch: (...args) => {
      attempts += 1;
      return fetch(...args);
    },
  });
  const refused = apiError(400, 'validation_failed', 'limit');
  await assert.rejects(opgraph.events({ limit: -1 }), refused);
  assert.equal(attempts, 1, 'a 400 stays a 400');
});
