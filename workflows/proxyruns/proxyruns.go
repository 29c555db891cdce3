// Package proxyruns reads ProxyWorkflow runs from Temporal's visibility, for discovery's
// index and the monitor shards' membership alike: the paging, when a run last changed (its
// memo's update time, or its close time if later), and which of one workflow ID's runs is
// the workflow. Each reader decodes the memo it needs; the rules for which run counts are
// here once, so the two readers cannot come to disagree about which proxies exist.
//
// It links the Temporal SDK's service and common types and package contract, never the
// workflow code or Kubernetes: discovery imports it.
package proxyruns

import (
	"context"
	"fmt"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Lister lists workflow executions; the SDK's client.Client is one.
type Lister interface {
	ListWorkflow(ctx context.Context, request *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error)
}

// Query is one visibility list: the namespace (empty: the client's), the page size (0: the
// server's default) and the query.
type Query struct {
	Namespace string
	PageSize  int32
	Query     string
}

// Run is one run as visibility lists it.
type Run struct {
	WorkflowID, RunID string
	// ListedRun says whether it runs and when it started: which of an ID's runs is the
	// workflow (contract.ListedRun.Supersedes).
	contract.ListedRun
	// Changed is when it last changed: its memo's update time (search attribute
	// ProxyUpdatedAt), or its close time if later. Incremental reads list the runs changed
	// since the latest Changed they saw.
	Changed time.Time
	// Memo is the run's memo, for the reader to decode what it needs.
	Memo *commonpb.Memo
}

// Latest is a run that is its workflow, with what the reader decoded from it.
type Latest[T any] struct {
	Run
	Value T
}

// List lists q and returns, for each workflow ID listed, the run that is the workflow, in
// the order the IDs were first listed, with what decode made of it. One ID can have a
// closed run and a running one (a Proxy deleted and created again, continue-as-new, a run
// terminated by hand whose close is not yet visible beside the run started after it). A run
// that continued as new is left out: its next run carries on, and until that run's memo is
// visible the last one holds. A run decode refuses (a memo not written yet) is left out
// too, and cannot take the place of one it accepted. high is the latest Changed of the runs
// listed, continued-as-new aside; read is how many runs were listed.
func List[T any](ctx context.Context, l Lister, q Query, decode func(Run) (T, bool)) (runs []Latest[T], high time.Time, read int, err error) {
	at := map[string]int{}
	var token []byte
	for {
		resp, err := l.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: q.Namespace, PageSize: q.PageSize, NextPageToken: token, Query: q.Query,
		})
		if err != nil {
			return runs, high, read, fmt.Errorf("list workflows: %w", err)
		}
		for _, ex := range resp.GetExecutions() {
			read++
			if ex.GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
				continue
			}
			r := runOf(ex)
			if r.Changed.After(high) {
				high = r.Changed
			}
			v, ok := decode(r)
			if !ok {
				continue
			}
			i, seen := at[r.WorkflowID]
			switch {
			case !seen:
				at[r.WorkflowID] = len(runs)
				runs = append(runs, Latest[T]{r, v})
			case r.Supersedes(runs[i].ListedRun):
				runs[i] = Latest[T]{r, v}
			}
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return runs, high, read, nil
		}
	}
}

var dc = converter.GetDefaultDataConverter()

// runOf reads one listed execution.
func runOf(ex *workflowpb.WorkflowExecutionInfo) Run {
	var changed time.Time
	if f := ex.GetSearchAttributes().GetIndexedFields()[contract.SearchAttrUpdatedAt.GetName()]; f != nil {
		_ = dc.FromPayload(f, &changed)
	}
	if c := ex.GetCloseTime(); c != nil && c.AsTime().After(changed) {
		changed = c.AsTime()
	}
	return Run{
		WorkflowID: ex.GetExecution().GetWorkflowId(), RunID: ex.GetExecution().GetRunId(),
		ListedRun: contract.ListedRun{Running: ex.GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Started: ex.GetStartTime().AsTime()},
		Changed:   changed, Memo: ex.GetMemo(),
	}
}

// Decode decodes the memo field key of r into v; false if r has none or it does not decode.
func Decode(r Run, key string, v any) bool {
	p := r.Memo.GetFields()[key]
	return p != nil && dc.FromPayload(p, v) == nil
}
