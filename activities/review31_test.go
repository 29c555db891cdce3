package activities_test

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	workflowpb "go.temporal.io/api/workflow/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
)

// TestReview31ShardReportsThroughTheWorkersSignallerNow: before the refactor each
// MonitorShard call built its members from a.Signaller (and its feed read a.Temporal,
// probed with a.prober(), logged with a.log()) as they were at that moment; after it, the
// worker's Shards capture them once, at the first shard ever run, and keep them for the
// Activities' life. A shard started again after the Activities' Signaller changed reports
// through the old one.
func TestReview31ShardReportsThroughTheWorkersSignallerNow(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	in := m.watchedProxy(t, vis, "px-r31-sig", "proxy/ns/r31-sig", "e1", activities.Health{Known: true, Healthy: true})
	fw1, fw2 := newFakeWorkflows(), newFakeWorkflows()
	reg := prometheus.NewRegistry()
	acts := m.shardActivities(vis, fw1)
	acts.Metrics = activities.NewMetrics(reg)
	watching := func() float64 { return metricValue(t, reg, "proxyfleet_monitors_running") }

	cancel, done := runShard(acts, activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return watching() == 1 }, 10*time.Second, 20*time.Millisecond)
	cancel()
	<-done
	require.Eventually(t, func() bool { return watching() == 0 }, 10*time.Second, 20*time.Millisecond)

	acts.Signaller = fw2
	startShard(t, acts, activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return watching() == 1 }, 10*time.Second, 20*time.Millisecond)
	_, _, err := m.daemon.SetFault(in.Instance.Name, local.FaultAuth)
	require.NoError(t, err)
	count := func(f *fakeWorkflows) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.reports["proxy/ns/r31-sig"])
	}
	require.Eventually(t, func() bool { return count(fw1)+count(fw2) > 0 }, 30*time.Second, 20*time.Millisecond, "no report at all")
	assert.Equal(t, 0, count(fw1), "the report went to the Signaller the Activities had at their first shard")
	assert.Equal(t, 1, count(fw2), "the report did not go to the Signaller the Activities have now")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReview31ShardWarnsOnTheDefaultLoggerOfTheMoment: with no Log set, the activities
// logged to slog.Default() as it was when they logged (a.log()); the monitor's Env takes
// a.log() when it is built, so a shard's member warns about a missing provider on the
// default logger of the Activities' first shard, not on the one set since.
func TestReview31ShardWarnsOnTheDefaultLoggerOfTheMoment(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	first := &syncBuffer{}
	slog.SetDefault(slog.New(slog.NewTextHandler(first, nil)))
	acts := m.shardActivities(vis, newFakeWorkflows())
	startShard(t, acts, activities.ShardInput{Index: 0, Count: 1, Refresh: 20 * time.Millisecond, IdleRefresh: 20 * time.Millisecond})
	require.Eventually(t, func() bool {
		vis.mu.Lock()
		defer vis.mu.Unlock()
		return vis.lists > 0
	}, 10*time.Second, 10*time.Millisecond)

	buf := &syncBuffer{}
	slog.SetDefault(slog.New(slog.NewTextHandler(buf, nil)))

	in := m.watchInput(t, "px-r31-log", activities.Health{Known: true, Healthy: true})
	in.Instance.Provider = "nowhere" // a provider this worker does not have
	vis.set(t, "proxy/ns/r31-log", true, &activities.MonitorMemo{Epoch: "e1", Input: in})
	assert.Eventually(t, func() bool { return bytes.Contains([]byte(buf.String()), []byte("cannot watch the proxy")) },
		10*time.Second, 20*time.Millisecond, "the missing provider's warning did not reach slog.Default()")
}
