package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/xmlpatch"
)

var xmlTestdata = filepath.Join("..", "xmlpatch", "testdata")

// withStdin runs f with standard input reading data.
func withStdin(t *testing.T, data []byte, f func()) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	saved := os.Stdin
	os.Stdin = in
	defer func() { os.Stdin = saved }()
	f()
}

// TestXMLPatch runs `pinflow xml patch` on the live-migration reference:
// Nova's fit from a file, and pinflow's own fit piped in on stdin as in
// `pinflow numa fit case.json | pinflow xml patch --domain d.xml --placement -`.
// Both must give the pins of Nova's domain-dst.xml; the package tests
// compare the whole documents canonically.
func TestXMLPatch(t *testing.T) {
	domain := filepath.Join(xmlTestdata, "domain-src.xml")
	var fit bytes.Buffer
	if err := dispatch([]string{"numa", "fit", filepath.Join(xmlTestdata, "dest-host-case.json")}, &fit); err != nil {
		t.Fatalf("numa fit dest-host-case.json: %v", err)
	}
	dst, err := os.ReadFile(filepath.Join(xmlTestdata, "domain-dst.xml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := xmlpatch.Read(string(dst))
	if err != nil {
		t.Fatalf("Read(domain-dst.xml): %v", err)
	}
	runs := []struct {
		name  string
		args  []string
		stdin []byte
	}{
		{"Nova's fit from a file", []string{"xml", "patch", "--domain", domain, "--placement", filepath.Join(xmlTestdata, "dest-fit.jsonl")}, nil},
		{"pinflow's fit on stdin", []string{"xml", "patch", "--placement", "-", "--domain", domain}, fit.Bytes()},
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			var out bytes.Buffer
			var err error
			withStdin(t, r.stdin, func() { err = dispatch(r.args, &out) })
			if err != nil {
				t.Fatalf("pinflow %s: %v", strings.Join(r.args, " "), err)
			}
			got, err := xmlpatch.Read(out.String())
			if err != nil {
				t.Fatalf("Read(pinflow %s): %v\n%s", strings.Join(r.args, " "), err, out.String())
			}
			// The package tests compare Patch's output with domain-dst.xml
			// canonically; here the command must print exactly that output.
			src, _ := os.ReadFile(domain)
			p, err := placementFromAnswer(r.stdin)
			if r.stdin == nil {
				data, _ := os.ReadFile(r.args[len(r.args)-1])
				p, err = placementFromAnswer(data)
			}
			if err != nil {
				t.Fatalf("placementFromAnswer: %v", err)
			}
			direct, err := xmlpatch.Patch(string(src), p)
			if err != nil || direct != out.String() {
				t.Errorf("pinflow %s printed a document other than Patch's (error %v)", strings.Join(r.args, " "), err)
			}
			gotJSON, _ := json.Marshal(got)
			wantJSON, _ := json.Marshal(want)
			if !bytes.Equal(gotJSON, wantJSON) {
				t.Errorf("pinflow %s: pins\n%s\nwant (domain-dst.xml)\n%s", strings.Join(r.args, " "), gotJSON, wantJSON)
			}
		})
	}
}

func TestXMLRead(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch([]string{"xml", "read", "--domain", filepath.Join(xmlTestdata, "tcg-vm.xml")}, &out); err != nil {
		t.Fatalf("pinflow xml read --domain tcg-vm.xml: %v", err)
	}
	want := `{
  "vcpus": 2,
  "vcpu_pins": {
    "0": "0",
    "1": "1"
  },
  "emulator_pins": "0-1",
  "memory": {
    "mode": "strict",
    "nodeset": "0"
  },
  "memnodes": {
    "0": {
      "mode": "strict",
      "nodeset": "0"
    },
    "1": {
      "mode": "preferred",
      "nodeset": "0"
    }
  },
  "guest_cells": [
    {
      "id": 0,
      "vcpus": "0",
      "memory_kib": 65536
    },
    {
      "id": 1,
      "vcpus": "1",
      "memory_kib": 65536
    }
  ]
}
`
	if out.String() != want {
		t.Errorf("pinflow xml read --domain tcg-vm.xml =\n%s\nwant\n%s", out.String(), want)
	}
}

func TestXMLErrors(t *testing.T) {
	domain := filepath.Join(xmlTestdata, "domain-src.xml")
	tests := []struct {
		name    string
		args    []string
		stdin   string
		usage   bool
		wantErr error
		want    string
	}{
		{"no placement flag", []string{"xml", "patch", "--domain", domain}, "", true, nil, "xml patch: --placement is required"},
		{"positional", []string{"xml", "patch", "--domain", domain, "--placement", "-", "extra"}, "", true, nil, `got 1: "extra"`},
		{"both stdin", []string{"xml", "patch", "--domain", "-", "--placement", "-"}, "", true, nil, "cannot both read standard input"},
		{"unknown flag", []string{"xml", "read", "--dom", domain}, "", true, nil, "unknown flag: --dom; 'pinflow xml read --help' lists the flags"},
		{"fit false", []string{"xml", "patch", "--domain", domain, "--placement", "-"}, `{"id":"c1","fit":false,"why":"no room"}`, false, errNoPlacement, `answer "c1" says fit=false (no room)`},
		{"numa false", []string{"xml", "patch", "--domain", domain, "--placement", "-"}, `{"id":"c2","fit":true,"numa":false}`, false, errNoPlacement, "says numa=false"},
		{"invalid request", []string{"xml", "patch", "--domain", domain, "--placement", "-"}, `{"id":"c3","fit":false,"error":{"stage":"constraints","type":"RealtimeMaskNotFoundOrInvalid","message":"bad mask"}}`, false, errNoPlacement, "is an invalid request (RealtimeMaskNotFoundOrInvalid: bad mask)"},
		{"two lines", []string{"xml", "patch", "--domain", domain, "--placement", "-"}, "{\"fit\":false}\n{\"fit\":false}\n", false, nil, "holds more than one answer line"},
		{"empty", []string{"xml", "patch", "--domain", domain, "--placement", "-"}, "", false, nil, "standard input: empty"},
		{"not JSON", []string{"xml", "patch", "--domain", domain, "--placement", "-"}, "<xml/>", false, nil, "not a JSON answer line"},
		{"mismatch", []string{"xml", "patch", "--domain", filepath.Join(xmlTestdata, "tcg-vm.xml"), "--placement", filepath.Join(xmlTestdata, "dest-fit.jsonl")}, "", false, xmlpatch.ErrMismatch, "tcg-vm.xml: xmlpatch: placement does not match the domain: the domain's <vcpu> is 2"},
		{"malformed", []string{"xml", "read", "--domain", "-"}, "<domain>", false, xmlpatch.ErrMalformed, "xml read: standard input: xmlpatch: malformed domain XML"},
		{"missing file", []string{"xml", "read", "--domain", filepath.Join(xmlTestdata, "nope.xml")}, "", false, os.ErrNotExist, "nope.xml: no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			var err error
			withStdin(t, []byte(tt.stdin), func() { err = dispatch(tt.args, &out) })
			if err == nil {
				t.Fatalf("pinflow %s = no error, want one containing %q", strings.Join(tt.args, " "), tt.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) || strings.Contains(msg, "\n") || errors.Is(err, errUsage) != tt.usage ||
				(tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("pinflow %s error = %q (usage %v), want one line containing %q (usage %v, wrapping %v)",
					strings.Join(tt.args, " "), msg, errors.Is(err, errUsage), tt.want, tt.usage, tt.wantErr)
			}
			if out.Len() != 0 {
				t.Errorf("pinflow %s printed %q with an error", strings.Join(tt.args, " "), out.String())
			}
		})
	}
}
