package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestWalkFleetKeepsOrder: results come out in the items' order across
// windows, whatever order the reads finish in, and the first error stops
// the walk.
func TestWalkFleetKeepsOrder(t *testing.T) {
	items := make([]string, 3*walkWindow+7)
	for i := range items {
		items[i] = fmt.Sprintf("h%05d", i)
	}
	var got []string
	err := walkFleet(context.Background(), items, func(_ context.Context, h string) (string, error) {
		return "read " + h, nil
	}, func(h, v string) error {
		if v != "read "+h {
			t.Errorf("item %s got %q", h, v)
		}
		got = append(got, h)
		return nil
	})
	if err != nil || !slices.Equal(got, items) {
		t.Fatalf("walk emitted %d items (error %v), want all %d in order", len(got), err, len(items))
	}
	bad := errors.New("redis: connection refused")
	emitted := 0
	err = walkFleet(context.Background(), items, func(_ context.Context, h string) (int, error) {
		if h == items[walkWindow+3] {
			return 0, bad
		}
		return 1, nil
	}, func(string, int) error { emitted++; return nil })
	if !errors.Is(err, bad) || emitted != walkWindow {
		t.Errorf("walk with a failing read: error %v after %d items, want %v after the first window (%d)", err, emitted, bad, walkWindow)
	}
}

// TestJSONArrayIsWriteJSON: the streamed array is byte for byte what
// writeJSON prints for the whole slice, empty or not.
func TestJSONArrayIsWriteJSON(t *testing.T) {
	type row struct {
		Host  string   `json:"host"`
		CPUs  []int    `json:"cpus"`
		Names []string `json:"names,omitempty"`
	}
	for _, rows := range [][]row{{}, {{Host: "a", CPUs: []int{1, 2}}}, {{Host: "a<b>", CPUs: nil, Names: []string{"x"}}, {Host: "c", CPUs: []int{}}}} {
		var want, got bytes.Buffer
		if err := writeJSON(&want, rows); err != nil {
			t.Fatal(err)
		}
		out := jsonArray{w: &got}
		for _, r := range rows {
			if err := out.add(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := out.close(); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("streamed:\n%s\nwriteJSON:\n%s", got.String(), want.String())
		}
	}
}
