package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRead: a passing test prints nothing but its package's line, a
// failing one prints all its output (its subtests' included), a test that
// never finished fails the run and says so, and the table orders by time.
func TestRead(t *testing.T) {
	events := `{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"pass","Package":"p","Test":"TestOK","Elapsed":1.5}
{"Action":"run","Package":"p","Test":"TestBad"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    bad_test.go:9: want 2\n"}
{"Action":"fail","Package":"p","Test":"TestBad/sub","Elapsed":0.1}
{"Action":"output","Package":"p","Test":"TestBad","Output":"--- FAIL: TestBad (3.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBad","Elapsed":3}
{"Action":"output","Package":"p","Output":"FAIL\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t4.5s\n"}
{"Action":"fail","Package":"p","Elapsed":4.5}
{"Action":"run","Package":"q","Test":"TestHangs"}
{"Action":"output","Package":"q","Test":"TestHangs","Output":"panic: test timed out after 1m0s\n"}
`
	var out bytes.Buffer
	pkgs, tests, failed := read(strings.NewReader(events), &out, false)
	if !failed {
		t.Error("read: a failed and an unfinished test, and failed = false")
	}
	got := out.String()
	for _, want := range []string{"bad_test.go:9: want 2", "--- FAIL: TestBad", "FAIL\tp\t4.5s", "--- UNFINISHED: TestHangs (q)", "panic: test timed out"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "=== RUN") {
		t.Errorf("output has a passing test's lines:\n%s", got)
	}
	var table bytes.Buffer
	tableOf(&table, pkgs, tests, 2)
	want := "TestBad                                                    3s  p\nTestOK                                                   1.5s  p\n"
	if !strings.Contains(table.String(), want) {
		t.Errorf("table:\n%s\nwant the two slowest tests, slowest first:\n%s", table.String(), want)
	}
}
