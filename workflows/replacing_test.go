package workflows

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// slowVerify makes the check of instance n through itself take d, as a replacement whose
// health check needs several successes in a row does.
func slowVerify(n int, d time.Duration) func(*harness) {
	return func(h *harness) {
		acts := &activities.Activities{}
		h.env.OnActivity(acts.Monitor, mock.Anything, mock.MatchedBy(func(in activities.MonitorInput) bool {
			return in.Auth != nil && in.Auth.Instance == InstanceName(h.uid, n) && !in.Last.Known
		})).After(d).Return(func(context.Context, activities.MonitorInput) (activities.MonitorResult, error) {
			return h.verdict(), nil
		})
	}
}

// turnsUnhealthy makes the watch of instance n, once it has a verdict, find it failing
// after(), and then nothing more.
func turnsUnhealthy(h *harness, n int, after func() time.Duration) {
	h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
		if in.Instance == nil || in.Instance.Name != InstanceName(h.uid, n) || !in.Last.Known {
			return activities.MonitorResult{}, 0, false
		}
		if !in.Last.Healthy {
			return activities.MonitorResult{}, 1000 * time.Hour, true
		}
		return activities.MonitorResult{Reason: activities.MonitorVerdict,
			Health: activities.Health{Known: true, Healthy: false, LastFailure: "connect: refused"}}, after(), true
	})
}

// TestReplacementKeepsTheProxyLeasable: while a maxAge replacement is built and verified,
// the instance that still serves stays in the pool (memo Healthy in phase Replacing), and
// leaves it only when the replacement takes its place. An unhealthy one does not stay.
func TestReplacementKeepsTheProxyLeasable(t *testing.T) {
	h := newHarness(t, slowVerify(2, 10*time.Minute))
	maxAge := v1alpha1.Duration("10m")
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) { s.Lifecycle = &v1alpha1.Lifecycle{MaxAge: &maxAge} }))
	h.checkAt(15*time.Minute, func() {
		m := h.memo()
		assert.Equal(t, contract.PhaseReplacing, m.Phase)
		assert.True(t, m.Healthy, "the old instance serves until its replacement is verified: %+v", m)
		assert.Equal(t, InstanceName(h.uid, 1), m.Auth.Instance)
		assert.Equal(t, []string{InstanceName(h.uid, 1), InstanceName(h.uid, 2)}, h.prov.names())
	})
	h.checkAt(25*time.Minute, func() {
		m := h.memo()
		assert.Equal(t, contract.PhaseReady, m.Phase)
		assert.True(t, m.Healthy)
		assert.Equal(t, InstanceName(h.uid, 2), m.Auth.Instance, "the replacement took over")
	})
	h.signalAt(26*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(1, 2)
}

// TestUnhealthyInstanceIsNotLeasedWhileReplaced: a replacement made because the instance
// is unhealthy does not put it back in the pool.
func TestUnhealthyInstanceIsNotLeasedWhileReplaced(t *testing.T) {
	h := newHarness(t, slowVerify(2, 10*time.Minute), func(h *harness) {
		// The first instance's watch finds it dead five minutes in.
		turnsUnhealthy(h, 1, func() time.Duration { return max(h.start.Add(5*time.Minute).Sub(h.env.Now()), 0) })
	})
	grace := v1alpha1.Duration("1m")
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) { s.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: &grace} }))
	h.checkAt(10*time.Minute, func() {
		m := h.memo()
		assert.Equal(t, contract.PhaseReplacing, m.Phase)
		assert.False(t, m.Healthy, "an unhealthy instance is not leased while it is replaced: %+v", m)
	})
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names())
		assert.True(t, h.memo().Healthy)
	})
	h.signalAt(40*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}

// TestVerdictAppliedWhileDeleting: the replacement turns unhealthy while the old instance
// is still being deleted (a delete can take 15 minutes a try); the verdict is published
// then, not when the delete returns.
func TestVerdictAppliedWhileDeleting(t *testing.T) {
	h := newHarness(t, func(h *harness) {
		acts := &activities.Activities{}
		h.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.MatchedBy(func(in activities.InstanceInput) bool {
			return in.Name == InstanceName(h.uid, 1)
		})).After(12 * time.Minute).Return(func(ctx context.Context, in activities.InstanceInput) error {
			return h.prov.Delete(ctx, in.ProviderID)
		})
		h.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.InstanceInput) error {
			return h.prov.Delete(ctx, in.ProviderID)
		})
		// The replacement's watch finds it dead two minutes in.
		turnsUnhealthy(h, 2, func() time.Duration { return 2 * time.Minute })
	})
	h.specAt(0, 1, h.spec())
	h.specAt(20*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) { s.Port = 8080 }))
	h.checkAt(28*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 1), InstanceName(h.uid, 2)}, h.prov.names(), "the old instance is still being deleted")
		m := h.memo()
		assert.False(t, m.Healthy, "the verdict is published while the delete runs: %+v", m)
		assert.Equal(t, v1alpha1.PhaseUnhealthy, h.lastStatus().Phase)
	})
	h.signalAt(50*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}

// TestLossDuringReplacementHandsOverToTheReplacement: the current instance is lost while
// its replacement is verified. The loss shows at once, and the replacement takes over:
// no third instance is built.
func TestLossDuringReplacementHandsOverToTheReplacement(t *testing.T) {
	h := newHarness(t, slowVerify(2, 10*time.Minute), func(h *harness) {
		h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
			if in.Instance == nil || in.Instance.Name != InstanceName(h.uid, 1) || !in.Last.Known {
				return activities.MonitorResult{}, 0, false
			}
			// Lost 22 minutes in: two minutes into its replacement's verification.
			return activities.MonitorResult{Reason: activities.MonitorGone, Health: activities.Health{Known: true, Healthy: true}},
				max(h.start.Add(22*time.Minute).Sub(h.env.Now()), 0), true
		})
	})
	h.specAt(0, 1, h.spec())
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	h.checkAt(24*time.Minute, func() {
		// Six minutes before its verification would have ended: the loss was applied when
		// it was reported, and the replacement, watched like any current instance, serves.
		m := h.memo()
		assert.Equal(t, InstanceName(h.uid, 2), m.Auth.Instance, "the replacement took over at once: %+v", m)
		assert.True(t, m.Healthy)
		assert.Contains(t, h.phases(), v1alpha1.PhaseUnhealthy, "the loss was published")
	})
	h.checkAt(45*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names())
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase)
		assert.Equal(t, InstanceName(h.uid, 2), h.lastStatus().InstanceName)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, -1, h.prov.opIndex("create "+InstanceName(h.uid, 3)), "no third instance: %v", h.prov.ops)
}
