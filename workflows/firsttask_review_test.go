package workflows

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// reviewLateStart holds the workflow function back for d of workflow time, so that signals
// sent meanwhile are already in its channels when its code first runs: what a run that
// continued as new sees when a signal reached its workflow ID between the previous run's
// close and its own first workflow task (they are events of that first task).
type reviewLateStart struct {
	interceptor.WorkerInterceptorBase
	d time.Duration
}

func (l *reviewLateStart) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &reviewLateStartInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}, d: l.d}
}

type reviewLateStartInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	d time.Duration
}

func (i *reviewLateStartInbound) ExecuteWorkflow(ctx workflow.Context, in *interceptor.ExecuteWorkflowInput) (any, error) {
	if err := workflow.Sleep(ctx, i.d); err != nil {
		return nil, err
	}
	return i.Next.ExecuteWorkflow(ctx, in)
}

// TestReviewReportInAContinuedRunsFirstTaskIsNotLost: a run continues as new (every 72h,
// or every 1,000 signals, which a flapping proxy reaches often). The shard member signals
// by workflow ID, so a report sent between the old run's close and the new run's first
// workflow task is delivered to the new run in that first task, about the watch (epoch)
// the new run carries on and is about to publish again. Version 5's drainSignals reads
// monitor reports at the top of the loop, before the run's first publish, when watchSet is
// still false: receiveReport drops it as stale. Version 4 read reports only while steady,
// after the publish, and applied it. The member does not send it again (same epoch; after
// "gone" it has ended, and sync restarts a member only for a new epoch), so here a lost
// instance stays Ready in the memo, and discovery keeps leasing a dead proxy.
func TestReviewReportInAContinuedRunsFirstTaskIsNotLost(t *testing.T) {
	reviewVersions(t, reviewReportInFirstTask)
}

// reviewVersions runs test as a run of version 4 and as one of the latest version: the
// review tests pass on version 4 and show what version 5 changed.
func reviewVersions(t *testing.T, test func(t *testing.T, v workflow.Version)) {
	for _, v := range []workflow.Version{versionShardMonitor, versionLatest} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { test(t, v) })
	}
}

// reviewVersion makes the harness's run start with version v.
func reviewVersion(v workflow.Version) func(*harness) {
	return func(h *harness) {
		h.env.OnGetVersion(versionChangeID, workflow.DefaultVersion, versionLatest).Return(v)
	}
}

func reviewReportInFirstTask(t *testing.T, version workflow.Version) {
	// A stable run of instance 1 ends at its age.
	h1 := newHarness(t)
	h1.specAt(0, 1, h1.spec())
	tuning := fastTuning()
	tuning.MaxRunAge = 6 * time.Hour
	h1.run(tuning)
	next := h1.continuedAs()
	epoch := h1.lastWatch().Epoch
	require.Equal(t, InstanceName(h1.uid, 1), next.State.Instance.Name)

	h := newHarness(t, func(h *harness) {
		h.env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{h.rec, &reviewLateStart{d: time.Second}}})
	}, reviewVersion(version))
	h.prov = h1.prov
	h.env.RegisterActivity(&activities.Activities{Providers: provider.Registry{v1alpha1.ProviderLocal: h1.prov}, Installation: "test", Keyring: testKeys})
	// The VM vanished; the shard's member reports it, once, as the run hands over.
	h.env.RegisterDelayedCallback(func() {
		require.NoError(t, h.prov.Delete(context.Background(), "fake/"+InstanceName(h.uid, 1)))
		h.env.SignalWorkflow(contract.SignalMonitor, activities.MonitorReport{Epoch: epoch, Result: activities.MonitorResult{
			Reason: activities.MonitorGone, Health: activities.Health{Known: true, Healthy: true}}})
	}, 500*time.Millisecond)
	h.checkAt(30*time.Minute, func() {
		m := h.memo()
		assert.False(t, m.Healthy && m.Auth != nil && m.Auth.Instance == InstanceName(h.uid, 1),
			"the lost instance is still leasable half an hour after its loss was reported: %+v", m)
		st := h.queryState()
		if assert.NotNil(t, st.Instance) {
			assert.NotEqual(t, InstanceName(h.uid, 1), st.Instance.Name, "the report of the loss was dropped as stale")
		}
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: contract.ProxyWorkflowID("ns", "p")})
	next.Tuning.MaxRunAge = 0
	h.env.ExecuteWorkflow(ProxyWorkflow, next)
	h.requireCompleted()
}
