// Trackables against the real cloud: register one, use it by its code, and
// find the event that use recorded.

import assert from 'node:assert/strict';
import test from 'node:test';

import { OpgraphApiError } from '../index.js';
import { client, unique } from '../support/clouds.js';

test('a trackable created, then tracked by its code, shows a tracked event', async () => {
  const opgraph = client();
  const eventName = unique('robot.used');

  const { trackable } = await opgraph.createTrackable('robot', 'AMR-7', { eventName });
  const tracked = await opgraph.track(trackable.code, {
    properties: { station: 'dock 3' },
    actor: { type: 'operator', id: 'op-1' },
  });

  assert.match(trackable.id, /^trk_/);
  assert.equal(trackable.kind, 'robot');
  assert.equal(trackable.name, 'AMR-7');
  assert.equal(trackable.eventName, eventName);
  assert.equal(tracked.accepted, 1);
  const [stored, ...more] = await opgraph.events({ event: eventName });
  assert.deepEqual(more, []);
  assert.equal(stored.id, tracked.ids[0]);
  assert.deepEqual(stored.trackable, { kind: 'robot', code: trackable.code, id: trackable.id });
  assert.deepEqual(stored.properties, { station: 'dock 3' });
  assert.deepEqual(stored.actor, { type: 'operator', id: 'op-1' });
});

test('a QR code comes with its SVG when asked, and an external code is kept', async () => {
  const opgraph = client();
  const code = unique('gtin').replaceAll('.', '-');

  const created = await opgraph.createTrackable('qr_code', 'Menu', {
    targetUrl: 'https://example.com/menu',
    includeQrSvg: true,
    code,
  });

  assert.equal(created.trackable.code, code);
  assert.equal(created.trackable.targetUrl, 'https://example.com/menu');
  assert.match(created.qrSvg, /<svg/);
  assert.match(created.trackable.scanUrl, /\/r\//);
});

test('tracking an unknown code is 404, an unknown kind 400', async () => {
  const opgraph = client();

  await assert.rejects(opgraph.track(unique('nothing').replaceAll('.', '-')), (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.status, 404);
    assert.equal(error.code, 'not_found');
    return true;
  });
  await assert.rejects(opgraph.createTrackable('nfc', 'x'), (error) => {
    assert.ok(error instanceof OpgraphApiError, `not an API error: ${error}`);
    assert.equal(error.field, 'kind');
    return true;
  });
});
