package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

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
	recordHistory(t, s, contract.MonitorShardWorkflowID(queue, 0, 2), "monitor-shard.json")
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
