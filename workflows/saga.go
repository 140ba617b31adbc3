package workflows

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// a names the activities; the nil pointer is never called, it lets the
// compiler check activity names and signatures.
var a *activities.Activities

// Timeouts of the activity kinds. Ledger and record steps are short and
// retried until they succeed; hypervisor steps may be slow.
const (
	ledgerTimeout  = 30 * time.Second
	driverTimeout  = 10 * time.Minute
	migrateTimeout = 6 * time.Hour
	// heartbeatTimeout is the hypervisor steps' heartbeat timeout: a worker
	// that dies in a step is noticed this long after its last heartbeat,
	// and a cancel reaches the step within about as long (the SDK sends
	// heartbeats at most every 0.8 of it).
	heartbeatTimeout = 5 * time.Second
	// postCopyRetry is how long a live migration that failed past its
	// switch to post-copy waits before it resumes it again: the link
	// between the hosts must come back first.
	postCopyRetry = 10 * time.Second
)

// untilDone is for steps that must eventually succeed: ledger and record
// changes, compensations, and everything past a commit point.
var untilDone = &temporal.RetryPolicy{
	InitialInterval:    500 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    30 * time.Second,
	// Errors that retrying cannot fix; activities also mark them
	// non-retryable themselves.
	NonRetryableErrorTypes: activities.NonRetryableErrorTypes,
}

// driverAttempts bounds the tries of a hypervisor step that has a
// compensation (prepare, migrate, spawn, offload): a hypervisor that fails
// it three times, a worker crash included, fails the operation, which then
// rolls back instead of holding its claims forever.
const driverAttempts = 3

var tries = &temporal.RetryPolicy{
	InitialInterval:        time.Second,
	BackoffCoefficient:     2,
	MaximumInterval:        30 * time.Second,
	MaximumAttempts:        driverAttempts,
	NonRetryableErrorTypes: activities.NonRetryableErrorTypes,
}

// untriedAttempts bounds the attempts of a step of driverAttempts tries
// that are no tries of it:
//   - lost: Temporal can record an attempt as started that no worker
//     received when its store is slow (docs/benchmarks.md, "Lost
//     dispatches"); such an attempt ends in a heartbeat timeout with no
//     heartbeat, and says nothing about the hypervisor.
//   - handed over: a stopping worker left the step to the next attempt
//     (a rolling restart of the workers during a long migration).
const untriedAttempts = 10

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

// claim claims pinned CPUs on in.Host and remembers the claim, so that a
// recovery after Redis lost it can make it again as this run knows it.
func (s *saga) claim(ctx workflow.Context, in activities.ClaimInput) (activities.ClaimResult, error) {
	var c activities.ClaimResult
	if err := s.ledger(ctx, "claim pinned CPUs on "+in.Host, a.Claim, in).Get(ctx, &c); err != nil {
		return c, err
	}
	s.held = append(s.held, audit.HeldClaim{Host: c.Host, ClaimID: c.ClaimID, Kind: in.Kind, Token: c.Token,
		OwnerRunID: in.Owner.FirstRunID, Placement: c.Placement})
	return c, nil
}

// alternateHosts bounds the hosts an operation tries when pinflow chose
// its destination and a claim there finds no room (another operation took
// it between the choice and the claim), like Nova's alternates: a claim
// is a compare-and-set, so trying the next host is safe.
const alternateHosts = 3

// retryElsewhere follows a claim on a host pinflow chose that found no
// room: it chooses again without the hosts tried and claims there, up to
// alternateHosts hosts in all. in ends naming the host and claim id of the
// last try; the first try's compensation, which reads the caller's host
// and claim id variables, must see them updated from in.
func (s *saga) retryElsewhere(ctx workflow.Context, first error, in *activities.ClaimInput, choose activities.ChooseHostInput, kind string) (activities.ClaimResult, error) {
	err := first
	var c activities.ClaimResult
	for try := 1; err != nil && lostRoom(err) && try < alternateHosts; try++ {
		choose.Exclude = append(choose.Exclude, in.Host)
		var next string
		if cerr := s.ledger(ctx, "choose another host", a.ChooseHost, choose).Get(ctx, &next); cerr != nil {
			return c, errors.Join(err, cerr)
		}
		s.phase(api.PhaseScheduling, fmt.Sprintf("%s had no room left (%v); trying %s", in.Host, err, next))
		in.Host, in.ClaimID = next, fmt.Sprintf("%s-%d", claimID(ctx, kind), try)
		c, err = s.claim(ctx, *in)
	}
	return c, err
}

// claimDest claims the destination with in, or, when the operation moves
// a guest for a drain, adopts the drain's reservation there instead: the
// pCPUs the drain held for the guest become the operation's own pending
// claim without ever being free.
func (s *saga) claimDest(ctx workflow.Context, in activities.ClaimInput, r *api.Reservation) (activities.ClaimResult, error) {
	if r == nil {
		return s.claim(ctx, in)
	}
	var c activities.ClaimResult
	adopt := activities.AdoptInput{Reservation: *r, UUID: in.UUID, Kind: in.Kind, Owner: in.Owner}
	if err := s.ledger(ctx, "adopt the drain's reservation on "+r.Host, a.AdoptClaim, adopt).Get(ctx, &c); err != nil {
		return c, err
	}
	s.held = append(s.held, audit.HeldClaim{Host: c.Host, ClaimID: c.ClaimID, Kind: in.Kind, Token: c.Token,
		OwnerRunID: in.Owner.FirstRunID, Placement: c.Placement})
	return c, nil
}

// move is what the steps of a live or cold migration share: the guest,
// where it goes and its claim there.
type move struct {
	*saga
	uuid        string
	inst        activities.InstanceInfo
	reservation *api.Reservation
	src, dst    string
	// chosen says pinflow chose dst, with choose.
	chosen bool
	choose activities.ChooseHostInput
	// kind and flavor are those of the claim on dst.
	kind      ledger.ClaimKind
	flavor    guest.Flavor
	claimed   activities.ClaimResult
	destClaim string
}

// taskState is the step that sets the guest's task state, cleared again
// if the operation fails.
func (m *move) taskState(task guest.TaskState) func(workflow.Context) error {
	return func(ctx workflow.Context) error { return m.startTask(ctx, m.uuid, task) }
}

// claimDestination claims the guest's CPUs on dst, or adopts the drain's
// reservation there. When pinflow chose the host and the claim finds no
// room there, it tries other hosts as retryElsewhere does; dst ends
// naming the host of the claim. The claim is released if the operation
// fails: a claim of its own from before it is made, since an unknown
// outcome may leave one, a reservation only once adopted.
func (m *move) claimDestination(ctx workflow.Context) error {
	in := activities.ClaimInput{Host: m.dst, ClaimID: claimID(ctx, string(m.kind)), UUID: m.uuid, Kind: m.kind, Owner: owner(ctx), Flavor: m.flavor}
	if m.reservation != nil {
		in.ClaimID = m.reservation.ClaimID
	}
	// The release reads dst and destClaim when it runs: after a retry
	// they name the last try.
	m.destClaim = in.ClaimID
	release := func(ctx workflow.Context) error {
		return m.ledger(ctx, "release claim on "+m.dst, a.ReleaseClaim,
			activities.ReleaseInput{Host: m.dst, ClaimID: m.destClaim, OnlyPending: true}).Get(ctx, nil)
	}
	if m.reservation == nil {
		m.onFailure("release the destination claim", release)
	}
	claim, err := m.claimDest(ctx, in, m.reservation)
	if err != nil && m.chosen {
		claim, err = m.retryElsewhere(ctx, err, &in, m.choose, string(m.kind))
		m.dst, m.destClaim = in.Host, in.ClaimID
		m.setHosts(m.src, m.dst)
	}
	if err != nil {
		return err
	}
	if m.reservation != nil {
		m.onFailure("release the destination claim", release)
	}
	m.claimed = claim
	m.step()
	m.phase(api.PhaseAccepted, "destination CPUs claimed: "+claim.Placement.String())
	return nil
}

// reservedDest is where a move goes: dest, or the host of the drain's
// reservation r when there is one; a dest naming another host is refused.
func reservedDest(dest string, r *api.Reservation) (string, error) {
	if r == nil {
		return dest, nil
	}
	if dest != "" && dest != r.Host {
		return "", activities.BadRequest(fmt.Sprintf("destination %s and a reservation on %s: a reserved move goes to its reservation's host", dest, r.Host))
	}
	return r.Host, nil
}

// phase records a new phase in the status, the search attributes and the
// UI's current details.
func (s *saga) phase(p api.Phase, detail string) {
	s.status.Phase, s.status.Detail = p, detail
	if p == api.PhaseCompleted {
		s.status.Progress = 100
	}
	// Upserting can only fail on a bad key, which the constants rule out.
	_ = workflow.UpsertTypedSearchAttributes(s.ctx, api.AttrPhase.ValueSet(string(p)))
	workflow.SetCurrentDetails(s.ctx, s.details())
}

func (s *saga) setHosts(src, dst string) {
	var attrs []temporal.SearchAttributeUpdate
	if src != "" && src != s.status.Source {
		s.status.Source = src
		attrs = append(attrs, api.AttrSourceHost.ValueSet(src))
	}
	if dst != "" && dst != s.status.Dest {
		s.status.Dest = dst
		attrs = append(attrs, api.AttrDestHost.ValueSet(dst))
	}
	if len(attrs) > 0 {
		_ = workflow.UpsertTypedSearchAttributes(s.ctx, attrs...)
	}
}

// details renders the status as the markdown the Web UI shows.
func (s *saga) details() string {
	st := s.status
	md := fmt.Sprintf("**%s**: phase **%s** (%d%%)", st.Operation, st.Phase, st.Progress)
	if st.Instance != "" {
		md = fmt.Sprintf("**%s** of `%s`: phase **%s** (%d%%)", st.Operation, st.Instance, st.Phase, st.Progress)
	}
	switch {
	case st.Source != "" && st.Dest != "":
		md += fmt.Sprintf("\n\nsource `%s` → destination `%s`", st.Source, st.Dest)
	case st.Source != "":
		md += fmt.Sprintf("\n\nhost `%s`", st.Source)
	case st.Dest != "":
		md += fmt.Sprintf("\n\nhost `%s`", st.Dest)
	}
	if s.about != "" {
		md += "\n\n" + s.about
	}
	if st.Detail != "" {
		md += "\n\n" + st.Detail
	}
	if st.Error != "" {
		md += "\n\nerror: " + st.Error
	}
	return md + uiFrameSlack
}

// uiFrameSlack ends the details with a blank line. The Web UI sizes the
// frame it renders them in to the body's scrollHeight, which leaves out
// the first paragraph's top margin: the last 14 pixels or so are cut,
// half of a drain's last table row, unless a blank line takes the cut.
const uiFrameSlack = "\n\n\u00a0"

// step counts a finished step towards Progress.
func (s *saga) step() {
	s.done++
	if s.steps > 0 {
		s.status.Progress = min(99, s.done*100/s.steps)
	}
}

// ledger runs a ledger or record step: short, idempotent, and retried
// until it succeeds. It is a local activity, run by the worker inside the
// workflow task that asks for it: a step costs no round trip through a
// task queue, and its result is recorded as a marker. It runs again after
// a crash before its result was recorded, which its idempotence makes
// safe.
func (s *saga) ledger(ctx workflow.Context, summary string, step any, args ...any) workflow.Future {
	s.current = ""
	return workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: ledgerTimeout, RetryPolicy: untilDone, Summary: summary,
	}), step, args...)
}

// hypervisorStep returns a context for a hypervisor step that is retried
// until it succeeds (a compensation, or a step past the commit point).
func (s *saga) hypervisorStep(ctx workflow.Context, summary string) workflow.Context {
	s.current = summary
	// It heartbeats, so a dead worker's attempt is retried within the
	// heartbeat timeout instead of the step's.
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: driverTimeout, HeartbeatTimeout: heartbeatTimeout, RetryPolicy: untilDone, Summary: summary,
	})
}

// hypervisorTry runs step(in...), a hypervisor step that may fail the
// operation, storing its result in out: it is tried driverAttempts times
// (try). It heartbeats, so a cancel
// reaches it, and the workflow waits for it to end before compensating:
// compensations that ran while the step still acted would undo a step
// that then takes effect.
func (s *saga) hypervisorTry(ctx workflow.Context, summary string, out any, step any, in ...any) error {
	s.current = summary
	return s.try(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: driverTimeout, HeartbeatTimeout: heartbeatTimeout, WaitForCancellation: true, Summary: summary,
	}, out, step, in...)
}

// try runs a hypervisor step of driverAttempts tries with opts, and stores
// its result in out (nil for none). The tries are the attempts that
// reached a worker and failed there: an attempt lost on its way
// (lostDispatch) or handed over by a stopping worker is dispatched again
// at once, up to untriedAttempts times. A step that fails its tries
// returns its last error; s.tried says how many attempts it made.
func (s *saga) try(ctx workflow.Context, opts workflow.ActivityOptions, out any, step any, in ...any) error {
	s.tried = 0
	if workflow.GetVersion(ctx, changeDeliveredTries, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		opts.RetryPolicy = tries
		return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, opts), step, in...).Get(ctx, out)
	}
	// Each attempt is its own activity, so that its heartbeat details are
	// its own.
	opts.RetryPolicy = &temporal.RetryPolicy{MaximumAttempts: 1}
	actx := workflow.WithActivityOptions(ctx, opts)
	redispatched := func(reason string) {
		workflow.GetMetricsHandler(ctx).WithTags(map[string]string{"activity": activityName(step), "reason": reason}).
			Counter(MetricStepRedispatched).Inc(1)
	}
	backoff := tries.InitialInterval
	attempts, ran, untried := 0, 0, 0
	for {
		err := workflow.ExecuteActivity(actx, step, in...).Get(ctx, out)
		attempts++
		var act *temporal.ActivityError
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			// Cancelled: no attempt after this one.
		case lostDispatch(err):
			if untried++; untried < untriedAttempts {
				redispatched("lost")
				continue
			}
		case isType(err, api.ErrTypeWorkerStopping):
			if untried++; untried < untriedAttempts {
				redispatched("handed-over")
				continue
			}
		case errors.As(err, &act) && retryable(act.Unwrap()):
			if ran++; ran < driverAttempts {
				redispatched("failed")
				if err := workflow.Sleep(ctx, backoff); err != nil {
					return err
				}
				backoff = min(time.Duration(float64(backoff)*tries.BackoffCoefficient), tries.MaximumInterval)
				continue
			}
		}
		s.tried = attempts
		return err
	}
}

// MetricStepRedispatched counts the attempts a step of tries dispatched
// again, by activity and reason: "lost" (no worker received the attempt),
// "handed-over" (its worker stopped) or "failed" (it failed and is tried
// again). Temporal's own retries of the other steps are
// pinflow.activity.retries.
const MetricStepRedispatched = "pinflow.step.redispatched"

// activityName is the activity type of step, a method value of
// *activities.Activities.
func activityName(step any) string {
	name := runtime.FuncForPC(reflect.ValueOf(step).Pointer()).Name()
	return strings.TrimSuffix(name[strings.LastIndex(name, ".")+1:], "-fm")
}

// lostDispatch says whether err ends an attempt that never reached a
// worker: its heartbeat timed out and no heartbeat of it arrived. Every
// step of tries heartbeats as it starts.
func lostDispatch(err error) bool {
	var timeout *temporal.TimeoutError
	return errors.As(err, &timeout) && timeout.TimeoutType() == enumspb.TIMEOUT_TYPE_HEARTBEAT && !timeout.HasLastHeartbeatDetails()
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

// claimID is the id of a claim this run makes; it stays the same when the
// claiming activity is retried and differs between runs.
func claimID(ctx workflow.Context, kind string) string {
	return kind + "-" + firstRunID(ctx)
}

// firstRunID is the run's chain's first run id: the same across retries
// and continue-as-new. (The test environment leaves it empty.)
func firstRunID(ctx workflow.Context) string {
	info := workflow.GetInfo(ctx)
	if info.FirstRunID != "" {
		return info.FirstRunID
	}
	return info.WorkflowExecution.RunID
}

// owner names this run as a claim's owner.
func owner(ctx workflow.Context) activities.Owner {
	info := workflow.GetInfo(ctx)
	return activities.Owner{WorkflowID: info.WorkflowExecution.ID, FirstRunID: firstRunID(ctx)}
}
