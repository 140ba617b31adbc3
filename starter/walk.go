package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"
)

// Walking the fleet: reads run walkAtOnce at a time, in windows of
// walkWindow items whose results are handed on in the items' order, so a
// command over 100,000 hosts streams its output instead of waiting on one
// host's round trips at a time, and holds one window in memory.
const (
	walkAtOnce = 16
	walkWindow = 512
)

// walkFleet reads every item with read and hands each result to emit in the
// items' order. The first error of either stops the walk.
func walkFleet[T any](ctx context.Context, items []string, read func(context.Context, string) (T, error), emit func(string, T) error) error {
	for len(items) > 0 {
		window := items[:min(len(items), walkWindow)]
		items = items[len(window):]
		got := make([]T, len(window))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(walkAtOnce)
		for i, item := range window {
			g.Go(func() error {
				v, err := read(gctx, item)
				got[i] = v
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		for i, item := range window {
			if err := emit(item, got[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonArray writes a JSON array an element at a time, byte for byte as
// writeJSON writes the whole slice.
type jsonArray struct {
	w io.Writer
	n int
}

func (j *jsonArray) add(v any) error {
	b, err := json.MarshalIndent(v, "  ", "  ")
	if err != nil {
		return err
	}
	sep := ",\n  "
	if j.n == 0 {
		sep = "[\n  "
	}
	j.n++
	_, err = fmt.Fprintf(j.w, "%s%s", sep, b)
	return err
}

func (j *jsonArray) close() error {
	end := "\n]\n"
	if j.n == 0 {
		end = "[]\n"
	}
	_, err := io.WriteString(j.w, end)
	return err
}
