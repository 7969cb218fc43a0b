package opgraph_test

import (
	"errors"
	"net/http"
	"testing"

	opgraph "opgraph.dev/go"
)

func TestIngestWithTheSameKeyStoresOnce(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("pallet.scanned")
	event := opgraph.Event{
		Event:      name,
		Actor:      opgraph.Ref{Type: "robot", ID: "amr-7"},
		Object:     "pallet-42",
		Properties: map[string]any{"weight": 12.5, "dock": "north"},
	}
	key := unique("key")
	first, err := c.Ingest(ctx, event, opgraph.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Ingest(ctx, event, opgraph.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if first.Accepted != 1 || len(first.IDs) != 1 || !sameIDs(first.IDs, again.IDs) {
		t.Fatalf("a repeat with the same key must answer the same ids: %+v then %+v", first, again)
	}

	stored := eventsNamed(t, c, name)
	if len(stored) != 1 {
		t.Fatalf("want exactly one %s stored, got %d", name, len(stored))
	}
	got := stored[0]
	if got.ID != first.IDs[0] || got.ReceivedAt == 0 || got.Timestamp == 0 {
		t.Fatalf("stored event %+v, want id %s with times", got, first.IDs[0])
	}
	// The cloud's defaults, and the envelope as sent.
	if got.BusinessID != "default" || got.TrustTier != "T0" {
		t.Fatalf("defaults not applied: business %q tier %q", got.BusinessID, got.TrustTier)
	}
	actor, ok := got.Actor.(map[string]any)
	if !ok || actor["type"] != "robot" || actor["id"] != "amr-7" || got.Object != "pallet-42" {
		t.Fatalf("actor %#v object %#v", got.Actor, got.Object)
	}
	if got.Properties["weight"] != 12.5 || got.Properties["dock"] != "north" || got.Extra != nil {
		t.Fatalf("properties %#v extra %#v", got.Properties, got.Extra)
	}
}

func TestIngestWithoutKeyStoresEachCall(t *testing.T) {
	// The key made per call must differ between calls: two calls are two
	// events.
	c, ctx := cloud(t), ctxOf(t)
	name := unique("door.opened")
	a, err := c.Ingest(ctx, opgraph.Event{Event: name})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Ingest(ctx, opgraph.Event{Event: name})
	if err != nil {
		t.Fatal(err)
	}
	if a.IDs[0] == b.IDs[0] || len(eventsNamed(t, c, name)) != 2 {
		t.Fatalf("two calls without a key must store two events: %v %v", a.IDs, b.IDs)
	}
}

func TestIngestBatchStoresEveryEvent(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("sensor.read")
	batch := make([]opgraph.Event, 3)
	for i := range batch {
		batch[i] = opgraph.Event{Event: name, Properties: map[string]any{"seq": i}}
	}
	res, err := c.IngestBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted != 3 || len(res.IDs) != 3 {
		t.Fatalf("want 3 accepted ids, got %+v", res)
	}
	stored := eventsNamed(t, c, name)
	listed := make([]string, len(stored))
	for i, e := range stored {
		listed[i] = e.ID
	}
	if !sameIDs(res.IDs, listed) {
		t.Fatalf("ingested %v, listed %v", res.IDs, listed)
	}
}

func TestInvalidBatchNamesTheIndexAndStoresNothing(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("order.created")
	batch := []opgraph.Event{
		{Event: name},
		{Properties: map[string]any{"note": "no name"}},
		{Event: name},
	}
	_, err := c.IngestBatch(ctx, batch)
	e := apiError(t, err, http.StatusBadRequest, "validation_failed")
	if e.Field != "batch[1].event" || e.Message == "" || e.Retryable() {
		t.Fatalf("want field batch[1].event, got %+v", e)
	}
	if stored := eventsNamed(t, c, name); len(stored) != 0 {
		t.Fatalf("a refused batch must store nothing, got %d events", len(stored))
	}
	// A lone envelope names the field itself.
	_, err = c.Ingest(ctx, opgraph.Event{Event: name, TrustTier: "T9"})
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "trustTier" {
		t.Fatalf("want field trustTier, got %+v", e)
	}
}

func TestWrongKeyIsUnauthorized(t *testing.T) {
	c := cloud(t, opgraph.WithAPIKey("og_thiskeydoesnotexist0000000000000"))
	_, err := c.Events(ctxOf(t), opgraph.EventFilter{})
	apiError(t, err, http.StatusUnauthorized, "unauthorized")
	var te *opgraph.TransportError
	if errors.As(err, &te) {
		t.Fatal("an answer is not a transport error")
	}
}

func TestReadOnlyKeyCannotIngest(t *testing.T) {
	admin, ctx := cloud(t), ctxOf(t)
	var created struct {
		Key struct {
			ID     string   `json:"id"`
			Scopes []string `json:"scopes"`
		} `json:"key"`
		APIKey string `json:"apiKey"`
	}
	body := map[string]any{"name": unique("dashboard"), "scopes": []string{"read"}}
	if err := admin.Do(ctx, http.MethodPost, "/api/keys", nil, body, "", &created); err != nil {
		t.Fatal(err)
	}
	if created.APIKey == "" || len(created.Key.Scopes) != 1 || created.Key.Scopes[0] != "read" {
		t.Fatalf("created key %+v", created)
	}

	reader := cloud(t, opgraph.WithAPIKey(created.APIKey))
	name := unique("forbidden.write")
	_, err := reader.Ingest(ctx, opgraph.Event{Event: name})
	apiError(t, err, http.StatusForbidden, "forbidden")
	if _, err := reader.Events(ctx, opgraph.EventFilter{Limit: 1}); err != nil {
		t.Fatalf("a read key must list events: %v", err)
	}
	if stored := eventsNamed(t, admin, name); len(stored) != 0 {
		t.Fatalf("a forbidden ingest stored %d events", len(stored))
	}
}

func TestEventsFilterAndLimit(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name, trace := unique("step.done"), unique("trace")
	batch := []opgraph.Event{
		{Event: name, TraceID: trace, Timestamp: 1_700_000_000_000 + 1},
		{Event: name, TraceID: trace, Timestamp: 1_700_000_000_000 + 2},
		{Event: name, Timestamp: 1_700_000_000_000 + 3},
	}
	if _, err := c.IngestBatch(ctx, batch); err != nil {
		// The timestamp must be within 10 years back; a clock far ahead
		// would make this fixture invalid.
		t.Fatal(err)
	}
	traced, err := c.Events(ctx, opgraph.EventFilter{TraceID: trace})
	if err != nil {
		t.Fatal(err)
	}
	if len(traced) != 2 || traced[0].Timestamp < traced[1].Timestamp {
		t.Fatalf("want the trace's 2 events newest first, got %+v", traced)
	}
	one, err := c.Events(ctx, opgraph.EventFilter{Event: name, Limit: 1, From: 1_700_000_000_000 + 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0].Timestamp != 1_700_000_000_000+3 {
		t.Fatalf("want the newest event only, got %+v", one)
	}
	_, err = c.Events(ctx, opgraph.EventFilter{From: 10, To: 5})
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "from" {
		t.Fatalf("want field from, got %+v", e)
	}
}
