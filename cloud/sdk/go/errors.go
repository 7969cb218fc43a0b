package opgraph

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error is satisfied by every error that comes from talking to the cloud:
// [*APIError] and [*TransportError]. Test for "any Opgraph error" with
// errors.As:
//
//	var oe opgraph.Error
//	if errors.As(err, &oe) && oe.Retryable() { ... }
//
// Errors of the caller's own making (a body that cannot be encoded as
// JSON, an empty business id) are plain errors, not Error.
type Error interface {
	error
	// Retryable reports whether the same request may succeed later
	// unchanged: a rate limit, an unavailable store, an internal error or
	// no answer at all. The client has already retried what it safely
	// could by the time it returns.
	Retryable() bool
	// sealed keeps the set of Opgraph errors to this package's two, so a
	// type switch over them is complete.
	sealed()
}

// APIError is an answer of the cloud outside 2xx, or a GraphQL answer whose
// errors list is not empty (Status 200, Code "graphql").
type APIError struct {
	// Status is the HTTP status, e.g. 400.
	Status int
	// Code is the API's snake_case code, e.g. "validation_failed",
	// "unauthorized", "rate_limited" or "graphql". When the answer did not
	// have the API's error shape (a proxy's page, a failed strict health
	// check), it is the API's code for the status ("unavailable" for 503),
	// else "http_<status>" ("http_502").
	Code string
	// Message is the API's text for a human (else the status text).
	Message string
	// Field is the JSON path of the offending input, e.g. "batch[3].event";
	// empty when the error is not about one field.
	Field string
	// RetryAfter is the answer's Retry-After; zero when it had none (or
	// asked for no wait).
	RetryAfter time.Duration
	// Errors is the GraphQL answer's error list (Code "graphql" only).
	Errors []GraphQLError
	// Body is the answer's body as received, e.g. the report of a failed
	// strict health check (which [Client.Health] also returns decoded).
	Body []byte
}

// Error says the status, code, message and field, e.g.
// "opgraph: 400 validation_failed: `event` is required (field batch[1].event)".
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "opgraph: %d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Field != "" {
		b.WriteString(" (field " + e.Field + ")")
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	return b.String()
}

// Retryable reports whether the same request may succeed later: 429, 500
// and 503.
func (e *APIError) Retryable() bool {
	switch e.Status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable:
		return true
	}
	return false
}

func (*APIError) sealed() {}

// GraphQLError is one entry of a GraphQL answer's "errors".
type GraphQLError struct {
	// Message is the error's text.
	Message string `json:"message"`
	// Path names the field that failed, as names and list indexes.
	Path []any `json:"path,omitempty"`
	// Locations are the places in the query the error is about.
	Locations []GraphQLLocation `json:"locations,omitempty"`
	// Extensions carries the API's "code" (and "field" for a bad argument).
	Extensions map[string]any `json:"extensions,omitempty"`
}

// GraphQLLocation is a line and column of a GraphQL document, from 1.
type GraphQLLocation struct {
	// Line is the line, from 1.
	Line int `json:"line"`
	// Column is the column, from 1.
	Column int `json:"column"`
}

// TransportError is a call that got no usable answer: a refused
// connection, a timeout, a TLS failure, a cancelled context, or a body that
// is not the JSON the API sends. Err is the cause; errors.Is(err,
// context.Canceled) and the like see through it.
type TransportError struct {
	// Method and URL are the request's.
	Method string
	// URL is the request's full URL.
	URL string
	// Attempts counts the requests sent, retries included.
	Attempts int
	// Err is the cause of the last attempt's failure.
	Err error
}

// Error names the request, how often it was tried, and the cause.
func (e *TransportError) Error() string {
	tries := ""
	if e.Attempts > 1 {
		tries = fmt.Sprintf(" (%d attempts)", e.Attempts)
	}
	return fmt.Sprintf("opgraph: %s %s%s: %v", e.Method, e.URL, tries, e.Err)
}

// Unwrap returns the cause.
func (e *TransportError) Unwrap() error { return e.Err }

// Retryable reports true: nothing came back, so the same request may work
// later (whether it is safe to send again is the caller's to judge).
func (e *TransportError) Retryable() bool { return true }

func (*TransportError) sealed() {}

// apiErrorOf reads an answer outside 2xx.
func apiErrorOf(a *answer) *APIError {
	e := &APIError{Status: a.status, Body: a.body, RetryAfter: retryAfter(a.header)}
	var shape struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"error"`
	}
	if json.Unmarshal(a.body, &shape) == nil && shape.Error != nil {
		e.Code, e.Message, e.Field = shape.Error.Code, shape.Error.Message, shape.Error.Field
	} else {
		e.Message = http.StatusText(a.status)
	}
	if e.Code == "" {
		e.Code = codeOf(a.status)
	}
	return e
}

// codeOf is the API's code for a status, for answers that did not come with
// one; the same table in all four SDKs. A 400 has several codes, so it gets
// none of them.
func codeOf(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusConflict:
		return "conflict"
	case http.StatusRequestEntityTooLarge:
		return "payload_too_large"
	case http.StatusUnsupportedMediaType:
		return "unsupported_media_type"
	case http.StatusTooManyRequests:
		return "rate_limited"
	case http.StatusInternalServerError:
		return "internal"
	case http.StatusServiceUnavailable:
		return "unavailable"
	}
	return "http_" + strconv.Itoa(status)
}

// retryAfter reads Retry-After as seconds or as an HTTP date; zero when
// absent or unreadable.
func retryAfter(h http.Header) time.Duration {
	wait, _ := retryAfterOf(h)
	return wait
}

// retryAfterOf reads Retry-After as seconds or as an HTTP date, and whether
// the answer had a readable one: "Retry-After: 0" asks for a retry at
// once, while an answer without one is not a refusal and is not retried.
func retryAfterOf(h http.Header) (time.Duration, bool) {
	value := strings.TrimSpace(h.Get("Retry-After"))
	if value == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(value, 10, 64); err == nil {
		// Clamped so that an absurd value cannot overflow a Duration; any
		// wait over a minute is raised at once anyway.
		if secs < 0 {
			return 0, false
		}
		if secs > maxRetryAfterSecs {
			secs = maxRetryAfterSecs
		}
		return time.Duration(secs) * time.Second, true
	}
	if at, err := http.ParseTime(value); err == nil {
		if wait := time.Until(at); wait > 0 {
			return wait, true
		}
		return 0, true
	}
	return 0, false
}

// maxRetryAfterSecs bounds a Retry-After read in seconds (a year).
const maxRetryAfterSecs = 365 * 24 * 3600
