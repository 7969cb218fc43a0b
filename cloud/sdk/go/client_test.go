package opgraph

// Unit tests of what the real clouds cannot be made to do on demand: a
// connection dropped before the answer, a long Retry-After, an answer that
// is not JSON. A local server plays those parts.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a fake cloud: it keeps every request and answers with the
// next of its scripted handlers (the last one repeats).
type recorder struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	script   []http.HandlerFunc
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.requests = append(r.requests, req)
	r.bodies = append(r.bodies, string(body))
	step := r.script[min(len(r.requests), len(r.script))-1]
	r.mu.Unlock()
	step(w, req)
}

// seen returns the requests and bodies so far. The lock is what orders the
// handler's writes before the test's reads: the race detector cannot see
// through the socket.
func (r *recorder) seen() ([]*http.Request, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*http.Request(nil), r.requests...), append([]string(nil), r.bodies...)
}

func (r *recorder) count() int {
	requests, _ := r.seen()
	return len(requests)
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func serve(t *testing.T, script ...http.HandlerFunc) (*recorder, *Client) {
	t.Helper()
	rec := &recorder{script: script}
	server := httptest.NewServer(rec)
	t.Cleanup(server.Close)
	c, err := New(WithURL(server.URL+"/"), WithAPIKey("og_k"), WithWorkspace("ws_1"), WithMaxRetries(3))
	if err != nil {
		t.Fatal(err)
	}
	return rec, c
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func reply(status int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestIngestRetriesWithTheSameKeyAndBody(t *testing.T) {
	rec, c := serve(t, drop, reply(202, `{"accepted":1,"ids":["evt_1"]}`))
	res, err := c.Ingest(context.Background(), Event{Event: "a"})
	if err != nil {
		t.Fatal(err)
	}
	requests, bodies := rec.seen()
	if res.IDs[0] != "evt_1" || len(requests) != 2 {
		t.Fatalf("want one retry, got %d requests and %+v", len(requests), res)
	}
	first, second := requests[0], requests[1]
	key := first.Header.Get("Idempotency-Key")
	if !uuidV4.MatchString(key) || second.Header.Get("Idempotency-Key") != key {
		t.Fatalf("keys %q then %q", key, second.Header.Get("Idempotency-Key"))
	}
	if bodies[0] != `{"event":"a"}` || bodies[1] != bodies[0] {
		t.Fatalf("bodies %q", bodies)
	}
	for name, want := range map[string]string{
		"Authorization":          "Bearer og_k",
		"X-Opgraph-Workspace-Id": "ws_1",
		"Content-Type":           "application/json",
		"User-Agent":             "opgraph-go/" + Version,
	} {
		if got := first.Header.Get(name); got != want {
			t.Fatalf("%s: %q, want %q", name, got, want)
		}
	}
	if first.URL.Path != "/api/ingest" || first.Method != http.MethodPost {
		t.Fatalf("%s %s", first.Method, first.URL.Path)
	}
}

func TestBatchBodyAndTheCallersKey(t *testing.T) {
	rec, c := serve(t, reply(202, `{"accepted":2,"ids":["evt_1","evt_2"]}`))
	_, err := c.IngestBatch(context.Background(), []Event{{Event: "a"}, {Event: "b"}}, WithIdempotencyKey("k-1"))
	if err != nil {
		t.Fatal(err)
	}
	requests, bodies := rec.seen()
	if bodies[0] != `{"batch":[{"event":"a"},{"event":"b"}]}` || requests[0].Header.Get("Idempotency-Key") != "k-1" {
		t.Fatalf("body %s key %q", bodies[0], requests[0].Header.Get("Idempotency-Key"))
	}
}

func TestWhatIsNotRetried(t *testing.T) {
	ctx := context.Background()
	// A 400 stays a 400.
	rec, c := serve(t, reply(400, `{"error":{"code":"validation_failed","message":"bad","field":"event"}}`))
	_, err := c.Ingest(ctx, Event{})
	var e *APIError
	if !errors.As(err, &e) || e.Field != "event" || rec.count() != 1 {
		t.Fatalf("%v after %d requests", err, rec.count())
	}
	// A write without a key that got no answer might have been stored;
	// so might POSTs that mostly read (persistSnapshots, GraphQL
	// mutations).
	for name, call := range map[string]func(c *Client) error{
		"Do": func(c *Client) error {
			return c.Do(ctx, http.MethodPost, "/api/trackables", nil, map[string]string{}, "", nil)
		},
		"CreateTrackable": func(c *Client) error {
			_, err := c.CreateTrackable(ctx, KindRobot, "x", TrackableOptions{})
			return err
		},
		"Enforce": func(c *Client) error { _, err := c.Enforce(ctx, EnforceRequest{}); return err },
		"Search":  func(c *Client) error { _, err := c.Search(ctx, "pallet", SearchFilter{}); return err },
		"Metrics": func(c *Client) error { _, err := c.Metrics(ctx, MetricsQuery{}); return err },
		"WhatsChanged": func(c *Client) error {
			_, err := c.WhatsChanged(ctx, WhatsChangedQuery{})
			return err
		},
		"AgentContext": func(c *Client) error {
			_, err := c.AgentContext(ctx, ModeSummarize, AgentContextOptions{})
			return err
		},
		"GraphQL": func(c *Client) error { return c.GraphQL(ctx, "{ events { id } }", nil, nil) },
	} {
		rec, c = serve(t, drop)
		err = call(c)
		var te *TransportError
		if !errors.As(err, &te) || rec.count() != 1 {
			t.Fatalf("%s: %v after %d requests", name, err, rec.count())
		}
	}
	// A quota's hour is not waited out.
	rec, c = serve(t, reply(429, `{"error":{"code":"rate_limited","message":"quota"}}`, "Retry-After", "3600"))
	_, err = c.Usage(ctx)
	if !errors.As(err, &e) || e.RetryAfter != time.Hour || rec.count() != 1 {
		t.Fatalf("%v after %d requests", err, rec.count())
	}
}

var (
	unavailable = reply(503, `{"error":{"code":"unavailable","message":"store"}}`, "Retry-After", "0")
	rateLimited = reply(429, `{"error":{"code":"rate_limited","message":"slow down"}}`, "Retry-After", "0")
	accepted    = reply(202, `{"accepted":1,"ids":["evt_1"]}`)
)

func TestUnavailableIsRetriedAfterItsWait(t *testing.T) {
	rec, c := serve(t, unavailable, reply(200, `{"events":[]}`))
	events, err := c.Events(context.Background(), EventFilter{Event: "a b", Limit: 5})
	if err != nil || events == nil || rec.count() != 2 {
		t.Fatalf("%v after %d requests", err, rec.count())
	}
	requests, _ := rec.seen()
	if q := requests[0].URL.RawQuery; q != "event=a+b&limit=5" {
		t.Fatalf("query %q", q)
	}
}

func TestUnavailableIsRetriedForKeyedCalls(t *testing.T) {
	ctx := context.Background()
	for name, call := range map[string]func(c *Client) error{
		"Ingest": func(c *Client) error { _, err := c.Ingest(ctx, Event{Event: "a"}); return err },
		"Track":  func(c *Client) error { _, err := c.Track(ctx, "AMR-7", TrackOptions{}); return err },
		"Do": func(c *Client) error {
			return c.Do(ctx, http.MethodPost, "/api/keys", nil, map[string]string{}, "mine-1", nil)
		},
	} {
		rec, c := serve(t, unavailable, accepted)
		if err := call(c); err != nil || rec.count() != 2 {
			t.Fatalf("%s: %v after %d requests", name, err, rec.count())
		}
		requests, _ := rec.seen()
		key := requests[0].Header.Get("Idempotency-Key")
		if key == "" || requests[1].Header.Get("Idempotency-Key") != key {
			t.Fatalf("%s: keys %q then %q", name, key, requests[1].Header.Get("Idempotency-Key"))
		}
	}
}

func TestUnavailableOnAPostWithoutAKeyIsSentOnce(t *testing.T) {
	ctx := context.Background()
	for name, call := range map[string]func(c *Client) error{
		"CreateTrackable": func(c *Client) error {
			_, err := c.CreateTrackable(ctx, KindRobot, "x", TrackableOptions{})
			return err
		},
		"Search": func(c *Client) error { _, err := c.Search(ctx, "pallet", SearchFilter{}); return err },
		"Do": func(c *Client) error {
			return c.Do(ctx, http.MethodPost, "/api/keys", nil, map[string]string{}, "", nil)
		},
	} {
		rec, c := serve(t, unavailable, accepted)
		err := call(c)
		var e *APIError
		if !errors.As(err, &e) || e.Status != 503 || e.Code != "unavailable" || rec.count() != 1 {
			t.Fatalf("%s: want the 503 at once, got %v after %d requests", name, err, rec.count())
		}
	}
}

func TestRateLimitedIsRetriedForAnyCall(t *testing.T) {
	// A 429 is a refusal before any work: even a POST without a key is
	// retried after its Retry-After.
	rec, c := serve(t, rateLimited, reply(201, `{"trackable":{"id":"trk_1","name":"x"}}`))
	created, err := c.CreateTrackable(context.Background(), KindRobot, "x", TrackableOptions{})
	if err != nil || created.Trackable.ID != "trk_1" || rec.count() != 2 {
		t.Fatalf("%v after %d requests", err, rec.count())
	}
	requests, _ := rec.seen()
	for _, r := range requests {
		if r.Header.Get("Idempotency-Key") != "" || r.Method != http.MethodPost {
			t.Fatalf("%s with key %q", r.Method, r.Header.Get("Idempotency-Key"))
		}
	}
}

func TestRefusalsWithoutRetryAfterAreReturnedAtOnce(t *testing.T) {
	ctx := context.Background()
	for status, code := range map[int]string{429: "rate_limited", 503: "unavailable"} {
		body := fmt.Sprintf(`{"error":{"code":%q,"message":"no wait given"}}`, code)
		rec, c := serve(t, reply(status, body), accepted)
		_, err := c.Ingest(ctx, Event{Event: "a"})
		var e *APIError
		if !errors.As(err, &e) || e.Status != status || e.Code != code || e.RetryAfter != 0 || rec.count() != 1 {
			t.Fatalf("%d: want it at once, got %v after %d requests", status, err, rec.count())
		}
	}
}

func TestTrackAlwaysCarriesAKeyKeptAcrossRetries(t *testing.T) {
	ctx := context.Background()
	rec, c := serve(t, drop, accepted)
	res, err := c.Track(ctx, "AMR-7", TrackOptions{Event: "robot.used"})
	if err != nil || res.IDs[0] != "evt_1" {
		t.Fatalf("%v %+v", err, res)
	}
	if _, err := c.Track(ctx, "AMR-7", TrackOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Track(ctx, "AMR-7", TrackOptions{}, WithIdempotencyKey("mine-2")); err != nil {
		t.Fatal(err)
	}
	requests, bodies := rec.seen()
	if len(requests) != 4 {
		t.Fatalf("want one retry, got %d requests", len(requests))
	}
	keys := make([]string, len(requests))
	for i, r := range requests {
		keys[i] = r.Header.Get("Idempotency-Key")
	}
	if !uuidV4.MatchString(keys[0]) || keys[1] != keys[0] {
		t.Fatalf("the retry must carry the first attempt's key: %q", keys)
	}
	if !uuidV4.MatchString(keys[2]) || keys[2] == keys[0] || keys[3] != "mine-2" {
		t.Fatalf("each call has its own key, or the caller's: %q", keys)
	}
	if bodies[0] != `{"code":"AMR-7","event":"robot.used"}` || bodies[1] != bodies[0] {
		t.Fatalf("bodies %q", bodies)
	}
}

func TestWorkspaceComesFromTheEnvironment(t *testing.T) {
	rec := &recorder{script: []http.HandlerFunc{reply(200, `{"events":[]}`)}}
	server := httptest.NewServer(rec)
	t.Cleanup(server.Close)
	t.Setenv("OPGRAPH_WORKSPACE_ID", "ws_from_env")
	fromEnv, err := New(WithURL(server.URL), WithAPIKey("og_k"))
	if err != nil {
		t.Fatal(err)
	}
	given, err := New(WithURL(server.URL), WithAPIKey("og_k"), WithWorkspace("ws_given"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Client{fromEnv, given} {
		if _, err := c.Events(context.Background(), EventFilter{}); err != nil {
			t.Fatal(err)
		}
	}
	requests, _ := rec.seen()
	if got := []string{
		requests[0].Header.Get("X-Opgraph-Workspace-ID"),
		requests[1].Header.Get("X-Opgraph-Workspace-ID"),
	}; got[0] != "ws_from_env" || got[1] != "ws_given" {
		t.Fatalf("workspaces sent: %q", got)
	}
}

func TestEmptySettingsCountAsNotGiven(t *testing.T) {
	rec := &recorder{script: []http.HandlerFunc{reply(200, `{"events":[]}`)}}
	server := httptest.NewServer(rec)
	t.Cleanup(server.Close)
	t.Setenv("OPGRAPH_URL", server.URL+"/")
	t.Setenv("OPGRAPH_API_KEY", "og_env")
	t.Setenv("OPGRAPH_WORKSPACE_ID", "ws_env")
	blanks := []string{"", "   ", "\t\r\n"}
	for _, b := range blanks {
		c, err := New(WithURL(b), WithAPIKey(b), WithWorkspace(b))
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if c.base != server.URL || c.apiKey != "og_env" || c.workspace != "ws_env" {
			t.Fatalf("%q: the environment must apply, got %+v", b, c)
		}
		if _, err := c.Events(context.Background(), EventFilter{}); err != nil {
			t.Fatal(err)
		}
	}
	requests, _ := rec.seen()
	for _, r := range requests {
		if r.Header.Get("Authorization") != "Bearer og_env" || r.Header.Get("X-Opgraph-Workspace-ID") != "ws_env" {
			t.Fatalf("headers sent: %v", r.Header)
		}
	}

	// An empty variable is unset too: the default URL, and no key or
	// workspace header at all (not an empty one).
	for _, empty := range []string{"", " "} {
		t.Setenv("OPGRAPH_URL", empty)
		t.Setenv("OPGRAPH_API_KEY", empty)
		t.Setenv("OPGRAPH_WORKSPACE_ID", empty)
		c, err := New(WithURL(empty), WithAPIKey(empty), WithWorkspace(empty))
		if err != nil {
			t.Fatal(err)
		}
		if c.base != DefaultURL || c.apiKey != "" || c.workspace != "" {
			t.Fatalf("%q: %+v", empty, c)
		}
		local, err := New(WithURL(server.URL), WithAPIKey(empty), WithWorkspace(empty))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := local.Events(context.Background(), EventFilter{}); err != nil {
			t.Fatal(err)
		}
	}
	requests, _ = rec.seen()
	if len(requests) != len(blanks)+2 {
		t.Fatalf("want %d requests, got %d", len(blanks)+2, len(requests))
	}
	for _, r := range requests[len(blanks):] {
		if _, sent := r.Header["Authorization"]; sent {
			t.Fatalf("no key was set, yet one was sent: %v", r.Header)
		}
		if _, sent := r.Header["X-Opgraph-Workspace-Id"]; sent {
			t.Fatalf("no workspace was set, yet one was sent: %v", r.Header)
		}
	}
}

func TestContextEndsARetryWait(t *testing.T) {
	limited := reply(429, `{"error":{"code":"rate_limited","message":"slow down"}}`, "Retry-After", "30")
	// A deadline shorter than the wait: the 429 itself is returned at once.
	_, c := serve(t, limited)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Usage(ctx)
	var e *APIError
	if !errors.As(err, &e) || e.Status != 429 || e.RetryAfter != 30*time.Second {
		t.Fatalf("want the 429, got %v", err)
	}
	// A cancel during the wait ends it with the context's error.
	answered, once := make(chan struct{}), sync.Once{}
	_, c = serve(t, func(w http.ResponseWriter, r *http.Request) {
		limited(w, r)
		w.(http.Flusher).Flush()
		once.Do(func() { close(answered) })
	})
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		<-answered
		cancel()
	}()
	start := time.Now()
	_, err = c.Usage(ctx)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 10*time.Second {
		t.Fatalf("want context.Canceled at once, got %v after %s", err, time.Since(start))
	}
}

func TestAnswersThatAreNotTheAPIs(t *testing.T) {
	ctx := context.Background()
	_, c := serve(t, reply(200, `<html>proxy</html>`))
	_, err := c.Usage(ctx)
	var te *TransportError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "not the JSON") {
		t.Fatalf("want a transport error, got %v", err)
	}
	// An error page of a proxy is still an answer: its status is kept.
	_, c = serve(t, reply(502, `<html>bad gateway</html>`))
	_, err = c.Usage(ctx)
	var e *APIError
	if !errors.As(err, &e) || e.Status != 502 || e.Code != "http_502" || e.Message != "Bad Gateway" {
		t.Fatalf("want a 502 APIError, got %v", err)
	}
	// GraphQL errors are errors even with data.
	_, c = serve(t, reply(200, `{"data":{"x":1},"errors":[{"message":"boom","path":["x"]}]}`))
	var data map[string]any
	err = c.GraphQL(ctx, "{ x }", nil, &data)
	if !errors.As(err, &e) || e.Code != "graphql" || e.Status != 200 || e.Message != "boom" || data != nil {
		t.Fatalf("want a graphql APIError and no data, got %v %v", err, data)
	}
}

func TestStrictHealthFailureKeepsTheReport(t *testing.T) {
	// A 503 without Retry-After is an answer, not a refusal: not retried.
	report := `{"status":"fail","version":"0.1.0","checks":{"store":{"ok":false}}}`
	rec, c := serve(t, reply(503, report), reply(200, `{"status":"ok"}`))
	h, err := c.Health(context.Background(), true)
	var e *APIError
	if !errors.As(err, &e) || e.Status != 503 || e.Code != "unavailable" || h == nil || h.Status != "fail" {
		t.Fatalf("want the report and a 503, got %+v, %v", h, err)
	}
	if string(e.Body) != report || rec.count() != 1 {
		t.Fatalf("body %q after %d requests", e.Body, rec.count())
	}
}

func TestSettingsAreChecked(t *testing.T) {
	for _, opts := range [][]Option{
		{WithURL("ftp://example.com")},
		{WithURL("example.com:8080")},
		{WithURL("http://")},
		{WithAPIKey("og_a\nInjected: yes")},
		{WithWorkspace("ws\r\n")},
		{WithMaxRetries(-1)},
		{WithTimeout(-time.Second)},
	} {
		if _, err := New(opts...); err == nil || !strings.HasPrefix(err.Error(), "opgraph: ") {
			t.Fatalf("want a clear error, got %v", err)
		}
	}
	t.Setenv("OPGRAPH_URL", "https://cloud.example.com/opgraph/")
	t.Setenv("OPGRAPH_API_KEY", "og_env")
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if c.base != "https://cloud.example.com/opgraph" || c.apiKey != "og_env" || c.timeout != 30*time.Second || c.maxRetries != 3 {
		t.Fatalf("%+v", c)
	}
	t.Setenv("OPGRAPH_URL", "")
	if c, _ = New(WithAPIKey("og_option")); c.base != DefaultURL || c.apiKey != "og_option" {
		t.Fatalf("%+v", c)
	}
}

func TestEventJSON(t *testing.T) {
	e := Event{
		Event:     "a",
		Actor:     Ref{Type: "user", ID: "1"},
		Timestamp: 5,
		Extra:     map[string]any{"event": "ignored", "future": true},
	}
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != `{"actor":{"type":"user","id":"1"},"event":"a","future":true,"timestamp":5}` {
		t.Fatalf("%s", data)
	}
	var stored StoredEvent
	in := `{"id":"evt_1","receivedAt":7,"event":"a","actor":"u","properties":{"n":1},"future":true}`
	if err := json.Unmarshal([]byte(in), &stored); err != nil {
		t.Fatal(err)
	}
	if stored.ID != "evt_1" || stored.ReceivedAt != 7 || stored.Actor != "u" ||
		stored.Properties["n"] != 1.0 || len(stored.Extra) != 1 || stored.Extra["future"] != true {
		t.Fatalf("%+v", stored)
	}
	out, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	var back, orig map[string]any
	json.Unmarshal(out, &back)
	json.Unmarshal([]byte(in), &orig)
	if len(back) != len(orig) || back["id"] != "evt_1" || back["receivedAt"] != 7.0 {
		t.Fatalf("%s", out)
	}
}

func TestRetryAfterAndBackoff(t *testing.T) {
	for value, want := range map[string]struct {
		wait time.Duration
		sent bool
	}{
		"": {0, false}, "0": {0, true}, "2": {2 * time.Second, true}, "-1": {0, false},
		"soon": {0, false}, "99999999999999": {maxRetryAfterSecs * time.Second, true},
		"Wed, 21 Oct 2015 07:28:00 GMT": {0, true},
	} {
		h := http.Header{"Retry-After": {value}}
		if wait, sent := retryAfterOf(h); wait != want.wait || sent != want.sent || retryAfter(h) != wait {
			t.Fatalf("Retry-After %q: %s %v, want %+v", value, wait, sent, want)
		}
	}
	date := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	if got := retryAfter(http.Header{"Retry-After": {date}}); got < 59*time.Minute {
		t.Fatalf("Retry-After %q: %s", date, got)
	}
	for attempt, want := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond} {
		if got := backoff(attempt); got != want {
			t.Fatalf("backoff(%d) = %s, want %s", attempt, got, want)
		}
	}
	if backoff(40) != maxPause {
		t.Fatalf("backoff must be capped")
	}
}
