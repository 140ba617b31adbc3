package workflows

import "go.temporal.io/sdk/worker"

// Polling sets how a worker of these workflows polls its task queue:
// pollers that Temporal's server scales with the work, workflow and
// activity alike. The SDK's fixed pollers all move to a worker's sticky
// queue while its last answer hinted at a backlog there, and a stale hint
// holds every one of them on an empty sticky queue for a whole long poll
// (about a minute) while the shared queue, where every new workflow's
// first task waits, goes unpolled; scaling pollers always keep one on the
// shared queue.
func Polling(o worker.Options) worker.Options {
	o.WorkflowTaskPollerBehavior = worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{})
	o.ActivityTaskPollerBehavior = worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{})
	return o
}
