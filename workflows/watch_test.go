package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestWatchFollowsTheInstance: the run publishes what its monitor shard is to watch: the
// running instance, with the last verdict, under a new epoch for each instance; a report
// about an instance since replaced is dropped; a deleted Proxy removes its watch.
func TestWatchFollowsTheInstance(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	var first *activities.MonitorMemo
	h.checkAt(30*time.Minute, func() {
		first = h.lastWatch()
		require.NotNil(t, first)
		require.NotNil(t, first.Input.Instance)
		assert.Equal(t, InstanceName(h.uid, 1), first.Input.Instance.Name)
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase)
		writes := 0
		for _, w := range h.shard.published {
			if w != nil {
				writes++
			}
		}
		assert.Equal(t, 2, writes, "the watch is written when the instance runs and once its first verdict is known, not with each verdict")
	})
	h.signalAt(time.Hour, contract.SignalReplace, contract.ReplaceSignal{Reason: "test"})
	h.checkAt(2*time.Hour, func() {
		w := h.lastWatch()
		require.NotNil(t, w)
		assert.Equal(t, InstanceName(h.uid, 2), w.Input.Instance.Name)
		assert.NotEqual(t, first.Epoch, w.Epoch, "a new instance is a new watch")
		// A shard that had not yet seen the new epoch reports the old instance unhealthy.
		h.env.SignalWorkflow(contract.SignalMonitor, activities.MonitorReport{Epoch: first.Epoch, Result: activities.MonitorResult{
			Reason: activities.MonitorVerdict, Health: activities.Health{Known: true, LastFailure: "connect: refused"}}})
	})
	h.checkAt(3*time.Hour, func() {
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase, "a stale report changes nothing")
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names())
	})
	var second string
	h.checkAt(3*time.Hour+time.Minute, func() { second = h.lastWatch().Epoch })
	h.specAt(3*time.Hour+2*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu"}
		s.MaxLeases = 9
	}))
	h.checkAt(3*time.Hour+30*time.Minute, func() {
		w := h.lastWatch()
		require.NotNil(t, w)
		assert.Equal(t, second, w.Epoch, "an edit of what the shard does not use restarts no watch")
		assert.Empty(t, w.Input.Instance.Spec.Attributes, "the watch carries only where the instance is")
	})
	h.signalAt(4*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Nil(t, h.lastWatch(), "a deleted Proxy is watched no more")
	// The first instance's first verdict; the second starts from the verdict of its
	// verification, and nothing is reported while stable.
	assert.Equal(t, 1, h.shard.reports)
}

// TestStableProxyCostsNothingWhileWatched: a healthy proxy left alone for a month records
// nothing after its first verdict: no signal, activity, timer or memo write in its run, so
// its history does not grow at rest.
func TestStableProxyCostsNothingWhileWatched(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	tuning := fastTuning()
	tuning.MaxRunAge = 40 * 24 * time.Hour
	var atRest runCounts
	h.checkAt(time.Hour, func() { atRest = h.rec.take() })
	h.checkAt(31*24*time.Hour, func() {
		assert.Equal(t, runCounts{}, h.rec.take(), "a month at rest recorded something")
	})
	h.signalAt(32*24*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(tuning)
	h.requireCompleted()
	assert.Equal(t, 1, h.shard.reports)
	assert.Equal(t, 2, atRest.signals, "the spec and the first verdict")
}

// TestWatchEpoch: the epoch names everything the shard watches but the last verdict.
func TestWatchEpoch(t *testing.T) {
	in := activities.MonitorInput{Target: "127.0.0.1:3128", HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", Interval: "10s"},
		Last: activities.Health{Known: true, LastFailure: "connect: refused"}}
	later := in
	later.Last = activities.Health{Known: true, Healthy: true, CheckedAt: time.Unix(1e9, 0)}
	assert.Equal(t, watchEpoch(in), watchEpoch(later), "a new verdict is the same watch")
	fresh := in
	fresh.Last = activities.Health{}
	assert.NotEqual(t, watchEpoch(in), watchEpoch(fresh), "a run that knows no verdict yet is told one again")
	moved := in
	moved.Target = "127.0.0.1:3129"
	assert.NotEqual(t, watchEpoch(in), watchEpoch(moved))
	checked := in
	checked.HealthCheck.Interval = "5s"
	assert.NotEqual(t, watchEpoch(in), watchEpoch(checked))
	sealed := in
	sealed.Auth = &activities.ProbeAuth{Sealed: "v1.abc"}
	assert.NotEqual(t, watchEpoch(in), watchEpoch(sealed), "rotated credentials restart the watch with them")
}

// TestReportsKeepTheWakeTimer: a report that leaves the run's wake time as it was (here a
// latency change every 10 minutes, the most a shard sends) keeps the pending timer. Each
// costs its signal and its writes, not a timer cancelled and started again: two events and
// a billable action per report on a fleet whose latencies move.
func TestReportsKeepTheWakeTimer(t *testing.T) {
	h := newHarness(t)
	latency := int64(10)
	h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
		if !in.Last.Known || !in.Last.Healthy {
			return activities.MonitorResult{}, 0, false
		}
		latency = 110 - latency // 10 ms, 100 ms, 10 ms...
		health := in.Last
		health.LatencyMillis = latency
		return activities.MonitorResult{Reason: activities.MonitorLatency, Health: health}, 10 * time.Minute, true
	})
	h.specAt(0, 1, h.spec())
	tuning := fastTuning()
	tuning.MaxRunAge = 24 * time.Hour
	var waking runCounts
	h.checkAt(time.Hour+time.Minute, func() { h.rec.take() })
	h.checkAt(3*time.Hour+time.Minute, func() { waking = h.rec.take() })
	h.signalAt(4*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(tuning)
	h.requireCompleted()
	assert.Equal(t, 12, waking.signals, "a latency report every 10 minutes for 2 hours")
	assert.Equal(t, 12, waking.localActivities, "each latency reaches the Proxy's status")
	assert.Zero(t, waking.timers, "a report restarted the run's wake timer")
}

// TestVerdictFollowsTheRun: beside its watch, which is written only when the epoch changes,
// the run keeps its current verdict in the memo for a shard that starts later: every flip
// and latency change, for the watch's epoch, in the writes those make anyway.
func TestVerdictFollowsTheRun(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	var epoch string
	var watches, writes int
	report := func(healthy bool, latency int64) {
		h.env.SignalWorkflow(contract.SignalMonitor, activities.MonitorReport{Epoch: epoch, Result: activities.MonitorResult{
			Reason: activities.MonitorVerdict, Health: activities.Health{Known: true, Healthy: healthy, LatencyMillis: latency, Since: h.env.Now().UTC()}}})
	}
	lastVerdict := func() *activities.Verdict {
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		require.NotEmpty(t, h.rec.verdicts, "no verdict was published")
		return h.rec.verdicts[len(h.rec.verdicts)-1]
	}
	h.checkAt(30*time.Minute, func() {
		epoch, watches = h.lastWatch().Epoch, len(h.shard.published)
		v := lastVerdict()
		assert.Equal(t, epoch, v.Epoch)
		assert.True(t, v.Healthy)
		report(false, 0)
	})
	h.checkAt(31*time.Minute, func() {
		v := lastVerdict()
		assert.Equal(t, epoch, v.Epoch)
		assert.False(t, v.Healthy, "the failure is not in the memo")
		report(true, 40)
	})
	h.checkAt(32*time.Minute, func() {
		v := lastVerdict()
		assert.True(t, v.Healthy, "the recovery is not in the memo")
		assert.EqualValues(t, 40, v.LatencyMillis)
		assert.Equal(t, watches, len(h.shard.published), "a verdict rewrote the watch")
		h.rec.mu.Lock()
		writes = len(h.rec.verdicts)
		h.rec.mu.Unlock()
	})
	h.checkAt(5*time.Hour, func() {
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		assert.Len(t, h.rec.verdicts, writes, "the verdict was written again with nothing new")
	})
	h.signalAt(6*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Nil(t, lastVerdict(), "a deleted Proxy keeps a verdict")
}
