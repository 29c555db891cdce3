package contract

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
)

// TaskQueue is where every workflow and activity of the project runs.
const TaskQueue = "proxies"

// Workflow type names, as registered by the worker and shown in the Web UI and CLI.
const (
	ProxyWorkflowType = "ProxyWorkflow"
	GCWorkflowType    = "GCWorkflow"
	// MonitorShardWorkflowType runs one monitor shard (see MonitorShardWorkflowID).
	MonitorShardWorkflowType = "MonitorShardWorkflow"
)

// Signal and query names of ProxyWorkflow.
const (
	SignalSpec    = "spec"
	SignalDelete  = "delete"
	SignalReplace = "replace"
	SignalReport  = "report"
	// SignalMonitor carries a monitor shard's report (activities.MonitorReport).
	SignalMonitor = "monitor"
	QueryState    = "state"
)

// GCScheduleID is the fixed ID of the Schedule that runs GCWorkflow.
const GCScheduleID = "proxy-gc"

// GCWorkflowID is the ID of the workflows the Schedule starts (Temporal appends the time).
const GCWorkflowID = "proxy-gc"

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

// Phases the memo and the ProxyPhase search attribute carry that readers act on; they are
// the Proxy API's status.phase values (a test checks they agree).
const (
	PhasePending = "Pending"
	PhaseReady   = "Ready"
	// PhaseReplacing: the instance serves while its replacement is built and verified.
	// Its memo says Healthy while that instance is healthy (workflow version 5 on).
	PhaseReplacing = "Replacing"
)

// InitialSearchAttributes are set when a ProxyWorkflow starts, so a Proxy is findable in the
// Web UI before its first step runs.
func InitialSearchAttributes(provider string) temporal.SearchAttributes {
	return temporal.NewSearchAttributes(
		SearchAttrPhase.ValueSet(PhasePending),
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

// RunningProxiesQuery selects every running ProxyWorkflow. Discovery's full pass and the
// orphan sweep both read the fleet with it, so they agree on what "live" means.
var RunningProxiesQuery = fmt.Sprintf("WorkflowId STARTS_WITH %q AND ExecutionStatus = 'Running'", ProxyWorkflowIDPrefix)

// ProxiesUpdatedSinceQuery selects ProxyWorkflows whose memo changed after since, and runs
// that closed after since: discovery's incremental pass. A run terminated by hand (or by a
// server limit) publishes nothing as it ends, so only its close time shows it is gone. The
// close-time clause is for closed runs only: the dev server's visibility store gives a
// running execution a close time in the far future, which "CloseTime > since" alone
// matches, and the incremental pass then read the whole fleet every second.
func ProxiesUpdatedSinceQuery(since time.Time) string {
	t := since.UTC().Format(time.RFC3339Nano)
	return fmt.Sprintf("WorkflowId STARTS_WITH %q AND (%s > %q OR (ExecutionStatus != 'Running' AND CloseTime > %q))",
		ProxyWorkflowIDPrefix, SearchAttrUpdatedAt.GetName(), t, t)
}

// ListedRun is what decides, among the runs of one ProxyWorkflow ID that a visibility
// list returns, which one is the workflow: whether it runs, and when it started.
type ListedRun struct {
	Running bool
	Started time.Time
}

// Supersedes reports whether r, listed after prev for the same workflow ID, is the
// workflow rather than prev: a running run before a closed one, else the one started
// later (or, started at once, listed later). Visibility writes a run's close after the
// fact, so a run terminated by hand can still be listed as running beside the run started
// after it. Monitor shards and discovery both follow this rule, so they agree on it.
func (r ListedRun) Supersedes(prev ListedRun) bool {
	if r.Running != prev.Running {
		return r.Running
	}
	return !r.Started.Before(prev.Started)
}

// MonitorShardWorkflowID is the ID of monitor shard index of count for the workers of
// taskQueue. The queue is part of it because shards watch the proxies of their queue only
// (installations may share a namespace); the count, so that shards of another count are
// told apart, and retired, when the count changes.
func MonitorShardWorkflowID(taskQueue string, index, count int) string {
	return fmt.Sprintf("proxyfleet-monitor-shard/%s/%d-of-%d", taskQueue, index, count)
}

// OnTaskQueue narrows a visibility query to the workflows of one task queue.
func OnTaskQueue(query, taskQueue string) string {
	return fmt.Sprintf("(%s) AND TaskQueue = %q", query, taskQueue)
}
