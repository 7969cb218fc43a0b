package opgraph

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

const (
	// maxRetryAfter is the longest Retry-After waited out; a longer one
	// (an exhausted monthly quota answers an hour) is returned at once.
	maxRetryAfter = 60 * time.Second
	// firstPause is the pause before the first retry of a call that got no
	// answer; it doubles with each retry.
	firstPause = 200 * time.Millisecond
	// maxPause caps the doubling, for clients with many retries.
	maxPause = 30 * time.Second
)

// answer is what came back from one attempt.
type answer struct {
	status int
	header http.Header
	body   []byte
	// url and attempts describe the request, for a TransportError about
	// the body.
	url      string
	attempts int
}

// Do sends any API request, for operations without a method of their own,
// and decodes the JSON answer into out (skipped when out is nil).
//
// path starts with "/api/"; query may be nil; body, when not nil, is
// encoded as JSON (a json.RawMessage is sent as is). A non-empty
// idempotencyKey is sent as Idempotency-Key and makes the request safe to
// repeat when no answer came. Retries, errors and timeouts are those of
// every call.
//
//	var keys struct{ Keys []map[string]any }
//	err := client.Do(ctx, "GET", "/api/keys", nil, nil, "", &keys)
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body any, idempotencyKey string, out any) error {
	a, err := c.send(ctx, method, path, query, body, idempotencyKey)
	if err != nil {
		return err
	}
	return decode(method, a, out)
}

// decode reads a 2xx answer into out. A body that is not the JSON the API
// sends is a TransportError: the request may well have been served, but
// its answer did not arrive intact.
func decode(method string, a *answer, out any) error {
	var err error
	if out == nil {
		// Nothing is read, but an answer that is not JSON is still not
		// the API's.
		if len(bytes.TrimSpace(a.body)) > 0 && !json.Valid(a.body) {
			err = errors.New("the answer is not JSON")
		}
	} else if e := json.Unmarshal(a.body, out); e != nil {
		err = fmt.Errorf("the answer is not the JSON expected: %w", e)
	}
	if err != nil {
		return &TransportError{Method: method, URL: a.url, Attempts: a.attempts, Err: err}
	}
	return nil
}

// send makes the attempts of one call: it returns a 2xx answer, or the
// error of the last attempt once retrying cannot help or is not safe
// (docs/sdks.md, "Retries"):
//   - no answer: retried after 0.2 s, 0.4 s, ... only when the call is
//     retry-safe (a GET, or a call carrying an idempotency key);
//   - 429 with Retry-After: the cloud refused before doing anything, so
//     any call is retried after the wait;
//   - 503 with Retry-After: the store may have taken a write it could not
//     answer, so only a retry-safe call is retried;
//   - a wait over a minute, a 429 or 503 without Retry-After (strict
//     health's report), and any other answer are returned at once.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, body any, key string) (*answer, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("opgraph: the path %q must start with /", path)
	}
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	// A bad method or path is the caller's mistake, not the network's:
	// refuse it before the loop would call it a transport failure.
	if _, err := http.NewRequest(method, target, nil); err != nil {
		return nil, fmt.Errorf("opgraph: %w", err)
	}
	// The bytes are kept, so that every retry sends the same body.
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("opgraph: the request body cannot be encoded as JSON: %w", err)
		}
	}
	// Repeating a request that got no answer (or a 503) must not store
	// twice: reads change nothing, and a write with an idempotency key is
	// stored once.
	repeatable := key != "" || method == http.MethodGet || method == http.MethodHead

	for attempt := 0; ; attempt++ {
		a, err := c.attempt(ctx, method, target, payload, key)
		var last error
		var pause time.Duration
		switch {
		case err != nil:
			last = &TransportError{Method: method, URL: target, Attempts: attempt + 1, Err: err}
			if ctx.Err() != nil || !repeatable || attempt >= c.maxRetries {
				return nil, last
			}
			pause = backoff(attempt)
		case a.status == http.StatusTooManyRequests ||
			a.status == http.StatusServiceUnavailable && repeatable:
			e := apiErrorOf(a)
			wait, sent := retryAfterOf(a.header)
			if !sent || wait > maxRetryAfter || attempt >= c.maxRetries {
				return nil, e
			}
			last, pause = e, wait
		case a.status < 200 || a.status > 299:
			return nil, apiErrorOf(a)
		default:
			a.url, a.attempts = target, attempt+1
			return a, nil
		}
		// A pause that would outlast the context cannot lead anywhere:
		// the last answer is more useful than a deadline error later.
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < pause {
			return nil, last
		}
		if err := sleep(ctx, pause); err != nil {
			return nil, &TransportError{Method: method, URL: target, Attempts: attempt + 1, Err: err}
		}
	}
}

// attempt sends the request once, bounded by the client's timeout, and
// reads the whole answer.
func (c *Client) attempt(ctx context.Context, method, target string, payload []byte, key string) (*answer, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "opgraph-go/"+Version)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.workspace != "" {
		req.Header.Set("X-Opgraph-Workspace-ID", c.workspace)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

// backoff is the pause before retry number attempt+1 of a call that got no
// answer: 0.2 s, 0.4 s, 0.8 s, ...
func backoff(attempt int) time.Duration {
	pause := firstPause
	for i := 0; i < attempt && pause < maxPause; i++ {
		pause *= 2
	}
	if pause > maxPause {
		pause = maxPause
	}
	return pause
}

// sleep waits d, or less if the context ends first.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newIdempotencyKey is a random UUID (version 4), made once per call so
// that its retries carry the same key.
func newIdempotencyKey() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("opgraph: making an idempotency key: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
