package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNumaFitAnswersCases(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch([]string{"numa", "fit", filepath.Join("..", "numa", "testdata", "nova", "anchors.json")}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 9 {
		t.Fatalf("numa fit printed %d lines, want one per case (9)", len(lines))
	}
	var first struct {
		ID    string `json:"id"`
		Fit   bool   `json:"fit"`
		Cells []struct {
			HostCell   int            `json:"host_cell"`
			CPUPinning map[string]int `json:"cpu_pinning"`
		} `json:"cells"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first.ID != "small-2x16smt-4vcpu-dedicated" || !first.Fit || len(first.Cells) != 1 || len(first.Cells[0].CPUPinning) != 4 {
		t.Errorf("first answer = %+v, want a fit of 4 pinned vCPUs", first)
	}
}

func TestNumaFitTime(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch([]string{"numa", "fit", "--time", "5", filepath.Join("..", "numa", "testdata", "nova", "anchors.json")}, &out); err != nil {
		t.Fatal(err)
	}
	var line struct {
		ID       string  `json:"id"`
		Fit      bool    `json:"fit"`
		MedianUS float64 `json:"fit_median_us"`
	}
	if err := json.Unmarshal([]byte(strings.Split(out.String(), "\n")[0]), &line); err != nil || line.ID == "" || line.MedianUS <= 0 {
		t.Errorf("numa fit --time line = %+v, %v; want an id and a positive median", line, err)
	}
}

func TestNumaFitMalformedInput(t *testing.T) {
	tests := []struct {
		name, input string
		want        []string
	}{
		{"not JSON", `[{"id": "a",`, []string{"not a JSON array"}},
		{"missing instance", `[{"id": "c1", "host": {"cells": []}}]`, []string{"case 0", `"c1"`, `"instance"`}},
		{"wrong type", `{"id": "c2", "host": {"cells": []}, "instance": {"vcpus": "four", "memory_mb": 1}}`, []string{"case 0", `"c2"`, "instance", "vcpus"}},
		{"bad cpu list", `{"id": "c3", "host": {"cells": [{"id": 0, "cpus": [-1], "memory_mb": 1}]}, "instance": {"vcpus": 1, "memory_mb": 1}}`, []string{"c3", "cpu id -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "cases.json")
			if err := os.WriteFile(f, []byte(tt.input), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := dispatch([]string{"numa", "fit", f}, &out)
			if tt.name == "bad cpu list" {
				// A bad host is an answer of its own, not a failure of the
				// whole run: the other cases still get theirs.
				if err != nil || !strings.Contains(out.String(), "cpu id -1") || !strings.Contains(out.String(), `"c3"`) {
					t.Errorf("numa fit %s = %q, %v; want an error answer naming the case and the bad id", tt.name, out.String(), err)
				}
				return
			}
			if err == nil {
				t.Fatalf("numa fit %s succeeded: %s", tt.name, out.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
					t.Errorf("numa fit %s error %q: want one line containing %q", tt.name, err, w)
				}
			}
		})
	}
}
