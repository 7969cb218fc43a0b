// The read calls and governance against the real cloud, each checked
// against events this file stored under names no other test uses.

import assert from 'node:assert/strict';
import test from 'node:test';

import { OpgraphApiError } from '../index.js';
import { client, unique } from '../support/clouds.js';

test('search finds an event by a property value', async () => {
  const opgraph = client();
  const event = unique('searched');
  const colour = unique('ultramarine');
  const { ids } = await opgraph.ingest([
    { event, properties: { colour } },
    { event, properties: { colour: 'grey' } },
  ]);

  const found = await opgraph.search(colour.toUpperCase(), { event });

  assert.equal(found.total, 1);
  assert.equal(found.totalCapped, false);
  assert.equal(found.results.length, 1);
  assert.equal(found.results[0].id, ids[0]);
  assert.equal(found.results[0].properties.colour, colour);
});

test('graphql returns stored events, and a bad query throws code graphql', async () => {
  const opgraph = client();
  const event = unique('graphql');
  const { ids } = await opgraph.ingest([{ event }, { event }]);

  const data = await opgraph.graphql(
    'query ($event: String, $limit: Int) { events(event: $event, limit: $limit) { id event } }',
    { event, limit: 10 },
  );

  assert.deepEqual(data.events.map((e) => e.id).sort(), [...ids].sort());
  assert.ok(data.events.every((e) => e.event === event));
  await assert.rejects(opgraph.graphql('{ noSuchField }'), (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.status, 200);
    assert.equal(error.code, 'graphql');
    assert.ok(error.errors.length > 0);
    assert.match(error.errors[0].message, /noSuchField/);
    assert.match(error.message, /noSuchField/);
    return true;
  });
});

test('metrics count an event and its revenue', async () => {
  const opgraph = client();
  const event = unique('metered');
  await opgraph.ingest([
    { event, actor: 'a', outcome: { revenue: 10.5, currency: 'EUR' } },
    { event, actor: 'b', outcome: { revenue: 2, currency: 'EUR' } },
  ]);

  const answer = await opgraph.metrics({ eventName: event, interval: 'day' });

  assert.equal(answer.metrics.length, 1);
  assert.equal(answer.metrics[0].eventName, event);
  assert.equal(answer.metrics[0].count, 2);
  assert.equal(answer.metrics[0].uniqueActors, 2);
  assert.equal(answer.metrics[0].revenue, 12.5);
  assert.equal(typeof answer.totalEvents, 'number');
  assert.ok(Array.isArray(answer.series));
  assert.ok(Array.isArray(answer.definitions));
  assert.ok(answer.from < answer.to);
});

test('whatsChanged reports a new event type of a business', async () => {
  const opgraph = client();
  const businessId = unique('biz');
  const event = unique('changed');
  await opgraph.ingest([{ event, businessId, outcome: { revenue: 4, currency: 'EUR' } }]);

  const answer = await opgraph.whatsChanged({ businessId });

  assert.equal(answer.current.totalEvents, 1);
  assert.equal(answer.previous.totalEvents, 0);
  assert.equal(answer.revenueDelta, 4);
  assert.deepEqual(answer.newEventTypes, [event]);
  assert.deepEqual(answer.disappearedEventTypes, []);
  assert.deepEqual(answer.eventDiffs, [
    { event, current: 1, previous: 0, delta: 1, pctChange: null },
  ]);
});

test('agentContext answers each mode, and refuses an unknown one', async () => {
  const opgraph = client();

  const summary = await opgraph.agentContext('summarize', { businessId: 'default', limit: 5 });
  assert.equal(summary.mode, 'summarize');
  assert.equal(summary.businessId, 'default');
  assert.equal(typeof summary.summary, 'string');
  assert.equal(typeof summary.changes.current.totalEvents, 'number');
  for (const list of ['anomalies', 'missingProofEvents', 'nextActions']) {
    assert.ok(Array.isArray(summary[list]), list);
  }
  for (const action of summary.nextActions) {
    assert.equal(typeof action.action, 'string');
    assert.equal(typeof action.governed, 'boolean');
  }
  const gaps = await opgraph.agentContext('proof_gaps');
  assert.equal(gaps.mode, 'proof_gaps');
  assert.equal(gaps.changes, null);

  await assert.rejects(opgraph.agentContext('guess'), (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.status, 400);
    assert.equal(error.code, 'validation_failed');
    return true;
  });
});

test('businessHealth of the default business, and 404 for an unknown one', async () => {
  const opgraph = client();

  const health = await opgraph.businessHealth('default');

  assert.equal(health.businessId, 'default');
  assert.ok(health.healthScore >= 0 && health.healthScore <= 100);
  for (const count of ['revenue', 'scans', 'leads', 'orders']) {
    assert.equal(typeof health[count], 'number', count);
  }
  for (const list of ['recentEvents', 'metrics', 'alerts', 'workflows', 'nextActions']) {
    assert.ok(Array.isArray(health[list]), list);
  }
  assert.ok(Array.isArray(health.attribution.bySource));
  // The id is one path segment however it is spelled.
  await assert.rejects(opgraph.businessHealth(`${unique('nowhere')}/dock 3?x=1`), (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.status, 404);
    assert.equal(error.code, 'not_found');
    return true;
  });
  await assert.rejects(opgraph.businessHealth(''), TypeError);
});

test('enforce naming objects that do not exist denies, with a receipt', async () => {
  const opgraph = client();

  const answer = await opgraph.enforce({
    decisionObjectId: 'dec_missing',
    authorityGrantId: 'grt_missing',
    contextContractId: 'ctc_missing',
    proposedAction: { action: 'refund', amount: 25, currency: 'EUR' },
  });

  assert.equal(answer.outcome, 'deny');
  assert.match(answer.receiptId, /^rcp_/);
  assert.equal(answer.receipt.id, answer.receiptId);
  assert.ok(answer.checks.some((c) => !c.passed && c.outcome === 'deny'));
});

test('usage reports the workspace, its events and the rate limit', async () => {
  const opgraph = client();

  const usage = await opgraph.usage();

  assert.match(usage.workspaceId, /^ws_/);
  assert.equal(typeof usage.events.ingested, 'number');
  assert.ok(usage.apiCalls >= 1);
  assert.ok(usage.period.from <= usage.period.to);
  assert.ok(Array.isArray(usage.connectors));
  assert.ok(Array.isArray(usage.agents));
  assert.equal(typeof usage.rateLimit.requestsPerSecond, 'number');
});

test('health reports its checks, plain and strict', async () => {
  const opgraph = client();

  const health = await opgraph.health();
  const strict = await opgraph.health({ strict: true });

  assert.ok(['ok', 'degraded'].includes(health.status), health.status);
  assert.equal(typeof health.version, 'string');
  for (const check of ['store', 'config', 'integrations', 'rateLimiting', 'usageMetering']) {
    assert.equal(typeof health.checks[check].ok, 'boolean', check);
  }
  assert.equal(health.checks.store.ok, true);
  assert.equal(strict.status, 'ok');
});
