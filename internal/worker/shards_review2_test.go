package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestReview2APollersIdentityCannotSetAnyShardCount: any process polling the task queue
// decides the shard count of every worker by its identity, with no bound: a worker started
// with a typo (--monitor-shards=40000) or any poller whose identity ends
// "@shards=1000000@started=<far future>" makes every worker start that many
// MonitorShardWorkflows (ensureShards loops over the count, one ExecuteWorkflow each) and
// terminate the real ones; a far-future start keeps that count for as long as it polls,
// whatever workers start after it. The count taken from others should be bounded (the
// same bound New enforces), and a start after the reader's own clock plus a skew allowance
// should have no say.
func TestReview2APollersIdentityCannotSetAnyShardCount(t *testing.T) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	self := shardPoller{count: 4, started: now.Add(-time.Hour)}
	poller := func(count int, started time.Time) *taskqueuepb.PollerInfo {
		return &taskqueuepb.PollerInfo{Identity: shardIdentity("1@h", count, started), LastAccessTime: timestamppb.New(now)}
	}
	t.Run("a huge count", func(t *testing.T) {
		got := newestLive([]*taskqueuepb.PollerInfo{poller(1_000_000, now.Add(-time.Minute))}, self, now, time.Minute)
		assert.LessOrEqual(t, got, 1024, "every worker would start %d shard workflows", got)
	})
	t.Run("a start in the future", func(t *testing.T) {
		got := newestLive([]*taskqueuepb.PollerInfo{poller(2, time.Unix(0, 1<<62))}, self, now, time.Minute)
		assert.Equal(t, 4, got, "a poller claiming to start in %d wins over every worker that will ever start", time.Unix(0, 1<<62).Year())
	})
}
