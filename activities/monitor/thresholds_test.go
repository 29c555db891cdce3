package monitor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
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
			ok(0, 10, ""), ok(time.Second, 10, ReasonVerdict)}},
		{"unknown becomes unhealthy after 3 failures", Health{}, []step{
			fail(0, ""), fail(time.Second, ""), fail(2*time.Second, ReasonVerdict)}},
		{"healthy survives 2 failures", healthy, []step{
			fail(0, ""), fail(time.Second, ""), ok(2*time.Second, 100, ""), fail(3*time.Second, ""), fail(4*time.Second, "")}},
		{"healthy becomes unhealthy on the 3rd failure in a row", healthy, []step{
			fail(0, ""), fail(time.Second, ""), fail(2*time.Second, ReasonVerdict)}},
		{"unhealthy needs 2 successes in a row", unhealthy, []step{
			ok(0, 10, ""), fail(time.Second, ""), ok(2*time.Second, 10, ""), ok(3*time.Second, 10, ReasonVerdict)}},
		{"flapping never flips", healthy, []step{
			fail(0, ""), ok(time.Second, 100, ""), fail(2*time.Second, ""), fail(3*time.Second, ""), ok(4*time.Second, 100, ""), fail(5*time.Second, "")}},
		{"a restart starts from the recorded verdict: one success is no news", healthy, []step{
			ok(0, 100, "")}},
		{"latency: small moves are noise", healthy, []step{
			ok(2*time.Minute, 140, ""), ok(3*time.Minute, 60, "")}},
		{"latency: a move over 50% is reported", healthy, []step{
			ok(2*time.Minute, 200, ReasonLatency)}},
		{"latency: at most one report a minute", healthy, []step{
			ok(2*time.Minute, 200, ReasonLatency), ok(2*time.Minute+10*time.Second, 400, ""), ok(3*time.Minute+time.Second, 400, ReasonLatency)}},
		{"latency: under 20ms moves never count", Health{Known: true, Healthy: true, LatencyMillis: 10}, []step{
			ok(2*time.Minute, 29, ""), ok(3*time.Minute, 35, ReasonLatency)}},
		{"latency is not reported while unhealthy", unhealthy, []step{
			ok(2*time.Minute, 900, ""), fail(3*time.Minute, "")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			st := Progress{Health: tc.start, LastReport: t0}
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
	st := Progress{Health: Health{Known: true, Healthy: true, LatencyMillis: 100}, LastReport: t0,
		Recent: []int64{100, 100, 100, 100, 100}}
	at := t0.Add(2 * time.Minute)
	for i, ms := range []int64{900, 850} {
		_, changed := th.record(&st, probe.Result{OK: true, Latency: time.Duration(ms) * time.Millisecond}, at.Add(time.Duration(i)*time.Second))
		assert.False(t, changed, "outlier %d reported", i)
	}
	reason, changed := th.record(&st, probe.Result{OK: true, Latency: 300 * time.Millisecond}, at.Add(3*time.Second))
	assert.True(t, changed, "three slow probes of five are a change")
	assert.Equal(t, ReasonLatency, reason)
	assert.Equal(t, int64(300), st.Health.LatencyMillis)
}

func TestThresholdsRecordTheFailure(t *testing.T) {
	th := thresholds{success: 2, failure: 1, latency: time.Minute}
	st := Progress{Health: Health{Known: true, Healthy: true}}
	now := time.Now()
	reason, changed := th.record(&st, probe.Result{Kind: probe.KindProxyAuth, Message: "proxy asks for authentication (407)"}, now)
	assert.True(t, changed)
	assert.Equal(t, ReasonVerdict, reason)
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
	// The dice always roll a third of what they are asked for, so a random wait shows.
	third := func(d time.Duration) time.Duration { return d / 3 }
	cases := []struct {
		name    string
		last    Health
		resumed bool
		want    time.Duration
	}{
		{"no verdict yet: probe at once", Health{}, false, 0},
		{"no verdict, resumed elsewhere: a random part of the interval", Health{}, true, interval / 3},
		{"a verdict never probed here (a watch's start): a random part", Health{Known: true, Healthy: true}, false, interval / 3},
		{"the cadence carries on from the last probe", checked(500 * time.Millisecond), false, 1500 * time.Millisecond},
		{"resumed elsewhere, not overdue: the cadence too", checked(500 * time.Millisecond), true, 1500 * time.Millisecond},
		{"due right now", checked(interval), false, 0},
		{"overdue, restarted by the workflow: at once", checked(time.Minute), false, 0},
		{"overdue, resumed on another worker: spread", checked(time.Minute), true, interval / 3},
		{"a clock ahead waits one interval at most", checked(-time.Hour), false, interval},
		{"a verdict without a probe yet, unhealthy", Health{Known: true}, false, interval / 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, firstWait(tc.last, tc.resumed, interval, now, third))
		})
	}

	spread := map[time.Duration]bool{}
	for range 50 {
		w := firstWait(checked(time.Minute), true, interval, now, randomBelow)
		assert.True(t, w >= 0 && w < interval, "%s", w)
		spread[w] = true
	}
	assert.Greater(t, len(spread), 1, "a resumed, overdue Monitor waits a random part of the interval")
}

// TestFold: one probe result folded into a proxy's counters, with its target's judgement,
// and what comes out: a report (why) or none, and the verdict and reason it leaves.
func TestFold(t *testing.T) {
	th := thresholds{success: 2, failure: 1, latency: 10 * time.Minute}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	healthy := Health{Known: true, Healthy: true}
	unhealthy := Health{Known: true, Healthy: false}
	down := targetJudgement{Down: true, Failed: 3, Of: 3, Name: "http://t"}
	targetDown := v1alpha1.ReasonHealthCheckTargetDown
	cases := []struct {
		name        string
		start       Progress
		res         probe.Result
		target      targetJudgement
		credsReason string
		want        string // "" when nothing is reported
		healthy     bool
		reason      string // the verdict's FailureReason after it
	}{
		{"a proxy's own failure turns it unhealthy", Progress{Health: healthy}, proxyFailure, targetJudgement{}, "", ReasonVerdict, false, ""},
		{"its own failure while the target is down too", Progress{Health: healthy}, proxyFailure, down, "", ReasonVerdict, false, ""},
		{"a target failure not judged down needs targetFailureMin in a row", Progress{Health: healthy}, targetFailure, targetJudgement{}, "", "", true, ""},
		{"the third target failure in a row is the proxy's", Progress{Health: healthy, ConsecFail: 2}, targetFailure, targetJudgement{}, "", ReasonVerdict, false, ""},
		{"a target judged down keeps a healthy verdict, and says so", Progress{Health: healthy}, targetFailure, down, "", ReasonTarget, true, targetDown},
		{"a target judged down keeps an unhealthy verdict, and says so", Progress{Health: unhealthy}, targetFailure, down, "", ReasonTarget, false, targetDown},
		{"the target's reason is told at most once per rate-limit period",
			Progress{Health: healthy, Reported: "", ReasonAt: now.Add(-time.Minute)}, targetFailure, down, "", "", true, targetDown},
		{"told already: nothing more",
			Progress{Health: Health{Known: true, Healthy: true, FailureReason: targetDown}, Reported: targetDown}, targetFailure, down, "", "", true, targetDown},
		{"one success after the target's outage is not enough to clear it",
			Progress{Health: Health{Known: true, Healthy: true, FailureReason: targetDown}, Reported: targetDown}, probeOK, targetJudgement{}, "", "", true, targetDown},
		{"successThreshold successes clear it",
			Progress{Health: Health{Known: true, Healthy: true, FailureReason: targetDown}, Reported: targetDown, ConsecOK: 1}, probeOK, targetJudgement{}, "", ReasonTarget, true, ""},
		{"an unhealthy proxy's Secret reason is told at once", Progress{Health: unhealthy}, proxyFailure, targetJudgement{}, v1alpha1.ReasonCredentialsNotLabelled,
			ReasonVerdict, false, v1alpha1.ReasonCredentialsNotLabelled},
		{"a healthy proxy's first success is no news", Progress{Health: healthy}, probeOK, targetJudgement{}, "", "", true, ""},
		{"an unhealthy proxy recovers after successThreshold", Progress{Health: unhealthy, ConsecOK: 1}, probeOK, targetJudgement{}, "", ReasonVerdict, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.start
			got, changed := th.fold(&st, tc.res, tc.target, tc.credsReason, now)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want != "", changed)
			assert.Equal(t, tc.healthy, st.Health.Healthy)
			assert.Equal(t, tc.reason, st.Health.FailureReason)
			assert.Equal(t, now, st.Health.CheckedAt)
			if changed {
				assert.Equal(t, st.Health.FailureReason, st.Reported, "a report tells the reason it carries")
			}
		})
	}
}
