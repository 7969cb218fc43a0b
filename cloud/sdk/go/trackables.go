package opgraph

import (
	"context"
	"net/http"
)

// Trackable kinds accepted by [Client.CreateTrackable].
const (
	// KindQRCode is a QR code; it needs a TargetURL.
	KindQRCode = "qr_code"
	// KindBarcode is a barcode (a GTIN as Code, say).
	KindBarcode = "barcode"
	// KindRFIDTag is an RFID tag (an EPC as Code, say).
	KindRFIDTag = "rfid_tag"
	// KindSensor is a sensor.
	KindSensor = "sensor"
	// KindRobot is a robot.
	KindRobot = "robot"
	// KindAIAgent is an AI agent.
	KindAIAgent = "ai_agent"
	// KindMCPServer is an MCP server.
	KindMCPServer = "mcp_server"
	// KindCLIWorkflow is a command-line workflow.
	KindCLIWorkflow = "cli_workflow"
)

// TrackableOptions are the optional fields of [Client.CreateTrackable].
type TrackableOptions struct {
	// TargetURL is where a QR scan leads (http or https; required for a QR
	// code).
	TargetURL string `json:"targetUrl,omitempty"`
	// EventName is the event recorded when it is used.
	EventName string `json:"eventName,omitempty"`
	// Code registers an external identifier (an EPC, a GTIN); by default
	// the cloud makes a short one.
	Code string `json:"code,omitempty"`
	// IncludeQRSVG asks for the QR code as SVG.
	IncludeQRSVG bool `json:"includeQrSvg,omitempty"`
}

// Trackable is a registered QR code, barcode, tag, sensor, robot or agent.
type Trackable struct {
	// ID is its id ("trk_...").
	ID string `json:"id"`
	// Code is what identifies it in the field and in [Client.Track].
	Code string `json:"code"`
	// Kind is one of the Kind constants.
	Kind string `json:"kind"`
	// Name says what it is.
	Name string `json:"name"`
	// TargetURL is where a QR scan leads.
	TargetURL string `json:"targetUrl,omitempty"`
	// EventName is the event recorded when it is used.
	EventName string `json:"eventName,omitempty"`
	// ScanURL is the public scan address (what a QR code encodes).
	ScanURL string `json:"scanUrl"`
	// CreatedAt is when it was registered, ms.
	CreatedAt int64 `json:"createdAt"`
}

// CreatedTrackable is the answer of [Client.CreateTrackable].
type CreatedTrackable struct {
	// Trackable is what was registered.
	Trackable Trackable `json:"trackable"`
	// QRSVG is the QR code as SVG, when asked for.
	QRSVG string `json:"qrSvg,omitempty"`
}

// CreateTrackable registers a trackable of a kind (a Kind constant) and
// gets its code and scan URL (POST /api/trackables).
func (c *Client) CreateTrackable(ctx context.Context, kind, name string, opts TrackableOptions) (*CreatedTrackable, error) {
	body := struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
		TrackableOptions
	}{kind, name, opts}
	var out CreatedTrackable
	if err := c.Do(ctx, http.MethodPost, "/api/trackables", nil, body, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TrackOptions are the optional fields of [Client.Track].
type TrackOptions struct {
	// Event is the event's name (default: the trackable's EventName, then
	// "trackable.used").
	Event string `json:"event,omitempty"`
	// Properties are the use's own facts.
	Properties map[string]any `json:"properties,omitempty"`
	// Actor is who or what used it, as in [Event].
	Actor any `json:"actor,omitempty"`
	// Timestamp is when, ms (default: the receive time).
	Timestamp int64 `json:"timestamp,omitempty"`
	// BusinessID is the business it belongs to.
	BusinessID string `json:"businessId,omitempty"`
}

// Track records a use of a registered trackable, named by its code (POST
// /api/track); the event's trackable is {kind, code, id}. An unknown code
// is an [*APIError] 404.
//
// Like [Client.Ingest], the request always carries an idempotency key, the
// caller's ([WithIdempotencyKey]) or a random one made for this call, so
// that a retry after a lost answer records the use once.
func (c *Client) Track(ctx context.Context, code string, opts TrackOptions, callOpts ...CallOption) (*IngestResult, error) {
	body := struct {
		Code string `json:"code"`
		TrackOptions
	}{code, opts}
	key, err := keyOf(callOpts)
	if err != nil {
		return nil, err
	}
	var out IngestResult
	if err := c.Do(ctx, http.MethodPost, "/api/track", nil, body, key, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
