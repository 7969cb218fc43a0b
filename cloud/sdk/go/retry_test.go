package opgraph_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	opgraph "opgraph.dev/go"
)

// The limited cloud allows one request per second with a burst of one, so
// a second request in the same second meets a real 429 with Retry-After.

func TestRateLimitWithoutRetriesReturns429(t *testing.T) {
	c, ctx := limited(t, opgraph.WithMaxRetries(0)), ctxOf(t)
	var limitedErr error
	for i := 0; i < 3 && limitedErr == nil; i++ {
		_, limitedErr = c.Usage(ctx)
	}
	e := apiError(t, limitedErr, http.StatusTooManyRequests, "rate_limited")
	if e.RetryAfter < time.Second || !e.Retryable() {
		t.Fatalf("want Retry-After of at least 1 s, got %+v", e)
	}
}

func TestRateLimitIsWaitedOut(t *testing.T) {
	c, ctx := limited(t), ctxOf(t)
	name := unique("burst")
	// Three writers at once: two of them meet a 429 and must wait their
	// turn, and the ingests' keys keep every event stored once.
	const writers = 3
	var wg sync.WaitGroup
	errs := make([]error, writers)
	ids := make([]string, writers)
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res, err := c.Ingest(ctx, opgraph.Event{Event: name, Properties: map[string]any{"writer": i}})
			if err == nil {
				ids[i] = res.IDs[0]
			}
			errs[i] = err
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	stored, err := c.Events(ctx, opgraph.EventFilter{Event: name})
	if err != nil {
		t.Fatal(err)
	}
	listed := make([]string, len(stored))
	for i, e := range stored {
		listed[i] = e.ID
	}
	if !sameIDs(ids, listed) {
		t.Fatalf("ingested %v, stored %v", ids, listed)
	}
}

func TestRateLimitIsWaitedOutByPostsWithoutAKey(t *testing.T) {
	// A 429 is a refusal before any work: even a call that could store
	// twice (no idempotency key) is retried after it.
	c, ctx := limited(t, opgraph.WithMaxRetries(5)), ctxOf(t)
	const writers = 3
	names := make([]string, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range names {
		names[i] = unique("robot")
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = c.CreateTrackable(ctx, opgraph.KindRobot, names[i], opgraph.TrackableOptions{})
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	var listed struct {
		Trackables []opgraph.Trackable `json:"trackables"`
	}
	if err := c.Do(ctx, http.MethodGet, "/api/trackables", url.Values{"limit": {"1000"}}, nil, "", &listed); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		count := 0
		for _, tr := range listed.Trackables {
			if tr.Name == name {
				count++
			}
		}
		if count != 1 {
			t.Fatalf("%s registered %d times", name, count)
		}
	}
}

// losingProxy relays each request to the cloud at upstream, where it is
// carried out, but drops the answers of the first lose requests (the
// connection closes unanswered), as when a network loses an answer after
// the cloud acted. It returns its URL and the Idempotency-Keys it saw.
func losingProxy(t *testing.T, upstream string, lose int) (string, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var keys []string
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		out, err := http.NewRequest(r.Method, strings.TrimRight(upstream, "/")+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		out.Header = r.Header.Clone()
		// Left to the transport, which then decompresses what it asked for.
		out.Header.Del("Accept-Encoding")
		resp, err := http.DefaultClient.Do(out)
		if err != nil {
			t.Error(err)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n <= lose {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		w.Write(answer)
	}))
	t.Cleanup(server.Close)
	return server.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), keys...)
	}
}

func TestLostTrackAnswerIsRetriedAndRecordedOnce(t *testing.T) {
	c, ctx := cloud(t), ctxOf(t)
	name := unique("robot.used")
	created, err := c.CreateTrackable(ctx, opgraph.KindRobot, "AMR-7", opgraph.TrackableOptions{EventName: name})
	if err != nil {
		t.Fatal(err)
	}
	proxyURL, keys := losingProxy(t, env(t, "OPGRAPH_URL"), 1)
	through := cloud(t, opgraph.WithURL(proxyURL), opgraph.WithMaxRetries(2))

	res, err := through.Track(ctx, created.Trackable.Code, opgraph.TrackOptions{Properties: map[string]any{"dock": 3}})
	if err != nil {
		t.Fatal(err)
	}
	sent := keys()
	if len(sent) != 2 || sent[0] == "" || sent[1] != sent[0] {
		t.Fatalf("want one retry under the first key, got keys %q", sent)
	}
	stored := eventsNamed(t, c, name)
	if len(stored) != 1 || stored[0].ID != res.IDs[0] {
		t.Fatalf("the use must be recorded once, got %d events for ids %v", len(stored), res.IDs)
	}
}

func TestClosedPortIsATransportError(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := listener.Addr().String()
	listener.Close()

	c, err := opgraph.New(
		opgraph.WithURL("http://"+addr),
		opgraph.WithAPIKey("og_unused"),
		opgraph.WithTimeout(500*time.Millisecond),
		opgraph.WithMaxRetries(2),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxOf(t)

	// A read, an ingest and a track (which always carry a key) are
	// retried...
	_, readErr := c.Events(ctx, opgraph.EventFilter{})
	_, ingestErr := c.Ingest(ctx, opgraph.Event{Event: "never.sent"})
	_, trackErr := c.Track(ctx, "code", opgraph.TrackOptions{})
	// ...a write without a key is not: it might have been stored.
	_, createErr := c.CreateTrackable(ctx, opgraph.KindRobot, "x", opgraph.TrackableOptions{})
	for _, tc := range []struct {
		err      error
		attempts int
	}{{readErr, 3}, {ingestErr, 3}, {trackErr, 3}, {createErr, 1}} {
		var te *opgraph.TransportError
		if !errors.As(tc.err, &te) {
			t.Fatalf("want a *TransportError, got %T: %v", tc.err, tc.err)
		}
		if te.Attempts != tc.attempts || te.Unwrap() == nil {
			t.Fatalf("want %d attempts with a cause, got %+v", tc.attempts, te)
		}
		var opErr *net.OpError
		var any opgraph.Error
		if !errors.As(tc.err, &opErr) || !errors.As(tc.err, &any) {
			t.Fatalf("the cause must show through: %v", tc.err)
		}
	}

	// A cancelled context ends the call with the context's error.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Events(cancelled, opgraph.EventFilter{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
}
