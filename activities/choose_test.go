package activities

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"

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
			w := newWorld(t)
			for _, h := range []string{"a", "b", "c", "d"} {
				w.addHost(t, h)
			}
			if indexed {
				w.acts.Placement = placement.NewIndex(w.led, placement.Options{})
			}
			// b holds 3 guests, c 2, a 1: b is the fullest, then c.
			for i, h := range []string{"a", "b", "b", "b", "c", "c"} {
				w.claim(t, h, "boot-"+string(rune('0'+i)), uuidN(i), ledger.KindBoot, Owner{"wf", "run"})
			}
			if _, err := w.led.SetHostDown(ctx, "c", "psu"); err != nil {
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
				got, err := w.acts.ChooseHost(ctx, ChooseHostInput{UUID: uuidN(9), Flavor: testFlavor, Exclude: tc.exclude})
				if got != tc.want || err != nil {
					t.Errorf("ChooseHost(excluding %v) = %q, %v; want %s", tc.exclude, got, err, tc.want)
				}
			}

			huge := testFlavor
			huge.VCPUs = 9
			_, err := w.acts.ChooseHost(ctx, ChooseHostInput{UUID: uuidN(9), Flavor: huge})
			var app *temporal.ApplicationError
			if !errors.As(err, &app) || app.Type() != ErrTypeNoFit || !app.NonRetryable() {
				t.Fatalf("ChooseHost(9 vCPUs on hosts of 8) error %v, want a non-retryable %s", err, ErrTypeNoFit)
			}
			for _, want := range []string{"no host can take instance " + uuidN(9), "a: no fit", "c: the host is down"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("ChooseHost(9 vCPUs) error %q lacks %q", err, want)
				}
			}
		})
	}
}
