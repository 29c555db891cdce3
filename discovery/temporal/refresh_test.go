package temporal_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

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

// TestRefresherRunRetriesTheFirstLoad: Run keeps trying full passes until one succeeds,
// so a discovery started while Temporal is down serves as soon as Temporal is back, not
// FullEvery later.
func TestRefresherRunRetriesTheFirstLoad(t *testing.T) {
	store := discovery.NewStore(time.Minute)
	lister := &fakeLister{}
	lister.failFirst.Store(3)
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler),
		Interval: 10 * time.Millisecond, FullEvery: time.Hour}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, store.Loaded, 5*time.Second, 5*time.Millisecond, "the index never loaded after Temporal came back")
	assert.GreaterOrEqual(t, lister.calls.Load(), int32(4), "three failed full passes, then one that loaded")
	cancel()
	require.NoError(t, <-done)
}

// TestRefresherLoadsIndex: only a full pass that succeeds loads the index. A Temporal that
// cannot be reached leaves it unloaded (the API keeps answering index_loading) instead of
// loading an empty fleet; incremental passes never load it.
func TestRefresherLoadsIndex(t *testing.T) {
	store := discovery.NewStore(time.Minute)
	lister := &fakeLister{err: errors.New("temporal unreachable")}
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}

	require.Error(t, r.Full(t.Context()))
	assert.False(t, store.Loaded(), "a failed full pass")

	lister.err = nil
	require.NoError(t, r.Incremental(t.Context()))
	assert.False(t, store.Loaded(), "an incremental pass")

	require.NoError(t, r.Full(t.Context()))
	assert.True(t, store.Loaded(), "a full pass, even of an empty fleet")
	assert.Equal(t, 0, store.Len())

	lister.err = errors.New("temporal unreachable again")
	require.Error(t, r.Full(t.Context()))
	assert.True(t, store.Loaded(), "the last full index is still served")
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

// TestIncrementalDropsClosedRuns: a run that ended without publishing anything (terminated
// by hand, or by a server limit) leaves the index at the next incremental pass; a run that
// continued as new does not, even before its successor's memo is visible.
func TestIncrementalDropsClosedRuns(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lister := &scriptedLister{}
	store := discovery.NewStore(time.Minute)
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}
	lister.set(
		listedRun{memo: readyMemo("a"), status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base},
		listedRun{memo: readyMemo("b"), status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base},
		listedRun{memo: readyMemo("c"), status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base},
	)
	require.NoError(t, r.Full(t.Context()))
	require.Equal(t, 3, store.Len())

	lister.set(
		listedRun{memo: readyMemo("a"), status: enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, updated: base, closed: base.Add(time.Hour)},
		listedRun{memo: readyMemo("b"), status: enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW, updated: base, closed: base.Add(time.Hour)},
		listedRun{memo: readyMemo("c"), status: enums.WORKFLOW_EXECUTION_STATUS_FAILED, updated: base, closed: base.Add(time.Hour)},
	)
	require.NoError(t, r.Incremental(t.Context()))
	assert.Equal(t, 1, store.Len(), "the terminated and the failed run are gone")
	_, err := store.Acquire(nil, "", time.Minute)
	require.NoError(t, err, "the continued run's proxy is still leased")
}

// TestTheLatestRunIsTheProxy: a run's close reaches visibility after the fact, so the run
// terminated by hand and the run the operator started again after it can both be listed
// as running; the index holds what the later one published (here: not Ready yet), in a
// full pass and in an incremental one alike, whatever order they are listed in.
func TestTheLatestRunIsTheProxy(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	provisioning := readyMemo("a")
	provisioning.Phase, provisioning.Healthy = contract.PhasePending, false
	old := listedRun{memo: readyMemo("a"), status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base, started: base.Add(-time.Hour)}
	next := listedRun{memo: provisioning, status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base.Add(time.Second), started: base}
	lister := &scriptedLister{}
	for _, order := range [][]listedRun{{old, next}, {next, old}} {
		lister.set(order...)
		for pass, run := range map[string]func(*temporal.Refresher, context.Context) error{
			"full": (*temporal.Refresher).Full, "incremental": (*temporal.Refresher).Incremental,
		} {
			store := discovery.NewStore(time.Minute)
			r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}
			require.NoError(t, run(r, t.Context()))
			list := store.List(discovery.Selector{}, nil)
			require.Len(t, list, 1, pass)
			assert.Equal(t, contract.PhasePending, list[0].Phase, "%s pass: the ended run's Ready memo was taken", pass)
		}
	}
}

// TestReplacingProxiesStayLeasable: a proxy whose instance is being replaced stays in the
// pool while its memo says it is healthy (runs of workflow version 5 on), and its leases
// renew; when the replacement takes over, a renewal ends the lease with proxy_gone
// "replaced". A memo of an older run (Replacing, not healthy) keeps the proxy out.
func TestReplacingProxiesStayLeasable(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lister := &scriptedLister{}
	store := discovery.NewStore(time.Minute)
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}
	serving := readyMemo("a")
	serving.Phase = contract.PhaseReplacing
	older := readyMemo("b")
	older.Phase, older.Healthy = contract.PhaseReplacing, false
	lister.set(
		listedRun{memo: serving, status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base},
		listedRun{memo: older, status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base},
	)
	require.NoError(t, r.Full(t.Context()))
	l, err := store.Acquire(nil, "", time.Minute)
	require.NoError(t, err, "the instance being replaced is leased")
	assert.Equal(t, "a", l.Proxy.Name)
	_, err = store.Acquire(nil, "", time.Minute)
	var none *discovery.NoMatch
	require.ErrorAs(t, err, &none, "a Replacing memo that is not healthy is not leased")

	_, err = store.Renew("", l.ID, time.Minute)
	require.NoError(t, err, "a lease on the serving instance renews while it is replaced")

	promoted := serving
	promoted.Phase, promoted.IP = contract.PhaseReady, "127.0.0.2"
	lister.set(listedRun{memo: promoted, status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base.Add(time.Minute)},
		listedRun{memo: older, status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, updated: base})
	require.NoError(t, r.Full(t.Context()))
	_, err = store.Renew("", l.ID, time.Minute)
	var gone *discovery.ProxyGone
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, discovery.ProxyGoneReplaced, gone.Reason)
}
