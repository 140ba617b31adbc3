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

func TestNumaFitDevices(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch([]string{"numa", "fit", filepath.Join("..", "numa", "testdata", "nova", "pci-edges.json")}, &out); err != nil {
		t.Fatal(err)
	}
	type take struct {
		Request  int  `json:"request"`
		Pool     int  `json:"pool"`
		HostCell *int `json:"host_cell"`
		Count    int  `json:"count"`
	}
	answers := map[string]struct {
		Fit     bool   `json:"fit"`
		Devices []take `json:"pci_devices"`
		Cells   []struct {
			HostCell int `json:"host_cell"`
		} `json:"cells"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var a struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatal(err)
		}
		v := answers[a.ID]
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatal(err)
		}
		answers[a.ID] = v
	}
	first := answers["pci-order-devices-first"]
	if !first.Fit || len(first.Cells) != 1 || first.Cells[0].HostCell != 2 || len(first.Devices) != 1 ||
		first.Devices[0].HostCell == nil || *first.Devices[0].HostCell != 2 || first.Devices[0].Count != 1 {
		t.Errorf("pci-order-devices-first = %+v, want host cell 2 and one device from its pool", first)
	}
	if plain := answers["pci-no-numa-guest-with-devices"]; !plain.Fit || len(plain.Devices) != 1 {
		t.Errorf("pci-no-numa-guest-with-devices = %+v, want a fit with its device", plain)
	}
	if bad := answers["pci-flavor-policy-unknown"]; bad.Error == nil || !strings.Contains(bad.Error.Message, `"strict": allowed values are required, legacy, preferred or socket`) {
		t.Errorf("pci-flavor-policy-unknown = %+v, want the policy refused", bad)
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
		{"bad pool address", `{"id": "c4", "host": {"cells": [{"id": 0, "cpus": [0], "memory_mb": 1}], "pci_pools": [{"vendor_id": "8086", "product_id": "154d", "count": 1, "address": "81:00.1"}]}, "instance": {"vcpus": 1, "memory_mb": 1}}`,
			[]string{"c4", `address \"81:00.1\": allowed is a PCI address DDDD:BB:SS.F`}},
		{"bad pool count", `{"id": "c5", "host": {"cells": [{"id": 0, "cpus": [0], "memory_mb": 1}], "pci_pools": [{"vendor_id": "8086", "product_id": "154d", "count": -1}]}, "instance": {"vcpus": 1, "memory_mb": 1}}`,
			[]string{"c5", "count -1: allowed are 0-1048576"}},
		{"request count zero", `{"id": "c6", "host": {"cells": [{"id": 0, "cpus": [0], "memory_mb": 1}]}, "instance": {"vcpus": 1, "memory_mb": 1, "pci_requests": [{"count": 0, "spec": [{"vendor_id": "8086"}]}]}}`,
			[]string{"c6", "pci_requests[0].count 0: allowed are whole numbers of at least 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "cases.json")
			if err := os.WriteFile(f, []byte(tt.input), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := dispatch([]string{"numa", "fit", f}, &out)
			if tt.name == "bad cpu list" || strings.HasPrefix(tt.name, "bad pool") || tt.name == "request count zero" {
				// A bad host or request is an answer of its own, not a
				// failure of the whole run: the other cases still get theirs.
				for _, want := range tt.want {
					if err != nil || !strings.Contains(out.String(), want) {
						t.Errorf("numa fit %s = %q, %v; want an error answer containing %q", tt.name, out.String(), err, want)
					}
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
