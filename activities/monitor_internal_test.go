package activities

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities/probe"
)

// step is one probe result fed to the thresholds, and what must come out.
type step struct {
	ok      bool
	latency time.Duration
	at      time.Duration // since the start
	want    string        // "" when nothing is worth reporting
}

func TestThresholds(t *testing.T) {
	th := thresholds{success: 2, failure: 3, latency: time.Minute}
	ok := func(at time.Duration, ms int, want string) step {
		return step{ok: true, latency: time.Duration(ms) * time.Millisecond, at: at, want: want}
	}
	fail := func(at time.Duration, want string) step { return step{at: at, want: want} }
	healthy := Health{Known: true, Healthy: true, LatencyMillis: 100}
	unhealthy := Health{Known: true, Healthy: false}

	cases := []struct {
		name  string
		start Health
		steps []step
	}{
		{"unknown becomes healthy after 2 successes", Health{}, []step{
			ok(0, 10, ""), ok(time.Second, 10, MonitorVerdict)}},
		{"unknown becomes unhealthy after 3 failures", Health{}, []step{
			fail(0, ""), fail(time.Second, ""), fail(2*time.Second, MonitorVerdict)}},
		{"healthy survives 2 failures", healthy, []step{
			fail(0, ""), fail(time.Second, ""), ok(2*time.Second, 100, ""), fail(3*time.Second, ""), fail(4*time.Second, "")}},
		{"healthy becomes unhealthy on the 3rd failure in a row", healthy, []step{
			fail(0, ""), fail(time.Second, ""), fail(2*time.Second, MonitorVerdict)}},
		{"unhealthy needs 2 successes in a row", unhealthy, []step{
			ok(0, 10, ""), fail(time.Second, ""), ok(2*time.Second, 10, ""), ok(3*time.Second, 10, MonitorVerdict)}},
		{"flapping never flips", healthy, []step{
			fail(0, ""), ok(time.Second, 100, ""), fail(2*time.Second, ""), fail(3*time.Second, ""), ok(4*time.Second, 100, ""), fail(5*time.Second, "")}},
		{"a restart starts from the recorded verdict: one success is no news", healthy, []step{
			ok(0, 100, "")}},
		{"latency: small moves are noise", healthy, []step{
			ok(2*time.Minute, 140, ""), ok(3*time.Minute, 60, "")}},
		{"latency: a move over 50% is reported", healthy, []step{
			ok(2*time.Minute, 200, MonitorLatency)}},
		{"latency: at most one report a minute", healthy, []step{
			ok(2*time.Minute, 200, MonitorLatency), ok(2*time.Minute+10*time.Second, 400, ""), ok(3*time.Minute+time.Second, 400, MonitorLatency)}},
		{"latency: under 20ms moves never count", Health{Known: true, Healthy: true, LatencyMillis: 10}, []step{
			ok(2*time.Minute, 29, ""), ok(3*time.Minute, 35, MonitorLatency)}},
		{"latency is not reported while unhealthy", unhealthy, []step{
			ok(2*time.Minute, 900, ""), fail(3*time.Minute, "")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			st := monitorProgress{Health: tc.start, LastReport: t0}
			for i, s := range tc.steps {
				res := probe.Result{OK: s.ok, Latency: s.latency}
				if !s.ok {
					res.Kind, res.Message = probe.KindRefused, "connect: refused"
				}
				got, changed := th.record(&st, res, t0.Add(s.at))
				assert.Equal(t, s.want != "", changed, "step %d", i)
				assert.Equal(t, s.want, got, "step %d", i)
			}
		})
	}
}

// TestLatencyOutliersAreNotNews: the reported latency is the median of recent probes.
func TestLatencyOutliersAreNotNews(t *testing.T) {
	th := thresholds{success: 2, failure: 3, latency: time.Minute}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := monitorProgress{Health: Health{Known: true, Healthy: true, LatencyMillis: 100}, LastReport: t0,
		Recent: []int64{100, 100, 100, 100, 100}}
	at := t0.Add(2 * time.Minute)
	for i, ms := range []int64{900, 850} {
		_, changed := th.record(&st, probe.Result{OK: true, Latency: time.Duration(ms) * time.Millisecond}, at.Add(time.Duration(i)*time.Second))
		assert.False(t, changed, "outlier %d reported", i)
	}
	reason, changed := th.record(&st, probe.Result{OK: true, Latency: 300 * time.Millisecond}, at.Add(3*time.Second))
	assert.True(t, changed, "three slow probes of five are a change")
	assert.Equal(t, MonitorLatency, reason)
	assert.Equal(t, int64(300), st.Health.LatencyMillis)
}

func TestThresholdsRecordTheFailure(t *testing.T) {
	th := thresholds{success: 2, failure: 1, latency: time.Minute}
	st := monitorProgress{Health: Health{Known: true, Healthy: true}}
	now := time.Now()
	reason, changed := th.record(&st, probe.Result{Kind: probe.KindProxyAuth, Message: "proxy asks for authentication (407)"}, now)
	assert.True(t, changed)
	assert.Equal(t, MonitorVerdict, reason)
	assert.False(t, st.Health.Healthy)
	assert.Equal(t, probe.KindProxyAuth, st.Health.FailureKind)
	assert.Equal(t, "proxy asks for authentication (407)", st.Health.LastFailure)
	assert.Equal(t, now, st.Health.Since)
}

// TestFirstWaitKeepsTheCadence: a Monitor the workflow restarts after a verdict probes one
// interval after the last probe, not a random pause later (which added up to an interval to
// the next failure's detection); an overdue one probes at once, unless it resumed on another
// worker, which spreads a whole fleet's probes over the interval.
func TestFirstWaitKeepsTheCadence(t *testing.T) {
	const interval = 2 * time.Second
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	checked := func(ago time.Duration) Health { return Health{Known: true, Healthy: true, CheckedAt: now.Add(-ago)} }

	assert.Zero(t, firstWait(Health{}, false, interval, now), "no verdict yet: probe at once")
	assert.Equal(t, 1500*time.Millisecond, firstWait(checked(500*time.Millisecond), false, interval, now))
	assert.Equal(t, 1500*time.Millisecond, firstWait(checked(500*time.Millisecond), true, interval, now))
	assert.Zero(t, firstWait(checked(time.Minute), false, interval, now), "overdue, restarted by the workflow")
	assert.Equal(t, interval, firstWait(checked(-time.Hour), false, interval, now), "a clock ahead waits one interval at most")
	spread := map[time.Duration]bool{}
	for range 50 {
		w := firstWait(checked(time.Minute), true, interval, now)
		assert.True(t, w >= 0 && w < interval, "%s", w)
		spread[w] = true
	}
	assert.Greater(t, len(spread), 1, "a resumed, overdue Monitor waits a random part of the interval")
}
