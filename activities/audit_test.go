package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// TestAuditErr: each kind of error the Auditor returns becomes the error
// type workflows and the CLI branch on, non-retryable when no retry can
// help, and anything else is passed through for Temporal to retry.
func TestAuditErr(t *testing.T) {
	ctx := context.Background()
	// The Auditor's own errors where it makes them without a server: a
	// bad request, and a worker without an owner checker.
	neg := -time.Second
	_, invalid := (&audit.Auditor{}).SweepBuilding(ctx, audit.SweepBuildingInput{Grace: &neg})
	var bad *audit.InvalidError
	if !errors.As(invalid, &bad) {
		t.Fatalf("SweepBuilding(grace %s) = %v, want an audit.InvalidError", neg, invalid)
	}
	_, unconfigured := (&audit.Auditor{}).SweepBuilding(ctx, audit.SweepBuildingInput{})
	if unconfigured == nil {
		t.Fatal("SweepBuilding without an owner checker = nil, want its error")
	}
	// A RefusedError's message is unexported: only a real refusal, which
	// needs a ledger, carries one.
	refused := &audit.RefusedError{}
	unknownHost := fmt.Errorf("ledger: snapshot nowhere: %w", ledger.ErrUnknownHost)
	unknownInstance := fmt.Errorf("ledger: instance 42: %w", ledger.ErrUnknownInstance)
	hostDown := fmt.Errorf("ledger: fence c1 on a: %w", ledger.ErrHostDown)
	badKey := fmt.Errorf("ledger: claim c1 on a b: %w", ledger.ErrInvalid)
	unreachable := fmt.Errorf("ledger: snapshot a: %w", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))

	tests := []struct {
		name string
		in   error
		// wantType is the application error's type; "" wants in itself
		// back, for Temporal to retry.
		wantType         string
		wantNonRetryable bool
		// wantMsg is what the application error's message must say.
		wantMsg string
	}{
		{"nil", nil, "", false, ""},
		{"invalid request", invalid, api.ErrTypeInvalidRequest, true, invalid.Error()},
		{"invalid request, wrapped", fmt.Errorf("audit: sweep: %w", invalid), api.ErrTypeInvalidRequest, true, invalid.Error()},
		{"refused", refused, api.ErrTypeBadState, true, ""},
		{"refused, wrapped", fmt.Errorf("audit: release quarantine: %w", refused), api.ErrTypeBadState, true, ""},
		{"unknown host in the ledger", unknownHost, api.ErrTypeUnknownHost, true, unknownHost.Error()},
		{"unknown host of the hypervisor", hypervisor.ErrUnknownHost, api.ErrTypeUnknownHost, true, hypervisor.ErrUnknownHost.Error()},
		{"unknown instance", unknownInstance, api.ErrTypeUnknownInstance, true, unknownInstance.Error()},
		{"host down", hostDown, api.ErrTypeHostDown, true, hostDown.Error()},
		{"bad ledger input", badKey, api.ErrTypeInvalidRequest, true, badKey.Error()},
		{"no owner checker", unconfigured, "", false, ""},
		{"ledger unreachable", unreachable, "", false, ""},
		{"cancelled", context.Canceled, "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, got := describe(tt.in), auditErr(tt.in)
			if tt.wantType == "" {
				if got != tt.in {
					t.Errorf("auditErr(%s) = %s, want the error itself, retryable", in, describe(got))
				}
				return
			}
			var app *temporal.ApplicationError
			if !errors.As(got, &app) {
				t.Fatalf("auditErr(%s) = %s, want a %s application error", in, describe(got), tt.wantType)
			}
			if app.Type() != tt.wantType || app.NonRetryable() != tt.wantNonRetryable {
				t.Errorf("auditErr(%s) = type %s, non-retryable %v; want type %s, non-retryable %v",
					in, app.Type(), app.NonRetryable(), tt.wantType, tt.wantNonRetryable)
			}
			if !strings.Contains(app.Message(), tt.wantMsg) {
				t.Errorf("auditErr(%s) message = %q, want it to say %q", in, app.Message(), tt.wantMsg)
			}
		})
	}
}

// describe names an error by its type and text, since some carry none.
func describe(err error) string {
	if err == nil {
		return "nil"
	}
	return fmt.Sprintf("%T %q", err, err.Error())
}
