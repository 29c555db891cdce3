package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestShardIdentityRoundTrips(t *testing.T) {
	at := time.Date(2026, 12, 2, 6, 0, 0, 123456789, time.UTC)
	id := shardIdentity("4242@worker-7f9c-x", 16, at)
	got, ok := parseShardIdentity(id)
	require.True(t, ok, id)
	assert.Equal(t, 16, got.count)
	assert.True(t, got.started.Equal(at))
	for _, bad := range []string{"4242@host", "4242@host@shards=0@started=1", "4242@host@shards=x@started=1", "4242@host@shards=3", "", "temporal-cli@laptop"} {
		_, ok := parseShardIdentity(bad)
		assert.False(t, ok, bad)
	}
}

// TestShardCountFollowsTheWorkersThatRemain: the count is the newest live worker's. A
// worker of the old count that restarts mid-rollout is the newest while it polls; once it
// has not polled for the liveness window, the workers that remain go back to their count,
// which the rule of "shards started after me" never did (the restarted worker's shards
// stay newer than everyone after it is gone).
func TestShardCountFollowsTheWorkersThatRemain(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	poller := func(count int, started, seen time.Time) *taskqueuepb.PollerInfo {
		return &taskqueuepb.PollerInfo{Identity: shardIdentity("1@h", count, started), LastAccessTime: timestamppb.New(seen)}
	}
	const live = 3 * time.Minute
	newBuild := shardPoller{count: 3, started: t0.Add(time.Minute)}
	restarted := poller(2, t0.Add(5*time.Minute), t0.Add(6*time.Minute))

	// While the restarted old worker polls, it is the newest: everyone keeps 2.
	now := t0.Add(7 * time.Minute)
	assert.Equal(t, 2, newestLive([]*taskqueuepb.PollerInfo{restarted, poller(3, newBuild.started, now)}, newBuild, now, live))
	// Gone (it last polled at 6m): past the liveness window only the new build is left.
	now = t0.Add(10 * time.Minute)
	assert.Equal(t, 3, newestLive([]*taskqueuepb.PollerInfo{restarted, poller(3, newBuild.started, now)}, newBuild, now, live))
	// The old worker's own view agrees while it lives.
	old := shardPoller{count: 2, started: t0.Add(5 * time.Minute)}
	now = t0.Add(7 * time.Minute)
	assert.Equal(t, 2, newestLive([]*taskqueuepb.PollerInfo{poller(3, newBuild.started, now)}, old, now, live))
	// Identities of other builds or tools have no say; a tie goes to the larger count.
	assert.Equal(t, 3, newestLive([]*taskqueuepb.PollerInfo{{Identity: "9@cli", LastAccessTime: timestamppb.New(now)}}, newBuild, now, live))
	assert.Equal(t, 5, newestLive([]*taskqueuepb.PollerInfo{poller(5, newBuild.started, now)}, newBuild, now, live))
	assert.Equal(t, 5, newestLive([]*taskqueuepb.PollerInfo{poller(3, newBuild.started, now)}, shardPoller{count: 5, started: newBuild.started}, now, live))
}
