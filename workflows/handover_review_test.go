package workflows

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Review tests for workflow version 5's hand-over on loss (health.go monitorReturned,
// serveWhileReplacing) and the reports drained at the loop's top (signals.go drainSignals).

// reviewVerifyOf2 mocks the check of instance 2 through itself: it takes five minutes, and
// just before its verdict comes back the old instance's shard member reports instance 1
// gone, `copies` times, buffered so that they reach the run in the same workflow task as
// the verdict (as on a real server, where events that arrive while a task runs are
// delivered together in the next one).
func reviewVerifyOf2(epoch1 *string, copies int) func(*harness) {
	return func(h *harness) {
		acts := &activities.Activities{}
		h.env.OnActivity(acts.Monitor, mock.Anything, mock.MatchedBy(func(in activities.MonitorInput) bool {
			return in.Auth != nil && in.Auth.Instance == InstanceName(h.uid, 2) && !in.Last.Known
		})).After(5 * time.Minute).Return(func(context.Context, activities.MonitorInput) (activities.MonitorResult, error) {
			gone := activities.MonitorReport{Epoch: *epoch1, Result: activities.MonitorResult{
				Reason: activities.MonitorGone, Health: activities.Health{Known: true, Healthy: true}}}
			for range copies {
				h.env.SignalWorkflowSkippingWorkflowTask(contract.SignalMonitor, gone)
			}
			return h.verdict(), nil
		})
	}
}

// reviewCloudInit makes the harness work with a cloud-init Secret: Create builds from it
// (the harness's activities have no API server to read it from), and the n-th hash of it
// runs hook first.
func reviewCloudInit(n int, hook func(h *harness)) func(*harness) {
	return func(h *harness) {
		acts := &activities.Activities{}
		real := &activities.Activities{Providers: h.reg, Installation: "test", Keyring: testKeys}
		h.env.OnActivity(acts.CreateInstance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.InstanceInput) (activities.CreateResult, error) {
			in.Spec.CloudInit = nil
			res, err := real.CreateInstance(ctx, in)
			res.SecretHash = "secret-hash-1"
			return res, err
		})
		var mu sync.Mutex
		calls := 0
		h.env.OnActivity(acts.HashCloudInit, mock.Anything, mock.Anything).Return(func(context.Context, activities.HashInput) (string, error) {
			mu.Lock()
			calls++
			c := calls
			mu.Unlock()
			if c == n {
				hook(h)
			}
			return "secret-hash-1", nil
		})
	}
}

// TestReviewDuplicateLossReportDestroysTheReplacement: a shard member's report is
// delivered at least once — report() signals again after an error whose first send went
// through, and a member that restarts for the same epoch (its shard moved workers) checks
// the provider first and reports the loss again. Two copies of "instance 1 gone" reach the
// run together, while it is not in a select: here during the cloud-init hash that an
// attribute edit made during a replacement asks for (on a real server, equally, in the
// workflow task that completes any step's activity). The loop's drainSignals applies both
// before anything is published: the first hands over to the replacement, the second still
// carries the epoch last *published* (instance 1's), so it is applied to the replacement:
// instance 2, healthy, is marked lost, retired and deleted, and a third instance is built.
// Version 4 dropped the second copy (the current instance was already nil).
func TestReviewDuplicateLossReportDestroysTheReplacement(t *testing.T) {
	reviewVersions(t, reviewDuplicateLoss)
}

func reviewDuplicateLoss(t *testing.T, v workflow.Version) {
	var epoch1 string
	gone := func(h *harness) {
		r := activities.MonitorReport{Epoch: epoch1, Result: activities.MonitorResult{
			Reason: activities.MonitorGone, Health: activities.Health{Known: true, Healthy: true}}}
		h.env.SignalWorkflowSkippingWorkflowTask(contract.SignalMonitor, r)
		h.env.SignalWorkflowSkippingWorkflowTask(contract.SignalMonitor, r)
	}
	h := newHarness(t, reviewVersion(v), reviewCloudInit(2, gone), slowVerify(2, 10*time.Minute))
	ci := func(s *v1alpha1.ProxySpec) {
		s.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "ci", Key: "user-data"}}
	}
	h.specAt(0, 1, h.spec(ci))
	h.checkAt(19*time.Minute, func() {
		epoch1 = h.lastWatch().Epoch
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names())
	})
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	// While instance 2 is checked through itself, an edit that changes no hash.
	h.specAt(22*time.Minute, 2, h.spec(ci, func(s *v1alpha1.ProxySpec) {
		s.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu"}
	}))
	h.checkAt(50*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names(),
			"the replacement took over and serves alone: %v", h.prov.ops)
		st := h.queryState()
		if assert.NotNil(t, st.Instance) {
			assert.Equal(t, InstanceName(h.uid, 2), st.Instance.Name)
		}
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, -1, h.prov.opIndex("create "+InstanceName(h.uid, 3)),
		"a duplicate report about the lost instance built a third one: %v", h.prov.ops)
}

// TestReviewHandOverKeepsTheReplacementsVerdict: instance 1 is reported gone in the same
// workflow task as its replacement's check through itself passes. The run hands over at
// the loop's top (drainSignals) instead of promoting, and throws the replacement's verdict
// away (Instance.Health = nil, s.Health = "instance gone"): the proxy, whose new instance
// was verified healthy a moment ago, is published Unhealthy, leaves the pool, and its
// shard starts the watch from "unhealthy" (provider check first, successThreshold probes).
// promote() makes the verified verdict the proxy's; the hand-over should too.
func TestReviewHandOverKeepsTheReplacementsVerdict(t *testing.T) {
	reviewVersions(t, reviewHandOverVerdict)
}

func reviewHandOverVerdict(t *testing.T, v workflow.Version) {
	var epoch1 string
	h := newHarness(t, reviewVersion(v), reviewVerifyOf2(&epoch1, 1), func(h *harness) {
		// A real shard member that starts from "unhealthy" needs the provider check and
		// successThreshold (2) probes 10s apart before it reports healthy.
		h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
			if in.Instance == nil || in.Instance.Name != InstanceName(h.uid, 2) || !in.Last.Known || in.Last.Healthy {
				return activities.MonitorResult{}, 0, false
			}
			return h.verdict(), 30 * time.Second, true
		})
	})
	h.specAt(0, 1, h.spec())
	h.checkAt(19*time.Minute, func() { epoch1 = h.lastWatch().Epoch })
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	// The check of instance 2 ends at 25 minutes (create and wait take no workflow time).
	h.checkAt(25*time.Minute+5*time.Second, func() {
		m := h.memo()
		assert.Equal(t, InstanceName(h.uid, 2), m.Auth.Instance, "instance 2 took over: %+v", m)
		assert.True(t, m.Healthy, "the replacement was verified healthy an instant ago, yet is out of the pool: %+v", m)
		assert.Equal(t, contract.PhaseReady, m.Phase)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}
