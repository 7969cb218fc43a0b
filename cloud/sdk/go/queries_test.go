package opgraph_test

import (
	"net/http"
	"strings"
	"testing"

	opgraph "opgraph.dev/go"
)

func TestSearchFindsAPropertyValue(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name, colour := unique("paint.mixed"), unique("ultramarine")
	res, err := c.Ingest(ctx, opgraph.Event{Event: name, Properties: map[string]any{"colour": colour}})
	if err != nil {
		t.Fatal(err)
	}
	// Case-insensitive, over property values.
	found, err := c.Search(ctx, strings.ToUpper(colour), opgraph.SearchFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if found.Total != 1 || len(found.Results) != 1 || found.Results[0].ID != res.IDs[0] {
		t.Fatalf("want the one event %s, got %+v", res.IDs[0], found)
	}
	if found.Results[0].Properties["colour"] != colour {
		t.Fatalf("result %+v", found.Results[0])
	}
	_, err = c.Search(ctx, "  ", opgraph.SearchFilter{})
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "query" {
		t.Fatalf("want field query, got %+v", e)
	}
}

func TestGraphQLReturnsEventsAndErrors(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("graph.node")
	res, err := c.Ingest(ctx, opgraph.Event{Event: name, TraceID: "t-1"})
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Events []struct {
			ID      string `json:"id"`
			Event   string `json:"event"`
			TraceID string `json:"traceId"`
		} `json:"events"`
	}
	query := `query($name: String) { events(event: $name, limit: 5) { id event traceId } }`
	if err := c.GraphQL(ctx, query, map[string]any{"name": name}, &data); err != nil {
		t.Fatal(err)
	}
	if len(data.Events) != 1 || data.Events[0].ID != res.IDs[0] || data.Events[0].TraceID != "t-1" {
		t.Fatalf("want event %s, got %+v", res.IDs[0], data)
	}

	err = c.GraphQL(ctx, `{ noSuchField }`, nil, &data)
	e := apiError(t, err, http.StatusOK, "graphql")
	if len(e.Errors) == 0 || !strings.Contains(e.Errors[0].Message, "noSuchField") {
		t.Fatalf("want the GraphQL errors, got %+v", e)
	}
}

func TestTrackableIsCreatedAndTracked(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	used := unique("robot.cycle")
	created, err := c.CreateTrackable(ctx, opgraph.KindRobot, "AMR-7", opgraph.TrackableOptions{EventName: used})
	if err != nil {
		t.Fatal(err)
	}
	tr := created.Trackable
	if !strings.HasPrefix(tr.ID, "trk_") || tr.Code == "" || tr.Kind != opgraph.KindRobot || tr.ScanURL == "" {
		t.Fatalf("created %+v", created)
	}
	res, err := c.Track(ctx, tr.Code, opgraph.TrackOptions{Properties: map[string]any{"cycleMs": 840}},
		opgraph.WithIdempotencyKey(unique("cycle")))
	if err != nil {
		t.Fatal(err)
	}
	stored := eventsNamed(t, c, used)
	if len(stored) != 1 || stored[0].ID != res.IDs[0] {
		t.Fatalf("want the tracked event %v, got %+v", res.IDs, stored)
	}
	if stored[0].Trackable["code"] != tr.Code || stored[0].Trackable["id"] != tr.ID {
		t.Fatalf("the event must name its trackable: %+v", stored[0].Trackable)
	}

	_, err = c.Track(ctx, unique("nosuchcode"), opgraph.TrackOptions{})
	apiError(t, err, http.StatusNotFound, "not_found")
	_, err = c.CreateTrackable(ctx, opgraph.KindQRCode, "Menu", opgraph.TrackableOptions{})
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "targetUrl" {
		t.Fatalf("a QR code needs targetUrl, got %+v", e)
	}
	qr, err := c.CreateTrackable(ctx, opgraph.KindQRCode, "Menu", opgraph.TrackableOptions{
		TargetURL: "https://example.com/menu", IncludeQRSVG: true,
	})
	if err != nil || !strings.Contains(qr.QRSVG, "<svg") {
		t.Fatalf("want a QR code with its SVG: %v", err)
	}
}

func TestEnforceDeniesMissingObjects(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	amount := 120.0
	res, err := c.Enforce(ctx, opgraph.EnforceRequest{
		DecisionObjectID:  "dec_missing",
		AuthorityGrantID:  "grt_missing",
		ContextContractID: "ctc_missing",
		ProposedAction: opgraph.ProposedAction{
			Action: "refund", Amount: &amount, Currency: "EUR",
			Extra: map[string]any{"orderId": "o-1"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != opgraph.OutcomeDeny || res.ReceiptID == "" || len(res.Checks) == 0 || res.Receipt == nil {
		t.Fatalf("want a recorded deny, got %+v", res)
	}
	failed := 0
	for _, check := range res.Checks {
		if !check.Passed {
			failed++
		}
	}
	if failed == 0 {
		t.Fatalf("a deny must come from a failed check: %+v", res.Checks)
	}
	_, err = c.Enforce(ctx, opgraph.EnforceRequest{DecisionObjectID: "dec_x"})
	apiError(t, err, http.StatusBadRequest, "validation_failed")
}

func TestMetricsCountsAndSums(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("order.paid")
	batch := []opgraph.Event{
		{Event: name, Actor: "a", Outcome: map[string]any{"revenue": 10.5, "currency": "EUR"}},
		{Event: name, Actor: "b", Outcome: map[string]any{"revenue": 4.5, "currency": "EUR"}},
	}
	if _, err := c.IngestBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	m, err := c.Metrics(ctx, opgraph.MetricsQuery{EventName: name, Interval: "day", UniqueActors: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Metrics) != 1 || m.Metrics[0].Count != 2 || m.Metrics[0].Revenue != 15 || m.TotalEvents != 2 {
		t.Fatalf("want 2 events and 15 revenue, got %+v", m)
	}
	if m.Metrics[0].UniqueActors == nil || *m.Metrics[0].UniqueActors != 2 {
		t.Fatalf("want 2 unique actors, got %+v", m.Metrics[0])
	}
	if len(m.Series) == 0 || m.From >= m.To {
		t.Fatalf("want a daily series over a range, got %+v", m)
	}
	_, err = c.Metrics(ctx, opgraph.MetricsQuery{Interval: "week"})
	apiError(t, err, http.StatusBadRequest, "validation_failed")
}

func TestWhatsChangedSeesANewEventType(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("lead.created")
	if _, err := c.Ingest(ctx, opgraph.Event{Event: name}); err != nil {
		t.Fatal(err)
	}
	w, err := c.WhatsChanged(ctx, opgraph.WhatsChangedQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if w.Current.TotalEvents < 1 || w.Current.From >= w.Current.To || w.Previous.To > w.Current.From {
		t.Fatalf("periods %+v %+v", w.Current, w.Previous)
	}
	if !contains(w.NewEventTypes, name) {
		t.Fatalf("%s must be new, got %v", name, w.NewEventTypes)
	}
	var diff *opgraph.EventDiff
	for i := range w.EventDiffs {
		if w.EventDiffs[i].Event == name {
			diff = &w.EventDiffs[i]
		}
	}
	if diff == nil || diff.Current != 1 || diff.Previous != 0 || diff.Delta != 1 || diff.PctChange != nil {
		t.Fatalf("want +1 from nothing for %s, got %+v", name, diff)
	}
}

func TestAgentContextAnswersItsModes(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	summary, err := c.AgentContext(ctx, opgraph.ModeSummarize, opgraph.AgentContextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if summary.Mode != opgraph.ModeSummarize || summary.BusinessID != "default" || summary.Summary == "" ||
		summary.Changes == nil || summary.GeneratedAt == 0 || summary.Anomalies == nil || summary.NextActions == nil {
		t.Fatalf("summary %+v", summary)
	}
	gaps, err := c.AgentContext(ctx, opgraph.ModeProofGaps, opgraph.AgentContextOptions{Limit: 5})
	if err != nil || gaps.Mode != opgraph.ModeProofGaps || gaps.MissingProofEvents == nil {
		t.Fatalf("proof gaps %+v: %v", gaps, err)
	}
	_, err = c.AgentContext(ctx, "guess", opgraph.AgentContextOptions{})
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "mode" {
		t.Fatalf("want field mode, got %+v", e)
	}
}

func TestBusinessHealth(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("qr.scanned")
	if _, err := c.Ingest(ctx, opgraph.Event{Event: name}); err != nil {
		t.Fatal(err)
	}
	h, err := c.BusinessHealth(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if h.BusinessID != "default" || h.HealthScore < 0 || h.HealthScore > 100 || len(h.RecentEvents) == 0 ||
		h.Attribution == nil || h.Alerts == nil || h.NextActions == nil || h.HealthComponents == nil {
		t.Fatalf("health %+v", h)
	}
	// The id is one path segment however it is spelled.
	_, err = c.BusinessHealth(ctx, "north/dock 3")
	apiError(t, err, http.StatusNotFound, "not_found")
}

func TestBusinessHealthLimit(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	business, name := unique("dock"), unique("crate.moved")
	events := []opgraph.Event{{Event: name}, {Event: name}, {Event: name}}
	for i := range events {
		events[i].BusinessID = business
	}
	if _, err := c.IngestBatch(ctx, events); err != nil {
		t.Fatal(err)
	}
	all, err := c.BusinessHealth(ctx, business)
	if err != nil {
		t.Fatal(err)
	}
	bounded, err := c.BusinessHealth(ctx, business, opgraph.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(all.RecentEvents) != 3 || len(bounded.RecentEvents) != 2 {
		t.Fatalf("want 3 recent events, 2 with a limit of 2: got %d and %d",
			len(all.RecentEvents), len(bounded.RecentEvents))
	}
	_, err = c.BusinessHealth(ctx, business, opgraph.WithLimit(-1))
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "limit" {
		t.Fatalf("want field limit, got %+v", e)
	}
}

func TestUsageAndHealth(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	if _, err := c.Ingest(ctx, opgraph.Event{Event: unique("metered")}); err != nil {
		t.Fatal(err)
	}
	u, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u.WorkspaceID != "ws_default" || u.Events.Ingested < 1 || u.APICalls < 1 ||
		u.Period.From >= u.Period.To || u.RateLimit.RequestsPerSecond == 0 || u.Connectors == nil {
		t.Fatalf("usage %+v", u)
	}

	for _, strict := range []bool{false, true} {
		h, err := c.Health(ctx, strict)
		if err != nil {
			t.Fatal(err)
		}
		if h.Status != "ok" || h.Version == "" || h.Checks["store"]["reachable"] != true {
			t.Fatalf("health (strict %v) %+v", strict, h)
		}
	}
	// Health needs no credential. An empty key counts as not given, so
	// OPGRAPH_API_KEY is emptied too.
	url := env(t, "OPGRAPH_URL")
	t.Setenv("OPGRAPH_API_KEY", "")
	anonymous, err := opgraph.New(opgraph.WithURL(url), opgraph.WithAPIKey(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonymous.Health(ctx, false); err != nil {
		t.Fatal(err)
	}
	_, err = anonymous.Usage(ctx)
	apiError(t, err, http.StatusUnauthorized, "unauthorized")
}

func TestUsageLimit(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	// Two agents at least, whatever the other tests stored.
	name := unique("agent.step")
	events := []opgraph.Event{
		{Event: name, Actor: opgraph.Ref{Type: "agent", ID: unique("planner")}},
		{Event: name, Actor: opgraph.Ref{Type: "agent", ID: unique("picker")}},
	}
	if _, err := c.IngestBatch(ctx, events); err != nil {
		t.Fatal(err)
	}
	all, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bounded, err := c.Usage(ctx, opgraph.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Agents) < 2 || len(bounded.Agents) != 1 {
		t.Fatalf("want 2 agents or more, 1 with a limit of 1: got %d and %d", len(all.Agents), len(bounded.Agents))
	}
	// The limit reaches the cloud, which checks it.
	_, err = c.Usage(ctx, opgraph.WithLimit(-1))
	if e := apiError(t, err, http.StatusBadRequest, "validation_failed"); e.Field != "limit" {
		t.Fatalf("want field limit, got %+v", e)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
