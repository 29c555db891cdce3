package activities

import (
	"context"
	"fmt"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/activities/monitor"
)

// The monitor shards' wire names, as workflow code has always used them (see monitor.go).
type (
	ShardInput        = monitor.ShardInput
	MonitorMemo       = monitor.Memo
	Verdict           = monitor.Verdict
	MonitorReport     = monitor.Report
	WorkflowSignaller = monitor.Signaller
)

// Memo fields of a ProxyWorkflow watched by a shard (see monitor.MemoKey, monitor.VerdictMemoKey).
const (
	MonitorMemoKey = monitor.MemoKey
	VerdictMemoKey = monitor.VerdictMemoKey
)

// ShardOf is the shard, of count, that watches the ProxyWorkflow workflowID (monitor.ShardOf).
func ShardOf(workflowID string, count int) int { return monitor.ShardOf(workflowID, count) }

// MonitorShard watches every proxy whose workflow the shard owns (monitor.Shards.Serve),
// until it is cancelled or its worker dies (Temporal then starts it on another worker after
// the heartbeat timeout). The shards this worker runs for one task queue share one reader
// of visibility. The shard heartbeats once a Refresh with no details; that heartbeat,
// throttled by the SDK to one per 0.8 × the heartbeat timeout, is the whole cost of a
// healthy fleet.
func (a *Activities) MonitorShard(ctx context.Context, in ShardInput) error {
	if in.Count < 1 || in.Index < 0 || in.Index >= in.Count {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("monitor shard %d of %d does not exist", in.Index, in.Count), ErrTypePermanent, nil)
	}
	if a.Temporal == nil || a.Signaller == nil {
		return temporal.NewNonRetryableApplicationError("this worker has no Temporal client for monitor shards", ErrTypePermanent, nil)
	}
	return a.shards().Serve(ctx, activity.GetInfo(ctx).TaskQueue, in, a.Signaller, func() { activity.RecordHeartbeat(ctx) })
}

// shards returns this worker's monitor shards, made at its first shard: the shards of one
// Activities share their readers of visibility, and those of another do not.
func (a *Activities) shards() *monitor.Shards {
	a.shardsOnce.Do(func() { a.monitorShards = monitor.NewShards(a.monitorEnv(), a.Temporal) })
	return a.monitorShards
}
