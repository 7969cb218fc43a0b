package opgraph

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Event is one event envelope: something happened, caused by an actor,
// against an object. Only Event (the name) is required; zero fields are
// left out, and the cloud fills in the timestamp (receive time), the
// business ("default") and the trust tier ("T0").
type Event struct {
	// Event is the name, usually dot-notated ("order.created"); at most
	// 200 characters.
	Event string `json:"event,omitempty"`
	// BusinessID is the business the event belongs to.
	BusinessID string `json:"businessId,omitempty"`
	// Actor is who or what caused the event: a string ("user_42"), a
	// [Ref], or a map with string "type" and "id" and other keys.
	Actor any `json:"actor,omitempty"`
	// Object is the thing acted on, in the same forms as Actor.
	Object any `json:"object,omitempty"`
	// Entity is a graph node to upsert: {type, id, name?, properties?}.
	Entity map[string]any `json:"entity,omitempty"`
	// TraceID correlates events, agents, workflows, decisions and proofs.
	TraceID string `json:"traceId,omitempty"`
	// Source is channel and campaign metadata.
	Source map[string]any `json:"source,omitempty"`
	// Attribution is touchpoint metadata.
	Attribution map[string]any `json:"attribution,omitempty"`
	// Context is context-contract or runtime metadata.
	Context map[string]any `json:"context,omitempty"`
	// Trackable is identifier metadata ({kind, code}); an event naming a
	// registered trackable's code is linked to it.
	Trackable map[string]any `json:"trackable,omitempty"`
	// DecisionID is a decision object's id, for governed execution.
	DecisionID string `json:"decisionId,omitempty"`
	// ProofID is a proof trail's id, for evidence packaging.
	ProofID string `json:"proofId,omitempty"`
	// Outcome is outcome metrics ("revenue", "currency", ...).
	Outcome map[string]any `json:"outcome,omitempty"`
	// TrustTier is how far the event can be trusted: "T0" (raw) to "T4"
	// (proof-ready).
	TrustTier string `json:"trustTier,omitempty"`
	// ComplianceMapping is control-evidence metadata.
	ComplianceMapping map[string]any `json:"complianceMapping,omitempty"`
	// Properties are the event's own facts.
	Properties map[string]any `json:"properties,omitempty"`
	// Timestamp is the event's time in ms since the Unix epoch (see
	// [Millis]); within 10 years back and a day ahead.
	Timestamp int64 `json:"timestamp,omitempty"`
	// MessageID is the client's id of this event: a retry carrying the same
	// one within 24 h stores nothing new.
	MessageID string `json:"messageId,omitempty"`
	// Extra holds top-level fields this version does not name: sent beside
	// the others (the named fields win), and filled with unknown fields
	// when decoding. The cloud refuses unknown fields, so this is for
	// fields newer than this SDK.
	Extra map[string]any `json:"-"`
}

// Ref is the object form of an actor or object: {"type": ..., "id": ...}.
type Ref struct {
	// Type is what kind of thing it is ("user", "robot", "pallet").
	Type string `json:"type"`
	// ID is its id within that type.
	ID string `json:"id"`
}

// Millis is t in ms since the Unix epoch, the API's time format.
func Millis(t time.Time) int64 { return t.UnixNano() / int64(time.Millisecond) }

// eventFields are the JSON names of Event's own fields, which Extra never
// holds.
var eventFields = jsonNames(reflect.TypeOf(Event{}))

// MarshalJSON writes the envelope, with Extra's fields beside the named
// ones.
func (e Event) MarshalJSON() ([]byte, error) {
	type plain Event // without this method, so no recursion
	return withExtra(plain(e), e.Extra)
}

// UnmarshalJSON reads an envelope, keeping fields it does not name in
// Extra.
func (e *Event) UnmarshalJSON(data []byte) error {
	type plain Event
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	extra, err := unknownFields(data, eventFields)
	if err != nil {
		return err
	}
	p.Extra = extra
	*e = Event(p)
	return nil
}

// StoredEvent is an event as the cloud keeps it: the envelope with its
// defaults applied, its id and when it was received.
type StoredEvent struct {
	// ID is the event's id ("evt_...").
	ID string
	// ReceivedAt is when the cloud received it, ms since the Unix epoch.
	ReceivedAt int64
	Event
}

// UnmarshalJSON reads the envelope with "id" and "receivedAt".
func (s *StoredEvent) UnmarshalJSON(data []byte) error {
	var meta struct {
		ID         string `json:"id"`
		ReceivedAt int64  `json:"receivedAt"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return err
	}
	if err := s.Event.UnmarshalJSON(data); err != nil {
		return err
	}
	delete(s.Extra, "id")
	delete(s.Extra, "receivedAt")
	if len(s.Extra) == 0 {
		s.Extra = nil
	}
	s.ID, s.ReceivedAt = meta.ID, meta.ReceivedAt
	return nil
}

// MarshalJSON writes the envelope with "id" and "receivedAt", as the cloud
// lists it.
func (s StoredEvent) MarshalJSON() ([]byte, error) {
	event := s.Event
	event.Extra = make(map[string]any, len(s.Extra)+2)
	for k, v := range s.Extra {
		event.Extra[k] = v
	}
	event.Extra["id"], event.Extra["receivedAt"] = s.ID, s.ReceivedAt
	return event.MarshalJSON()
}

// IngestResult is the answer of an ingest: how many events the request
// held (stored now, or earlier under the same idempotency key) and their
// ids in request order.
type IngestResult struct {
	// Accepted counts the request's events.
	Accepted int `json:"accepted"`
	// IDs are the events' ids ("evt_..."), in request order.
	IDs []string `json:"ids"`
}

// CallOption is a setting of one write call: [Client.Ingest],
// [Client.IngestBatch] or [Client.Track].
type CallOption func(*callSettings)

type callSettings struct {
	idempotencyKey string
}

// WithIdempotencyKey sends key as the request's Idempotency-Key (1 to 255
// visible ASCII characters): a repeat of the request with the same key
// within 24 h returns the first answer and stores nothing new. A key names
// one call: the cloud answers 409 conflict to it sent with another body.
func WithIdempotencyKey(key string) CallOption {
	return func(s *callSettings) { s.idempotencyKey = key }
}

func callSettingsOf(opts []CallOption) callSettings {
	var s callSettings
	for _, opt := range opts {
		opt(&s)
	}
	return s
}

// keyOf is the idempotency key of a write that always carries one
// ([Client.Ingest], [Client.Track]): the caller's, else a random one made
// once for the call and kept across its retries.
func keyOf(opts []CallOption) (string, error) {
	if key := callSettingsOf(opts).idempotencyKey; key != "" {
		return key, nil
	}
	return newIdempotencyKey()
}

// Ingest records one event (POST /api/ingest with one envelope). A field
// error names the field itself ("event").
//
// The request always carries an idempotency key, the caller's
// ([WithIdempotencyKey]) or a random one made for this call, so that a
// retry after a lost answer stores the event once.
func (c *Client) Ingest(ctx context.Context, event Event, opts ...CallOption) (*IngestResult, error) {
	return c.ingest(ctx, event, opts)
}

// IngestBatch records up to 1000 events as one all-or-nothing batch (POST
// /api/ingest with {"batch": [...]}): one invalid event stores none, and
// the error's Field names its index ("batch[3].event"). Idempotency is as
// for [Client.Ingest].
func (c *Client) IngestBatch(ctx context.Context, events []Event, opts ...CallOption) (*IngestResult, error) {
	if events == nil {
		events = []Event{} // "batch is empty" rather than "batch is null"
	}
	return c.ingest(ctx, struct {
		Batch []Event `json:"batch"`
	}{events}, opts)
}

func (c *Client) ingest(ctx context.Context, body any, opts []CallOption) (*IngestResult, error) {
	key, err := keyOf(opts)
	if err != nil {
		return nil, err
	}
	var out IngestResult
	if err := c.Do(ctx, http.MethodPost, "/api/ingest", nil, body, key, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EventFilter narrows [Client.Events]; zero fields do not filter.
type EventFilter struct {
	// Event keeps only this event name.
	Event string
	// TraceID keeps only this trace.
	TraceID string
	// BusinessID keeps only this business.
	BusinessID string
	// From keeps events at or after this time, ms.
	From int64
	// To keeps events before this time, ms.
	To int64
	// Limit bounds the list (0: the cloud's default, 100; at most 1000).
	Limit int
}

// Events lists stored events, newest first (GET /api/events).
func (c *Client) Events(ctx context.Context, filter EventFilter) ([]StoredEvent, error) {
	query := url.Values{}
	setText(query, "event", filter.Event)
	setText(query, "traceId", filter.TraceID)
	setText(query, "businessId", filter.BusinessID)
	setInt(query, "from", filter.From)
	setInt(query, "to", filter.To)
	setInt(query, "limit", int64(filter.Limit))
	var out struct {
		Events []StoredEvent `json:"events"`
	}
	if err := c.Do(ctx, http.MethodGet, "/api/events", query, nil, "", &out); err != nil {
		return nil, err
	}
	return out.Events, nil
}

// SearchFilter narrows [Client.Search]; zero fields do not filter.
type SearchFilter struct {
	// Event keeps only this event name.
	Event string `json:"event,omitempty"`
	// BusinessID keeps only this business.
	BusinessID string `json:"businessId,omitempty"`
	// From keeps events at or after this time, ms.
	From int64 `json:"from,omitempty"`
	// To keeps events before this time, ms.
	To int64 `json:"to,omitempty"`
	// Limit bounds the results (0: the cloud's default, 100).
	Limit int `json:"limit,omitempty"`
}

// SearchResult is the answer of [Client.Search].
type SearchResult struct {
	// Results are the matching events, newest first.
	Results []StoredEvent `json:"results"`
	// Total counts the matches, up to 10 000.
	Total int `json:"total"`
	// TotalCapped is true when Total stopped at 10 000, or when a query
	// shorter than 3 characters was checked only against the newest
	// 100 000 events of the range (the embedded store).
	TotalCapped bool `json:"totalCapped"`
}

// Search finds events whose name, actor or object id or type, or a
// property value contains query (1 to 200 characters, case-insensitive)
// (POST /api/analytics/event-search).
func (c *Client) Search(ctx context.Context, query string, filter SearchFilter) (*SearchResult, error) {
	body := struct {
		Query string `json:"query"`
		SearchFilter
	}{query, filter}
	var out SearchResult
	if err := c.Do(ctx, http.MethodPost, "/api/analytics/event-search", nil, body, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func setText(q url.Values, name, value string) {
	if value != "" {
		q.Set(name, value)
	}
}

func setInt(q url.Values, name string, value int64) {
	if value != 0 {
		q.Set(name, strconv.FormatInt(value, 10))
	}
}

// withExtra encodes v (a struct) and adds the fields of extra that v does
// not set.
func withExtra(v any, extra map[string]any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil || len(extra) == 0 {
		return data, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, err
	}
	for name, value := range extra {
		if _, set := fields[name]; set {
			continue
		}
		raw, err := json.Marshal(value)
		if err != nil {
			return nil, err
		}
		fields[name] = raw
	}
	return json.Marshal(fields)
}

// unknownFields decodes the fields of the JSON object data not in known;
// nil when there are none.
func unknownFields(data []byte, known map[string]bool) (map[string]any, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, err
	}
	var extra map[string]any
	for name, raw := range fields {
		if known[name] {
			continue
		}
		var value any
		if err := json.Unmarshal(raw, &value); err != nil {
			return nil, err
		}
		if extra == nil {
			extra = make(map[string]any)
		}
		extra[name] = value
	}
	return extra, nil
}

// jsonNames lists the JSON names of a struct type's encoded fields.
func jsonNames(t reflect.Type) map[string]bool {
	names := make(map[string]bool)
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("json")
		name := strings.Split(tag, ",")[0]
		if name != "" && name != "-" {
			names[name] = true
		}
	}
	return names
}
