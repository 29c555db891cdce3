// Package workflows holds the Temporal workflows that own each Proxy's life and the orphan
// sweep. Workflow code here is deterministic and does no I/O: everything that touches the
// world is an activity in package activities.
//
// This file is the one place where the names shared by the controller, the worker, discovery
// and the tests are defined: task queue, workflow IDs, signals, queries, search attributes.
package workflows

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
)

// TaskQueue is where every workflow and activity of the project runs.
const TaskQueue = "proxies"

// Signal and query names of ProxyWorkflow.
const (
	SignalSpec    = "spec"
	SignalDelete  = "delete"
	SignalReplace = "replace"
	SignalReport  = "report"
	QueryState    = "state"
)

// Search attributes upserted by ProxyWorkflow. They must be registered on the namespace
// before the first workflow runs (the dev server takes them as --search-attribute flags).
var (
	SearchAttrPhase     = temporal.NewSearchAttributeKeyKeyword("ProxyPhase")
	SearchAttrProvider  = temporal.NewSearchAttributeKeyKeyword("ProxyProvider")
	SearchAttrHealthy   = temporal.NewSearchAttributeKeyBool("ProxyHealthy")
	SearchAttrUpdatedAt = temporal.NewSearchAttributeKeyTime("ProxyUpdatedAt")
)

// SearchAttributes returns zero values of every project search attribute; registering
// code only reads their names and types from it.
func SearchAttributes() temporal.SearchAttributes {
	return temporal.NewSearchAttributes(
		SearchAttrPhase.ValueSet(""),
		SearchAttrProvider.ValueSet(""),
		SearchAttrHealthy.ValueSet(false),
		SearchAttrUpdatedAt.ValueSet(time.Time{}),
	)
}

// InitialSearchAttributes are set when a ProxyWorkflow starts, so a Proxy is findable in the
// Web UI before its first step runs.
func InitialSearchAttributes(provider string) temporal.SearchAttributes {
	return temporal.NewSearchAttributes(
		SearchAttrPhase.ValueSet("Pending"),
		SearchAttrProvider.ValueSet(provider),
		SearchAttrHealthy.ValueSet(false),
	)
}

// ProxyWorkflowIDPrefix starts every ProxyWorkflow ID; visibility queries use it to tell
// proxy workflows from the GC workflow.
const ProxyWorkflowIDPrefix = "proxy/"

// ProxyWorkflowID is the ID of the workflow that owns the Proxy namespace/name. It is a pure
// function of the object's key so that every caller finds the same workflow.
func ProxyWorkflowID(namespace, name string) string {
	return ProxyWorkflowIDPrefix + namespace + "/" + name
}

// ParseProxyWorkflowID is the inverse of ProxyWorkflowID.
func ParseProxyWorkflowID(id string) (namespace, name string, err error) {
	rest, ok := strings.CutPrefix(id, ProxyWorkflowIDPrefix)
	if !ok {
		return "", "", fmt.Errorf("workflow ID %q does not start with %q", id, ProxyWorkflowIDPrefix)
	}
	namespace, name, ok = strings.Cut(rest, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("workflow ID %q is not %snamespace/name", id, ProxyWorkflowIDPrefix)
	}
	return namespace, name, nil
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
