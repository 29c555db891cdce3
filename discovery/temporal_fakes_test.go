package discovery_test

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

// Fakes of Temporal's visibility for the tests that load the index through the refresher,
// as discovery/temporal's own tests do (a copy of theirs: test files are not shared
// between packages).

// fakeLister answers ListWorkflow with err, or with no workflows. failFirst makes the
// first calls fail instead (for Run, which owns the calls).
type fakeLister struct {
	err       error
	failFirst atomic.Int32
	calls     atomic.Int32
}

func (f *fakeLister) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	if f.calls.Add(1) <= f.failFirst.Load() {
		return nil, errors.New("temporal unreachable")
	}
	if f.err != nil {
		return nil, f.err
	}
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

// listedRun is one workflow execution a scriptedLister returns.
type listedRun struct {
	memo    contract.ProxyMemo
	status  enums.WorkflowExecutionStatus
	updated time.Time
	closed  time.Time
	started time.Time
}

// scriptedLister answers every ListWorkflow with runs, as the visibility store would list
// them for the incremental query (the test chooses which runs match).
type scriptedLister struct {
	mu   sync.Mutex
	runs []listedRun
}

func (l *scriptedLister) set(runs ...listedRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = runs
}

func (l *scriptedLister) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	resp := &workflowservice.ListWorkflowExecutionsResponse{}
	for _, r := range l.runs {
		memo, err := converter.GetDefaultDataConverter().ToPayload(r.memo)
		if err != nil {
			return nil, err
		}
		updated, err := converter.GetDefaultDataConverter().ToPayload(r.updated)
		if err != nil {
			return nil, err
		}
		ex := &workflowpb.WorkflowExecutionInfo{
			Execution:        &commonpb.WorkflowExecution{WorkflowId: contract.ProxyWorkflowID(r.memo.Namespace, r.memo.Name)},
			Status:           r.status,
			Memo:             &commonpb.Memo{Fields: map[string]*commonpb.Payload{contract.MemoKey: memo}},
			SearchAttributes: &commonpb.SearchAttributes{IndexedFields: map[string]*commonpb.Payload{contract.SearchAttrUpdatedAt.GetName(): updated}},
		}
		if !r.closed.IsZero() {
			ex.CloseTime = timestamppb.New(r.closed)
		}
		if !r.started.IsZero() {
			ex.StartTime = timestamppb.New(r.started)
		}
		resp.Executions = append(resp.Executions, ex)
	}
	return resp, nil
}

func readyMemo(name string) contract.ProxyMemo {
	return contract.ProxyMemo{Name: name, Namespace: "crawl", UID: "uid-" + name, Phase: contract.PhaseReady,
		Healthy: true, IP: "127.0.0.1", Port: 3128, MaxLeases: 1}
}
