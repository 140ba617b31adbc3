package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/numa"
)

func numaCommand() *cobra.Command {
	fit := &cobra.Command{Use: "fit [FILE|-]", Short: "fit NUMA reference cases offline, one JSON answer a line",
		Long: `Read reference cases (a JSON array of host and instance objects, or one object)
from FILE or standard input, and print one answer line per case: whether the
instance fits and its placement, as Nova's NUMA fitting gives it. A host's
pci_pools and its cells' network_metadata, and an instance's pci_requests and
network_metadata, are fitted too: pci_devices lists the devices the instance
takes, per request, pool and host cell.`,
		Args: takes(cobra.MaximumNArgs(1), "at most one FILE")}
	times := fit.Flags().Int("time", 0, "instead of answers, print the median of N timed fits per case")
	fit.RunE = func(c *cobra.Command, args []string) error { return numaFit(args, times, c.OutOrStdout()) }
	return group("numa", "fit NUMA reference cases offline", fit)
}

// readInput reads FILE, or standard input for "" or "-".
func readInput(name string) ([]byte, error) {
	if name == "" || name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

func numaFit(pos []string, times *int, stdout io.Writer) error {
	if *times < 0 {
		return fmt.Errorf("numa fit: --time %d: must be 0 or more: %w", *times, errUsage)
	}
	file := ""
	if len(pos) == 1 {
		file = pos[0]
	}
	data, err := readInput(file)
	if err != nil {
		return fmt.Errorf("numa fit: %w", err)
	}
	cases, err := numa.ReadCases(data)
	if err != nil {
		return err
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for i := range cases {
		var line any
		if *times > 0 {
			line = timeCase(&cases[i], *times)
		} else {
			line = cases[i].Solve()
		}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return nil
}

// timing is one line of `numa fit --time N`.
type timing struct {
	ID       json.RawMessage   `json:"id"`
	Fit      bool              `json:"fit"`
	N        int               `json:"n,omitempty"`
	MedianUS float64           `json:"fit_median_us"`
	MinUS    float64           `json:"fit_min_us,omitempty"`
	Error    *numa.AnswerError `json:"error,omitempty"`
}

// timeCase times Fit alone: the host and request are built once, outside
// the timing, and Fit changes neither.
func timeCase(c *numa.Case, n int) timing {
	t := timing{ID: c.ID}
	ans := c.Solve()
	if ans.Error != nil {
		t.Error = ans.Error
		return t
	}
	host, req, _ := c.Inputs()
	samples := make([]float64, n)
	for i := range samples {
		start := time.Now()
		_, err := numa.Fit(host, req)
		samples[i] = float64(time.Since(start).Nanoseconds()) / 1e3
		t.Fit = err == nil
	}
	sort.Float64s(samples)
	t.N, t.MinUS = n, samples[0]
	t.MedianUS = samples[n/2]
	if n%2 == 0 {
		t.MedianUS = (samples[n/2-1] + samples[n/2]) / 2
	}
	return t
}
