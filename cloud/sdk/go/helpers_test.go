package opgraph_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	opgraph "opgraph.dev/go"
)

// The suite runs against real clouds started by tests/tests/sdks.rs; a
// missing one is a failure, never a skip, so a broken harness cannot pass.

// env returns the variable or fails the test.
func env(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		t.Fatalf("%s is not set: run the suite through tests/tests/sdks.rs or set it by hand", name)
	}
	return value
}

// cloud is a client of the normal cloud with an admin and operator key.
func cloud(t *testing.T, opts ...opgraph.Option) *opgraph.Client {
	t.Helper()
	base := []opgraph.Option{
		opgraph.WithURL(env(t, "OPGRAPH_URL")),
		opgraph.WithAPIKey(env(t, "OPGRAPH_API_KEY")),
	}
	client, err := opgraph.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// limited is a client of the cloud allowing 1 request/s, burst 1.
func limited(t *testing.T, opts ...opgraph.Option) *opgraph.Client {
	t.Helper()
	base := []opgraph.Option{
		opgraph.WithURL(env(t, "OPGRAPH_LIMITED_URL")),
		opgraph.WithAPIKey(env(t, "OPGRAPH_LIMITED_API_KEY")),
	}
	client, err := opgraph.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// ctxOf bounds a test's calls, so a hung cloud fails it rather than the
// harness's timeout.
func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// unique is a name no other test (or run) uses: the clouds are shared by
// every test of the suite.
func unique(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "." + hex.EncodeToString(b[:])
}

// apiError asserts that err is an *APIError with this status and code.
func apiError(t *testing.T, err error, status int, code string) *opgraph.APIError {
	t.Helper()
	var e *opgraph.APIError
	if !errors.As(err, &e) {
		t.Fatalf("want an *APIError %d %s, got %T: %v", status, code, err, err)
	}
	if e.Status != status || e.Code != code {
		t.Fatalf("want %d %s, got %d %s: %v", status, code, e.Status, e.Code, err)
	}
	var any opgraph.Error
	if !errors.As(err, &any) {
		t.Fatalf("an *APIError must be an opgraph.Error")
	}
	return e
}

// eventsNamed lists the stored events of one name.
func eventsNamed(t *testing.T, c *opgraph.Client, name string) []opgraph.StoredEvent {
	t.Helper()
	events, err := c.Events(ctxOf(t), opgraph.EventFilter{Event: name, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return events
}

func sameIDs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	set := make(map[string]bool, len(a))
	for _, id := range a {
		set[id] = true
	}
	for _, id := range b {
		if !set[id] {
			return false
		}
	}
	return true
}
