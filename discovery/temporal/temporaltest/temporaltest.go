// Package temporaltest is Temporal's visibility as discovery's index reader sees it, for
// tests: a lister that fails or lists nothing, and one that lists the runs a test
// scripts. Discovery's tests and its Temporal adapter's tests load the index through the
// real refresher with these, so both read runs the same way.
package temporaltest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Lister answers ListWorkflow with Err, or with no workflows. FailFirst makes the first
// calls fail instead (for a refresher's Run, which owns the calls); Calls counts them.
type Lister struct {
	Err       error
	FailFirst atomic.Int32
	Calls     atomic.Int32
}

// ListWorkflow implements the refresher's lister.
func (f *Lister) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	if f.Calls.Add(1) <= f.FailFirst.Load() {
		return nil, errors.New("temporal unreachable")
	}
	if f.Err != nil {
		return nil, f.Err
	}
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

// Run is one workflow execution a Scripted lister returns.
type Run struct {
	Memo    contract.ProxyMemo
	Status  enums.WorkflowExecutionStatus
	Updated time.Time
	Closed  time.Time
	Started time.Time
}

// Scripted answers every ListWorkflow with its runs, as the visibility store would list
// them for the incremental query (the test chooses which runs match).
type Scripted struct {
	mu   sync.Mutex
	runs []Run
}

// Set replaces the runs listed.
func (l *Scripted) Set(runs ...Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = runs
}

// ListWorkflow implements the refresher's lister.
func (l *Scripted) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	resp := &workflowservice.ListWorkflowExecutionsResponse{}
	for _, r := range l.runs {
		memo, err := converter.GetDefaultDataConverter().ToPayload(r.Memo)
		if err != nil {
			return nil, err
		}
		updated, err := converter.GetDefaultDataConverter().ToPayload(r.Updated)
		if err != nil {
			return nil, err
		}
		ex := &workflowpb.WorkflowExecutionInfo{
			Execution:        &commonpb.WorkflowExecution{WorkflowId: contract.ProxyWorkflowID(r.Memo.Namespace, r.Memo.Name)},
			Status:           r.Status,
			Memo:             &commonpb.Memo{Fields: map[string]*commonpb.Payload{contract.MemoKey: memo}},
			SearchAttributes: &commonpb.SearchAttributes{IndexedFields: map[string]*commonpb.Payload{contract.SearchAttrUpdatedAt.GetName(): updated}},
		}
		if !r.Closed.IsZero() {
			ex.CloseTime = timestamppb.New(r.Closed)
		}
		if !r.Started.IsZero() {
			ex.StartTime = timestamppb.New(r.Started)
		}
		resp.Executions = append(resp.Executions, ex)
	}
	return resp, nil
}

// ReadyMemo is the memo of a Ready, healthy proxy name in namespace crawl, one lease wide.
func ReadyMemo(name string) contract.ProxyMemo {
	return contract.ProxyMemo{Name: name, Namespace: "crawl", UID: "uid-" + name, Phase: contract.PhaseReady,
		Healthy: true, IP: "127.0.0.1", Port: 3128, MaxLeases: 1}
}
