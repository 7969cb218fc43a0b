// What the test files share: the clouds tests/tests/sdks.rs started, names
// that keep tests apart, and small local servers for what a real cloud
// cannot be made to do on demand (drop a connection, never answer, answer
// HTML). Kept out of test/, where node's runner would take it for a suite.

import { randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';

import { Opgraph } from '../index.js';

/** A variable the harness sets; missing fails the test instead of skipping it. */
export function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run the suite through tests/tests/sdks.rs (README.md)`);
  }
  return value;
}

/** A client of the normal cloud, as its admin and operator key. */
export function client(options = {}) {
  return new Opgraph({
    url: required('OPGRAPH_URL'),
    apiKey: required('OPGRAPH_API_KEY'),
    ...options,
  });
}

/** A client of the cloud that allows one request per second, burst 1. */
export function limitedClient(options = {}) {
  return new Opgraph({
    url: required('OPGRAPH_LIMITED_URL'),
    apiKey: required('OPGRAPH_LIMITED_API_KEY'),
    ...options,
  });
}

/** An event name (or id) no other test uses, so no test sees another's data. */
export function unique(label) {
  return `sdk.js.${label}.${randomUUID().slice(0, 8)}`;
}

/** A loopback port that nothing listens on: bound by the system, then freed. */
export async function closedPort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * A local HTTP server whose `answer(request, response, n, body)` handles the
 * n-th request (from 1); every request is recorded in `requests` with its
 * body.
 */
export async function fakeServer(answer) {
  const requests = [];
  const server = http.createServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => {
      body += chunk;
    });
    request.on('end', () => {
      requests.push({ method: request.method, url: request.url, headers: request.headers, body });
      answer(request, response, requests.length, body);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

/** Answers `status` with `body` as JSON and the given extra headers. */
export function json(response, status, body, headers = {}) {
  response.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  response.end(JSON.stringify(body));
}

/**
 * A local proxy to a real cloud that loses answers on purpose: each request
 * is relayed to `upstream` and carried out there, but the answers of the
 * first `lose` requests are dropped (the connection closes unanswered), as
 * when a network loses an answer after the cloud acted. Every request is
 * recorded in `requests`, as by `fakeServer`.
 */
export async function losingProxy(upstream, lose) {
  const relayed = ['authorization', 'content-type', 'idempotency-key', 'x-opgraph-workspace-id'];
  return fakeServer(async (request, response, n, body) => {
    const headers = {};
    for (const name of relayed) {
      if (request.headers[name] !== undefined) headers[name] = request.headers[name];
    }
    const hasBody = request.method !== 'GET' && request.method !== 'HEAD';
    try {
      const answer = await fetch(upstream.replace(/\/+$/, '') + request.url, {
        method: request.method,
        headers,
        body: hasBody ? body : undefined,
      });
      const text = await answer.text();
      if (n <= lose) {
        request.socket.destroy();
        return;
      }
      response.writeHead(answer.status, { 'Content-Type': 'application/json' });
      response.end(text);
    } catch {
      request.socket.destroy();
    }
  });
}
