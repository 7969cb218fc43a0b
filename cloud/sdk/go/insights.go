package opgraph

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
)

// MetricsQuery is the question of [Client.Metrics]; zero fields take the
// cloud's defaults (the last 30 days, every event name).
type MetricsQuery struct {
	// EventName keeps only this event.
	EventName string `json:"eventName,omitempty"`
	// From is the range's start, ms.
	From int64 `json:"from,omitempty"`
	// To is the range's end, ms.
	To int64 `json:"to,omitempty"`
	// Interval, "hour" or "day", adds a Series.
	Interval string `json:"interval,omitempty"`
	// Limit bounds the per-event rows (0: the cloud's default, 100).
	Limit int `json:"limit,omitempty"`
	// BusinessID keeps only this business.
	BusinessID string `json:"businessId,omitempty"`
	// PersistSnapshots keeps the definitions' values as snapshots.
	PersistSnapshots bool `json:"persistSnapshots,omitempty"`
	// UniqueActors counts distinct actors per event.
	UniqueActors bool `json:"uniqueActors,omitempty"`
}

// EventTotals are one event name's numbers over a range.
type EventTotals struct {
	// EventName is the event's name.
	EventName string `json:"eventName"`
	// Count counts its events.
	Count int64 `json:"count"`
	// UniqueActors counts distinct actor ids; nil unless asked for.
	UniqueActors *int64 `json:"uniqueActors,omitempty"`
	// Revenue sums outcome.revenue (else attribution.revenue).
	Revenue float64 `json:"revenue"`
}

// MetricsBucket is one hour or day of a metrics series.
type MetricsBucket struct {
	// Bucket is the start of the hour or day, ms.
	Bucket int64 `json:"bucket"`
	// Count counts the events in it.
	Count int64 `json:"count"`
	// Revenue sums their revenue.
	Revenue float64 `json:"revenue"`
}

// MetricsResult is the answer of [Client.Metrics].
type MetricsResult struct {
	// From and To are the range answered, ms.
	From int64 `json:"from"`
	// To is the range's end, ms.
	To int64 `json:"to"`
	// Metrics are per-event totals, the most frequent first.
	Metrics []EventTotals `json:"metrics"`
	// TotalEvents counts every event of the range.
	TotalEvents int64 `json:"totalEvents"`
	// TotalRevenue sums the range's revenue.
	TotalRevenue float64 `json:"totalRevenue"`
	// Series is the hourly or daily series, when an Interval was asked.
	Series []MetricsBucket `json:"series,omitempty"`
	// Definitions are the workspace's metric definitions evaluated:
	// {definition, count, value}.
	Definitions []map[string]any `json:"definitions"`
	// SnapshotIDs are the snapshots kept, when PersistSnapshots was set.
	SnapshotIDs []string `json:"snapshotIds,omitempty"`
}

// Metrics counts events and sums revenue per event name over a range
// (POST /api/metrics/query).
func (c *Client) Metrics(ctx context.Context, query MetricsQuery) (*MetricsResult, error) {
	var out MetricsResult
	if err := c.Do(ctx, http.MethodPost, "/api/metrics/query", nil, query, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Period is a time range, ms since the Unix epoch.
type Period struct {
	// From is the start, ms.
	From int64 `json:"from"`
	// To is the end, ms.
	To int64 `json:"to"`
}

// WhatsChangedQuery is the question of [Client.WhatsChanged]; by default
// the last 7 days against the 7 before.
type WhatsChangedQuery struct {
	// BusinessID keeps only this business.
	BusinessID string `json:"businessId,omitempty"`
	// Current is the period judged (default: the last 7 days).
	Current *Period `json:"current,omitempty"`
	// Previous is the period compared with (default: as long as Current,
	// right before it).
	Previous *Period `json:"previous,omitempty"`
	// Limit bounds EventDiffs (0: the cloud's default, 100).
	Limit int `json:"limit,omitempty"`
}

// PeriodTotals are a period's totals.
type PeriodTotals struct {
	// From is the start, ms.
	From int64 `json:"from"`
	// To is the end, ms.
	To int64 `json:"to"`
	// TotalEvents counts the period's events.
	TotalEvents int64 `json:"totalEvents"`
	// Revenue sums the period's revenue.
	Revenue float64 `json:"revenue"`
}

// EventDiff is one event name's change between two periods.
type EventDiff struct {
	// Event is the event's name.
	Event string `json:"event"`
	// Current counts it in the current period.
	Current int64 `json:"current"`
	// Previous counts it in the previous period.
	Previous int64 `json:"previous"`
	// Delta is Current - Previous.
	Delta int64 `json:"delta"`
	// PctChange is the change in percent; nil when Previous is 0.
	PctChange *float64 `json:"pctChange"`
}

// WhatsChanged is a period-over-period diff.
type WhatsChanged struct {
	// Current are the current period's totals.
	Current PeriodTotals `json:"current"`
	// Previous are the previous period's totals.
	Previous PeriodTotals `json:"previous"`
	// RevenueDelta is the current revenue minus the previous.
	RevenueDelta float64 `json:"revenueDelta"`
	// EventDiffs are the largest absolute changes first.
	EventDiffs []EventDiff `json:"eventDiffs"`
	// NewEventTypes are seen now and not before.
	NewEventTypes []string `json:"newEventTypes"`
	// DisappearedEventTypes were seen before and not now.
	DisappearedEventTypes []string `json:"disappearedEventTypes"`
}

// WhatsChanged compares two periods (POST /api/analytics/whats-changed).
func (c *Client) WhatsChanged(ctx context.Context, query WhatsChangedQuery) (*WhatsChanged, error) {
	var out WhatsChanged
	if err := c.Do(ctx, http.MethodPost, "/api/analytics/whats-changed", nil, query, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NextAction is an action the cloud recommends.
type NextAction struct {
	// Action says what to do.
	Action string `json:"action"`
	// Reason says why.
	Reason string `json:"reason"`
	// Governed is true when taking it goes through governance first.
	Governed bool `json:"governed"`
	// DecisionObjectID is the decision it waits on, if any.
	DecisionObjectID string `json:"decisionObjectId,omitempty"`
}

// Alert is something about a business that needs attention.
type Alert struct {
	// Kind is "anomaly", "run_failed", "connector_rejects", "proof_gap" or
	// "no_recent_events".
	Kind string `json:"kind"`
	// Severity is "info", "warning" or "critical".
	Severity string `json:"severity"`
	// Message says what, for a human.
	Message string `json:"message"`
	// At is when it happened, ms, when it has one time.
	At *int64 `json:"at"`
}

// BusinessHealth is the operating health of one business.
type BusinessHealth struct {
	// BusinessID is the business's id.
	BusinessID string `json:"businessId"`
	// HealthScore is 0 to 100 (formula in the cloud's docs/queries.md).
	HealthScore int `json:"healthScore"`
	// HealthComponents are the parts of the score.
	HealthComponents map[string]any `json:"healthComponents"`
	// Revenue is the last 30 days' revenue.
	Revenue float64 `json:"revenue"`
	// Scans counts the last 30 days' scan events.
	Scans int64 `json:"scans"`
	// Leads counts the last 30 days' leads.
	Leads int64 `json:"leads"`
	// Orders counts the last 30 days' orders.
	Orders int64 `json:"orders"`
	// RecentEvents are the newest events.
	RecentEvents []StoredEvent `json:"recentEvents"`
	// Metrics are the last 30 days' per-event totals, the 20 most frequent.
	Metrics []EventTotals `json:"metrics"`
	// Attribution is last-touch attribution of the last 30 days:
	// bySource, byCampaign, byChannel, byEntity.
	Attribution map[string]any `json:"attribution"`
	// Alerts need attention.
	Alerts []Alert `json:"alerts"`
	// Workflows are the workflow, robot and agent runs of the last 7 days.
	Workflows []map[string]any `json:"workflows"`
	// NextActions are recommended actions.
	NextActions []NextAction `json:"nextActions"`
}

// ReadOption is a setting of a read that takes no query struct:
// [Client.BusinessHealth] and [Client.Usage].
type ReadOption func(*readSettings)

type readSettings struct {
	limit int
}

// WithLimit bounds the lists of the answer: the recent events and runs of
// [Client.BusinessHealth], the agents of [Client.Usage] (0: the cloud's
// default, 100; at most 1000).
func WithLimit(n int) ReadOption { return func(s *readSettings) { s.limit = n } }

// queryOf is the query string of a read's options.
func queryOf(opts []ReadOption) url.Values {
	var s readSettings
	for _, opt := range opts {
		opt(&s)
	}
	query := url.Values{}
	setInt(query, "limit", int64(s.limit))
	return query
}

// BusinessHealth reports a business's health ("default" is the
// workspace's default business) (GET /api/businesses/{id}/health).
// [WithLimit] bounds its recent events and runs.
func (c *Client) BusinessHealth(ctx context.Context, businessID string, opts ...ReadOption) (*BusinessHealth, error) {
	if businessID == "" {
		return nil, errEmptyID
	}
	var out BusinessHealth
	path := "/api/businesses/" + url.PathEscape(businessID) + "/health"
	if err := c.Do(ctx, http.MethodGet, path, queryOf(opts), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AgentMode is what [Client.AgentContext] is asked for.
type AgentMode string

// The agent context modes.
const (
	// ModeSummarize asks for everything.
	ModeSummarize AgentMode = "summarize"
	// ModeRecommendNextActions asks for NextActions only.
	ModeRecommendNextActions AgentMode = "recommend_next_actions"
	// ModeDetectAnomalies asks for Anomalies only.
	ModeDetectAnomalies AgentMode = "detect_anomalies"
	// ModeProofGaps asks for MissingProofEvents only.
	ModeProofGaps AgentMode = "proof_gaps"
)

// AgentContextOptions narrow [Client.AgentContext].
type AgentContextOptions struct {
	// BusinessID is the business (default "default").
	BusinessID string `json:"businessId,omitempty"`
	// Limit bounds each list (0: the cloud's default, 100).
	Limit int `json:"limit,omitempty"`
}

// Anomaly is an hour whose count of an event is far from its baseline.
type Anomaly struct {
	// EventName is the event's name.
	EventName string `json:"eventName"`
	// Hour is the start of the hour judged, ms.
	Hour int64 `json:"hour"`
	// Observed counts the events of that hour.
	Observed int64 `json:"observed"`
	// Expected is the mean of the baseline hours.
	Expected float64 `json:"expected"`
	// StdDev is the baseline's standard deviation.
	StdDev float64 `json:"stdDev"`
	// ZScore is how many deviations Observed is from Expected.
	ZScore float64 `json:"zScore"`
	// Direction is "spike" or "drop".
	Direction string `json:"direction"`
}

// AgentContext is what an agent should know now.
type AgentContext struct {
	// Mode is the mode asked.
	Mode AgentMode `json:"mode"`
	// BusinessID is the business.
	BusinessID string `json:"businessId"`
	// GeneratedAt is when the answer was made, ms.
	GeneratedAt int64 `json:"generatedAt"`
	// Summary is one paragraph for an agent's prompt.
	Summary string `json:"summary"`
	// Changes are the last 7 days against the 7 before (summarize only).
	Changes *WhatsChanged `json:"changes"`
	// Anomalies are computed from hourly counts.
	Anomalies []Anomaly `json:"anomalies"`
	// MissingProofEvents are governed events below T3 without a proof.
	MissingProofEvents []StoredEvent `json:"missingProofEvents"`
	// NextActions are recommended, governed where they must be.
	NextActions []NextAction `json:"nextActions"`
}

// AgentContext gathers changes, anomalies, proof gaps and next actions for
// an agent (POST /api/intelligence/agent-context).
func (c *Client) AgentContext(ctx context.Context, mode AgentMode, opts AgentContextOptions) (*AgentContext, error) {
	body := struct {
		Mode AgentMode `json:"mode"`
		AgentContextOptions
	}{mode, opts}
	var out AgentContext
	if err := c.Do(ctx, http.MethodPost, "/api/intelligence/agent-context", nil, body, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Usage is the workspace's metering.
type Usage struct {
	// WorkspaceID is the workspace's id.
	WorkspaceID string `json:"workspaceId"`
	// Period is the metered period (this month).
	Period Period `json:"period"`
	// Events are the events ingested against the quota.
	Events struct {
		// Ingested counts the period's events.
		Ingested int64 `json:"ingested"`
		// Quota is the monthly quota; nil without one.
		Quota *int64 `json:"quota"`
		// Remaining is what is left of it; nil without one.
		Remaining *int64 `json:"remaining"`
	} `json:"events"`
	// APICalls counts the period's API calls.
	APICalls int64 `json:"apiCalls"`
	// Connectors is the load of each connector.
	Connectors []map[string]any `json:"connectors"`
	// Agents is the activity of each agent.
	Agents []map[string]any `json:"agents"`
	// RateLimit is the rate limit and what is left of its burst.
	RateLimit struct {
		// RequestsPerSecond is the sustained rate (0: unlimited).
		RequestsPerSecond int `json:"requestsPerSecond"`
		// Burst is the bucket's size.
		Burst int `json:"burst"`
		// Remaining is the tokens left now, when known.
		Remaining *int `json:"remaining"`
	} `json:"rateLimit"`
}

// Usage reports the workspace's metering: events this month against the
// quota, API calls, connector load, agent activity (GET /api/usage).
// [WithLimit] bounds its agents.
func (c *Client) Usage(ctx context.Context, opts ...ReadOption) (*Usage, error) {
	var out Usage
	if err := c.Do(ctx, http.MethodGet, "/api/usage", queryOf(opts), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// HealthReport is the cloud's readiness.
type HealthReport struct {
	// Status is "ok", "degraded" (works, but a recommended setting is
	// missing) or "fail".
	Status string `json:"status"`
	// Version is the cloud's version.
	Version string `json:"version"`
	// Checks are store, config, integrations, rateLimiting and
	// usageMetering: each {ok, required, ...details}.
	Checks map[string]map[string]any `json:"checks"`
}

// Health reports the cloud's readiness (GET /api/health; no credential
// needed). With strict, a failed required check is an [*APIError] with
// Status 503; the report is then returned beside it.
func (c *Client) Health(ctx context.Context, strict bool) (*HealthReport, error) {
	var query url.Values
	if strict {
		query = url.Values{"strict": {"1"}}
	}
	var out HealthReport
	err := c.Do(ctx, http.MethodGet, "/api/health", query, nil, "", &out)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusServiceUnavailable {
		if json.Unmarshal(apiErr.Body, &out) == nil && out.Status != "" {
			return &out, err
		}
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}
