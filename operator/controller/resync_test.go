package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

// scriptedTemporal answers from what the test set: listed is what visibility shows running,
// status what DescribeWorkflow says (absent: NotFound). A start records its call and makes
// the workflow running, as the server would; a signal reaches only a running workflow, which
// then takes stopOnSignal's status once if the test set one (a run that stops right after).
type scriptedTemporal struct {
	mu           sync.Mutex
	listed       map[string]bool
	status       map[string]enums.WorkflowExecutionStatus
	stopOnSignal map[string]enums.WorkflowExecutionStatus
	listErr      error
	starts       []started
}

type started struct {
	ID       string
	Signal   string
	Arg      any
	Options  client.StartWorkflowOptions
	Workflow any
	Input    proxyinput.Start
}

var _ controller.Temporal = (*scriptedTemporal)(nil)

func newScripted() *scriptedTemporal {
	return &scriptedTemporal{listed: map[string]bool{}, status: map[string]enums.WorkflowExecutionStatus{},
		stopOnSignal: map[string]enums.WorkflowExecutionStatus{}}
}

func (f *scriptedTemporal) set(id string, st enums.WorkflowExecutionStatus, listed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[id] = st
	f.listed[id] = listed
}

// startsIn returns the starts of workflows of Proxies in namespace ns: a resync pass lists
// every namespace, so it also sees other tests' Proxies.
func (f *scriptedTemporal) startsIn(ns string) []started {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []started
	for _, s := range f.starts {
		if strings.HasPrefix(s.ID, contract.ProxyWorkflowID(ns, "")) {
			out = append(out, s)
		}
	}
	return out
}

func (f *scriptedTemporal) SignalWithStartWorkflow(_ context.Context, id, name string, arg any, opts client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, _ := args[0].(proxyinput.Start)
	f.starts = append(f.starts, started{ID: id, Signal: name, Arg: arg, Options: opts, Workflow: wf, Input: in})
	f.status[id] = enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	return nil, nil
}

func (f *scriptedTemporal) SignalWorkflow(_ context.Context, id, _, _ string, _ any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status[id] != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return serviceerror.NewNotFound("workflow execution already completed")
	}
	if st, ok := f.stopOnSignal[id]; ok {
		f.status[id] = st
		delete(f.stopOnSignal, id)
	}
	return nil
}

func (f *scriptedTemporal) DescribeWorkflow(_ context.Context, id, _ string) (*client.WorkflowExecutionDescription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.status[id]
	if !ok {
		return nil, serviceerror.NewNotFound("workflow not found for ID: " + id)
	}
	return &client.WorkflowExecutionDescription{WorkflowExecutionMetadata: client.WorkflowExecutionMetadata{Status: st}}, nil
}

// ListWorkflow answers one execution per page, so a pass must follow the page tokens.
func (f *scriptedTemporal) ListWorkflow(_ context.Context, req *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	if req.GetQuery() != contract.RunningProxiesQuery {
		return nil, serviceerror.NewInvalidArgument("unexpected query " + req.GetQuery())
	}
	var ids []string
	for id, ok := range f.listed {
		if ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	i := 0
	if len(req.GetNextPageToken()) > 0 {
		i, _ = strconv.Atoi(string(req.GetNextPageToken()))
	}
	resp := &workflowservice.ListWorkflowExecutionsResponse{}
	if i < len(ids) {
		resp.Executions = []*workflowpb.WorkflowExecutionInfo{{
			Execution: &commonpb.WorkflowExecution{WorkflowId: ids[i]},
			Status:    enums.WORKFLOW_EXECUTION_STATUS_RUNNING,
		}}
		if i+1 < len(ids) {
			resp.NextPageToken = []byte(strconv.Itoa(i + 1))
		}
	}
	return resp, nil
}

// newReconciler returns a reconciler on a running manager's cache and event recorder, with
// no controller: the test drives it by calling Reconcile and Resync, so nothing else talks
// to tc.
func newReconciler(t *testing.T, tc controller.Temporal) *controller.ProxyReconciler {
	t.Helper()
	mgr := testManager(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return &controller.ProxyReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Temporal: tc, Events: mgr.GetEventRecorder("proxyfleet-operator"),
		Installation: "test", TaskQueue: "controller-test-no-worker", RecheckDeleting: time.Second,
	}
}

// testCtx carries a logger that writes through t, as the manager's context would carry its own.
func testCtx(t *testing.T) context.Context {
	return log.IntoContext(context.Background(), testr.New(t))
}

// createProxy creates a Proxy as the controller leaves it after its first reconcile: with
// the finalizer and, when workflowID is set, a status the workflow published.
func createProxy(t *testing.T, ns, name string, finalizer bool, workflowID string) *v1alpha1.Proxy {
	t.Helper()
	k := testenv.Kube(t)
	ctx := context.Background()
	p := proxy(ns, name)
	if finalizer {
		p.Finalizers = []string{v1alpha1.Finalizer}
	}
	require.NoError(t, k.Client.Create(ctx, p))
	if workflowID != "" {
		p.Status.WorkflowID = workflowID
		require.NoError(t, k.Client.Status().Update(ctx, p))
	}
	return p
}

// waitCached waits until the reconciler's cache holds p in the state ok accepts.
func waitCached(t *testing.T, r *controller.ProxyReconciler, p *v1alpha1.Proxy, ok func(*v1alpha1.Proxy) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got v1alpha1.Proxy
		if err := r.Client.Get(context.Background(), ctrlclient.ObjectKeyFromObject(p), &got); err != nil {
			return false
		}
		return ok(&got)
	}, 30*time.Second, 20*time.Millisecond, "the cache never showed %s/%s in the expected state", p.Namespace, p.Name)
}

func sameVersion(p *v1alpha1.Proxy) func(*v1alpha1.Proxy) bool {
	return func(got *v1alpha1.Proxy) bool { return got.ResourceVersion == p.ResourceVersion }
}

// waitEvents waits until the namespace holds a Warning event with this reason for each
// name in want, and returns their notes by Proxy name.
func waitEvents(t *testing.T, ns, reason string, want ...string) map[string]string {
	t.Helper()
	notes := map[string]string{}
	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		if err := testenv.Kube(t).Client.List(context.Background(), &list, ctrlclient.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning {
				notes[e.Regarding.Name] = e.Note
			}
		}
		for _, name := range want {
			if _, ok := notes[name]; !ok {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "no %s events for %v", reason, want)
	return notes
}

func restartsCounted(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, controller.WorkflowRestarts.Write(&m))
	return m.GetCounter().GetValue()
}

// TestResyncRestartsStoppedWorkflows: one pass starts again, exactly as a reconcile would,
// the workflows of live Proxies that are not running (terminated, failed, never found),
// with a Warning event and a count; it leaves alone running workflows (listed, or only
// described as running while visibility lags), deleting Proxies and Proxies that were never
// reconciled. A second pass finds nothing more to do.
func TestResyncRestartsStoppedWorkflows(t *testing.T) {
	tc := newScripted()
	r := newReconciler(t, tc)
	ctx := testCtx(t)
	ns := namespace(t)
	id := func(name string) string { return contract.ProxyWorkflowID(ns, name) }

	terminated := createProxy(t, ns, "terminated", true, id("terminated"))
	tc.set(id("terminated"), enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, false)
	failed := createProxy(t, ns, "failed", true, id("failed"))
	tc.set(id("failed"), enums.WORKFLOW_EXECUTION_STATUS_FAILED, false)
	missing := createProxy(t, ns, "missing", true, "")
	running := createProxy(t, ns, "running", true, id("running"))
	tc.set(id("running"), enums.WORKFLOW_EXECUTION_STATUS_RUNNING, true)
	// A listed workflow is trusted without a Describe: this one would be restarted if the
	// pass asked.
	listedOnly := createProxy(t, ns, "listed", true, id("listed"))
	tc.set(id("listed"), enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, true)
	lagging := createProxy(t, ns, "lagging", true, id("lagging"))
	tc.set(id("lagging"), enums.WORKFLOW_EXECUTION_STATUS_RUNNING, false)
	deleting := createProxy(t, ns, "deleting", true, id("deleting"))
	tc.set(id("deleting"), enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, false)
	require.NoError(t, testenv.Kube(t).Client.Delete(ctx, deleting))
	unreconciled := createProxy(t, ns, "unreconciled", false, "")

	for _, p := range []*v1alpha1.Proxy{terminated, failed, missing, running, listedOnly, lagging, unreconciled} {
		waitCached(t, r, p, sameVersion(p))
	}
	waitCached(t, r, deleting, func(p *v1alpha1.Proxy) bool { return p.DeletionTimestamp != nil })

	before := restartsCounted(t)
	n, err := r.Resync(ctx)
	require.NoError(t, err)
	starts := tc.startsIn(ns)
	var got []string
	for _, s := range starts {
		got = append(got, s.ID)
	}
	assert.ElementsMatch(t, []string{id("terminated"), id("failed"), id("missing")}, got)
	assert.GreaterOrEqual(t, n, len(starts), "other tests' Proxies may be restarted too")
	assert.Equal(t, float64(n), restartsCounted(t)-before, "every restart is counted")

	// Started exactly as a reconcile starts a run: spec signal, same ID, queue and input.
	for _, s := range starts {
		name := strings.TrimPrefix(s.ID, contract.ProxyWorkflowID(ns, ""))
		assert.Equal(t, contract.SignalSpec, s.Signal)
		sig, ok := s.Arg.(proxyinput.SpecSignal)
		require.True(t, ok, "spec signal, got %T", s.Arg)
		var p v1alpha1.Proxy
		require.NoError(t, testenv.Kube(t).Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p))
		assert.Equal(t, string(p.UID), sig.UID)
		assert.Equal(t, p.Generation, sig.Generation)
		assert.Equal(t, s.ID, s.Options.ID)
		assert.Equal(t, "controller-test-no-worker", s.Options.TaskQueue)
		assert.Equal(t, enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE, s.Options.WorkflowIDReusePolicy)
		assert.Equal(t, contract.ProxyWorkflowType, s.Workflow)
		assert.Equal(t, proxyinput.Start{Namespace: ns, Name: name, Installation: "test"}, s.Input)
	}

	notes := waitEvents(t, ns, controller.EventWorkflowRestarted, "terminated", "failed", "missing")
	assert.Equal(t, fmt.Sprintf("workflow %s was Terminated; started it again", id("terminated")), notes["terminated"])
	assert.Equal(t, fmt.Sprintf("workflow %s was Failed; started it again", id("failed")), notes["failed"])
	assert.Equal(t, fmt.Sprintf("workflow %s was not found; started it again", id("missing")), notes["missing"])

	// The restarted runs are running now (Describe says so although visibility does not
	// list them yet): nothing more to do.
	_, err = r.Resync(ctx)
	require.NoError(t, err)
	assert.Len(t, tc.startsIn(ns), len(starts), "a second pass restarted again")
}

// TestResyncSkipsWhileTemporalIsDown: a pass that cannot list the running workflows starts
// nothing (without the list, every Proxy would need a Describe) and says why.
func TestResyncSkipsWhileTemporalIsDown(t *testing.T) {
	tc := newScripted()
	tc.listErr = errUnreachable
	r := newReconciler(t, tc)
	ctx := testCtx(t)
	ns := namespace(t)
	p := createProxy(t, ns, "stopped", true, contract.ProxyWorkflowID(ns, "stopped"))
	waitCached(t, r, p, sameVersion(p))
	n, err := r.Resync(ctx)
	require.ErrorIs(t, err, errUnreachable)
	assert.Zero(t, n)
	assert.Empty(t, tc.startsIn(ns))
}

// TestDeleteStartsCleanupRun: a deleting Proxy whose workflow once ran (status.workflowID)
// but no longer runs keeps its finalizer, and a new run is started with the delete signal to
// find and delete what the stopped run left. A Proxy whose workflow never ran is released.
func TestDeleteStartsCleanupRun(t *testing.T) {
	for _, tt := range []struct {
		name string
		// status is what Describe says before the delete signal (absent: NotFound);
		// stopOnSignal what it says after.
		status, stopOnSignal enums.WorkflowExecutionStatus
		workflowID           bool
		wantCleanup          bool
		wantReleased         bool
	}{
		{name: "terminated", status: enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, workflowID: true, wantCleanup: true},
		{name: "history-gone", workflowID: true, wantCleanup: true},
		{name: "stops-on-signal", status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, stopOnSignal: enums.WORKFLOW_EXECUTION_STATUS_FAILED,
			workflowID: true, wantCleanup: true},
		// It completed: it released the finalizer itself (this reconcile's copy predates that).
		{name: "completes-on-signal", status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, stopOnSignal: enums.WORKFLOW_EXECUTION_STATUS_COMPLETED,
			workflowID: true},
		{name: "running", status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, workflowID: true},
		{name: "never-ran", wantReleased: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newScripted()
			r := newReconciler(t, tc)
			ctx := testCtx(t)
			k := testenv.Kube(t)
			ns := namespace(t)
			id := contract.ProxyWorkflowID(ns, tt.name)
			wfID := ""
			if tt.workflowID {
				wfID = id
			}
			if tt.status != enums.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED {
				tc.set(id, tt.status, tt.status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING)
			}
			if tt.stopOnSignal != enums.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED {
				tc.stopOnSignal[id] = tt.stopOnSignal
			}
			p := createProxy(t, ns, tt.name, true, wfID)
			require.NoError(t, k.Client.Delete(ctx, p))
			waitCached(t, r, p, func(p *v1alpha1.Proxy) bool { return p.DeletionTimestamp != nil })

			res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: tt.name}})
			require.NoError(t, err)

			var got v1alpha1.Proxy
			err = k.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: tt.name}, &got)
			if tt.wantReleased {
				require.True(t, ctrlclient.IgnoreNotFound(err) == nil && err != nil, "still there: %v", err)
				assert.Empty(t, tc.startsIn(ns))
				return
			}
			require.NoError(t, err)
			assert.Contains(t, got.Finalizers, v1alpha1.Finalizer, "released while an instance may be left")
			assert.Equal(t, time.Second, res.RequeueAfter, "looked at again after RecheckDeleting")
			starts := tc.startsIn(ns)
			if !tt.wantCleanup {
				assert.Empty(t, starts)
				return
			}
			require.Len(t, starts, 1)
			s := starts[0]
			assert.Equal(t, id, s.ID)
			assert.Equal(t, contract.SignalDelete, s.Signal)
			assert.Equal(t, contract.DeleteSignal{UID: string(p.UID)}, s.Arg)
			assert.Equal(t, id, s.Options.ID)
			assert.Equal(t, "controller-test-no-worker", s.Options.TaskQueue)
			assert.Equal(t, enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE, s.Options.WorkflowIDReusePolicy)
			assert.Equal(t, contract.ProxyWorkflowType, s.Workflow)
			assert.Equal(t, proxyinput.Start{Namespace: ns, Name: tt.name, Installation: "test"}, s.Input)
			waitEvents(t, ns, controller.EventWorkflowRestarted, tt.name)

			// The cleanup run is running now: the next look signals it and waits again.
			_, err = r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: tt.name}})
			require.NoError(t, err)
			assert.Len(t, tc.startsIn(ns), 1, "a running cleanup run was started again")
		})
	}
}

// TestResyncRestartsTerminatedWorkflow runs against the real dev server: a workflow
// terminated by hand (as `temporal workflow terminate` does) while its Proxy lives gets a new
// run from the resync; a running workflow keeps its run. Visibility may lag the terminate,
// so the pass is repeated until it acts.
func TestResyncRestartsTerminatedWorkflow(t *testing.T) {
	k := testenv.Kube(t)
	temporal := testenv.Temporal(t).Client
	tc := &flakyTemporal{real: temporal}
	r := startController(t, tc)
	ctx := testCtx(t)
	ns := namespace(t)
	for _, name := range []string{"stopped", "alive"} {
		require.NoError(t, k.Client.Create(ctx, proxy(ns, name)))
	}
	runOf := func(name string) (string, enums.WorkflowExecutionStatus) {
		d, err := temporal.DescribeWorkflow(ctx, contract.ProxyWorkflowID(ns, name), "")
		if err != nil {
			return "", enums.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED
		}
		return d.WorkflowExecution.RunID, d.Status
	}
	for _, name := range []string{"stopped", "alive"} {
		require.Eventually(t, func() bool {
			_, st := runOf(name)
			return st == enums.WORKFLOW_EXECUTION_STATUS_RUNNING
		}, 30*time.Second, 50*time.Millisecond, "the controller never started %s's workflow", name)
		// The resync only looks at Proxies the controller has taken (finalizer added).
		p := proxy(ns, name)
		waitCached(t, r, p, func(p *v1alpha1.Proxy) bool { return slices.Contains(p.Finalizers, v1alpha1.Finalizer) })
	}
	firstRun, _ := runOf("stopped")
	aliveRun, _ := runOf("alive")
	require.NoError(t, temporal.TerminateWorkflow(ctx, contract.ProxyWorkflowID(ns, "stopped"), "", "test: terminated by hand"))

	require.Eventually(t, func() bool {
		if _, err := r.Resync(ctx); err != nil {
			t.Logf("resync: %v", err)
			return false
		}
		run, st := runOf("stopped")
		return st == enums.WORKFLOW_EXECUTION_STATUS_RUNNING && run != firstRun
	}, 30*time.Second, 100*time.Millisecond, "the terminated workflow was never started again")
	run, st := runOf("alive")
	assert.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_RUNNING, st)
	assert.Equal(t, aliveRun, run, "a running workflow was restarted")
	notes := waitEvents(t, ns, controller.EventWorkflowRestarted, "stopped")
	assert.Equal(t, fmt.Sprintf("workflow %s was Terminated; started it again", contract.ProxyWorkflowID(ns, "stopped")), notes["stopped"])
	assert.NotContains(t, notes, "alive")
}
