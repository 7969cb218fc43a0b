package opgraph

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Version is this SDK's version, sent in the User-Agent header.
const Version = "0.1.0"

// DefaultURL is the cloud's address when neither [WithURL] nor OPGRAPH_URL
// names one: a cloud started locally with its defaults.
const DefaultURL = "http://127.0.0.1:8080"

// Defaults of the settings, as in every first-party SDK.
const (
	// DefaultTimeout bounds each attempt of a call (not the call with its
	// retries: bound that with the context).
	DefaultTimeout = 30 * time.Second
	// DefaultMaxRetries is how many times a call is repeated after its
	// first attempt, at most.
	DefaultMaxRetries = 3
)

// Client calls one Opgraph cloud. It is safe for concurrent use; make one
// and share it, so that connections are reused.
type Client struct {
	// base is the URL without a trailing slash; paths are appended to it.
	base       string
	apiKey     string
	workspace  string
	timeout    time.Duration
	maxRetries int
	http       *http.Client
}

// settings collects the options before New checks them.
type settings struct {
	url        string
	apiKey     string
	workspace  string
	timeout    time.Duration
	maxRetries int
	http       *http.Client
}

// Option is a setting of [New].
type Option func(*settings)

// WithURL sets the cloud's base URL, e.g. "https://opgraph.example.com"
// (default: OPGRAPH_URL, else [DefaultURL]). A path prefix is kept, for a
// cloud behind a proxy at "https://example.com/opgraph". An empty URL
// counts as not given (see [New]).
func WithURL(u string) Option { return func(s *settings) { s.url = u } }

// WithAPIKey sets the credential sent as "Authorization: Bearer <key>": an
// API key ("og_...") or an enterprise token (default: OPGRAPH_API_KEY). An
// empty key counts as not given (see [New]).
func WithAPIKey(key string) Option { return func(s *settings) { s.apiKey = key } }

// WithWorkspace sets the workspace id sent as X-Opgraph-Workspace-ID, which
// an enterprise token naming several workspaces needs (default:
// OPGRAPH_WORKSPACE_ID). An API key belongs to one workspace and needs
// none. An empty id counts as not given (see [New]).
func WithWorkspace(id string) Option { return func(s *settings) { s.workspace = id } }

// WithTimeout bounds each attempt of a call, retries each getting their own
// (default [DefaultTimeout]); 0 leaves attempts bounded by the context
// only.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithMaxRetries sets how many times a call may be repeated after its first
// attempt (default [DefaultMaxRetries]); 0 turns retries off.
func WithMaxRetries(n int) Option { return func(s *settings) { s.maxRetries = n } }

// WithHTTPClient sets the http.Client that sends requests, for a proxy,
// custom TLS or instrumentation (default: a client of its own with
// http.DefaultTransport). Its own Timeout, if any, applies on top of
// [WithTimeout].
func WithHTTPClient(c *http.Client) Option { return func(s *settings) { s.http = c } }

// New makes a client. Without options, the URL comes from OPGRAPH_URL
// (else [DefaultURL]), the key from OPGRAPH_API_KEY and the workspace from
// OPGRAPH_WORKSPACE_ID, as for the command line. An empty URL, key or
// workspace (or one of only spaces, tabs and line breaks) counts as not
// given, so its environment variable applies; an empty variable counts as
// unset too, so the URL falls back to [DefaultURL] and no key or workspace
// header is sent. It refuses a URL that is not http(s), and a key or
// workspace id holding control characters (a newline would split the
// header).
func New(opts ...Option) (*Client, error) {
	s := settings{timeout: DefaultTimeout, maxRetries: DefaultMaxRetries}
	for _, opt := range opts {
		opt(&s)
	}
	s.url = setting(s.url, "OPGRAPH_URL")
	if s.url == "" {
		s.url = DefaultURL
	}
	s.apiKey = setting(s.apiKey, "OPGRAPH_API_KEY")
	s.workspace = setting(s.workspace, "OPGRAPH_WORKSPACE_ID")
	base, err := checkURL(s.url)
	if err != nil {
		return nil, err
	}
	if err := checkHeaderValue("API key", s.apiKey); err != nil {
		return nil, err
	}
	if err := checkHeaderValue("workspace id", s.workspace); err != nil {
		return nil, err
	}
	if s.timeout < 0 {
		return nil, fmt.Errorf("opgraph: the timeout must not be negative, got %s", s.timeout)
	}
	if s.maxRetries < 0 {
		return nil, fmt.Errorf("opgraph: the retries must not be negative, got %d", s.maxRetries)
	}
	if s.http == nil {
		s.http = &http.Client{}
	}
	return &Client{
		base:       base,
		apiKey:     s.apiKey,
		workspace:  s.workspace,
		timeout:    s.timeout,
		maxRetries: s.maxRetries,
		http:       s.http,
	}, nil
}

// blank is what a setting may hold and still count as not given: the
// same rule in all four SDKs.
const blank = " \t\n\v\f\r"

// setting is the value given, else the environment variable, else "". A
// value of only blank characters counts as not given, so that
// OPGRAPH_WORKSPACE_ID= or WithAPIKey("") falls through to the next source
// instead of sending an empty header.
func setting(value, variable string) string {
	if strings.Trim(value, blank) != "" {
		return value
	}
	if value = os.Getenv(variable); strings.Trim(value, blank) != "" {
		return value
	}
	return ""
}

// checkURL accepts an absolute http(s) URL without query or fragment and
// returns it without its trailing slash.
func checkURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("opgraph: the URL %q cannot be read: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("opgraph: the URL %q must start with http:// or https://", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("opgraph: the URL %q names no host", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("opgraph: the URL %q must not carry a query, fragment or user info", raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// checkHeaderValue refuses control characters: net/http would refuse them
// too, but only at the first call, with a less clear message.
func checkHeaderValue(what, value string) error {
	for _, r := range value {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("opgraph: the %s must not contain control characters such as a newline", what)
		}
	}
	return nil
}

// errEmptyID is returned before sending when a path id is empty.
var errEmptyID = errors.New("opgraph: the id must not be empty")
