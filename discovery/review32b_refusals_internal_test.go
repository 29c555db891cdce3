package discovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReview32bOldRefusalsLeaveTheGrantPath: a grant skips the demand book's lock only
// while the book holds no refusal (held == 0). Refusals are dropped only when another
// refusal is noted (pruneLocked), so once a pool has grown and nobody is refused any
// more, the last burst's refusals stay in the book for good, long past RefusalWindow:
// every grant of every client, on the hot path, takes the book's lock and builds a key
// for a refusal that counts for nothing.
func TestReview32bOldRefusalsLeaveTheGrantPath(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	store := NewStore(time.Hour)
	store.SetClock(func() time.Time { return now })
	pool := Selector{"pool": "eu"}
	store.ReplaceAll([]Proxy{{Name: "eu-0", Namespace: "crawl", IP: "10.0.0.1", Port: 3128, Healthy: true,
		Phase: "Ready", MaxLeases: 1, Attributes: pool}})
	s := NewServer(Config{}, store, nil, nil, nil, nil)
	ctx := context.Background()
	s.Demand(pool) // an autoscaler watches the pool

	held, err := s.Grant(ctx, Want{Client: "a", Selector: pool, TTL: time.Minute}, nil)
	require.NoError(t, err)
	_, err = s.GrantWaiting(ctx, Want{Client: "b", Selector: pool, TTL: time.Minute}, 0)
	require.Error(t, err)
	require.EqualValues(t, 1, s.demand.held.Load())

	// Long after the window: b's refusal counts for nothing.
	now = now.Add(10 * RefusalWindow)
	require.Zero(t, s.Demand(pool).Refused)
	s.ReleaseOwned("a", held.LeaseID)
	_, err = s.Grant(ctx, Want{Client: "a", Selector: pool, TTL: time.Minute}, nil)
	require.NoError(t, err)
	require.EqualValues(t, 0, s.demand.held.Load(),
		"a refusal %s old still sends every grant through the demand book's lock", 10*RefusalWindow)
}
