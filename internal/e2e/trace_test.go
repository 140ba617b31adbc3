package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
)

// suspect notes a guest a violation named, whose story the run tells at
// its end (traceSuspects).
func (c *chaos) suspect(uuids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.suspects == nil {
		c.suspects = map[string]bool{}
	}
	for _, u := range uuids {
		c.suspects[u] = true
	}
}

// noteAudit keeps what an audit freed and the drift it found, by guest,
// for the stories of suspects.
func (c *chaos) noteAudit(id string, hosts []audit.HostAudit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.audited == nil {
		c.audited = map[string][]string{}
	}
	at := time.Now().Format("15:04:05.000")
	for _, h := range hosts {
		for _, f := range h.Freed {
			c.audited[f.Instance] = append(c.audited[f.Instance], fmt.Sprintf("%s %s freed %s claim %s (%s, pCPUs %s) on %s: %s",
				at, id, f.State, f.ClaimID, f.Kind, f.CPUs, h.Host, f.Reason))
		}
		for _, d := range h.Drift {
			if d.Instance != "" {
				c.audited[d.Instance] = append(c.audited[d.Instance], fmt.Sprintf("%s %s drift on %s: %s: %s", at, id, h.Host, d.Kind, d.Detail))
			}
		}
	}
}

// traceSuspects logs, for each guest a violation named, every run of its
// instance workflow with each step, attempt and failure, and what the
// audits did to its claims: enough to tell how it came to be.
func (c *chaos) traceSuspects(ctx context.Context) {
	c.mu.Lock()
	uuids := make([]string, 0, len(c.suspects))
	for u := range c.suspects {
		uuids = append(uuids, u)
	}
	c.mu.Unlock()
	slices.Sort(uuids)
	for _, u := range uuids {
		story, err := c.story(ctx, u)
		if err != nil {
			story += fmt.Sprintf("\n  (its histories could not all be read: %v)", err)
		}
		c.mu.Lock()
		audits := strings.Join(c.audited[u], "\n  ")
		c.mu.Unlock()
		if audits != "" {
			story += "\n  audits:\n  " + audits
		}
		c.t.Logf("the story of guest %s:%s", u, story)
	}
}

// story lists the runs of uuid's instance workflow, oldest first, each
// with its events that say what it did.
func (c *chaos) story(ctx context.Context, uuid string) (string, error) {
	id := guest.InstanceWorkflowID(uuid)
	var runs []string
	var token []byte
	for {
		resp, err := c.tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: fmt.Sprintf("WorkflowId = '%s'", id), NextPageToken: token})
		if err != nil {
			return "", err
		}
		for _, e := range resp.Executions {
			runs = append(runs, e.Execution.RunId)
		}
		if token = resp.NextPageToken; len(token) == 0 {
			break
		}
	}
	slices.Reverse(runs)
	var b strings.Builder
	for _, run := range runs {
		if err := c.runStory(ctx, &b, id, run); err != nil {
			return b.String(), err
		}
	}
	return b.String(), nil
}

// runStory writes one run's events: its start, each activity's scheduling,
// attempts and end, each local activity's result, and how the run ended.
func (c *chaos) runStory(ctx context.Context, b *strings.Builder, id, run string) error {
	activity := map[int64]string{}
	it := c.tc.GetWorkflowHistory(ctx, id, run, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return err
		}
		line := eventLine(e, activity)
		if line != "" {
			fmt.Fprintf(b, "\n  %s %s", e.EventTime.AsTime().Format("15:04:05.000"), line)
		}
	}
	return nil
}

// eventLine says what one event of a run did, or "" for the events that
// say nothing of the guest; activity maps scheduling events to their
// activity's type and summary.
func eventLine(e *historypb.HistoryEvent, activity map[int64]string) string {
	switch e.EventType {
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
		return fmt.Sprintf("run %s: %s", e.GetWorkflowExecutionStartedEventAttributes().OriginalExecutionRunId,
			e.GetWorkflowExecutionStartedEventAttributes().WorkflowType.Name)
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
		a := e.GetActivityTaskScheduledEventAttributes()
		name := a.ActivityType.Name
		if s := e.UserMetadata.GetSummary(); s != nil {
			var summary string
			if json.Unmarshal(s.Data, &summary) == nil {
				name += " (" + summary + ")"
			}
		}
		activity[e.EventId] = name
		return "scheduled " + name
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
		a := e.GetActivityTaskStartedEventAttributes()
		return fmt.Sprintf("started %s, attempt %d", activity[a.ScheduledEventId], a.Attempt)
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
		return "completed " + activity[e.GetActivityTaskCompletedEventAttributes().ScheduledEventId]
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED:
		a := e.GetActivityTaskFailedEventAttributes()
		return fmt.Sprintf("failed %s: %s", activity[a.ScheduledEventId], a.Failure.GetMessage())
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
		a := e.GetActivityTaskTimedOutEventAttributes()
		return fmt.Sprintf("timed out %s: %s", activity[a.ScheduledEventId], a.Failure.GetMessage())
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
		return "cancel asked of " + activity[e.GetActivityTaskCancelRequestedEventAttributes().ScheduledEventId]
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
		return "cancelled " + activity[e.GetActivityTaskCanceledEventAttributes().ScheduledEventId]
	case enumspb.EVENT_TYPE_MARKER_RECORDED:
		return markerLine(e.GetMarkerRecordedEventAttributes())
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
		return "cancel requested"
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
		return "terminated"
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
		return "completed"
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
		return "cancelled"
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
		return "failed: " + e.GetWorkflowExecutionFailedEventAttributes().Failure.GetMessage()
	case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
		return "timed out"
	}
	return ""
}

// markerLine says which local activity a marker recorded, and its
// failure if it failed.
func markerLine(m *historypb.MarkerRecordedEventAttributes) string {
	name := m.MarkerName
	if p := m.Details["data"].GetPayloads(); len(p) > 0 {
		var data struct{ ActivityType string }
		if json.Unmarshal(p[0].Data, &data) == nil && data.ActivityType != "" {
			name = "local " + data.ActivityType
		}
	}
	if f := m.Failure; f != nil {
		return fmt.Sprintf("%s failed: %s", name, f.GetMessage())
	}
	return name
}

var uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// uuidsIn returns the guest UUIDs a violation's text names.
func uuidsIn(s string) []string { return uuidPattern.FindAllString(s, -1) }
