package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

const targetDownMessage = "health-check target http://127.0.0.1:1 is down: 6 of 6 proxies failed against it in their latest probe " +
	"(target 127.0.0.1:1 answered 503, want 200); the proxy's verdict is kept until the target answers again"

// targetDown is what a shard reports for a proxy whose health-check target it judges down:
// the verdict held (healthy or not), with the reason.
func targetDown(healthy bool) activities.Health {
	return activities.Health{Known: true, Healthy: healthy, LatencyMillis: 12, FailureKind: probe.KindWrongStatus,
		FailureReason: v1alpha1.ReasonHealthCheckTargetDown, LastFailure: targetDownMessage}
}

// TestATargetDownReplacesNothing (issue 29): a Proxy with lifecycle.unhealthyReplaceAfter
// whose shard reports its health-check target down (the verdict held healthy) stays Ready,
// leasable and unreplaced for hours, far past the grace; its Healthy condition is Unknown
// with the reason and the shard's message, Ready stays True; and when the shard reports the
// target back, the condition is True again. The control: a healthy-to-unhealthy report of
// the same proxy is replaced after the grace, so the harness would have seen a replacement.
func TestATargetDownReplacesNothing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		report   activities.MonitorResult
		replaced bool
	}{
		{"target down", activities.MonitorResult{Reason: activities.MonitorTarget, Health: targetDown(true)}, false},
		{"control: the proxy itself failed", activities.MonitorResult{Reason: activities.MonitorVerdict,
			Health: activities.Health{Known: true, LastFailure: "connect: refused", FailureKind: probe.KindRefused}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) {
				s.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: ptr(v1alpha1.Duration("5m"))}
			}))
			h.checkAt(30*time.Minute, func() {
				h.env.SignalWorkflow(contract.SignalMonitor, activities.MonitorReport{Epoch: h.lastWatch().Epoch, Result: tc.report})
			})
			if !tc.replaced {
				h.checkAt(31*time.Minute, func() {
					st := h.lastStatus()
					assert.Equal(t, v1alpha1.PhaseReady, st.Phase)
					c := condition(st, v1alpha1.ConditionHealthy)
					assert.Equal(t, metav1.ConditionUnknown, c.Status)
					assert.Equal(t, v1alpha1.ReasonHealthCheckTargetDown, c.Reason)
					assert.Equal(t, targetDownMessage, c.Message)
					assert.Equal(t, metav1.ConditionTrue, condition(st, v1alpha1.ConditionReady).Status, "a proxy kept healthy is still leasable")
					assert.True(t, h.memo().Healthy, "discovery stopped leasing a proxy whose target is down")
				})
			}
			h.checkAt(10*time.Hour, func() {
				if tc.replaced {
					assert.NotContains(t, h.prov.names(), InstanceName(h.uid, 1), "the control was not replaced: the test proves nothing")
					return
				}
				assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names(), "replaced because its health-check target was down")
				assert.Zero(t, h.lastStatus().Replacements)
				h.env.SignalWorkflow(contract.SignalMonitor, activities.MonitorReport{Epoch: h.lastWatch().Epoch, Result: activities.MonitorResult{
					Reason: activities.MonitorTarget, Health: activities.Health{Known: true, Healthy: true, LatencyMillis: 12}}})
			})
			if !tc.replaced {
				h.checkAt(10*time.Hour+time.Minute, func() {
					c := condition(h.lastStatus(), v1alpha1.ConditionHealthy)
					assert.Equal(t, metav1.ConditionTrue, c.Status)
					assert.Equal(t, v1alpha1.ReasonProbeSucceeded, c.Reason)
				})
			}
			h.signalAt(11*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
			h.run(fastTuning())
			h.requireCompleted()
		})
	}
}

// TestATargetDownReportKeepsTheGrace: the core takes a target-down report as it is: a
// healthy verdict stays healthy and never wakes for unhealthyReplaceAfter; an unhealthy one
// keeps the time it turned unhealthy, so its grace runs on (its own failure came first).
func TestATargetDownReportKeepsTheGrace(t *testing.T) {
	grace := func(p *v1alpha1.ProxySpec) {
		p.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: ptr(v1alpha1.Duration("5m"))}
	}
	s := steadyState(grace)
	s.monitorReturned(activities.MonitorResult{Reason: activities.MonitorTarget, Health: targetDown(true)}, t0.Add(time.Hour))
	wake, _ := s.nextWake(t0)
	assert.True(t, wake.IsZero(), "a healthy proxy whose target is down wakes at %s", wake)
	assert.Equal(t, v1alpha1.PhaseReady, phase(&s))

	s = steadyState(grace)
	s.Health = activities.Health{Known: true, Since: t0, LastFailure: "connect: refused"}
	s.monitorReturned(activities.MonitorResult{Reason: activities.MonitorTarget, Health: targetDown(false)}, t0.Add(time.Minute))
	wake, why := s.nextWake(t0)
	assert.Equal(t, t0.Add(5*time.Minute), wake)
	assert.Equal(t, wakeUnhealthy, why)
	c := condition(status(&s, "wf"), v1alpha1.ConditionHealthy)
	assert.Equal(t, metav1.ConditionFalse, c.Status, "an unhealthy proxy is still unhealthy")
	assert.Equal(t, v1alpha1.ReasonHealthCheckTargetDown, c.Reason)
}
