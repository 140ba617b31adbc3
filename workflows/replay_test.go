package workflows

import (
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/worker"
)

// TestReplay replays the golden histories recorded on a real server (see
// internal/e2e TestHistoriesReplay) against the current workflow code: a
// change that would break running workflows fails here.
func TestReplay(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "history", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 7 {
		t.Fatalf("found %d golden histories, want one per workflow path (7)", len(files))
	}
	replayer := worker.NewWorkflowReplayer()
	for _, wf := range []any{Boot, LiveMigration, ShelveOffload, Unshelve, Delete} {
		replayer.RegisterWorkflow(wf)
	}
	for _, f := range files {
		if err := replayer.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
			t.Errorf("replay %s: %v", filepath.Base(f), err)
		}
	}
}
