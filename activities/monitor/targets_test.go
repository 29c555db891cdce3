package monitor

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

var (
	probeOK       = probe.Result{OK: true, Latency: 5 * time.Millisecond}
	targetFailure = probe.Result{Kind: probe.KindWrongStatus, TargetFailed: true, Message: "target t answered 503, want 200"}
	proxyFailure  = probe.Result{Kind: probe.KindRefused, Message: "connect to proxy: refused"}
)

// gauge reads the worker's count of targets judged down.
func gauge(t *testing.T, m *Metrics) float64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, m.targetsDown.Write(&out))
	return out.GetGauge().GetValue()
}

// TestTargetBoardJudges: a target is judged down from at least three proxies and nine
// tenths of those whose latest probe said anything about it; a proxy that failed on its own
// says nothing; a probe too old to be a member's latest, and a member that stopped, no
// longer count; the worker's gauge follows.
func TestTargetBoardJudges(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const stale = 2500 * time.Millisecond
	type probeAt struct {
		member string
		res    probe.Result
	}
	fleet := func(results ...probe.Result) []probeAt {
		var out []probeAt
		for i, r := range results {
			out = append(out, probeAt{fmt.Sprintf("m%d", i), r})
		}
		return out
	}
	cases := []struct {
		name       string
		probes     []probeAt
		down       bool
		failed, of int
	}{
		{"two failures are not enough, though all fail", fleet(targetFailure, targetFailure), false, 2, 2},
		{"three of three", fleet(targetFailure, targetFailure, targetFailure), true, 3, 3},
		{"nine of ten", fleet(probeOK, targetFailure, targetFailure, targetFailure, targetFailure, targetFailure, targetFailure, targetFailure, targetFailure, targetFailure), true, 9, 10},
		{"half is not enough: the other half shows the target up", fleet(probeOK, probeOK, probeOK, targetFailure, targetFailure, targetFailure), false, 3, 6},
		{"proxies failing on their own say nothing about the target",
			fleet(proxyFailure, proxyFailure, proxyFailure, proxyFailure, targetFailure, targetFailure, targetFailure), true, 3, 3},
		{"a fleet of dead proxies is no target down", fleet(proxyFailure, proxyFailure, proxyFailure, proxyFailure), false, 0, 0},
		{"only a member's latest probe counts", []probeAt{{"a", targetFailure}, {"b", targetFailure}, {"c", targetFailure}, {"c", probeOK}}, false, 2, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			b := newTargetBoard(m)
			var j targetJudgement
			for i, p := range tc.probes {
				j = b.observe("http://t/", "http://t", p.member, true, p.res, stale, t0.Add(time.Duration(i)*100*time.Millisecond))
			}
			assert.Equal(t, tc.down, j.Down)
			assert.Equal(t, tc.failed, j.Failed)
			assert.Equal(t, tc.of, j.Of)
			assert.Equal(t, map[bool]float64{true: 1, false: 0}[tc.down], gauge(t, m))
		})
	}

	t.Run("stale probes and stopped members drop out", func(t *testing.T) {
		m := NewMetrics(prometheus.NewRegistry())
		b := newTargetBoard(m)
		for _, id := range []string{"a", "b", "c"} {
			b.observe("k", "n", id, true, targetFailure, stale, t0)
		}
		j := b.observe("k", "n", "d", true, targetFailure, stale, t0.Add(stale/2))
		require.True(t, j.Down)
		assert.Equal(t, 1.0, gauge(t, m))
		// a, b and c stopped probing: past their staleness only d's probe counts.
		j = b.observe("k", "n", "d", true, targetFailure, stale, t0.Add(stale+time.Second))
		assert.False(t, j.Down)
		assert.Equal(t, 1, j.Of)
		assert.Zero(t, gauge(t, m))

		for _, id := range []string{"a", "b"} {
			b.observe("k", "n", id, true, targetFailure, stale, t0.Add(stale+time.Second))
		}
		require.True(t, b.observe("k", "n", "d", true, targetFailure, stale, t0.Add(stale+time.Second)).Down)
		b.forget("k", "a")
		assert.Zero(t, gauge(t, m), "a stopped member still counted")
		b.forget("k", "b")
		b.forget("k", "d")
		assert.Empty(t, b.byKey, "a target nobody probes is kept")
		b.forget("k", "d") // twice, or for a target never seen: nothing happens
	})
}

// TestTargetKey: members are grouped by the whole URL (a status is one URL's answer), and
// messages name only scheme, host and port (a query may carry a token).
func TestTargetKey(t *testing.T) {
	k1, name := targetKey("https://Site.example:8443/healthz?token=s3cret#frag")
	k2, _ := targetKey("https://site.example:8443/healthz?token=s3cret")
	k3, _ := targetKey("https://site.example:8443/other")
	assert.Equal(t, k1, k2, "a fragment never reaches the target; host names ignore case")
	assert.NotEqual(t, k1, k3, "another path is another target")
	assert.Equal(t, "https://site.example:8443", name)
	_, name = targetKey("https://user:pw@site.example/")
	assert.NotContains(t, name, "pw")
}

// fold runs probe results through th.fold as a shard's member would: each result with the
// judgement given, one interval apart. It returns the reports made.
func foldAll(th thresholds, st *Progress, t0 time.Time, interval time.Duration, steps []foldStep) []string {
	var reports []string
	for i, s := range steps {
		if reason, changed := th.fold(st, s.res, targetJudgement{Down: s.down, Failed: 4, Of: 4, Name: "http://t"}, "", t0.Add(time.Duration(i)*interval)); changed {
			reports = append(reports, reason)
		}
	}
	return reports
}

type foldStep struct {
	res  probe.Result
	down bool
}

func repeat(n int, s foldStep) []foldStep {
	out := make([]foldStep, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestFoldKeepsTheVerdictWhileTheTargetIsDown: a failure against a target judged down
// changes no verdict: a healthy proxy stays healthy, an unhealthy one stays unhealthy with
// its grace's start untouched; the reason is reported once, and cleared once the proxy
// passes successThreshold probes again. Its own failures still count meanwhile.
func TestFoldKeepsTheVerdictWhileTheTargetIsDown(t *testing.T) {
	th := thresholds{success: 2, failure: 3, latency: 10 * time.Minute}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	down := foldStep{targetFailure, true}

	st := Progress{Health: Health{Known: true, Healthy: true, Since: t0.Add(-time.Hour)}}
	reports := foldAll(th, &st, t0, 10*time.Second, repeat(100, down))
	assert.Equal(t, []string{ReasonTarget}, reports)
	assert.True(t, st.Health.Healthy)
	assert.Equal(t, v1alpha1.ReasonHealthCheckTargetDown, st.Health.FailureReason)
	assert.Contains(t, st.Health.LastFailure, "health-check target http://t is down: 4 of 4 proxies")
	assert.Equal(t, t0.Add(-time.Hour), st.Health.Since)

	// Recovery, 20 minutes later (past the rate limit): cleared after two successes.
	reports = foldAll(th, &st, t0.Add(20*time.Minute), 10*time.Second, repeat(3, foldStep{res: probeOK}))
	assert.Equal(t, []string{ReasonTarget}, reports)
	assert.Empty(t, st.Health.FailureReason)
	assert.Empty(t, st.Health.LastFailure)
	assert.True(t, st.Health.Healthy)

	unhealthySince := t0.Add(-time.Minute)
	st = Progress{Health: Health{Known: true, Healthy: false, Since: unhealthySince, LastFailure: "bad gateway"}}
	reports = foldAll(th, &st, t0, 10*time.Second, repeat(50, down))
	assert.Equal(t, []string{ReasonTarget}, reports)
	assert.False(t, st.Health.Healthy, "an unhealthy proxy turned healthy because its target is down")
	assert.Equal(t, unhealthySince, st.Health.Since)

	// A healthy proxy whose target is down and whose own process dies: its failures are
	// its own, and it turns unhealthy after failureThreshold of them, with its own reason.
	st = Progress{Health: Health{Known: true, Healthy: true}}
	steps := append(repeat(5, down), repeat(3, foldStep{res: proxyFailure, down: true})...)
	reports = foldAll(th, &st, t0, 10*time.Second, steps)
	assert.Equal(t, []string{ReasonTarget, ReasonVerdict}, reports)
	assert.False(t, st.Health.Healthy)
	assert.Empty(t, st.Health.FailureReason)
	assert.Equal(t, probe.KindRefused, st.Health.FailureKind)

	// A target that is down for too few proxies to judge: the failure is the proxy's.
	st = Progress{Health: Health{Known: true, Healthy: true}}
	reports = foldAll(th, &st, t0, 10*time.Second, repeat(3, foldStep{res: targetFailure}))
	assert.Equal(t, []string{ReasonVerdict}, reports)
	assert.False(t, st.Health.Healthy)
}

// TestFoldBoundsReportsOfAFlappingTarget: a target judged down and up again at every probe
// for a day, with successThreshold 1 (the worst case: every recovery counts at once),
// costs each proxy at most one reason-only report per rate-limit period, and no verdict.
func TestFoldBoundsReportsOfAFlappingTarget(t *testing.T) {
	th := thresholds{success: 1, failure: 3, latency: 10 * time.Minute}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const interval = 10 * time.Second
	var steps []foldStep
	for i := range int(24 * time.Hour / interval) {
		if i%2 == 0 {
			steps = append(steps, foldStep{targetFailure, true})
		} else {
			steps = append(steps, foldStep{res: probeOK})
		}
	}
	st := Progress{Health: Health{Known: true, Healthy: true}}
	reports := foldAll(th, &st, t0, interval, steps)
	assert.NotContains(t, reports, ReasonVerdict)
	assert.LessOrEqual(t, len(reports), int(24*time.Hour/th.latency)+1, "%d reports in a day", len(reports))
	assert.Positive(t, len(reports))
	assert.True(t, st.Health.Healthy)
}

// TestFoldStillReportsACredentialsReason: a reason change that is not about the target
// (the credentials Secret of an unhealthy proxy) is reported at once, as before.
func TestFoldStillReportsACredentialsReason(t *testing.T) {
	th := thresholds{success: 2, failure: 3, latency: 10 * time.Minute}
	st := Progress{Health: Health{Known: true, Healthy: false}}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	reason, changed := th.fold(&st, probe.Result{Kind: probe.KindProxyAuth, Message: "not labelled"}, targetJudgement{}, v1alpha1.ReasonCredentialsNotLabelled, now)
	assert.True(t, changed)
	assert.Equal(t, ReasonVerdict, reason)
	assert.Equal(t, v1alpha1.ReasonCredentialsNotLabelled, st.Health.FailureReason)
	_, changed = th.fold(&st, probe.Result{Kind: probe.KindProxyAuth, Message: "not labelled"}, targetJudgement{}, v1alpha1.ReasonCredentialsNotLabelled, now.Add(time.Second))
	assert.False(t, changed, "the same reason twice")
}
