package gateway_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// review30FleetOwnedBy01 is count proxies of maxLeases max, each owned by replica 0 or 1 of
// a set of three, alternately.
func review30FleetOwnedBy01(count, max int) []discovery.Proxy {
	var ps []discovery.Proxy
	for i := 0; len(ps) < count; i++ {
		name := fmt.Sprintf("r%03d", i)
		if discovery.OwnerOf("crawl/"+name, 3) != len(ps)%2 {
			continue
		}
		p := discovery.Proxy{Name: name, Namespace: "crawl", IP: fmt.Sprintf("10.0.2.%d", len(ps)+1), Port: 3128,
			Attributes: map[string]string{"region": "eu"}, LatencyMillis: 10, Healthy: true, Phase: "Ready", MaxLeases: max}
		ps = append(ps, p)
	}
	return ps
}

// TestReview30RenewalStormBehindAHungPeer: the gateway renews its held leases at most 32
// at a time, and with one replica hung every renewal takes the peer timeout (the owner
// waits for every peer's copy, and a renewal forwarded to another owner waits for that
// owner's). A pass over N leases then takes N/32 timeouts: at 10,000 held leases and the
// default 2 s timeout, over ten minutes, against a lease TTL of one minute. The leases at
// the end of the pass have expired before their renewal starts, and are counted free
// while their tunnels are open. Scaled down here: 384 leases of a 6 s TTL, a 1 s peer
// timeout. Expected: one hung replica makes no held lease expire (the two that answer
// renew them all within the TTL).
func TestReview30RenewalStormBehindAHungPeer(t *testing.T) {
	rs := newReplicaSet(t, 3, review30FleetOwnedBy01(8, 64))
	const n = 384
	var ids []string
	for len(ids) < n {
		l, err := rs.Client(len(ids)%2).Acquire(context.Background(), dclient.AcquireRequest{TTL: 6 * time.Second})
		require.NoError(t, err)
		ids = append(ids, l.ID)
	}
	g := gateway.New(gateway.Config{LeaseTTL: 6 * time.Second}, rs.Nodes[0].API, slog.New(slog.DiscardHandler), nil)
	for _, id := range ids {
		g.Hold(id, "Bearer "+testToken)
	}
	rs.BlackHole(2)
	start := time.Now()
	g.RenewPass(context.Background())
	t.Logf("a pass over %d leases took %s", n, time.Since(start).Round(time.Millisecond))
	expired := 0
	now := time.Now()
	for _, id := range ids {
		owner, _ := discovery.LeaseOwner(id)
		rec, ok := rs.Nodes[owner].Store.Record(id)
		if !ok || rec.Ended || !rec.Expires.After(now) {
			expired++
		}
	}
	require.Zero(t, expired, "held leases that expired before their renewal while one replica hung, of %d", n)
}
