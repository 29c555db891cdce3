package activities_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	workflowpb "go.temporal.io/api/workflow/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// healthTarget is a loopback site every proxy of a test fleet is health-checked against,
// whose answer the test sets: 200, or 503 while it is "down". It counts the probes that
// reach it, so a test can wait for the fleet to have probed rather than sleep.
type healthTarget struct {
	srv    *httptest.Server
	status atomic.Int32
	hits   atomic.Int64
}

func newHealthTarget(t *testing.T) *healthTarget {
	t.Helper()
	h := &healthTarget{}
	h.status.Store(http.StatusOK)
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.hits.Add(1)
		w.WriteHeader(int(h.status.Load()))
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *healthTarget) url() string { return h.srv.URL + "/healthz" }

// waitHits waits until the target has been probed n more times than at from.
func (h *healthTarget) waitHits(t *testing.T, from int64, n int64, why string) {
	t.Helper()
	require.Eventually(t, func() bool { return h.hits.Load()-from >= n }, 30*time.Second, 10*time.Millisecond,
		"the target was probed %d times, want %d: %s", h.hits.Load()-from, n, why)
}

// latest is the last report workflow id received, and whether any of them called the proxy
// unhealthy.
func (f *fakeWorkflows) latest(id string) (last activities.MonitorReport, n int, unhealthy bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs := f.reports[id]
	for _, r := range rs {
		if r.Result.Health.Known && !r.Result.Health.Healthy {
			unhealthy = true
		}
	}
	if len(rs) > 0 {
		last = rs[len(rs)-1]
	}
	return last, len(rs), unhealthy
}

// reasons counts workflow id's reports by reason.
func (f *fakeWorkflows) reasons(id string) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for _, r := range f.reports[id] {
		out[r.Result.Reason]++
	}
	return out
}

// waitTargetDown waits until every proxy in ids has reported that its target is down,
// failing at once if one is reported unhealthy instead: that is the defect (issue 29),
// every proxy of the fleet failing at once and each then replaced.
func waitTargetDown(t *testing.T, fw *fakeWorkflows, ids []string) {
	t.Helper()
	var lost string
	require.Eventually(t, func() bool {
		all := true
		for _, id := range ids {
			last, _, unhealthy := fw.latest(id)
			if unhealthy {
				lost = id
				return true
			}
			all = all && last.Result.Health.FailureReason == v1alpha1.ReasonHealthCheckTargetDown
		}
		return all
	}, 20*time.Second, 10*time.Millisecond, "the proxies never reported their health-check target down")
	require.Empty(t, lost, "%s was judged unhealthy because its health-check target failed", lost)
}

// evidence is how a target-down message counts the proxies that failed against it.
var evidence = regexp.MustCompile(`(\d+) of (\d+) proxies failed against it`)

// assertEvidence checks that msg counts the evidence of a judgement: at least three
// proxies, and at least half of those (at most fleet) whose latest probe said anything
// about the target, failed against it. The counts are those of the moment of the report.
func assertEvidence(t *testing.T, msg string, fleet int, id string) {
	t.Helper()
	m := evidence.FindStringSubmatch(msg)
	require.NotNil(t, m, "%s: the message does not count the proxies: %q", id, msg)
	failed, _ := strconv.Atoi(m[1])
	of, _ := strconv.Atoi(m[2])
	assert.GreaterOrEqual(t, failed, 3, "%s: %q", id, msg)
	assert.GreaterOrEqual(t, 2*failed, of, "%s: %q", id, msg)
	assert.LessOrEqual(t, of, fleet, "%s: %q", id, msg)
}

// targetFleet creates n loopback proxies health-checked against target and publishes their
// watches (healthy) in vis, under workflow IDs from ids. LatencyEvery is short so a
// recovery is reported within the test, while still bounding reason-only reports.
func (m *monitorEnv) targetFleet(t *testing.T, vis *fakeVisibility, target *healthTarget, prefix string, ids []string) map[string]activities.MonitorInput {
	t.Helper()
	ins := map[string]activities.MonitorInput{}
	for i, id := range ids {
		in := m.watchInput(t, fmt.Sprintf("%s-%d", prefix, i), activities.Health{Known: true, Healthy: true})
		in.HealthCheck.URL = target.url()
		in.LatencyEvery = 2 * time.Second
		vis.set(t, id, true, &activities.MonitorMemo{Epoch: "e1", Input: in})
		ins[id] = in
	}
	return ins
}

// TestShardHoldsVerdictsWhileTheHealthCheckTargetIsDown (issue 29): six proxies are
// health-checked against one site, which starts answering 503. Every probe fails, but
// the proxy answered each time: it is the target that is down. The proxies stay healthy
// (so lifecycle.unhealthyReplaceAfter replaces none of them) and report the target down,
// naming it and how many of them failed against it; a proxy whose own process died at the
// same moment is still judged unhealthy. When the site answers again, the reason clears,
// and each proxy has sent exactly two reason-only reports for the whole outage.
func TestShardHoldsVerdictsWhileTheHealthCheckTargetIsDown(t *testing.T) {
	m := newMonitorEnv(t)
	target := newHealthTarget(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	var ids []string
	for i := range 6 {
		ids = append(ids, fmt.Sprintf("proxy/ns/td-%d", i))
	}
	ins := m.targetFleet(t, vis, target, "px-td", ids)
	live, dead := ids[:5], ids[5]
	fw := newFakeWorkflows()
	reg := prometheus.NewRegistry()
	acts := m.shardActivities(vis, fw)
	acts.Metrics = activities.NewMetrics(reg)
	startShard(t, acts, activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	// Two rounds of probes through every proxy: all of them have a verdict to keep.
	target.waitHits(t, 0, 12, "the fleet never probed its target")

	_, _, err := m.daemon.Kill(ins[dead].Instance.Name)
	require.NoError(t, err)
	down := target.hits.Load()
	target.status.Store(http.StatusServiceUnavailable)

	got := fw.waitReports(t, dead, 1)
	assert.Equal(t, activities.MonitorVerdict, got[0].Result.Reason)
	assert.False(t, got[0].Result.Health.Healthy, "a proxy that died is healthy because its target is down")
	assert.Equal(t, probe.KindRefused, got[0].Result.Health.FailureKind)
	assert.Empty(t, got[0].Result.Health.FailureReason, "a dead proxy's failure is its own")

	waitTargetDown(t, fw, live)
	host := strings.TrimPrefix(target.srv.URL, "http://")
	for _, id := range live {
		last, _, _ := fw.latest(id)
		assert.Equal(t, activities.MonitorTarget, last.Result.Reason, id)
		assert.True(t, last.Result.Health.Healthy, id)
		assert.Contains(t, last.Result.Health.LastFailure, "http://"+host, "%s: the message does not name the target", id)
		assertEvidence(t, last.Result.Health.LastFailure, 6, id)
		assert.Contains(t, last.Result.Health.LastFailure, "503", id)
	}
	assert.Equal(t, 1.0, metricValue(t, reg, "proxyfleet_health_check_targets_down"))
	// Well past failureThreshold (3) probes through each proxy: none turned unhealthy, and
	// nothing more was reported than that the target is down.
	target.waitHits(t, down, 5*5, "the fleet stopped probing")
	for _, id := range live {
		_, n, unhealthy := fw.latest(id)
		assert.False(t, unhealthy, "%s was judged unhealthy because its health-check target failed", id)
		assert.Equal(t, 1, n, "%s: %v", id, fw.reasons(id))
	}

	target.status.Store(http.StatusOK)
	require.Eventually(t, func() bool {
		for _, id := range live {
			if last, _, _ := fw.latest(id); last.Result.Health.FailureReason != "" || !last.Result.Health.Healthy {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "the target's recovery was not reported")
	for _, id := range live {
		_, _, unhealthy := fw.latest(id)
		assert.False(t, unhealthy, id)
		assert.Equal(t, 2, fw.reasons(id)[activities.MonitorTarget], "%s: one report as the target went down, one as it came back: %v", id, fw.reasons(id))
	}
	assert.Zero(t, metricValue(t, reg, "proxyfleet_health_check_targets_down"))
}

// TestShardsOfAProcessJudgeATargetTogether: the shards one worker runs share one judgement
// per target. Six proxies spread over three shards, two each: no shard alone has the three
// proxies a judgement needs, yet together they see their target down and none is judged
// unhealthy. With a judgement per shard, a small fleet (fewer than 3 proxies per shard,
// 12 with the default 4 shards) would have no protection at all.
func TestShardsOfAProcessJudgeATargetTogether(t *testing.T) {
	m := newMonitorEnv(t)
	target := newHealthTarget(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	perShard := map[int]int{}
	var ids []string
	for i := 0; len(ids) < 6; i++ {
		id := fmt.Sprintf("proxy/ns/spread-%d", i)
		if k := activities.ShardOf(id, 3); perShard[k] < 2 {
			perShard[k]++
			ids = append(ids, id)
		}
	}
	m.targetFleet(t, vis, target, "px-spread", ids)
	fw := newFakeWorkflows()
	acts := m.shardActivities(vis, fw)
	for k := range 3 {
		startShard(t, acts, activities.ShardInput{Index: k, Count: 3, Refresh: 50 * time.Millisecond})
	}
	target.waitHits(t, 0, 12, "the fleet never probed its target")
	target.status.Store(http.StatusServiceUnavailable)
	waitTargetDown(t, fw, ids)
	for _, id := range ids {
		last, _, _ := fw.latest(id)
		assertEvidence(t, last.Result.Health.LastFailure, 6, id)
	}
}

// TestShardClearsATargetDownReasonItTookOver: a member that starts (its shard moved, its
// worker restarted) from a workflow's verdict that still carries the target-down reason,
// while the target has come back, reports the reason gone. Otherwise the Proxy would say
// its target is down until its next verdict or latency change, which may never come.
func TestShardClearsATargetDownReasonItTookOver(t *testing.T) {
	m := newMonitorEnv(t)
	target := newHealthTarget(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	const id = "proxy/ns/took-over"
	m.targetFleet(t, vis, target, "px-took-over", []string{id})
	vis.setVerdict(t, id, activities.Verdict{Epoch: "e1", Healthy: true, Since: time.Now().Add(-time.Hour).UTC(),
		FailureReason: v1alpha1.ReasonHealthCheckTargetDown})
	fw := newFakeWorkflows()
	startShard(t, m.shardActivities(vis, fw), activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	got := fw.waitReports(t, id, 1)
	assert.Equal(t, activities.MonitorTarget, got[0].Result.Reason)
	assert.True(t, got[0].Result.Health.Healthy)
	assert.Empty(t, got[0].Result.Health.FailureReason)
}
