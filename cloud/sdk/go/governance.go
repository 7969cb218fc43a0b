package opgraph

import (
	"context"
	"net/http"
)

// EnforceRequest asks governance whether a proposed action may go ahead.
type EnforceRequest struct {
	// DecisionObjectID is the decision the action carries out ("dec_...").
	DecisionObjectID string `json:"decisionObjectId"`
	// AuthorityGrantID is the grant it acts under ("grt_...").
	AuthorityGrantID string `json:"authorityGrantId"`
	// ContextContractID is the contract that bounds it ("ctc_...").
	ContextContractID string `json:"contextContractId"`
	// ProposedAction is what is proposed.
	ProposedAction ProposedAction `json:"proposedAction"`
	// Attestation is one attestation ({provider, ...}) or a list of up to
	// 20.
	Attestation any `json:"attestation,omitempty"`
	// TraceID names the trace whose latest event triggered the action.
	TraceID string `json:"traceId,omitempty"`
	// EventID names the triggering event (over TraceID).
	EventID string `json:"eventId,omitempty"`
	// ComplianceMapping maps a framework's name to its control evidence.
	ComplianceMapping map[string]any `json:"complianceMapping,omitempty"`
}

// ProposedAction is the action of an [EnforceRequest].
type ProposedAction struct {
	// Action names it; it must be allowed by the grant and the contract.
	Action string `json:"action"`
	// Amount is its value, 0 to 1e15; nil when it has none. Currency is
	// then required.
	Amount *float64 `json:"amount,omitempty"`
	// Currency is three upper-case letters ("EUR").
	Currency string `json:"currency,omitempty"`
	// Actor is who proposes to act: the grant's grantee when given.
	Actor string `json:"actor,omitempty"`
	// Extra fields are recorded as sent (the named fields win).
	Extra map[string]any `json:"-"`
}

// MarshalJSON writes the action with Extra's fields beside the named ones.
func (p ProposedAction) MarshalJSON() ([]byte, error) {
	type plain ProposedAction
	return withExtra(plain(p), p.Extra)
}

// EnforceCheck is one rule's verdict.
type EnforceCheck struct {
	// Check is the rule's stable name, e.g. "grant_amount".
	Check string `json:"check"`
	// Passed is true when the rule is satisfied.
	Passed bool `json:"passed"`
	// Outcome is what this rule alone demands ("allow" when it passed).
	Outcome string `json:"outcome"`
	// Detail says why, for a human.
	Detail string `json:"detail"`
}

// EnforceResult is governance's answer.
type EnforceResult struct {
	// Outcome is the most severe of the checks': "deny",
	// "needs_human_approval", "escrow" or "allow".
	Outcome string `json:"outcome"`
	// ReceiptID is the id of the receipt recorded ("rcp_...").
	ReceiptID string `json:"receiptId"`
	// Checks are every rule's verdict.
	Checks []EnforceCheck `json:"checks"`
	// Receipt is the immutable, hash-chained receipt.
	Receipt map[string]any `json:"receipt"`
}

// Outcomes of an enforcement, from the most severe.
const (
	// OutcomeDeny: the action must not go ahead.
	OutcomeDeny = "deny"
	// OutcomeNeedsHumanApproval: a person must approve it first.
	OutcomeNeedsHumanApproval = "needs_human_approval"
	// OutcomeEscrow: it may go ahead with its value held in escrow.
	OutcomeEscrow = "escrow"
	// OutcomeAllow: it may go ahead.
	OutcomeAllow = "allow"
)

// Enforce evaluates every governance check of a proposed action and
// records a receipt (POST /api/governance/enforce). A denial is an answer,
// not an error: read Outcome.
func (c *Client) Enforce(ctx context.Context, request EnforceRequest) (*EnforceResult, error) {
	var out EnforceResult
	if err := c.Do(ctx, http.MethodPost, "/api/governance/enforce", nil, request, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}
