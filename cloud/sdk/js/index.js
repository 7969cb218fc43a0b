// Opgraph's client for JavaScript and TypeScript (docs/sdks.md).
//
// One class, `Opgraph`, with a method per API call that applications use
// most, and `request` for the rest. Every method goes through `#send`, which
// owns the retry rules; `#attempt` makes one bounded fetch and turns what
// came back into JSON or an error. Only `fetch`, `AbortController` and
// `crypto.randomUUID` are used, so the file runs unchanged in Node 18+,
// Deno, Bun and browsers. Types are in index.d.ts, written by hand.

export const VERSION = '0.1.0';

const DEFAULT_URL = 'http://127.0.0.1:8080';
const USER_AGENT = `opgraph-js/${VERSION}`;
// A longer Retry-After (an exhausted monthly quota answers an hour) is the
// caller's decision, not something to block a loop on.
const MAX_RETRY_AFTER_S = 60;
const FIRST_PAUSE_MS = 200;
const MAX_PAUSE_MS = 30_000;
// Header values with these would let a setting smuggle in another header;
// fetch refuses them too, but only at the first call and with a vaguer error.
const HEADER_BREAKS = /[\r\n\0]/;
// A setting of only these counts as not given (see `given`).
const BLANK = /^[ \t\n\v\f\r]*$/;

/** The base of both errors a call can throw. */
export class OpgraphError extends Error {}

/**
 * An answer outside 2xx, or a GraphQL answer with `errors` (status 200,
 * code `graphql`).
 */
export class OpgraphApiError extends OpgraphError {
  /**
   * @param {{status: number, code: string, message: string, field?: string,
   *   retryAfter?: number, errors?: object[], body?: unknown}} detail
   */
  constructor({ status, code, message, field, retryAfter, errors, body }) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
    this.retryAfter = retryAfter;
    this.errors = errors;
    // The decoded answer, for the rare one that says more than `error`
    // (strict health answers 503 with its whole report).
    this.body = body;
  }
}

/**
 * No usable answer: refused connection, timeout, TLS failure, or a body that
 * is not the JSON the API sends. `cause` holds what the runtime raised.
 */
export class OpgraphTransportError extends OpgraphError {
  constructor(message, options) {
    super(message, options);
    // Older runtimes ignore the `cause` option of Error.
    if (options && 'cause' in options && this.cause === undefined) this.cause = options.cause;
  }
}

// On the prototypes, so that logging an error does not list `name` as data.
for (const kind of [OpgraphError, OpgraphApiError, OpgraphTransportError]) {
  const name = { value: kind.name, writable: true, configurable: true };
  Object.defineProperty(kind.prototype, 'name', name);
}

export class Opgraph {
  #base;
  #apiKey;
  #workspace;
  #timeoutMs;
  #maxRetries;
  #fetch;

  /**
   * @param {import('./index.js').OpgraphOptions} [options] Without `url`,
   *   `apiKey` or `workspace`, `OPGRAPH_URL` (else http://127.0.0.1:8080),
   *   `OPGRAPH_API_KEY` and `OPGRAPH_WORKSPACE_ID` are read where the runtime
   *   has an environment, as the command line does. An empty setting (or
   *   one of only spaces, tabs and line breaks) counts as not given, and so
   *   does an empty variable.
   */
  constructor(options = {}) {
    const { url, apiKey, workspace, timeoutMs = 30_000, maxRetries = 3, fetch } = options;
    this.#base = baseUrl(given(url) ?? fromEnv('OPGRAPH_URL') ?? DEFAULT_URL);
    this.#apiKey = headerSetting('apiKey', given(apiKey) ?? fromEnv('OPGRAPH_API_KEY'));
    this.#workspace = headerSetting(
      'workspace',
      given(workspace) ?? fromEnv('OPGRAPH_WORKSPACE_ID'),
    );
    if (typeof timeoutMs !== 'number' || !(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      throw new TypeError(`timeoutMs must be a positive number of milliseconds, not ${timeoutMs}`);
    }
    if (!Number.isInteger(maxRetries) || maxRetries < 0) {
      throw new TypeError(`maxRetries must be a non-negative integer, not ${maxRetries}`);
    }
    this.#timeoutMs = timeoutMs;
    this.#maxRetries = maxRetries;
    this.#fetch = fetch ?? globalThis.fetch?.bind(globalThis);
    if (typeof this.#fetch !== 'function') {
      throw new TypeError('no fetch in this runtime: pass one as the `fetch` option');
    }
  }

  /** The cloud's base URL, without a trailing slash. */
  get url() {
    return this.#base;
  }

  /** The workspace sent as X-Opgraph-Workspace-ID, if any. */
  get workspace() {
    return this.#workspace;
  }

  /**
   * Stores one event, or an array of them as one all-or-nothing batch. Always
   * sends an Idempotency-Key (the caller's, else one made here and kept
   * across retries), so a batch whose answer was lost is stored once.
   */
  async ingest(eventOrEvents, { idempotencyKey } = {}) {
    const body = Array.isArray(eventOrEvents) ? { batch: eventOrEvents } : eventOrEvents;
    if (body === null || typeof body !== 'object') {
      throw new TypeError('ingest takes an event object or an array of them');
    }
    const key = idempotencyKey ?? (await randomKey());
    return this.#send('POST', '/api/ingest', { body, idempotencyKey: key });
  }

  /** Stored events, newest first (the answer's `events`). */
  async events(filters = {}) {
    const answer = await this.#send('GET', '/api/events', { query: filters });
    return listOf(answer, 'events', 'GET /api/events');
  }

  // search, metrics, whatsChanged, agentContext and graphql are POSTs that
  // mostly read, but some of them can write (persistSnapshots, GraphQL
  // mutations): like any POST without a key, a lost answer is not retried.

  /** Events whose name, property values, actor or object match `query`. */
  async search(query, filters = {}) {
    const body = { ...filters, query };
    return this.#send('POST', '/api/analytics/event-search', { body });
  }

  async metrics(options = {}) {
    return this.#send('POST', '/api/metrics/query', { body: options });
  }

  async whatsChanged(options = {}) {
    return this.#send('POST', '/api/analytics/whats-changed', { body: options });
  }

  async businessHealth(businessId, { limit } = {}) {
    if (typeof businessId !== 'string' || businessId === '') {
      throw new TypeError('businessId must be a non-empty string');
    }
    const path = `/api/businesses/${encodeURIComponent(businessId)}/health`;
    return this.#send('GET', path, { query: { limit } });
  }

  async agentContext(mode, options = {}) {
    const body = { ...options, mode };
    return this.#send('POST', '/api/intelligence/agent-context', { body });
  }

  /**
   * Runs a GraphQL document and returns its `data`. An answer with `errors`
   * throws, so that partial data is never read by mistake.
   */
  async graphql(query, variables) {
    const body = { query, variables };
    const answer = await this.#send('POST', '/api/graphql', { body });
    const errors = answer?.errors;
    if (Array.isArray(errors) && errors.length > 0) {
      const message = errors.map((e) => e?.message ?? String(e)).join('; ');
      throw new OpgraphApiError({ status: 200, code: 'graphql', message, errors, body: answer });
    }
    return answer?.data;
  }

  async enforce(request) {
    return this.#send('POST', '/api/governance/enforce', { body: request });
  }

  /**
   * Records a use of the trackable registered under `code`. Like `ingest`, it
   * always sends an Idempotency-Key (the caller's, else one made here and
   * kept across retries), so a use whose answer was lost is recorded once.
   */
  async track(code, { idempotencyKey, ...options } = {}) {
    const key = idempotencyKey ?? (await randomKey());
    return this.#send('POST', '/api/track', { body: { ...options, code }, idempotencyKey: key });
  }

  async createTrackable(kind, name, options = {}) {
    return this.#send('POST', '/api/trackables', { body: { ...options, kind, name } });
  }

  async usage({ limit } = {}) {
    return this.#send('GET', '/api/usage', { query: { limit } });
  }

  /** Readiness; with `strict`, a failed required check is a 503 (thrown). */
  async health({ strict = false } = {}) {
    return this.#send('GET', '/api/health', { query: { strict: strict ? 1 : undefined } });
  }

  /**
   * Any other API call, with the same headers, errors and retries. `path`
   * starts with `/`; `query` values that are undefined or null are left out.
   */
  async request(method, path, { body, query, idempotencyKey } = {}) {
    if (typeof method !== 'string' || !/^[A-Za-z]+$/.test(method)) {
      throw new TypeError(`method must be an HTTP method name, not ${method}`);
    }
    return this.#send(method.toUpperCase(), path, { body, query, idempotencyKey });
  }

  /**
   * @param {string} method
   * @param {string} path
   * @param {{body?: unknown, query?: object, idempotencyKey?: string}} parts
   */
  async #send(method, path, { body, query, idempotencyKey }) {
    if (typeof path !== 'string' || !path.startsWith('/')) {
      throw new TypeError(`path must start with "/", not ${path}`);
    }
    const url = urlOf(this.#base, path, query);
    const headers = { Accept: 'application/json' };
    if (this.#apiKey !== undefined) headers.Authorization = `Bearer ${this.#apiKey}`;
    if (this.#workspace !== undefined) headers['X-Opgraph-Workspace-ID'] = this.#workspace;
    if (idempotencyKey !== undefined) {
      headers['Idempotency-Key'] = headerSetting('idempotencyKey', idempotencyKey);
    }
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    // Browsers own their User-Agent; elsewhere it tells the operator who calls.
    if (globalThis.document === undefined) headers['User-Agent'] = USER_AGENT;
    const init = { method, headers, body: body === undefined ? undefined : encode(body) };
    // Repeating a call that got no answer (or a 503) must not store anything
    // twice: only reads and keyed calls are safe to repeat.
    const repeatable = method === 'GET' || method === 'HEAD' || idempotencyKey !== undefined;
    for (let attempt = 0; ; attempt += 1) {
      try {
        return await this.#attempt(`${method} ${path}`, url, init);
      } catch (error) {
        const pauseMs = retryPause(error, attempt, repeatable);
        if (pauseMs === undefined || attempt >= this.#maxRetries) throw error;
        await sleep(pauseMs);
      }
    }
  }

  /** One request, bounded by the timeout from sending to the body's end. */
  async #attempt(label, url, init) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), this.#timeoutMs);
    let response;
    let text;
    try {
      // Called unbound: a browser's fetch refuses any receiver but the global.
      const fetch = this.#fetch;
      response = await fetch(url, { ...init, signal: controller.signal });
      text = await response.text();
    } catch (cause) {
      const why = controller.signal.aborted
        ? `no answer within ${this.#timeoutMs} ms`
        : describe(cause);
      throw new OpgraphTransportError(`${label}: ${why}`, { cause });
    } finally {
      clearTimeout(timer);
    }
    return decode(label, response, text);
  }
}

export default Opgraph;

/**
 * The pause before the next attempt, or undefined when there is none
 * (docs/sdks.md, "Retries"):
 * - no answer: backoff, only when repeating cannot store twice;
 * - 429 with Retry-After: the cloud refused before doing anything, so any
 *   call waits it out;
 * - 503 with Retry-After: the store may have taken a write it could not
 *   answer, so only a call that cannot store twice waits it out;
 * - a 429 or 503 without Retry-After is an answer (strict health's report),
 *   and a wait over 60 s is the caller's to decide: neither is retried.
 */
function retryPause(error, attempt, repeatable) {
  if (error instanceof OpgraphTransportError) {
    return repeatable ? backoffMs(attempt) : undefined;
  }
  if (!(error instanceof OpgraphApiError)) return undefined;
  const refused = error.status === 429 || (error.status === 503 && repeatable);
  if (!refused || error.retryAfter === undefined || error.retryAfter > MAX_RETRY_AFTER_S) {
    return undefined;
  }
  return error.retryAfter * 1000;
}

function backoffMs(attempt) {
  return Math.min(FIRST_PAUSE_MS * 2 ** attempt, MAX_PAUSE_MS);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The answer's JSON, or the error it stands for. */
function decode(label, response, text) {
  let json;
  let isJson = false;
  if (text.trim() !== '') {
    try {
      json = JSON.parse(text);
      isJson = true;
    } catch {
      // Judged below: an error answer may be a proxy's HTML page.
    }
  }
  if (response.ok) {
    if (text.trim() === '') return null;
    if (!isJson) {
      throw new OpgraphTransportError(`${label}: the answer (HTTP ${response.status}) is not JSON`);
    }
    return json;
  }
  const detail = isJson && typeof json?.error === 'object' && json.error !== null ? json.error : {};
  throw new OpgraphApiError({
    status: response.status,
    code: typeof detail.code === 'string' ? detail.code : codeOf(response.status),
    message:
      typeof detail.message === 'string'
        ? detail.message
        : `${label}: HTTP ${response.status} ${response.statusText}`.trim(),
    field: typeof detail.field === 'string' ? detail.field : undefined,
    retryAfter: secondsOf(response.headers.get('retry-after')),
    body: isJson ? json : undefined,
  });
}

/**
 * The API's code for a status, for answers that did not come with one (a
 * proxy's page, strict health's report); the same table in all four SDKs.
 * A 400 has several codes, so it gets none of them.
 */
function codeOf(status) {
  const codes = {
    401: 'unauthorized',
    403: 'forbidden',
    404: 'not_found',
    405: 'method_not_allowed',
    409: 'conflict',
    413: 'payload_too_large',
    415: 'unsupported_media_type',
    429: 'rate_limited',
    500: 'internal',
    503: 'unavailable',
  };
  return codes[status] ?? `http_${status}`;
}

/** Retry-After in whole seconds: delta-seconds or an HTTP date. */
function secondsOf(value) {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  // An HTTP date names its month; Date.parse would read "-1" as a year.
  if (!/[a-z]/i.test(text)) return undefined;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - Date.now()) / 1000));
}

function listOf(answer, name, label) {
  const list = answer?.[name];
  if (!Array.isArray(list)) {
    throw new OpgraphTransportError(`${label}: the answer has no \`${name}\` list`);
  }
  return list;
}

/** What the runtime said about a failed fetch, as specific as it gets. */
function describe(cause) {
  // Node's fetch wraps the socket error (ECONNREFUSED, ...) in `cause`.
  const inner = cause?.cause?.message ?? cause?.cause?.code;
  const outer = cause?.message ?? String(cause);
  return inner ? `${outer} (${inner})` : outer;
}

/** JSON with Dates as the API's milliseconds, not ISO strings. */
function encode(body) {
  return JSON.stringify(body, function dates(key, value) {
    const raw = this[key];
    return raw instanceof Date ? raw.getTime() : value;
  });
}

function urlOf(base, path, query) {
  const url = new URL(base + path);
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value === undefined || value === null) continue;
    if (value instanceof Date) {
      url.searchParams.append(name, String(value.getTime()));
    } else if (['string', 'number', 'boolean'].includes(typeof value)) {
      url.searchParams.append(name, String(value));
    } else {
      throw new TypeError(`query parameter ${name} must be a string, number, boolean or Date`);
    }
  }
  return url.href;
}

function baseUrl(url) {
  let parsed;
  try {
    parsed = new URL(String(url));
  } catch {
    throw new TypeError(`url must be an absolute http(s) URL, not ${url}`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new TypeError(`url must use http or https, not ${parsed.protocol}`);
  }
  if (parsed.search || parsed.hash) {
    throw new TypeError('url must not have a query or fragment');
  }
  return `${parsed.origin}${parsed.pathname.replace(/\/+$/, '')}`;
}

function headerSetting(name, value) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string' || value === '') {
    throw new TypeError(`${name} must be a non-empty string`);
  }
  if (HEADER_BREAKS.test(value)) {
    throw new TypeError(`${name} must not contain line breaks or NUL characters`);
  }
  return value;
}

/**
 * A setting as given, or undefined when it counts as not given: missing, or
 * a string of nothing but spaces, tabs and line breaks (the same rule in all
 * four SDKs), so that `OPGRAPH_WORKSPACE_ID=` or `apiKey: ''` falls through
 * to the next source instead of sending an empty header.
 */
function given(value) {
  if (value === undefined || value === null) return undefined;
  return typeof value === 'string' && BLANK.test(value) ? undefined : value;
}

/** An environment variable where there is one; Deno may deny the read. */
function fromEnv(name) {
  try {
    return given(globalThis.process?.env?.[name]);
  } catch {
    return undefined;
  }
}

async function randomKey() {
  if (typeof globalThis.crypto?.randomUUID === 'function') return globalThis.crypto.randomUUID();
  // Node 18 keeps Web Crypto off the global object; the name is a variable
  // so that bundlers for browsers do not try to resolve it.
  const nodeCrypto = 'node:crypto';
  const { randomUUID } = await import(nodeCrypto);
  return randomUUID();
}
