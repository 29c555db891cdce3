package workflows

import (
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Register registers every workflow and activity of the project on w. The worker binary
// and the test stack both call it, so a test never runs a worker that production lacks.
// Workflow types are registered under the contract's names rather than the functions'
// names, so renaming a function cannot strand running workflows.
func Register(w worker.Registry, acts *activities.Activities) {
	w.RegisterWorkflowWithOptions(ProxyWorkflow, workflow.RegisterOptions{Name: contract.ProxyWorkflowType})
	w.RegisterWorkflowWithOptions(GCWorkflow, workflow.RegisterOptions{Name: contract.GCWorkflowType})
	w.RegisterWorkflowWithOptions(MonitorShardWorkflow, workflow.RegisterOptions{Name: contract.MonitorShardWorkflowType})
	w.RegisterActivity(acts)
}

// WorkerOptions are the options every worker of these workflows starts from. Pollers scale
// with the server's feedback: a fleet's health verdicts and status changes arrive in bursts
// of workflow tasks, and two fixed pollers (the SDK default) queued them for over a second
// under load, which is time a failed proxy stays leasable.
func WorkerOptions() worker.Options {
	autoscale := worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{})
	return worker.Options{
		WorkflowTaskPollerBehavior: autoscale,
		ActivityTaskPollerBehavior: autoscale,
	}
}
