package health

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestWorkerKeepsItsMonitorShards: a worker starts every monitor shard of its count, each
// running its MonitorShard activity; a second worker with the same count starts nothing
// new, and one with another count retires the old shards and starts its own, leaving the
// shards of another task queue alone.
func TestWorkerKeepsItsMonitorShards(t *testing.T) {
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true})
	ctx := context.Background()
	queue, other := s.TaskQueue+"-shards", s.TaskQueue+"-other"
	t.Cleanup(func() {
		for _, q := range []string{queue, other} {
			for n := 2; n <= 3; n++ {
				for k := range n {
					_ = s.Temporal.Client.TerminateWorkflow(context.Background(), contract.MonitorShardWorkflowID(q, k, n), "", "test done")
				}
			}
		}
	})
	// The queries a shard reads its members with are valid where it runs.
	for _, q := range []string{contract.RunningProxiesQuery, contract.ProxiesUpdatedSinceQuery(time.Now())} {
		_, err := s.Temporal.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: contract.OnTaskQueue(q, queue)})
		require.NoError(t, err, q)
	}
	startOn := func(queue string, n int) {
		w := s.NewWorker(t, queue, func(c *worker.Config) { c.MonitorShards = n })
		t.Cleanup(w.Stop)
		require.NoError(t, w.Start(ctx))
	}
	start := func(n int) { startOn(queue, n) }
	// running reports whether the shard's workflow runs with its activity started.
	running := func(id string) string {
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, id, "")
		if err != nil {
			return err.Error()
		}
		d := desc.RawResponse
		if st := d.GetWorkflowExecutionInfo().GetStatus(); st != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			return st.String()
		}
		for _, pa := range d.GetPendingActivities() {
			if pa.GetActivityType().GetName() == "MonitorShard" && pa.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED {
				return ""
			}
		}
		return "no MonitorShard activity started"
	}
	waitAllOn := func(queue string, n int) map[string]string {
		runs := map[string]string{}
		for k := range n {
			id := contract.MonitorShardWorkflowID(queue, k, n)
			require.Eventually(t, func() bool { return running(id) == "" }, time.Minute, 100*time.Millisecond, "%s: %s", id, running(id))
			desc, err := s.Temporal.Client.DescribeWorkflow(ctx, id, "")
			require.NoError(t, err)
			runs[id] = desc.RawResponse.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		}
		return runs
	}
	waitAll := func(n int) map[string]string { return waitAllOn(queue, n) }

	start(2)
	first := waitAll(2)
	start(2) // another worker of the same count: the same runs go on
	require.Equal(t, first, waitAll(2))

	startOn(other, 2)
	others := waitAllOn(other, 2)
	start(3)
	waitAll(3)
	require.Equal(t, others, waitAllOn(other, 2), "another queue's shards were retired")
	for k := range 2 {
		id := contract.MonitorShardWorkflowID(queue, k, 2)
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, id, "")
		require.NoError(t, err)
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED, desc.RawResponse.GetWorkflowExecutionInfo().GetStatus(),
			fmt.Sprintf("%s was not retired when the count became 3", id))
	}
	e2e.RecordHistory(t, s, contract.MonitorShardWorkflowID(queue, 0, 2), "monitor-shard.json")
}

// TestWorkerRestartsATerminatedShard: a monitor shard terminated by hand is started again
// by the worker's periodic check, so its proxies are not left unwatched until a restart.
func TestWorkerRestartsATerminatedShard(t *testing.T) {
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true})
	ctx := context.Background()
	queue := s.TaskQueue + "-restart"
	w := s.NewWorker(t, queue, func(c *worker.Config) { c.MonitorShards, c.ShardCheckEvery = 2, 200*time.Millisecond })
	t.Cleanup(func() {
		w.Stop()
		for k := range 2 {
			_ = s.Temporal.Client.TerminateWorkflow(context.Background(), contract.MonitorShardWorkflowID(queue, k, 2), "", "test done")
		}
	})
	require.NoError(t, w.Start(ctx))
	id := contract.MonitorShardWorkflowID(queue, 1, 2)
	run := func() (string, enumspb.WorkflowExecutionStatus) {
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, id, "")
		if err != nil {
			return "", enumspb.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED
		}
		info := desc.RawResponse.GetWorkflowExecutionInfo()
		return info.GetExecution().GetRunId(), info.GetStatus()
	}
	first, status := run()
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, status)
	require.NoError(t, s.Temporal.Client.TerminateWorkflow(ctx, id, first, "an operator's mistake"))
	require.Eventually(t, func() bool {
		r, st := run()
		return r != first && st == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	}, 30*time.Second, 100*time.Millisecond, "the terminated shard was not started again")
}

// TestShardCountRolloutConverges: during a rollout that changes --monitor-shards, workers
// of both counts check the shards every 200ms. They settle on the count of the worker that
// started last and then leave its shards alone: no run is terminated or started again
// over many checks. A shard of that count that ends is started again by the older worker
// too, once the newer one is gone.
func TestShardCountRolloutConverges(t *testing.T) {
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true})
	ctx := context.Background()
	queue := s.TaskQueue + "-rollout"
	t.Cleanup(func() {
		for n := 2; n <= 3; n++ {
			for k := range n {
				_ = s.Temporal.Client.TerminateWorkflow(context.Background(), contract.MonitorShardWorkflowID(queue, k, n), "", "test done")
			}
		}
	})
	const every = 200 * time.Millisecond
	old := s.NewWorker(t, queue, func(c *worker.Config) { c.MonitorShards, c.ShardCheckEvery = 2, every })
	t.Cleanup(old.Stop)
	require.NoError(t, old.Start(ctx))
	newer := s.NewWorker(t, queue, func(c *worker.Config) { c.MonitorShards, c.ShardCheckEvery = 3, every })
	t.Cleanup(newer.Stop)
	require.NoError(t, newer.Start(ctx))

	// runs is the run ID of every running shard of the queue, by workflow ID.
	runs := func() map[string]string {
		resp, err := s.Temporal.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: contract.OnTaskQueue(fmt.Sprintf("WorkflowType = %q AND ExecutionStatus = 'Running'", contract.MonitorShardWorkflowType), queue),
		})
		require.NoError(t, err)
		out := map[string]string{}
		for _, ex := range resp.GetExecutions() {
			out[ex.GetExecution().GetWorkflowId()] = ex.GetExecution().GetRunId()
		}
		return out
	}
	wantIDs := func(n int) []string {
		var ids []string
		for k := range n {
			ids = append(ids, contract.MonitorShardWorkflowID(queue, k, n))
		}
		return ids
	}
	var settled map[string]string
	require.Eventually(t, func() bool {
		settled = runs()
		return assert.ObjectsAreEqual(wantIDs(3), slices.Sorted(maps.Keys(settled)))
	}, time.Minute, 50*time.Millisecond, "the newest worker's count runs alone")
	// The workers agree from the pollers the server lists: each says its count and start.
	tq, err := s.Temporal.Client.DescribeTaskQueue(ctx, queue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
	require.NoError(t, err)
	var said []string
	for _, p := range tq.GetPollers() {
		said = append(said, p.GetIdentity())
	}
	assert.True(t, slices.ContainsFunc(said, func(id string) bool { return strings.Contains(id, "@shards=3@started=") }), "pollers: %q", said)
	assert.True(t, slices.ContainsFunc(said, func(id string) bool { return strings.Contains(id, "@shards=2@started=") }), "pollers: %q", said)
	// Twenty checks of each worker later, the same runs go on: neither worker retires the
	// other's shards.
	deadline := time.Now().Add(20 * every)
	for time.Now().Before(deadline) {
		require.Equal(t, settled, runs(), "the shards were restarted while the workers disagreed on the count")
		time.Sleep(every / 2) // the pace of the check, not a synchronisation
	}

	// The newer worker goes (the rollout is rolled back); a shard of its count ends. The
	// older worker keeps that count whole rather than leave its proxies unwatched.
	newer.Stop()
	gone := contract.MonitorShardWorkflowID(queue, 1, 3)
	require.NoError(t, s.Temporal.Client.TerminateWorkflow(ctx, gone, "", "an operator's mistake"))
	require.Eventually(t, func() bool {
		r := runs()
		return r[gone] != "" && r[gone] != settled[gone] && len(r) == 3
	}, time.Minute, 50*time.Millisecond, "the older worker started the ended shard of the newer count again")
}
