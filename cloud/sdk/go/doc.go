// Package opgraph is the Go client of the Opgraph cloud's HTTP API.
//
// A [Client] holds the cloud's URL, an API key (or an enterprise token) and
// the retry settings; it is safe for concurrent use. Each method is one API
// operation and takes a [context.Context] first:
//
//	client, err := opgraph.New() // OPGRAPH_URL, OPGRAPH_API_KEY, OPGRAPH_WORKSPACE_ID
//	if err != nil {
//		log.Fatal(err)
//	}
//	res, err := client.Ingest(ctx, opgraph.Event{
//		Event:      "pallet.scanned",
//		Actor:      "dock-3",
//		Properties: map[string]any{"weight": 12.5},
//	})
//
// Every error that comes from talking to the cloud is an [Error]: an
// [*APIError] when the cloud answered outside 2xx (or a GraphQL answer
// carried errors), a [*TransportError] when no usable answer came.
//
// Retries follow the contract shared by the four first-party SDKs
// (docs/sdks.md): a 429 with Retry-After is retried after it for any call;
// a 503 with Retry-After, and a request that got no answer (with growing
// pauses), only when repeating it cannot store twice: GET requests, and
// writes carrying an idempotency key, which Ingest and Track always do. A
// wait over a minute, and a 429 or 503 without Retry-After, are returned
// at once.
//
// The package uses the standard library only.
package opgraph
