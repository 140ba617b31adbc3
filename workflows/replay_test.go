package workflows

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestReplay replays the golden histories recorded on a real server (see
// internal/e2e TestHistoriesReplay) against the current workflow code: a
// change that would break running workflows fails here. v0.1.0 holds the
// histories of the first release, unreleased those of the release in the
// making (the host changes among them). Every history is also replayed cut
// short before each of its workflow tasks: that is the history of the
// same workflow still open at that step, which a new worker must be able
// to pick up.
func TestReplay(t *testing.T) {
	releases, err := filepath.Glob(filepath.Join("testdata", "history", "*"))
	if err != nil {
		t.Fatal(err)
	}
	replayer := worker.NewWorkflowReplayer()
	for _, wf := range All() {
		replayer.RegisterWorkflow(wf)
	}
	if !slices.Contains(releases, filepath.Join("testdata", "history", "unreleased")) {
		t.Errorf("no golden histories of the release in the making (testdata/history/unreleased)")
	}
	for _, dir := range releases {
		release := filepath.Base(dir)
		files, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		types := map[string]bool{}
		for _, f := range files {
			h := readHistory(t, f)
			types[h.Events[0].GetWorkflowExecutionStartedEventAttributes().GetWorkflowType().GetName()] = true
			for _, cut := range openPoints(h) {
				open := &historypb.History{Events: h.Events[:cut]}
				if err := replayer.ReplayWorkflowHistory(nil, open); err != nil {
					t.Errorf("replay %s/%s open after event %d of %d: %v", release, filepath.Base(f), cut, len(h.Events), err)
				}
			}
		}
		if release != "unreleased" {
			continue
		}
		// Every workflow of the release in the making has its paths
		// recorded; an older release's lack the workflows added since.
		for _, fn := range All() {
			if name := registeredName(fn); !types[name] {
				t.Errorf("no golden history of workflow %s in %s: add its paths to internal/e2e TestHistoriesReplay and record them", name, dir)
			}
		}
	}
}

// openPoints returns the lengths at which the history is one of a
// workflow still open: before each workflow task after the first, and
// whole. A cancel request goes with the task it schedules: the server
// writes the two together, so no open history ends with the request
// alone, and the cut falls before it.
func openPoints(h *historypb.History) []int {
	var cuts []int
	for i, ev := range h.Events {
		if i > 1 && ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED {
			cut := i
			if h.Events[i-1].GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED {
				cut = i - 1
			}
			cuts = append(cuts, cut)
		}
	}
	return append(cuts, len(h.Events))
}

func readHistory(t *testing.T, path string) *historypb.History {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := &historypb.History{}
	if err := protojson.Unmarshal(data, h); err != nil {
		t.Fatal(fmt.Errorf("%s: %w", path, err))
	}
	return h
}
