package opgraph

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// GraphQL runs a query over the operating graph (POST /api/graphql) and
// decodes its "data" into out (skipped when out is nil). variables may be
// nil.
//
// An answer with errors is an [*APIError] with Status 200, Code "graphql"
// and the list in Errors, and out is left alone: a caller never reads
// partial data by mistake.
//
//	var data struct {
//		Events []struct{ ID, Event string }
//	}
//	err := client.GraphQL(ctx, `{ events(limit: 5) { id event } }`, nil, &data)
func (c *Client) GraphQL(ctx context.Context, query string, variables map[string]any, out any) error {
	body := struct {
		Query     string         `json:"query"`
		Variables map[string]any `json:"variables,omitempty"`
	}{query, variables}
	var answer struct {
		Data   json.RawMessage `json:"data"`
		Errors []GraphQLError  `json:"errors"`
	}
	if err := c.Do(ctx, http.MethodPost, "/api/graphql", nil, body, "", &answer); err != nil {
		return err
	}
	if len(answer.Errors) > 0 {
		return graphqlError(answer.Errors)
	}
	if out == nil || len(answer.Data) == 0 {
		return nil
	}
	if err := json.Unmarshal(answer.Data, out); err != nil {
		return &TransportError{
			Method: http.MethodPost, URL: c.base + "/api/graphql", Attempts: 1,
			Err: fmt.Errorf("the answer's data do not fit: %w", err),
		}
	}
	return nil
}

// graphqlError turns a GraphQL error list into one APIError whose message
// holds every error's.
func graphqlError(list []GraphQLError) *APIError {
	messages := make([]string, len(list))
	for i, e := range list {
		messages[i] = e.Message
	}
	return &APIError{
		Status:  http.StatusOK,
		Code:    "graphql",
		Message: strings.Join(messages, "; "),
		Errors:  list,
	}
}
