package monitor

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities/probe"
)

// badGateway is what a proxy that cannot reach anything (its egress, DNS or upstream
// broken; a vendor's gateway down) answers a probe of an http target.
var badGateway = probe.Result{Kind: probe.KindBadGateway, TargetFailed: true, Message: "proxy could not reach t (502)"}

// TestReview2HalfAFleetAnsweringIsNoTargetDown: a fleet of two halves (two vendors of
// External proxies, two regions) probing one URL. The target answers every probe through
// the first half; the second half's proxies answer 502 for everything because they are
// broken. The target is demonstrably up, yet "at least half failed" judges it down, so the
// broken half keeps its healthy verdict, stays leasable and is never replaced, for as long
// as it stays broken.
func TestReview2HalfAFleetAnsweringIsNoTargetDown(t *testing.T) {
	b := newTargetBoard(nil)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const stale = 25 * time.Second
	for i := range 5 {
		b.observe("k", "http://t", fmt.Sprintf("vendorA-%d", i), true, probeOK, stale, t0)
	}
	var j targetJudgement
	for i := range 5 {
		j = b.observe("k", "http://t", fmt.Sprintf("vendorB-%d", i), true, badGateway, stale, t0)
	}
	assert.False(t, j.Down, "target judged down although it answered %d of %d proxies just now", j.Of-j.Failed, j.Of)

	th := thresholds{success: 2, failure: 3, latency: 10 * time.Minute}
	st := Progress{Health: Health{Known: true, Healthy: true}}
	for i := range 20 {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		for k := range 5 {
			b.observe("k", "http://t", fmt.Sprintf("vendorA-%d", k), true, probeOK, stale, now)
		}
		for k := 1; k < 5; k++ {
			b.observe("k", "http://t", fmt.Sprintf("vendorB-%d", k), true, badGateway, stale, now)
		}
		th.fold(&st, badGateway, b.observe("k", "http://t", "vendorB-0", true, badGateway, stale, now), "", now)
	}
	assert.False(t, st.Health.Healthy, "a proxy answering 502 for 20 probes in a row, beside proxies the target answers, is still healthy")
}

// TestReview2TargetOutageOnsetWithFailureThresholdOne: failureThreshold 1 is allowed by
// the schema. When the target goes down, the members that probe first in the interval see
// fewer than half of the fleet's latest probes failed: their failure counts as their own,
// and with threshold 1 they turn unhealthy at once. Once the target is judged down, fold
// keeps them unhealthy ("its own failure came first"), so with unhealthyReplaceAfter
// nearly half the fleet is replaced for one target outage, and leaves discovery meanwhile.
func TestReview2TargetOutageOnsetWithFailureThresholdOne(t *testing.T) {
	b := newTargetBoard(nil)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const interval = 10 * time.Second
	stale := staleAfter(interval, 5*time.Second)
	th := thresholds{success: 2, failure: 1, latency: 10 * time.Minute}
	const n = 10
	sts := make([]Progress, n)
	member := func(i int) string { return fmt.Sprintf("m%d", i) }
	for i := range n {
		sts[i] = Progress{Health: Health{Known: true, Healthy: true}}
		b.observe("k", "http://t", member(i), true, probeOK, stale, t0)
	}
	// The target goes down; members probe in turn over the next intervals.
	for round := 1; round <= 3; round++ {
		for i := range n {
			now := t0.Add(time.Duration(round)*interval + time.Duration(i)*interval/n)
			th.fold(&sts[i], targetFailure, b.observe("k", "http://t", member(i), true, targetFailure, stale, now), "", now)
		}
	}
	var unhealthy []string
	for i := range n {
		if !sts[i].Health.Healthy {
			unhealthy = append(unhealthy, member(i))
		}
	}
	assert.Empty(t, unhealthy, "turned unhealthy (and will be replaced) because the health-check target went down")
}

// TestReview2ProxiesNeverSeenWorkingJudgeOthersTarget: the board is shared by every Proxy
// of the worker, across namespaces, and every member counts, even one that never passed a
// probe. Someone who may create Proxies creates a handful of External proxies pointing at
// an endpoint that answers 503 to everything, with the health-check URL everyone uses:
// they never turn healthy, but they outvote the healthy fleet of that URL, the target is
// judged down for good, and a real proxy of another team that starts answering 502 keeps
// its healthy verdict and is never replaced.
func TestReview2ProxiesNeverSeenWorkingJudgeOthersTarget(t *testing.T) {
	b := newTargetBoard(nil)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const stale = 25 * time.Second
	th := thresholds{success: 2, failure: 3, latency: 10 * time.Minute}
	// Three healthy proxies of team A; one of them breaks.
	for i := range 3 {
		b.observe("k", "https://t", fmt.Sprintf("teamA-%d", i), true, probeOK, stale, t0)
	}
	broken := Progress{Health: Health{Known: true, Healthy: true}}
	for step := range 30 {
		now := t0.Add(time.Duration(step) * 10 * time.Second)
		// Four Proxies that never passed a probe (Known false), answering 503.
		for i := range 4 {
			b.observe("k", "https://t", fmt.Sprintf("bogus-%d", i), false, targetFailure, stale, now)
		}
		b.observe("k", "https://t", "teamA-1", true, probeOK, stale, now)
		b.observe("k", "https://t", "teamA-2", true, probeOK, stale, now)
		th.fold(&broken, badGateway, b.observe("k", "https://t", "teamA-0", true, badGateway, stale, now), "", now)
	}
	assert.False(t, broken.Health.Healthy,
		"a proxy failing 30 probes in a row kept healthy on the word of proxies that never worked")
}
