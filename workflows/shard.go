package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
)

// ShardHeartbeatTimeout is how soon a monitor shard whose worker died is started on
// another worker. The SDK heartbeats at 0.8 × this (one action every 32 s per shard, the
// cost of a healthy fleet), and the proxies it watched are probed again within this plus
// the retry's second and at most one probe interval.
const ShardHeartbeatTimeout = 40 * time.Second

// shardRunsPerWorkflowRun bounds one run's history: each time the activity ends (at worst
// every StartToClose), a few events; the run continues as new after this many.
const shardRunsPerWorkflowRun = 100

// MonitorShardWorkflow keeps one monitor shard running: a MonitorShard activity for as
// long as the workflow lives, started again on another worker when its worker dies (by the
// heartbeat timeout) and again when it ends. It records nothing else: members, probes and
// reports live in the activity, so a healthy fleet adds no history here either.
func MonitorShardWorkflow(ctx workflow.Context, in activities.ShardInput) error {
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("watching the proxies of monitor shard %d of %d", in.Index, in.Count))
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		Summary:             fmt.Sprintf("monitor shard %d of %d", in.Index, in.Count),
		StartToCloseTimeout: 7 * 24 * time.Hour,
		HeartbeatTimeout:    ShardHeartbeatTimeout,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second,
			NonRetryableErrorTypes: []string{activities.ErrTypePermanent},
		},
	})
	for range shardRunsPerWorkflowRun {
		err := workflow.ExecuteActivity(actx, a.MonitorShard, in).Get(ctx, nil)
		if isType(err, activities.ErrTypePermanent) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Anything else (its week ran out, retries exhausted by a long outage): again.
	}
	return workflow.NewContinueAsNewError(ctx, MonitorShardWorkflow, in)
}
