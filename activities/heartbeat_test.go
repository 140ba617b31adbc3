package activities_test

import (
	"sync"
	"testing"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
)

// Every hypervisor step of limited tries heartbeats with a detail as it
// starts: the workflows read a heartbeat timeout with no
// detail as an attempt that never reached a worker, and dispatch it again
// without counting a try. Here each step fails at once (no such guest),
// and its heartbeat is there all the same.
func TestStepsHeartbeatAsTheyStart(t *testing.T) {
	w := simcloud.New(t)
	u := simcloud.UUID(1)
	steps := []struct {
		name string
		run  func(env *testsuite.TestActivityEnvironment) error
	}{
		{"PrepareMigration", func(env *testsuite.TestActivityEnvironment) error {
			_, err := env.ExecuteActivity(w.Acts.PrepareMigration, activities.PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", DestClaimID: "c"})
			return err
		}},
		{"Migrate", func(env *testsuite.TestActivityEnvironment) error {
			_, err := env.ExecuteActivity(w.Acts.Migrate, activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: "c", DestToken: "t"})
			return err
		}},
		{"Offload", func(env *testsuite.TestActivityEnvironment) error {
			_, err := env.ExecuteActivity(w.Acts.Offload, activities.DomainInput{UUID: u, Host: "a"})
			return err
		}},
	}
	var suite testsuite.WorkflowTestSuite
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			env := suite.NewTestActivityEnvironment()
			env.RegisterActivity(w.Acts)
			var mu sync.Mutex
			var details []bool
			env.SetOnActivityHeartbeatListener(func(_ *activity.Info, d converter.EncodedValues) {
				mu.Lock()
				defer mu.Unlock()
				details = append(details, d != nil && d.Get(new(any)) == nil)
			})
			if err := step.run(env); err == nil {
				t.Fatalf("%s of a guest that does not exist succeeded", step.name)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(details) == 0 || !details[0] {
				t.Errorf("%s heartbeats %v (with a detail or not), want a first heartbeat with a detail", step.name, details)
			}
		})
	}
}
