// Command testtimes reads `go test -json` events and prints what a plain
// `go test` prints (each package's result line, and the whole output of
// every test that failed), then a table of the packages' wall times and
// the slowest tests. It exits 1 when a test or package failed.
//
//	go test -json ./... | go run ./internal/testtimes -save bin/test-events.json
//	go run ./internal/testtimes -from bin/test-events.json   # the table again
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// run is what the events said about one package or test.
type run struct {
	pkg, test string
	result    string // pass, fail or skip; "" while running
	elapsed   time.Duration
	output    strings.Builder
}

func main() {
	save := flag.String("save", "", "also write the events read to this file")
	from := flag.String("from", "", "read the events from this file and print only the table")
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list")
	flag.Parse()
	in := io.Reader(os.Stdin)
	quiet := false
	if *from != "" {
		f, err := os.Open(*from)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(2)
		}
		defer f.Close()
		in, quiet = f, true
	}
	if *save != "" {
		f, err := os.Create(*save)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(2)
		}
		defer f.Close()
		in = io.TeeReader(in, f)
	}
	pkgs, tests, failed := read(in, os.Stdout, quiet)
	tableOf(os.Stdout, pkgs, tests, *slowest)
	if failed {
		os.Exit(1)
	}
}

// read consumes the events, echoing what a plain `go test` would print
// unless quiet, and returns the packages and top-level tests it saw.
func read(in io.Reader, out io.Writer, quiet bool) (pkgs, tests []*run, failed bool) {
	byKey := map[string]*run{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A line that is no event (a build error) is printed as it is.
			if !quiet {
				fmt.Fprintln(out, sc.Text())
			}
			continue
		}
		// Subtests belong to their top-level test.
		top, _, _ := strings.Cut(e.Test, "/")
		key := e.Package + " " + top
		r := byKey[key]
		if r == nil {
			r = &run{pkg: e.Package, test: top}
			byKey[key] = r
			if top == "" {
				pkgs = append(pkgs, r)
			} else {
				tests = append(tests, r)
			}
		}
		switch e.Action {
		case "output":
			r.output.WriteString(e.Output)
			if top == "" && !quiet && !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
				fmt.Fprint(out, e.Output)
			}
		case "pass", "fail", "skip":
			if e.Test != top {
				continue // a subtest; its output is its parent's
			}
			r.result, r.elapsed = e.Action, time.Duration(e.Elapsed*float64(time.Second))
			if e.Action == "fail" {
				failed = true
				if top != "" && !quiet {
					fmt.Fprint(out, r.output.String())
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		failed = true
	}
	// What never finished (a timeout, a crash) failed, and says why.
	for _, r := range append(append([]*run{}, tests...), pkgs...) {
		if r.result != "" {
			continue
		}
		failed = true
		if r.test != "" && !quiet {
			fmt.Fprintf(out, "--- UNFINISHED: %s (%s)\n%s", r.test, r.pkg, r.output.String())
		}
	}
	return pkgs, tests, failed
}

// table prints the packages by wall time and the slowest top-level tests.
func tableOf(out io.Writer, pkgs, tests []*run, slowest int) {
	byTime := func(rs []*run) {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].elapsed > rs[j].elapsed })
	}
	byTime(pkgs)
	fmt.Fprintf(out, "\n%-50s %10s  %s\n", "package", "wall", "result")
	for _, p := range pkgs {
		fmt.Fprintf(out, "%-50s %10s  %s\n", p.pkg, p.elapsed.Round(100*time.Millisecond), orRunning(p.result))
	}
	byTime(tests)
	fmt.Fprintf(out, "\n%-50s %10s  %s\n", fmt.Sprintf("slowest %d tests", min(slowest, len(tests))), "wall", "package")
	for _, t := range tests[:min(slowest, len(tests))] {
		fmt.Fprintf(out, "%-50s %10s  %s\n", t.test, t.elapsed.Round(100*time.Millisecond), t.pkg)
	}
}

func orRunning(result string) string {
	if result == "" {
		return "unfinished"
	}
	return result
}
