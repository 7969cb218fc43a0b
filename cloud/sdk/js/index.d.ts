// Type declarations of the `opgraph` package, written by hand beside
// index.js. Answer types list the fields the API documents; the index
// signatures leave room for fields a newer cloud adds.

export declare const VERSION: string;

/** Milliseconds since the Unix epoch; a Date is sent as its milliseconds. */
export type Millis = number | Date;

/**
 * An empty `url`, `apiKey` or `workspace` (or one of only spaces, tabs and
 * line breaks) counts as not given, so its environment variable applies; an
 * empty variable counts as unset too.
 */
export interface OpgraphOptions {
  /** Default: `OPGRAPH_URL`, else `http://127.0.0.1:8080`. http or https only. */
  url?: string;
  /** An API key (`og_...`) or an enterprise token. Default: `OPGRAPH_API_KEY`. */
  apiKey?: string;
  /**
   * Sent as `X-Opgraph-Workspace-ID`; needed by a token naming several
   * workspaces. Default: `OPGRAPH_WORKSPACE_ID`.
   */
  workspace?: string;
  /** Per attempt, from sending to the end of the answer. Default 30000. */
  timeoutMs?: number;
  /**
   * Retries at most per call: after a 429 with Retry-After, a 503 with
   * Retry-After or a lost answer (the last two only for GET or keyed calls).
   * Default 3; 0 turns retries off.
   */
  maxRetries?: number;
  /** A fetch implementation to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
}

/** Who or what acted, or what was acted on: an id, or a typed object. */
export type Party = string | { type: string; id: string; [key: string]: unknown };

export type TrustTier = 'T0' | 'T1' | 'T2' | 'T3' | 'T4';

export type JsonObject = { [key: string]: unknown };

/** An event as sent to `ingest`. Unknown top-level fields are refused (400). */
export interface EventEnvelope {
  /** The event's name, e.g. `order.created`; 1 to 200 characters. */
  event: string;
  /** Default `default`. */
  businessId?: string;
  actor?: Party;
  object?: Party;
  /** A graph entity to upsert: `{type, id, name?, properties?}`. */
  entity?: JsonObject;
  traceId?: string;
  source?: JsonObject;
  attribution?: JsonObject;
  context?: JsonObject;
  /** `{kind, code}`; links the event to a registered trackable. */
  trackable?: JsonObject;
  decisionId?: string;
  proofId?: string;
  /** Outcome metrics, e.g. `{revenue, currency}`. */
  outcome?: JsonObject;
  /** Default `T0`. */
  trustTier?: TrustTier;
  complianceMapping?: JsonObject;
  properties?: JsonObject;
  /** Default: the time the cloud received it. */
  timestamp?: Millis;
  /** Makes a retry within 24 h store nothing new. */
  messageId?: string;
}

/** An event as stored: the envelope with its defaults, id and receive time. */
export interface StoredEvent extends Omit<EventEnvelope, 'timestamp'> {
  id: string;
  receivedAt: number;
  timestamp: number;
  businessId: string;
  trustTier: TrustTier;
  [key: string]: unknown;
}

export interface IngestOptions {
  /** Default: a random key made once per call and kept across its retries. */
  idempotencyKey?: string;
}

export interface IngestResult {
  accepted: number;
  /** `evt_...`, in the order sent. */
  ids: string[];
}

export interface EventFilters {
  event?: string;
  traceId?: string;
  businessId?: string;
  /** Event time at or after. */
  from?: Millis;
  /** Event time before. */
  to?: Millis;
  /** Default 100, at most 1000. */
  limit?: number;
}

export interface SearchFilters {
  event?: string;
  businessId?: string;
  from?: Millis;
  to?: Millis;
  limit?: number;
}

export interface SearchResult {
  /** Newest first. */
  results: StoredEvent[];
  /** Matches in all, counted up to 10 000. */
  total: number;
  totalCapped: boolean;
}

export interface MetricsOptions {
  eventName?: string;
  /** Default: 30 days before `to`. */
  from?: Millis;
  /** Default: now. */
  to?: Millis;
  interval?: 'hour' | 'day';
  limit?: number;
  businessId?: string;
  persistSnapshots?: boolean;
  /** Default true; false makes long ranges cheap. */
  uniqueActors?: boolean;
}

export interface EventTotals {
  eventName: string;
  count: number;
  uniqueActors?: number;
  revenue: number;
}

export interface MetricsResult {
  from: number;
  to: number;
  metrics: EventTotals[];
  totalEvents: number;
  totalRevenue: number;
  series?: { bucket: number; count: number; revenue: number }[];
  definitions: JsonObject[];
  snapshotIds?: string[];
  [key: string]: unknown;
}

export interface Period {
  from: Millis;
  to: Millis;
}

export interface WhatsChangedOptions {
  businessId?: string;
  /** Default: the last 7 days. */
  current?: Period;
  /** Default: as long as `current`, right before it. */
  previous?: Period;
  limit?: number;
}

export interface PeriodTotals {
  from: number;
  to: number;
  totalEvents: number;
  revenue: number;
}

export interface EventDiff {
  event: string;
  current: number;
  previous: number;
  delta: number;
  /** Null when the previous count is 0. */
  pctChange: number | null;
}

export interface WhatsChangedResult {
  current: PeriodTotals;
  previous: PeriodTotals;
  revenueDelta: number;
  eventDiffs: EventDiff[];
  newEventTypes: string[];
  disappearedEventTypes: string[];
  [key: string]: unknown;
}

export interface NextAction {
  action: string;
  reason: string;
  /** Whether taking it goes through governance first. */
  governed: boolean;
  decisionObjectId?: string;
}

export interface Anomaly {
  eventName: string;
  hour: number;
  observed: number;
  expected: number;
  stdDev: number;
  zScore: number;
  direction: 'spike' | 'drop';
}

export interface AttributionRow {
  key: string;
  touchpoints: number;
  conversions: number;
  revenue: number;
}

export interface BusinessHealth {
  businessId: string;
  /** 0 to 100. */
  healthScore: number;
  healthComponents: JsonObject;
  revenue: number;
  scans: number;
  leads: number;
  orders: number;
  recentEvents: StoredEvent[];
  metrics: EventTotals[];
  attribution: {
    bySource: AttributionRow[];
    byCampaign: AttributionRow[];
    byChannel: AttributionRow[];
    byEntity: AttributionRow[];
    [key: string]: unknown;
  };
  alerts: { kind: string; severity: string; message: string; at: number | null }[];
  workflows: JsonObject[];
  nextActions: NextAction[];
  [key: string]: unknown;
}

export type AgentContextMode =
  | 'summarize'
  | 'recommend_next_actions'
  | 'detect_anomalies'
  | 'proof_gaps';

export interface AgentContextOptions {
  /** Default `default`. */
  businessId?: string;
  limit?: number;
}

export interface AgentContext {
  mode: AgentContextMode;
  businessId: string;
  generatedAt: number;
  /** One paragraph for an agent's prompt. */
  summary: string;
  /** Only for `summarize`. */
  changes: WhatsChangedResult | null;
  anomalies: Anomaly[];
  missingProofEvents: StoredEvent[];
  nextActions: NextAction[];
  [key: string]: unknown;
}

export interface GraphQLError {
  message: string;
  locations?: { line: number; column: number }[];
  path?: (string | number)[];
  extensions?: { code?: string; field?: string; [key: string]: unknown };
}

export type Outcome = 'allow' | 'escrow' | 'needs_human_approval' | 'deny';

export interface EnforceRequest {
  decisionObjectId: string;
  authorityGrantId: string;
  contextContractId: string;
  proposedAction: {
    action: string;
    amount?: number;
    /** Three upper-case letters; required with `amount`. */
    currency?: string;
    actor?: string;
    [key: string]: unknown;
  };
  attestation?: JsonObject | JsonObject[];
  traceId?: string;
  eventId?: string;
  complianceMapping?: JsonObject;
}

export interface EnforcementCheck {
  check: string;
  passed: boolean;
  outcome: Outcome;
  detail: string;
}

export interface EnforceResult {
  outcome: Outcome;
  /** `rcp_...` */
  receiptId: string;
  checks: EnforcementCheck[];
  /** The immutable, hash-chained receipt recorded for this call. */
  receipt: JsonObject & { id: string; outcome: Outcome; contentHash: string; prevHash: string };
}

export type TrackableKind =
  | 'qr_code'
  | 'barcode'
  | 'rfid_tag'
  | 'sensor'
  | 'robot'
  | 'ai_agent'
  | 'mcp_server'
  | 'cli_workflow';

export interface CreateTrackableOptions {
  /** http(s); required for `qr_code`. */
  targetUrl?: string;
  /** Event recorded on use. */
  eventName?: string;
  /** An external identifier (an EPC, a GTIN); default a generated code. */
  code?: string;
  /** Adds `qrSvg` to the answer. */
  includeQrSvg?: boolean;
}

export interface Trackable {
  /** `trk_...` */
  id: string;
  code: string;
  kind: TrackableKind;
  name: string;
  targetUrl: string | null;
  eventName: string | null;
  scanUrl: string;
  createdAt: number;
  [key: string]: unknown;
}

export interface CreatedTrackable {
  trackable: Trackable;
  /** Only with `includeQrSvg`. */
  qrSvg?: string;
}

export interface TrackOptions {
  /** Default: the trackable's `eventName`, then `trackable.used`. */
  event?: string;
  properties?: JsonObject;
  actor?: Party;
  timestamp?: Millis;
  businessId?: string;
  /** Default: a random UUID made once per call and kept across its retries. */
  idempotencyKey?: string;
}

export interface UsageReport {
  workspaceId: string;
  period: { from: number; to: number };
  events: { ingested: number; quota: number | null; remaining: number | null };
  apiCalls: number;
  connectors: JsonObject[];
  agents: JsonObject[];
  rateLimit: { requestsPerSecond: number; burst: number; remaining: number | null };
  [key: string]: unknown;
}

export interface HealthReport {
  status: 'ok' | 'degraded' | 'fail';
  version: string;
  /** `store`, `config`, `integrations`, `rateLimiting`, `usageMetering`. */
  checks: { [name: string]: JsonObject & { ok: boolean; required: boolean } };
}

export interface RequestOptions {
  /** Sent as JSON. */
  body?: unknown;
  /** Undefined and null values are left out. */
  query?: { [name: string]: string | number | boolean | Date | null | undefined };
  /** Makes a write repeatable: a lost answer, or a 503 with Retry-After, is then retried. */
  idempotencyKey?: string;
}

/** The base of both errors a call can throw. */
export declare class OpgraphError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
}

/** An answer outside 2xx, or a GraphQL answer with `errors`. */
export declare class OpgraphApiError extends OpgraphError {
  constructor(detail: {
    status: number;
    code: string;
    message: string;
    field?: string;
    retryAfter?: number;
    errors?: GraphQLError[];
    body?: unknown;
  });
  /** The HTTP status; 200 for GraphQL errors. */
  readonly status: number;
  /** The API's code (`validation_failed`, `rate_limited`, ...) or `graphql`. */
  readonly code: string;
  /** The JSON path of the offending input, e.g. `batch[3].event`. */
  readonly field: string | undefined;
  /** Seconds the cloud asked to wait (`Retry-After`), when the answer had one. */
  readonly retryAfter: number | undefined;
  /** The GraphQL errors, for code `graphql`. */
  readonly errors: GraphQLError[] | undefined;
  /** The decoded answer, when it was JSON (strict health's report on its 503). */
  readonly body: unknown;
}

/** No usable answer: refused, timed out, TLS failure, or not JSON. */
export declare class OpgraphTransportError extends OpgraphError {
  constructor(message?: string, options?: { cause?: unknown });
  /** What the runtime raised, when it raised something. */
  readonly cause: unknown;
}

export declare class Opgraph {
  constructor(options?: OpgraphOptions);
  /** The cloud's base URL, without a trailing slash. */
  readonly url: string;
  readonly workspace: string | undefined;

  /** One event, or an array of at most 1000 stored all-or-nothing. */
  ingest(
    eventOrEvents: EventEnvelope | EventEnvelope[],
    options?: IngestOptions,
  ): Promise<IngestResult>;
  /** Stored events, newest first. */
  events(filters?: EventFilters): Promise<StoredEvent[]>;
  search(query: string, filters?: SearchFilters): Promise<SearchResult>;
  metrics(options?: MetricsOptions): Promise<MetricsResult>;
  whatsChanged(options?: WhatsChangedOptions): Promise<WhatsChangedResult>;
  businessHealth(businessId: string, options?: { limit?: number }): Promise<BusinessHealth>;
  agentContext(mode: AgentContextMode, options?: AgentContextOptions): Promise<AgentContext>;
  /** The answer's `data`; throws OpgraphApiError (code `graphql`) on `errors`. */
  graphql<T = { [field: string]: unknown }>(
    query: string,
    variables?: { [name: string]: unknown },
  ): Promise<T>;
  enforce(request: EnforceRequest): Promise<EnforceResult>;
  track(code: string, options?: TrackOptions): Promise<IngestResult>;
  createTrackable(
    kind: TrackableKind,
    name: string,
    options?: CreateTrackableOptions,
  ): Promise<CreatedTrackable>;
  usage(options?: { limit?: number }): Promise<UsageReport>;
  /** With `strict`, a failed required check throws OpgraphApiError 503 (report in `body`). */
  health(options?: { strict?: boolean }): Promise<HealthReport>;
  /** Any other call; resolves to the answer's JSON (null for an empty body). */
  request<T = unknown>(method: string, path: string, options?: RequestOptions): Promise<T>;
}

export default Opgraph;
