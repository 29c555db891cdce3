package discovery_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
)

// TestRotationThroughOneReplicaSpreadsOverTheFleet: acquire+release pairs through one
// replica of three walk the whole fleet, whichever replica owns each proxy. The copy of a
// lease a peer granted moves its proxy back in this replica's rotation, as a grant of its
// own does; before, twelve pairs over six idle proxies all went to one proxy that another
// replica owned.
func TestRotationThroughOneReplicaSpreadsOverTheFleet(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(6, 4))
	c := rs.Client(0)
	ctx := context.Background()
	used := map[string]int{}
	const pairs = 1000
	for range pairs {
		l, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: time.Minute})
		if dclient.IsReplicasUnavailable(err) {
			continue
		}
		require.NoError(t, err)
		used[l.Proxy.IP]++
		require.NoError(t, c.Release(ctx, l.ID))
	}
	require.Len(t, used, 6, "every proxy is used: %v", used)
	counts := make([]int, 0, len(used))
	for _, n := range used {
		counts = append(counts, n)
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	t.Logf("rotation through one replica of three, %d pairs over 6 proxies: %v (max/min %.2f)", pairs, used, float64(hi)/float64(lo))
	assert.LessOrEqual(t, float64(hi)/float64(lo), 1.5, "rotation max/min over %d pairs: %v", pairs, used)
}

// TestPeerSweepDoesNotOutvoteTheOwner: a non-owner that ends its copy of a lease (its
// sweep found it expired) does not change the lease's version, which only the owner does:
// the owner's renewal at that moment still applies there.
func TestPeerSweepDoesNotOutvoteTheOwner(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	peer := discovery.NewStoreWith(discovery.StoreConfig{Replica: 1, KeepEnded: time.Hour})
	peer.SetClock(func() time.Time { return now })
	rec := discovery.LeaseRecord{ID: ownedLeaseID(t, 0), Version: 3, ProxyID: "crawl/p", IP: "10.0.0.1", Port: 3128,
		Client: "shop", Expires: now.Add(time.Second)}
	peer.Apply([]discovery.LeaseRecord{rec})
	now = now.Add(2 * time.Second)
	peer.Sweep()
	got, ok := peer.Record(rec.ID)
	require.True(t, ok)
	assert.True(t, got.Ended, "the copy expired here")
	assert.Equal(t, uint64(3), got.Version, "only the owner changes the version")

	renewed := rec
	renewed.Version, renewed.Expires = 4, now.Add(time.Minute)
	peer.Apply([]discovery.LeaseRecord{renewed})
	got, _ = peer.Record(rec.ID)
	assert.False(t, got.Ended, "the owner's renewal made as the copy expired applies")
	assert.Equal(t, uint64(4), got.Version)
}

// ownedLeaseID is a lease ID that replica owner granted.
func ownedLeaseID(t *testing.T, owner byte) string {
	t.Helper()
	return hex.EncodeToString(append([]byte{owner}, bytes.Repeat([]byte{0x5a}, 15)...))
}

// TestSessionsStayKnownOnPeersWhileRenewed: a session's lease renewed by its owner keeps
// the session known on every replica, so a report by session through any of them finds
// it after the idle time has passed since the grant.
func TestSessionsStayKnownOnPeersWhileRenewed(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	peer := discovery.NewStoreWith(discovery.StoreConfig{Replica: 1, KeepEnded: time.Hour, SessionIdle: time.Hour})
	peer.SetClock(func() time.Time { return now })
	rec := discovery.LeaseRecord{ID: ownedLeaseID(t, 0), Version: 1, ProxyID: "crawl/p", IP: "10.0.0.1", Port: 3128,
		Client: "shop", Session: "basket-7", Expires: now.Add(40 * time.Minute)}
	peer.Apply([]discovery.LeaseRecord{rec})
	for i := range 3 {
		now = now.Add(30 * time.Minute)
		rec.Version, rec.Expires = rec.Version+1, now.Add(40*time.Minute)
		peer.Apply([]discovery.LeaseRecord{rec})
		id, ok := peer.SessionLease("shop", "basket-7")
		require.True(t, ok, "the session is forgotten on a peer %v after its grant, though renewed", time.Duration(i+1)*30*time.Minute)
		assert.Equal(t, rec.ID, id)
	}
}

// TestReportCountsReachThePeers: a report counted against a lease's cap is in the copies
// the peers hold, so an owner restored from them still holds the lease to its cap.
func TestReportCountsReachThePeers(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(6, 4))
	ctx := context.Background()
	c := rs.Client(0)
	l, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, c.Report(ctx, l.ID, "banned", "shop.example"))
	owner, _ := discovery.LeaseOwner(l.ID)
	for i := range 3 {
		if i == owner {
			continue
		}
		require.Eventually(t, func() bool {
			rec, ok := rs.Nodes[i].Store.Record(l.ID)
			return ok && rec.Reports == 1
		}, 5*time.Second, 5*time.Millisecond, "replica %d's copy counts the report", i)
	}
}
