package activities_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
)

// fakeWorkflows stands in for the proxies' workflows a shard signals: it records each
// report; a workflow in gone answers NotFound, and the next failNext signals fail as a
// Temporal outage would.
type fakeWorkflows struct {
	mu       sync.Mutex
	reports  map[string][]activities.MonitorReport
	attempts map[string]int
	gone     map[string]bool
	failNext int
}

func newFakeWorkflows() *fakeWorkflows {
	return &fakeWorkflows{reports: map[string][]activities.MonitorReport{}, attempts: map[string]int{}, gone: map[string]bool{}}
}

func (f *fakeWorkflows) SignalWorkflow(_ context.Context, id, _, name string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts[id]++
	switch {
	case name != "monitor":
		return serviceerror.NewInvalidArgument("unknown signal " + name)
	case f.gone[id]:
		return serviceerror.NewNotFound("workflow not found")
	case f.failNext > 0:
		f.failNext--
		return serviceerror.NewUnavailable("frontend unavailable")
	}
	f.reports[id] = append(f.reports[id], arg.(activities.MonitorReport))
	return nil
}

// waitReports waits until id has n reports and returns them.
func (f *fakeWorkflows) waitReports(t *testing.T, id string, n int) []activities.MonitorReport {
	t.Helper()
	var got []activities.MonitorReport
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = append([]activities.MonitorReport(nil), f.reports[id]...)
		return len(got) >= n
	}, 30*time.Second, 20*time.Millisecond, "%s: %d reports, want %d", id, len(got), n)
	return got
}

// fakeVisibility answers every list with the runs it holds, as visibility would list them
// (memo, status, start time), in the order of their keys; a full pass and a pass of
// changes see the same, which the shard must take alike.
type fakeVisibility struct {
	mu sync.Mutex
	// wfs holds the runs by workflow ID, "#" and run ID.
	wfs map[string]*workflowpb.WorkflowExecutionInfo
	// lists counts the lists asked for.
	lists int
}

// set publishes memo as workflow id's (its run "run") in a list's answers.
func (f *fakeVisibility) set(t *testing.T, id string, running bool, memo *activities.MonitorMemo) {
	t.Helper()
	f.setRun(t, id, "run", time.Time{}, running, memo)
}

// setRun publishes memo as run run's of workflow id, started at started.
func (f *fakeVisibility) setRun(t *testing.T, id, run string, started time.Time, running bool, memo *activities.MonitorMemo) {
	t.Helper()
	info := &workflowpb.WorkflowExecutionInfo{Execution: &commonpb.WorkflowExecution{WorkflowId: id, RunId: run},
		StartTime: timestamppb.New(started),
		Status:    enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, Memo: &commonpb.Memo{Fields: map[string]*commonpb.Payload{}}}
	if !running {
		info.Status = enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED
		info.CloseTime = timestamppb.Now()
	}
	if memo != nil {
		p, err := converter.GetDefaultDataConverter().ToPayload(memo)
		require.NoError(t, err)
		info.Memo.Fields[activities.MonitorMemoKey] = p
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wfs[id+"#"+run] = info
}

// setVerdict publishes a workflow's current verdict beside its watch.
func (f *fakeVisibility) setVerdict(t *testing.T, id string, v activities.Verdict) {
	t.Helper()
	p, err := converter.GetDefaultDataConverter().ToPayload(v)
	require.NoError(t, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wfs[id+"#run"].Memo.Fields[activities.VerdictMemoKey] = p
}

func (f *fakeVisibility) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	resp := &workflowservice.ListWorkflowExecutionsResponse{}
	for _, key := range slices.Sorted(maps.Keys(f.wfs)) {
		resp.Executions = append(resp.Executions, proto.CloneOf(f.wfs[key]))
	}
	return resp, nil
}

// runShard runs the MonitorShard activity in the SDK's test environment until cancel; done
// receives what it returned.
func runShard(acts *activities.Activities, in activities.ShardInput) (cancel context.CancelFunc, done chan error) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(acts)
	ctx, cancel := context.WithCancel(context.Background())
	env.SetWorkerOptions(worker.Options{BackgroundActivityContext: ctx})
	done = make(chan error, 1)
	go func() {
		_, err := env.ExecuteActivity(acts.MonitorShard, in)
		done <- err
	}()
	return cancel, done
}

// watchedProxy creates a loopback proxy and publishes its watch, under epoch and starting
// from last, as workflow id's memo in vis. It returns the watch's input.
func (m *monitorEnv) watchedProxy(t *testing.T, vis *fakeVisibility, name, id, epoch string, last activities.Health) activities.MonitorInput {
	t.Helper()
	in := m.watchInput(t, name, last)
	vis.set(t, id, true, &activities.MonitorMemo{Epoch: epoch, Input: in})
	return in
}

// watchInput creates a loopback proxy and returns the input of a watch of it starting from
// last.
func (m *monitorEnv) watchInput(t *testing.T, name string, last activities.Health) activities.MonitorInput {
	t.Helper()
	inst, ii := m.instance(t, name)
	in := m.input(inst, last)
	in.Instance = &ii
	return in
}

// shardActivities are the activities of a worker whose shards read vis and report to signal.
func (m *monitorEnv) shardActivities(vis *fakeVisibility, signal activities.WorkflowSignaller) *activities.Activities {
	return &activities.Activities{Providers: m.acts.Providers, Installation: "test", Keyring: m.acts.Keyring,
		Temporal: vis, Signaller: signal}
}

// startShard runs a shard until the test ends.
func startShard(t *testing.T, acts *activities.Activities, in activities.ShardInput) {
	cancel, done := runShard(acts, in)
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// TestMonitorShardFollowsVisibility: a shard watches the running workflows that publish a
// MonitorMemo, and only those, reports their changes, and stops watching a workflow that
// closed; cancelled, it stops every watch.
func TestMonitorShardFollowsVisibility(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	inA := m.watchedProxy(t, vis, "px-vis-a", "proxy/ns/a", "e1", activities.Health{Known: true, Healthy: true})
	instB, _ := m.instance(t, "px-vis-b")
	vis.set(t, "proxy/ns/b", true, nil) // an older run: it watches its proxy itself
	fw := newFakeWorkflows()
	reg := prometheus.NewRegistry()
	acts := m.shardActivities(vis, fw)
	acts.Metrics = activities.NewMetrics(reg)
	watching := func() float64 { return metricValue(t, reg, "proxyfleet_monitors_running") }

	cancel, done := runShard(acts, activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})

	require.Eventually(t, func() bool { return watching() == 1 }, 10*time.Second, 20*time.Millisecond, "the shard never watched exactly the one proxy with a memo")
	for _, name := range []string{inA.Instance.Name, instB.Name} {
		_, _, err := m.daemon.SetFault(name, local.FaultAuth)
		require.NoError(t, err)
	}
	got := fw.waitReports(t, "proxy/ns/a", 1)
	assert.False(t, got[0].Result.Health.Healthy)
	assert.Equal(t, "e1", got[0].Epoch)

	vis.set(t, "proxy/ns/a", false, nil)
	require.Eventually(t, func() bool { return watching() == 0 }, 10*time.Second, 20*time.Millisecond, "the closed workflow's proxy is still watched")
	fw.mu.Lock()
	assert.Zero(t, fw.attempts["proxy/ns/b"], "a workflow without a memo was reported to")
	fw.mu.Unlock()

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the shard did not stop when cancelled")
	}
}

// TestMonitorShardRefusesABadShard: a shard outside its count is a permanent error.
func TestMonitorShardRefusesABadShard(t *testing.T) {
	acts := &activities.Activities{Temporal: &fakeVisibility{}, Signaller: newFakeWorkflows()}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(acts)
	_, err := env.ExecuteActivity(acts.MonitorShard, activities.ShardInput{Index: 4, Count: 4})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "shard 4 of 4")
}

// TestShardsOfAProcessShareOneReader: the shards one worker runs for a task queue read
// visibility together, one list per refresh, not one each; each still watches exactly the
// proxies it owns, and a shard that stops leaves the other's watches alone.
func TestShardsOfAProcessShareOneReader(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	const proxies = 6
	owners := map[int]int{}
	for i := range proxies {
		id := fmt.Sprintf("proxy/ns/share-%d", i)
		m.watchedProxy(t, vis, fmt.Sprintf("px-share-%d", i), id, "e1", activities.Health{Known: true, Healthy: true})
		owners[activities.ShardOf(id, 2)]++
	}
	require.Len(t, owners, 2, "the proxies should fall in both shards")
	reg := prometheus.NewRegistry()
	acts := m.shardActivities(vis, newFakeWorkflows())
	acts.Metrics = activities.NewMetrics(reg)
	watching := func() float64 { return metricValue(t, reg, "proxyfleet_monitors_running") }
	const refresh = 50 * time.Millisecond
	cancels := make([]context.CancelFunc, 2)
	dones := make([]chan error, 2)
	for k := range 2 {
		cancels[k], dones[k] = runShard(acts, activities.ShardInput{Index: k, Count: 2, Refresh: refresh})
	}
	require.Eventually(t, func() bool { return watching() == proxies }, 10*time.Second, 20*time.Millisecond, "the two shards never watched the fleet")

	vis.mu.Lock()
	before := vis.lists
	vis.mu.Unlock()
	start := time.Now()
	require.Eventually(t, func() bool { return time.Since(start) >= 40*refresh }, 10*time.Second, refresh)
	vis.mu.Lock()
	lists := vis.lists - before
	vis.mu.Unlock()
	ticks := int(time.Since(start) / refresh)
	assert.LessOrEqual(t, lists, ticks+ticks/2+2, "%d lists in %d refreshes: the shards read visibility each on their own", lists, ticks)
	assert.Equal(t, float64(proxies), watching())

	cancels[0]()
	<-dones[0]
	require.Eventually(t, func() bool { return watching() == float64(owners[1]) }, 10*time.Second, 20*time.Millisecond,
		"the stopped shard's watches did not end, or took the other's with them")
	cancels[1]()
	<-dones[1]
	assert.Zero(t, watching())
}

// TestShardsOfTwoWorkersReadApart: two workers in one process (tests, a benchmark's fleet)
// each read their own visibility for the same task queue: a worker's shards share a reader,
// workers do not. Each watches, and reports, only the proxies its own visibility lists.
func TestShardsOfTwoWorkersReadApart(t *testing.T) {
	m := newMonitorEnv(t)
	type worker struct {
		vis *fakeVisibility
		fw  *fakeWorkflows
		reg *prometheus.Registry
		id  string
	}
	var workers []worker
	for i := range 2 {
		w := worker{vis: &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}, fw: newFakeWorkflows(),
			reg: prometheus.NewRegistry(), id: fmt.Sprintf("proxy/ns/apart-%d", i)}
		m.watchedProxy(t, w.vis, fmt.Sprintf("px-apart-%d", i), w.id, "e1", activities.Health{Known: true, Healthy: true})
		acts := m.shardActivities(w.vis, w.fw)
		acts.Metrics = activities.NewMetrics(w.reg)
		startShard(t, acts, activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
		workers = append(workers, w)
	}
	for i, w := range workers {
		require.Eventually(t, func() bool { return metricValue(t, w.reg, "proxyfleet_monitors_running") == 1 }, 10*time.Second, 20*time.Millisecond,
			"worker %d never watched exactly its own proxy", i)
		_, _, err := m.daemon.SetFault(fmt.Sprintf("px-apart-%d", i), local.FaultAuth)
		require.NoError(t, err)
	}
	for i, w := range workers {
		got := w.fw.waitReports(t, w.id, 1)
		assert.False(t, got[0].Result.Health.Healthy)
		other := workers[1-i]
		w.fw.mu.Lock()
		assert.Zero(t, w.fw.attempts[other.id], "worker %d reported a proxy only the other worker's visibility lists", i)
		w.fw.mu.Unlock()
		assert.Equal(t, 1.0, metricValue(t, w.reg, "proxyfleet_monitors_running"), "worker %d", i)
	}
}

// TestShardReaderSlowsWhileNothingChanges: once no watch has changed for a while, the
// shards read visibility at their idle pace, although every read returns the last changes
// again (as visibility does within the overlap); a new epoch is still picked up.
func TestShardReaderSlowsWhileNothingChanges(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	in := m.watchedProxy(t, vis, "px-quiet", "proxy/ns/quiet", "e1", activities.Health{Known: true, Healthy: true})
	fw := newFakeWorkflows()
	startShard(t, m.shardActivities(vis, fw), activities.ShardInput{Index: 0, Count: 1,
		Refresh: 10 * time.Millisecond, IdleRefresh: 400 * time.Millisecond, Quiet: 100 * time.Millisecond})
	lists := func() int {
		vis.mu.Lock()
		defer vis.mu.Unlock()
		return vis.lists
	}
	require.Eventually(t, func() bool { return lists() > 0 }, 10*time.Second, 10*time.Millisecond)
	// Past the quiet period, then a window of 1.2 s: 3 or 4 idle reads, not 120 busy ones.
	start := time.Now()
	require.Eventually(t, func() bool { return time.Since(start) > 300*time.Millisecond }, time.Second, 10*time.Millisecond)
	before, t0 := lists(), time.Now()
	require.Eventually(t, func() bool { return time.Since(t0) > 1200*time.Millisecond }, 3*time.Second, 10*time.Millisecond)
	assert.LessOrEqual(t, lists()-before, 8, "the reader kept its busy pace with nothing changing")

	// A new epoch is picked up at the idle pace: the watch restarts on the new input
	// (here, a port where nothing listens), and reports from it.
	moved := in
	moved.Target = "127.0.0.1:1"
	vis.set(t, "proxy/ns/quiet", true, &activities.MonitorMemo{Epoch: "e2", Input: moved})
	reports := fw.waitReports(t, "proxy/ns/quiet", 1)
	assert.Equal(t, "e2", reports[0].Epoch)
	assert.False(t, reports[0].Result.Health.Healthy)
}

// TestShardStartsFromTheWorkflowsVerdict: a shard that starts (it moved from a killed
// worker, or its worker restarted) watches each proxy from the verdict its workflow holds
// now, not the one of the watch's start. Here the watch began healthy, the workflow has
// since been told the proxy failed, and the proxy works again: the recovery is reported.
// From the watch's verdict the member would think nothing had changed, and the workflow
// would hold a working proxy out of rotation until it failed and recovered once more.
func TestShardStartsFromTheWorkflowsVerdict(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	m.watchedProxy(t, vis, "px-verdict", "proxy/ns/verdict", "e1", activities.Health{Known: true, Healthy: true})
	failed := time.Now().Add(-time.Minute).UTC()
	vis.setVerdict(t, "proxy/ns/verdict", activities.Verdict{Epoch: "e1", Healthy: false, Since: failed})
	// A verdict about an earlier watch says nothing about this one: this watch began
	// unhealthy, and its working proxy's recovery is reported although a stale verdict
	// calls it healthy.
	m.watchedProxy(t, vis, "px-verdict-old", "proxy/ns/other", "e2", activities.Health{Known: true, Healthy: false, LastFailure: "connect: refused"})
	vis.setVerdict(t, "proxy/ns/other", activities.Verdict{Epoch: "e1", Healthy: true, Since: failed})

	fw := newFakeWorkflows()
	startShard(t, m.shardActivities(vis, fw), activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	got := fw.waitReports(t, "proxy/ns/verdict", 1)
	assert.Equal(t, activities.MonitorVerdict, got[0].Result.Reason)
	assert.True(t, got[0].Result.Health.Healthy, "the recovery was not reported")
	assert.Equal(t, "e1", got[0].Epoch)
	got = fw.waitReports(t, "proxy/ns/other", 1)
	assert.True(t, got[0].Result.Health.Healthy, "a verdict of another epoch was taken for the watch's")
	assert.Equal(t, "e2", got[0].Epoch)
}

// TestShardTellsARestartedRunItsVerdict: a workflow terminated just after its shard's first
// verdict, before it published anything else, is started again; the new run adopts the
// instance and publishes the very watch the old one did (no verdict known), and must be
// told the verdict the old run was given. It waited for ever when the shard took the
// same epoch for the same watch whatever run published it.
func TestShardTellsARestartedRunItsVerdict(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	const id = "proxy/ns/restarted"
	watch := &activities.MonitorMemo{Epoch: "unknown", Input: m.watchInput(t, "px-restarted", activities.Health{})}
	t0 := time.Now().Add(-time.Minute)
	vis.setRun(t, id, "run-1", t0, true, watch)
	fw := newFakeWorkflows()
	startShard(t, m.shardActivities(vis, fw), activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	got := fw.waitReports(t, id, 1)
	require.True(t, got[0].Result.Health.Healthy)

	vis.setRun(t, id, "run-1", t0, false, watch)
	vis.setRun(t, id, "run-2", t0.Add(time.Second), true, watch)
	got = fw.waitReports(t, id, 2)
	assert.Equal(t, activities.MonitorVerdict, got[1].Result.Reason)
	assert.True(t, got[1].Result.Health.Healthy)
	assert.Equal(t, "unknown", got[1].Epoch)
}

// TestShardFollowsTheLatestRun: visibility writes a run's close after the fact, so a run
// and its successor can both be listed as running; the shard watches what the one started
// later published, whichever is listed last.
func TestShardFollowsTheLatestRun(t *testing.T) {
	m := newMonitorEnv(t)
	vis := &fakeVisibility{wfs: map[string]*workflowpb.WorkflowExecutionInfo{}}
	const id = "proxy/ns/twice"
	in := m.watchInput(t, "px-twice", activities.Health{Known: true, Healthy: true})
	t0 := time.Now().Add(-time.Minute)
	// Listed in key order: the new run ("a") before the old one ("b").
	vis.setRun(t, id, "b-old", t0, true, &activities.MonitorMemo{Epoch: "old", Input: in})
	vis.setRun(t, id, "a-new", t0.Add(time.Second), true, &activities.MonitorMemo{Epoch: "new", Input: in})
	fw := newFakeWorkflows()
	startShard(t, m.shardActivities(vis, fw), activities.ShardInput{Index: 0, Count: 1, Refresh: 50 * time.Millisecond})
	_, _, err := m.daemon.SetFault("px-twice", local.FaultAuth)
	require.NoError(t, err)
	got := fw.waitReports(t, id, 1)
	assert.False(t, got[0].Result.Health.Healthy)
	assert.Equal(t, "new", got[0].Epoch, "the shard watched for a run that has ended")
}
