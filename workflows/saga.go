package workflows

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
)

// saga carries one operation's status and the bookkeeping every workflow
// here shares: phases shown in the UI and the status query, the kinds of
// step (activity options), and the compensation stack.
type saga struct {
	ctx           workflow.Context
	status        api.Status
	steps         int // total steps, for Progress
	done          int
	compensations []compensation
	// held are the claims the operation made, for HeldClaimsQuery.
	held []audit.HeldClaim
	// about is a line the UI's details show under the hosts, such as a
	// drain's limits.
	about string
	// current is the hypervisor step running or last run, empty while a
	// ledger step runs: the step a failure names.
	current string
	// tried is how many attempts the last step of tries made, when it
	// counted them itself (try).
	tried int
	// stays says where the guest is once every compensation ran: where
	// the operation found it. A commit clears it.
	stays string
}

type compensation struct {
	summary string
	do      func(ctx workflow.Context) error
}

func newSaga(ctx workflow.Context, op api.Operation, uuid string, steps int) (*saga, error) {
	s := &saga{ctx: ctx, steps: steps, status: api.Status{Operation: op, Instance: uuid, Phase: api.PhaseStarted}}
	if err := workflow.SetQueryHandler(ctx, api.StatusQuery, func() (api.Status, error) { return s.status, nil }); err != nil {
		return nil, err
	}
	if err := workflow.SetQueryHandler(ctx, audit.HeldClaimsQuery, func() ([]audit.HeldClaim, error) { return s.held, nil }); err != nil {
		return nil, err
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, api.StartAttributes(op, uuid)...); err != nil {
		return nil, err
	}
	return s, nil
}

// loadInstance loads the instance record and refuses it with can's error
// when the operation may not act on it; a nil can takes any record.
func (s *saga) loadInstance(ctx workflow.Context, uuid string, can func(activities.InstanceInfo) error) (activities.InstanceInfo, error) {
	var inst activities.InstanceInfo
	if err := s.ledger(ctx, "load instance "+uuid, a.LoadInstance, uuid).Get(ctx, &inst); err != nil {
		return inst, err
	}
	if can != nil {
		if err := can(inst); err != nil {
			return inst, err
		}
	}
	s.stays = fmt.Sprintf("instance %s stays on %s", uuid, inst.Host)
	if inst.Host == "" {
		s.stays = fmt.Sprintf("instance %s stays %s", uuid, inst.VMState)
	}
	return inst, nil
}

// setTask sets the instance's task state, retried until done.
func (s *saga) setTask(ctx workflow.Context, uuid string, task guest.TaskState) error {
	summary := "task state " + string(task)
	if task == "" {
		summary = "clear task state"
	}
	return s.ledger(ctx, summary, a.SetTaskState,
		activities.TaskStateInput{UUID: uuid, TaskState: task}).Get(ctx, nil)
}

// startTask sets the task state of the operation the saga runs, cleared
// again if the operation fails.
func (s *saga) startTask(ctx workflow.Context, uuid string, task guest.TaskState) error {
	s.onFailure("clear the task state", func(ctx workflow.Context) error {
		return s.setTask(ctx, uuid, "")
	})
	return s.setTask(ctx, uuid, task)
}

// endTask clears the instance's task state and sets its vm state, retried
// until done.
func (s *saga) endTask(ctx workflow.Context, uuid string, vm guest.VMState) error {
	return s.ledger(ctx, "vm state "+string(vm), a.SetTaskState,
		activities.TaskStateInput{UUID: uuid, VMState: vm}).Get(ctx, nil)
}

// run runs steps in order until one fails.
func (s *saga) run(ctx workflow.Context, steps ...func(workflow.Context) error) error {
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// undo is the step that registers do as a compensation (onFailure): it
// comes before the step that do undoes.
func (s *saga) undo(summary string, do func(ctx workflow.Context) error) func(workflow.Context) error {
	return func(workflow.Context) error {
		s.onFailure(summary, do)
		return nil
	}
}

// onFailure registers a compensation before the step it undoes runs: the
// step may have taken effect even when it reports an error.
func (s *saga) onFailure(summary string, do func(ctx workflow.Context) error) {
	s.compensations = append(s.compensations, compensation{summary: summary, do: do})
}

// commit drops the compensations and returns the context for the rest of
// the operation: past this point it only goes forwards, so the rest runs
// in a disconnected context that a cancel cannot stop.
func (s *saga) commit(ctx workflow.Context) workflow.Context {
	s.compensations, s.stays = nil, ""
	ctx, _ = workflow.NewDisconnectedContext(ctx)
	return ctx
}

// isType says whether err is an activity's application error of one of
// the types.
func isType(err error, types ...string) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && slices.Contains(types, app.Type())
}

// appMessage is the message of err's application error, without the
// activity and workflow wrapping around it.
func appMessage(err error) string {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return app.Message()
	}
	return err.Error()
}

// errRolledForward is what a compensation returns when it finds the step
// it undoes complete and past undoing (a migration that switched over):
// the remaining compensations do not run, and the operation finishes
// forwards instead.
var errRolledForward = errors.New("the step had completed; finishing forwards")

// ended is what a compensation returns when it ended the operation
// another way than undoing it (a resize that keeps its guest on the
// destination): the remaining compensations do not run, and the
// operation fails with err, which says how it ended.
type ended struct{ err error }

func (e ended) Error() string { return e.err.Error() }

func (e ended) Unwrap() error { return e.err }

// fail runs the compensations in reverse order in a disconnected context
// (so a cancelled workflow still compensates), records the error phase and
// returns the operation's error: cause, as one line that says which step
// failed, after how many attempts, why, and where the guest is now (a
// Failure, see failure).
func (s *saga) fail(cause error) error {
	err, _ := s.abort(cause)
	return err
}

// abort is fail, and also says whether every compensation ran: the guest
// is where the operation found it.
func (s *saga) abort(cause error) (error, bool) {
	f, known := api.FailureOf(cause)
	if !known {
		f = s.failure(cause)
	}
	compensated := len(s.compensations) > 0
	if compensated {
		s.phase(api.PhaseRollingBack, "undoing: "+f.Line())
	}
	ctx, _ := workflow.NewDisconnectedContext(s.ctx)
	undone := true
	for i := len(s.compensations) - 1; i >= 0 && undone; i-- {
		c := s.compensations[i]
		err := c.do(ctx)
		var end ended
		switch {
		case errors.Is(err, errRolledForward):
			s.compensations = nil
			return errRolledForward, false
		case errors.As(err, &end):
			// It says where the guest is.
			f.Guest, undone = api.RootCause(end.err), false
		case err != nil:
			// What the failed compensation did not undo may still need
			// what the earlier steps hold (a guest not rolled back still
			// runs on the destination claim): keep them.
			f.Guest = fmt.Sprintf("undoing it failed at %q (%s); kept for an operator: %s", c.summary, api.RootCause(err), s.remaining(i))
			undone = false
		}
	}
	if compensated && undone && !known {
		f.Guest = s.stays
	}
	s.compensations = nil
	s.status.Error = f.Line()
	s.phase(api.PhaseError, "")
	var canceled *temporal.CanceledError
	if undone && (known || errors.As(cause, &canceled)) {
		// A cancel that was undone ends the run as cancelled.
		return cause, true
	}
	return asError(f, cause), undone
}

// remaining names the compensations below index i, which a failed
// compensation left undone.
func (s *saga) remaining(i int) string {
	var names []string
	for j := i - 1; j >= 0; j-- {
		names = append(names, s.compensations[j].summary)
	}
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, ", ")
}
