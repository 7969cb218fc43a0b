// Compiled, never run (`tsc -p types/tsconfig.json`, from tests/tests/sdks.rs):
// index.d.ts is written by hand, and test/declarations.test.js only checks
// that it names what index.js exports. This file uses every export, method,
// option and error the way the README does, so the compiler checks that the
// declarations accept what the README promises and refuse misuse.
//
// - The README's TypeScript examples are copied below line for line (only
//   indented, inside blocks so that their names do not clash);
//   test/readme.test.js fails when the two drift apart.
// - Option objects are built as `Required<...>`, so a declared option that
//   this file does not pass fails to compile; `Equal` pins the exports and
//   the client's members, so a new one fails too until it is covered here.
// - `@ts-expect-error` lines prove that misuse is refused: each fails to
//   compile if its line stops being an error.

import { Opgraph, OpgraphApiError } from 'opgraph';

import DefaultOpgraph, * as sdk from '../index.js';
import {
  OpgraphError,
  OpgraphTransportError,
  VERSION,
  type AgentContext,
  type AgentContextMode,
  type AgentContextOptions,
  type Anomaly,
  type AttributionRow,
  type BusinessHealth,
  type CreateTrackableOptions,
  type CreatedTrackable,
  type EnforceRequest,
  type EnforceResult,
  type EnforcementCheck,
  type EventDiff,
  type EventEnvelope,
  type EventFilters,
  type EventTotals,
  type GraphQLError,
  type HealthReport,
  type IngestOptions,
  type IngestResult,
  type JsonObject,
  type MetricsOptions,
  type MetricsResult,
  type Millis,
  type NextAction,
  type OpgraphOptions,
  type Outcome,
  type Party,
  type Period,
  type PeriodTotals,
  type RequestOptions,
  type SearchFilters,
  type SearchResult,
  type StoredEvent,
  type TrackOptions,
  type Trackable,
  type TrackableKind,
  type TrustTier,
  type UsageReport,
  type WhatsChangedOptions,
  type WhatsChangedResult,
} from '../index.js';

/** True when A and B are the same type (not merely assignable). */
type Equal<A, B> =
  (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only when given `true`. */
function assert<T extends true>(): void {}

// The README imports `opgraph`; it must resolve, through package.json's
// `exports`, to the same declarations as `../index.js`.
assert<Equal<typeof Opgraph, typeof sdk.Opgraph>>();
assert<Equal<typeof OpgraphApiError, typeof sdk.OpgraphApiError>>();
assert<Equal<typeof DefaultOpgraph, typeof Opgraph>>();

// Every value export, and every member of the client: a new one fails here
// until this file uses it.
assert<
  Equal<
    keyof typeof sdk,
    'VERSION' | 'Opgraph' | 'OpgraphError' | 'OpgraphApiError' | 'OpgraphTransportError' | 'default'
  >
>();
assert<
  Equal<
    keyof Opgraph,
    | 'url'
    | 'workspace'
    | 'ingest'
    | 'events'
    | 'search'
    | 'metrics'
    | 'whatsChanged'
    | 'businessHealth'
    | 'agentContext'
    | 'graphql'
    | 'enforce'
    | 'track'
    | 'createTrackable'
    | 'usage'
    | 'health'
    | 'request'
  >
>();

const version: string = VERSION;

declare const myFetch: typeof fetch;

// ---- The README's examples, in its order ----

// "A first call", "Calls" and "Errors".
{
  // Reads OPGRAPH_URL (else http://127.0.0.1:8080), OPGRAPH_API_KEY and
  // OPGRAPH_WORKSPACE_ID.
  const opgraph = new Opgraph();

  const { ids } = await opgraph.ingest({
    event: 'order.created',
    actor: { type: 'customer', id: 'cus_42' },
    properties: { sku: 'DOCK-3', quantity: 2 },
    outcome: { revenue: 59.9, currency: 'EUR' },
  });
  console.log('stored', ids);

  const recent = await opgraph.events({ event: 'order.created', limit: 10 });
  const data = await opgraph.graphql<{ events: { id: string; event: string }[] }>(
    'query ($n: Int) { events(limit: $n) { id event } }',
    { n: 5 },
  );

  assert<Equal<typeof ids, string[]>>();
  assert<Equal<typeof recent, StoredEvent[]>>();
  assert<Equal<typeof data, { events: { id: string; event: string }[] }>>();

  await opgraph.ingest([{ event: 'door.opened' }, { event: 'door.closed' }]);

  const { apiKey } = await opgraph.request<{ apiKey: string }>('POST', '/api/keys', {
    body: { name: 'dashboard', scopes: ['read'] },
  });
  assert<Equal<typeof apiKey, string>>();

  try {
    await opgraph.ingest([{ event: 'ok' }, { properties: {} } as any]);
  } catch (error) {
    if (error instanceof OpgraphApiError && error.code === 'validation_failed') {
      console.error(`${error.field}: ${error.message}`); // batch[1].event: ...
    } else {
      throw error;
    }
  }
}

// "Settings".
{
  const opgraph = new Opgraph({
    url: 'https://opgraph.example.com', // default OPGRAPH_URL, else http://127.0.0.1:8080
    apiKey: 'og_...',                   // default OPGRAPH_API_KEY; an enterprise token works too
    workspace: 'ws_...',                // default OPGRAPH_WORKSPACE_ID; sent as
                                        // X-Opgraph-Workspace-ID (tokens naming several)
    timeoutMs: 30_000,                  // per attempt, until the whole answer is read
    maxRetries: 3,
    fetch: myFetch,                     // default the runtime's fetch
  });
  const url: string = opgraph.url;
  const workspace: string | undefined = opgraph.workspace;
}

// ---- Every call with every option ----

const settings: Required<OpgraphOptions> = {
  url: 'http://127.0.0.1:8080',
  apiKey: 'og_x',
  workspace: 'ws_x',
  timeoutMs: 5_000,
  maxRetries: 0,
  fetch: globalThis.fetch,
};
const opgraph = new DefaultOpgraph(settings);

// ingest: one event with every field, then a batch; a Date is a time too.
const actor: Party = { type: 'customer', id: 'cus_42', tier: 'gold' };
const object: Party = 'order_7';
const tier: TrustTier = 'T2';
const when: Millis = new Date();
const event: Required<EventEnvelope> = {
  event: 'order.created',
  businessId: 'shop_1',
  actor,
  object,
  entity: { type: 'order', id: 'order_7', name: 'Order 7', properties: { lines: 2 } },
  traceId: 'trace_1',
  source: { kind: 'webhook' },
  attribution: { campaign: 'spring' },
  context: { ip: '10.0.0.1' },
  trackable: { kind: 'qr_code', code: 'abc' },
  decisionId: 'dec_1',
  proofId: 'prf_1',
  outcome: { revenue: 59.9, currency: 'EUR' },
  trustTier: tier,
  complianceMapping: { gdpr: 'art6' },
  properties: { sku: 'DOCK-3' },
  timestamp: when,
  messageId: 'msg_1',
};
const ingestOptions: Required<IngestOptions> = { idempotencyKey: 'key-1' };
const ingested: IngestResult = await opgraph.ingest(event, ingestOptions);
const accepted: number = ingested.accepted;
await opgraph.ingest([event, { event: 'door.opened', timestamp: 1_700_000_000_000 }]);

// events
const eventFilters: Required<EventFilters> = {
  event: 'order.created',
  traceId: 'trace_1',
  businessId: 'shop_1',
  from: new Date(0),
  to: Date.now(),
  limit: 1000,
};
const events: StoredEvent[] = await opgraph.events(eventFilters);
await opgraph.events();
for (const stored of events) {
  const id: string = stored.id;
  const receivedAt: number = stored.receivedAt;
  const at: number = stored.timestamp;
  const business: string = stored.businessId;
  const trust: TrustTier = stored.trustTier;
  const name: string = stored.event;
  const who: Party | undefined = stored.actor;
}

// search
const searchFilters: Required<SearchFilters> = {
  event: 'order.created',
  businessId: 'shop_1',
  from: 0,
  to: new Date(),
  limit: 10,
};
const found: SearchResult = await opgraph.search('DOCK-3', searchFilters);
await opgraph.search('DOCK-3');
const firstFound: StoredEvent | undefined = found.results[0];
const foundTotal: number = found.total;
const capped: boolean = found.totalCapped;

// metrics
const metricsOptions: Required<MetricsOptions> = {
  eventName: 'order.created',
  from: new Date(0),
  to: Date.now(),
  interval: 'day',
  limit: 50,
  businessId: 'shop_1',
  persistSnapshots: false,
  uniqueActors: false,
};
const metrics: MetricsResult = await opgraph.metrics(metricsOptions);
await opgraph.metrics();
const totals: EventTotals[] = metrics.metrics;
for (const row of totals) {
  const counted: [string, number, number | undefined, number] = [
    row.eventName,
    row.count,
    row.uniqueActors,
    row.revenue,
  ];
}
const metricNumbers: number[] = [
  metrics.from,
  metrics.to,
  metrics.totalEvents,
  metrics.totalRevenue,
];
const buckets: number[] | undefined = metrics.series?.map((b) => b.bucket + b.count + b.revenue);
const definitions: JsonObject[] = metrics.definitions;
const snapshotIds: string[] | undefined = metrics.snapshotIds;

// whatsChanged
const current: Period = { from: Date.now() - 86_400_000, to: new Date() };
const changedOptions: Required<WhatsChangedOptions> = {
  businessId: 'shop_1',
  current,
  previous: { from: 0, to: 86_400_000 },
  limit: 20,
};
const changed: WhatsChangedResult = await opgraph.whatsChanged(changedOptions);
await opgraph.whatsChanged();
const periods: PeriodTotals[] = [changed.current, changed.previous];
const periodNumbers: number[] = periods.map((p) => p.from + p.to + p.totalEvents + p.revenue);
const revenueDelta: number = changed.revenueDelta;
const diffs: EventDiff[] = changed.eventDiffs;
for (const diff of diffs) {
  const fields: [string, number, number, number, number | null] = [
    diff.event,
    diff.current,
    diff.previous,
    diff.delta,
    diff.pctChange,
  ];
}
const appeared: string[] = changed.newEventTypes;
const disappeared: string[] = changed.disappearedEventTypes;

// businessHealth
const health: BusinessHealth = await opgraph.businessHealth('shop_1', { limit: 5 });
await opgraph.businessHealth('shop_1');
const healthNumbers: number[] = [
  health.healthScore,
  health.revenue,
  health.scans,
  health.leads,
  health.orders,
];
const healthBusiness: string = health.businessId;
const components: JsonObject = health.healthComponents;
const healthEvents: StoredEvent[] = health.recentEvents;
const healthTotals: EventTotals[] = health.metrics;
const attributionRows: AttributionRow[] = [
  ...health.attribution.bySource,
  ...health.attribution.byCampaign,
  ...health.attribution.byChannel,
  ...health.attribution.byEntity,
];
for (const row of attributionRows) {
  const fields: [string, number, number, number] = [
    row.key,
    row.touchpoints,
    row.conversions,
    row.revenue,
  ];
}
for (const alert of health.alerts) {
  const fields: [string, string, string, number | null] = [
    alert.kind,
    alert.severity,
    alert.message,
    alert.at,
  ];
}
const workflows: JsonObject[] = health.workflows;
const healthActions: NextAction[] = health.nextActions;

// agentContext, in each mode
const modes: AgentContextMode[] = [
  'summarize',
  'recommend_next_actions',
  'detect_anomalies',
  'proof_gaps',
];
const contextOptions: Required<AgentContextOptions> = { businessId: 'shop_1', limit: 10 };
const context: AgentContext = await opgraph.agentContext('summarize', contextOptions);
for (const mode of modes) await opgraph.agentContext(mode);
const contextMode: AgentContextMode = context.mode;
const contextFields: [string, number, string] = [
  context.businessId,
  context.generatedAt,
  context.summary,
];
const contextChanges: WhatsChangedResult | null = context.changes;
const anomalies: Anomaly[] = context.anomalies;
for (const anomaly of anomalies) {
  const direction: 'spike' | 'drop' = anomaly.direction;
  const fields: [string, number, number, number, number, number] = [
    anomaly.eventName,
    anomaly.hour,
    anomaly.observed,
    anomaly.expected,
    anomaly.stdDev,
    anomaly.zScore,
  ];
}
const missingProof: StoredEvent[] = context.missingProofEvents;
for (const action of context.nextActions) {
  const fields: [string, string, boolean, string | undefined] = [
    action.action,
    action.reason,
    action.governed,
    action.decisionObjectId,
  ];
}

// graphql: `data` typed by the caller, else a record of fields.
const untyped = await opgraph.graphql('{ events { id } }');
assert<Equal<typeof untyped, { [field: string]: unknown }>>();
await opgraph.graphql('query ($n: Int) { events(limit: $n) { id } }', { n: 1 });

// enforce
const enforceRequest: Required<EnforceRequest> = {
  decisionObjectId: 'do_1',
  authorityGrantId: 'ag_1',
  contextContractId: 'cc_1',
  proposedAction: { action: 'refund', amount: 20, currency: 'EUR', actor: 'agent_1', note: 'x' },
  attestation: [{ kind: 'signature' }],
  traceId: 'trace_1',
  eventId: 'evt_1',
  complianceMapping: { sox: '404' },
};
const enforced: EnforceResult = await opgraph.enforce(enforceRequest);
await opgraph.enforce({
  decisionObjectId: 'do_1',
  authorityGrantId: 'ag_1',
  contextContractId: 'cc_1',
  proposedAction: { action: 'notify' },
  attestation: { kind: 'signature' },
});
const outcome: Outcome = enforced.outcome;
const outcomes: Outcome[] = ['allow', 'escrow', 'needs_human_approval', 'deny'];
const receiptId: string = enforced.receiptId;
const checks: EnforcementCheck[] = enforced.checks;
for (const check of checks) {
  const fields: [string, boolean, Outcome, string] = [
    check.check,
    check.passed,
    check.outcome,
    check.detail,
  ];
}
const receipt: [string, Outcome, string, string] = [
  enforced.receipt.id,
  enforced.receipt.outcome,
  enforced.receipt.contentHash,
  enforced.receipt.prevHash,
];

// createTrackable, of each kind, and track
const kinds: TrackableKind[] = [
  'qr_code',
  'barcode',
  'rfid_tag',
  'sensor',
  'robot',
  'ai_agent',
  'mcp_server',
  'cli_workflow',
];
const trackableOptions: Required<CreateTrackableOptions> = {
  targetUrl: 'https://example.com/menu',
  eventName: 'menu.scanned',
  code: 'urn:epc:id:sgtin:0614141.107346.2017',
  includeQrSvg: true,
};
const created: CreatedTrackable = await opgraph.createTrackable(
  'qr_code',
  'Menu',
  trackableOptions,
);
for (const kind of kinds) await opgraph.createTrackable(kind, `a ${kind}`);
const qrSvg: string | undefined = created.qrSvg;
const trackable: Trackable = created.trackable;
const trackableFields: [string, string, TrackableKind, string, string, number] = [
  trackable.id,
  trackable.code,
  trackable.kind,
  trackable.name,
  trackable.scanUrl,
  trackable.createdAt,
];
const trackableTargets: (string | null)[] = [trackable.targetUrl, trackable.eventName];
const trackOptions: Required<TrackOptions> = {
  event: 'robot.docked',
  properties: { dock: 3 },
  actor: 'robot_7',
  timestamp: new Date(),
  businessId: 'shop_1',
  idempotencyKey: 'use-1',
};
const tracked: IngestResult = await opgraph.track(trackable.code, trackOptions);
await opgraph.track(trackable.code);

// usage
const usage: UsageReport = await opgraph.usage({ limit: 10 });
await opgraph.usage();
const usageWorkspace: string = usage.workspaceId;
const usageNumbers: number[] = [usage.period.from, usage.period.to, usage.events.ingested];
const quota: [number | null, number | null] = [usage.events.quota, usage.events.remaining];
const apiCalls: number = usage.apiCalls;
const usageLists: JsonObject[] = [...usage.connectors, ...usage.agents];
const rateLimit: [number, number, number | null] = [
  usage.rateLimit.requestsPerSecond,
  usage.rateLimit.burst,
  usage.rateLimit.remaining,
];

// health
const report: HealthReport = await opgraph.health({ strict: true });
await opgraph.health();
const status: 'ok' | 'degraded' | 'fail' = report.status;
const cloudVersion: string = report.version;
for (const [name, check] of Object.entries(report.checks)) {
  const fields: [string, boolean, boolean] = [name, check.ok, check.required];
}

// request: every option, and the default answer type.
const requestOptions: Required<RequestOptions> = {
  body: { name: 'dashboard' },
  query: { limit: 5, from: new Date(), strict: true, cursor: null, after: undefined, q: 'x' },
  idempotencyKey: 'key-2',
};
const answer = await opgraph.request('PUT', '/api/things/1', requestOptions);
assert<Equal<typeof answer, unknown>>();
await opgraph.request('GET', '/api/health');

// ---- Errors ----

// Both errors are kinds of OpgraphError, which is an Error; their fields are
// read-only and typed as the README describes.
function describe(error: unknown): string {
  if (error instanceof OpgraphApiError) {
    const base: OpgraphError = error;
    const { status, code, field, retryAfter, errors, body } = error;
    assert<Equal<typeof status, number>>();
    assert<Equal<typeof code, string>>();
    assert<Equal<typeof field, string | undefined>>();
    assert<Equal<typeof retryAfter, number | undefined>>();
    assert<Equal<typeof errors, GraphQLError[] | undefined>>();
    assert<Equal<typeof body, unknown>>();
    for (const e of errors ?? []) {
      const where: string = `${e.message} ${e.locations?.[0]?.line}:${e.locations?.[0]?.column}`;
      const path: (string | number)[] | undefined = e.path;
      const extension: string | undefined = e.extensions?.code ?? e.extensions?.field;
    }
    return `${base.name} ${status} ${code} ${field} ${retryAfter} ${String(body)}`;
  }
  if (error instanceof OpgraphTransportError) {
    const base: OpgraphError = error;
    const cause = error.cause;
    assert<Equal<typeof cause, unknown>>();
    return `${base.message} ${String(cause)}`;
  }
  if (error instanceof OpgraphError) {
    const base: Error = error;
    return base.message;
  }
  return String(error);
}

// Tests and wrappers build errors themselves.
const apiError = new OpgraphApiError({
  status: 429,
  code: 'rate_limited',
  message: 'slow down',
  field: 'batch[0]',
  retryAfter: 1,
  errors: [{ message: 'bad', locations: [{ line: 1, column: 2 }], path: ['events', 0] }],
  body: { error: { code: 'rate_limited' } },
});
const transportError = new OpgraphTransportError('refused', { cause: new Error('ECONNREFUSED') });
const plainError = new OpgraphError('x');
const described: string[] = [apiError, transportError, plainError].map(describe);

// ---- Misuse the declarations must refuse ----

// A wrong option name.
// @ts-expect-error `timeout` is not an option (it is `timeoutMs`).
new Opgraph({ timeout: 5_000 });
// @ts-expect-error `idempotency_key` is not an option of ingest.
await opgraph.ingest({ event: 'x' }, { idempotency_key: 'k' });
// @ts-expect-error unknown top-level event fields are refused by the cloud.
await opgraph.ingest({ event: 'x', evnt: 'typo' });
// @ts-expect-error `includeQrSVG` is spelled `includeQrSvg`.
await opgraph.createTrackable('robot', 'r', { includeQrSVG: true });

// A missing required argument.
// @ts-expect-error search needs a query.
await opgraph.search();
// @ts-expect-error createTrackable needs a name.
await opgraph.createTrackable('robot');
// @ts-expect-error an event needs its name.
await opgraph.ingest({ properties: {} });
// @ts-expect-error enforce needs the three ids and the proposed action.
await opgraph.enforce({ decisionObjectId: 'do_1' });

// A wrong type.
// @ts-expect-error an event's name is a string.
await opgraph.ingest({ event: 42 });
// @ts-expect-error timeoutMs is a number of milliseconds.
new Opgraph({ timeoutMs: '30s' });
// @ts-expect-error there is no trust tier T5.
await opgraph.ingest({ event: 'x', trustTier: 'T5' });
// @ts-expect-error not a mode (it is spelled `summarize`).
await opgraph.agentContext('summarise');
// @ts-expect-error not a kind of trackable.
await opgraph.createTrackable('nfc', 'n');
// @ts-expect-error strict is a boolean.
await opgraph.health({ strict: 'yes' });
// @ts-expect-error query values are strings, numbers, booleans or Dates.
await opgraph.request('GET', '/api/events', { query: { ids: ['a', 'b'] } });
// @ts-expect-error the error's fields are read-only.
apiError.status = 500;
// @ts-expect-error the answer of ingest has no `id`, only `ids`.
ingested.id;
