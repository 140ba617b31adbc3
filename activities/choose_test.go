package activities_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/placement"
)

// TestChooseHost: with the placement index and without one, ChooseHost
// packs (the fullest host that takes the guest), passes over excluded
// hosts and hosts that are down, and fails a guest no host takes with a
// non-retryable NoFit error that says why.
func TestChooseHost(t *testing.T) {
	ctx := context.Background()
	for _, indexed := range []bool{false, true} {
		name := "exhaustive"
		if indexed {
			name = "index"
		}
		t.Run(name, func(t *testing.T) {
			w := simcloud.New(t)
			for _, h := range []string{"a", "b", "c", "d"} {
				w.AddHost(t, h)
			}
			if indexed {
				w.Acts.Placement = placement.NewIndex(w.Ledger, placement.Options{})
			}
			// b holds 3 guests, c 2, a 1: b is the fullest, then c.
			for i, h := range []string{"a", "b", "b", "b", "c", "c"} {
				w.Claim(t, h, "boot-"+string(rune('0'+i)), simcloud.UUID(i), ledger.KindBoot, activities.Owner{WorkflowID: "wf", FirstRunID: "run"})
			}
			if _, err := w.Ledger.SetHostDown(ctx, "c", "psu"); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				exclude []string
				want    string
			}{
				{nil, "b"},
				{[]string{"b"}, "a"},
				{[]string{"b", "a"}, "d"},
			} {
				got, err := w.Acts.ChooseHost(ctx, activities.ChooseHostInput{UUID: simcloud.UUID(9), Flavor: simcloud.Flavor(), Exclude: tc.exclude})
				if got != tc.want || err != nil {
					t.Errorf("ChooseHost(excluding %v) = %q, %v; want %s", tc.exclude, got, err, tc.want)
				}
			}

			huge := simcloud.Flavor()
			huge.VCPUs = 9
			_, err := w.Acts.ChooseHost(ctx, activities.ChooseHostInput{UUID: simcloud.UUID(9), Flavor: huge})
			var app *temporal.ApplicationError
			if !errors.As(err, &app) || app.Type() != api.ErrTypeNoFit || !app.NonRetryable() {
				t.Fatalf("ChooseHost(9 vCPUs on hosts of 8) error %v, want a non-retryable %s", err, api.ErrTypeNoFit)
			}
			for _, want := range []string{"no host can take instance " + simcloud.UUID(9), "no NUMA cell with enough free pCPUs: a (no fit", "host down (takes no new guests): c (psu)"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("ChooseHost(9 vCPUs) error %q lacks %q", err, want)
				}
			}
		})
	}
}
