package discovery

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAcquireWaitEndsAGrantForACrawlerThatLeft: a lease granted to a waiting acquire whose
// crawler left at that moment is ended, not held for its TTL. The crawler leaves as the
// slot frees up (a hook on the store's changes cancels its request), so its wake and its
// departure arrive together; whichever the wait sees first, no lease is left held, and
// across the runs the grant-then-end path is taken.
func TestAcquireWaitEndsAGrantForACrawlerThatLeft(t *testing.T) {
	store := NewStore(time.Hour)
	store.ReplaceAll([]Proxy{{Name: "only", Namespace: "crawl", IP: "10.0.0.1", Port: 3128, Healthy: true,
		Phase: "Ready", MaxLeases: 1}})
	s := NewServer(Config{}, store, nil, nil, nil, nil)
	var (
		mu     sync.Mutex
		cancel context.CancelFunc
	)
	store.notifyFreed(func() {
		mu.Lock()
		defer mu.Unlock()
		if cancel != nil {
			cancel()
		}
	})
	ended := 0
	for run := 0; run < 200 && ended < 3; run++ {
		held, err := s.Grant(context.Background(), Want{TTL: time.Minute}, nil)
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.Background())
		mu.Lock()
		cancel = stop
		mu.Unlock()
		done := make(chan error, 1)
		go func() {
			_, err := s.GrantWaiting(ctx, Want{TTL: time.Minute}, time.Minute)
			done <- err
		}()
		require.Eventually(t, func() bool { return s.Waiting() == 1 }, 10*time.Second, time.Millisecond)
		grants := store.grantCount()
		s.ReleaseOwned("", held.LeaseID) // frees the slot and, through the hook, cancels ctx
		require.Error(t, <-done)
		mu.Lock()
		cancel = nil
		mu.Unlock()
		stop()
		require.Equal(t, 0, store.Stats().Leases, "run %d: no lease held for the crawler that left", run)
		if store.grantCount() > grants {
			ended++
		}
	}
	require.Positive(t, ended, "the grant made as the crawler left was never taken")
}

// grantCount is how many leases the store has granted.
func (s *Store) grantCount() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants
}
