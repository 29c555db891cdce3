package discovery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/service/servicetest"
)

const peerToken = servicetest.PeerToken

// replicaSet is discovery's replicas in this process (servicetest), each built as the
// process builds it, with this package's API configuration.
type replicaSet = servicetest.ReplicaSet

func newReplicaSet(t testing.TB, n int, fleet []discovery.Proxy, configure ...func(*discovery.Config)) *replicaSet {
	opts := servicetest.Options{Config: defaultConfig(), KeepEnded: keepExpired}
	if len(configure) > 0 {
		opts.Configure = configure[0]
	}
	return servicetest.NewReplicaSet(t, n, fleet, opts)
}

// replicaFleet is n healthy proxies taking max leases each.
func replicaFleet(n, max int) []discovery.Proxy {
	var ps []discovery.Proxy
	for i := range n {
		p := proxy(fmt.Sprintf("p%02d", i), 10, true, map[string]string{"region": "eu"})
		p.IP, p.MaxLeases = fmt.Sprintf("10.0.0.%d", i+1), max
		ps = append(ps, p)
	}
	return ps
}

// acquireAll acquires through c until a 409, retrying 503s (an owner busy or
// restarting), and returns what it got.
func acquireAll(t *testing.T, c *dclient.Client) []*dclient.Lease {
	return acquireUntil(t, c, dclient.IsNoMatch)
}

// acquireUntil acquires through c until an error stop accepts, retrying 503s
// replicas_unavailable that it does not.
func acquireUntil(t *testing.T, c *dclient.Client, stop func(error) bool) []*dclient.Lease {
	t.Helper()
	var got []*dclient.Lease
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		l, err := c.Acquire(context.Background(), dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: 5 * time.Minute})
		switch {
		case err == nil:
			got = append(got, l)
		case stop(err):
			return got
		case dclient.IsReplicasUnavailable(err):
		default:
			require.NoError(t, err)
		}
	}
	t.Fatal("acquire never reached a 409")
	return nil
}

// perProxy counts leases by proxy address.
func perProxy(ls []*dclient.Lease) map[string]int {
	n := map[string]int{}
	for _, l := range ls {
		n[l.Proxy.IP]++
	}
	return n
}

// TestReplicasShareMaxLeases: crawlers racing through three replicas get exactly the
// fleet's capacity, never more than maxLeases of any proxy in total.
func TestReplicasShareMaxLeases(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(12, 2))
	var mu sync.Mutex
	var all []*dclient.Lease
	var wg sync.WaitGroup
	for g := range 9 {
		wg.Go(func() {
			got := acquireAll(t, rs.Client(g%3))
			mu.Lock()
			defer mu.Unlock()
			all = append(all, got...)
		})
	}
	wg.Wait()
	assert.Len(t, all, 24, "every slot of 12 proxies × 2 granted once")
	for ip, n := range perProxy(all) {
		assert.LessOrEqual(t, n, 2, "proxy %s over-subscribed", ip)
	}
	owners := map[int]bool{}
	for _, l := range all {
		o, ok := discovery.LeaseOwner(l.ID)
		require.True(t, ok)
		owners[o] = true
	}
	assert.Len(t, owners, 3, "every replica owns some proxies")
}

// TestReplicaKilledLosesNoLease: a replica killed and started afresh takes its leases back
// from the others before serving them. While it is down, renewals of its leases answer
// 503 replicas_unavailable with a Retry-After, and the others keep granting; afterwards
// every lease renews, reports and releases through any replica, and no proxy is
// over-subscribed.
func TestReplicaKilledLosesNoLease(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(6, 2))
	ctx := context.Background()
	var held []*dclient.Lease
	for i := range 9 {
		l, err := rs.Client(i%3).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: 5 * time.Minute})
		require.NoError(t, err)
		held = append(held, l)
	}
	ownedBy1 := slices.IndexFunc(held, func(l *dclient.Lease) bool { o, _ := discovery.LeaseOwner(l.ID); return o == 1 })
	require.GreaterOrEqual(t, ownedBy1, 0, "replica 1 owns one of the leases")

	rs.Kill(1)
	_, err := rs.Client(0).Renew(ctx, held[ownedBy1].ID, 5*time.Minute)
	require.True(t, dclient.IsReplicasUnavailable(err), "renewal while its owner is down: %v", err)
	var e *dclient.Error
	require.True(t, errors.As(err, &e))
	assert.Positive(t, e.RetryAfter(), "says when to retry")
	// The others still grant on their own proxies. Once those are full the answer is a
	// 503, not a 409, if the dead replica's proxies may have free slots.
	more := acquireUntil(t, rs.Client(2), func(err error) bool { return dclient.IsNoMatch(err) || dclient.IsReplicasUnavailable(err) })
	for _, l := range more {
		o, _ := discovery.LeaseOwner(l.ID)
		assert.NotEqual(t, 1, o, "nothing granted on the dead replica's proxies")
	}
	held = append(held, more...)

	rs.Start(1)
	rs.WaitReady(1)
	for i, l := range held {
		via := (i + 1) % 3
		r, err := rs.Client(via).Renew(ctx, l.ID, 5*time.Minute)
		require.NoError(t, err, "renew lease %d through replica %d", i, via)
		assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
	}
	require.NoError(t, rs.Client(2).Report(ctx, held[ownedBy1].ID, "ok", ""))

	held = append(held, acquireAll(t, rs.Client(1))...)
	assert.Len(t, held, 12, "exactly the fleet's capacity is held: the restarted replica counted the leases it had granted")
	for ip, n := range perProxy(held) {
		assert.LessOrEqual(t, n, 2, "proxy %s over-subscribed", ip)
	}

	require.NoError(t, rs.Client(0).Release(ctx, held[ownedBy1].ID))
	again := acquireAll(t, rs.Client(2))
	require.Len(t, again, 1, "the released slot is free on every replica, and only it")
	assert.Equal(t, held[ownedBy1].Proxy.IP, again[0].Proxy.IP)
}

// TestReplicaWaitsForEveryPeer: a replica that starts while a peer is down is not ready and
// serves none of its own leases until it has heard from every peer, since the one that is
// down may hold the only copy of a change.
func TestReplicaWaitsForEveryPeer(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(6, 1))
	ctx := context.Background()
	var mine *dclient.Lease
	for mine == nil {
		l, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}})
		require.NoError(t, err)
		if o, _ := discovery.LeaseOwner(l.ID); o == 0 {
			mine = l
		}
	}
	rs.Kill(0)
	rs.Kill(2)
	rs.Start(0)
	resp, err := http.Get(rs.URLs[0] + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "not ready while replica 2 cannot be asked")
	_, err = rs.Client(0).Renew(ctx, mine.ID, time.Minute)
	assert.True(t, dclient.IsReplicasUnavailable(err), "its own leases wait: %v", err)

	rs.Start(2)
	rs.WaitReady(0)
	r, err := rs.Client(0).Renew(ctx, mine.ID, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, mine.Proxy.IP, r.Proxy.IP)
}

// TestPeerRoutesAreForReplicas: a crawler's token does not open the routes replicas use
// between themselves, so it cannot forge a lease into the table or read everyone's.
func TestPeerRoutesAreForReplicas(t *testing.T) {
	rs := newReplicaSet(t, 2, replicaFleet(2, 1))
	for _, tc := range []struct {
		method, path, body string
	}{
		{http.MethodGet, "/peer/v1/leases?owner=0", ""},
		{http.MethodPost, "/peer/v1/leases", "[]"},
		{http.MethodPost, "/peer/v1/grant", `{"proxyID":"crawl/p00"}`},
		{http.MethodPost, "/peer/v1/release", `{"leaseID":"00aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}`},
	} {
		req, err := http.NewRequest(tc.method, rs.URLs[0]+tc.path, strings.NewReader(tc.body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
	}
	req, err := http.NewRequest(http.MethodGet, rs.URLs[0]+"/peer/v1/leases?owner=1", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+peerToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestRestartedReplicaWaitsForItsIndex: a replica that has its leases back but not yet its
// proxy index answers renewals of its leases with 503, not with a proxy_gone for proxies
// it merely has not read yet.
func TestRestartedReplicaWaitsForItsIndex(t *testing.T) {
	rs := newReplicaSet(t, 2, replicaFleet(4, 1))
	ctx := context.Background()
	var mine *dclient.Lease
	for mine == nil {
		l, err := rs.Client(1).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}})
		require.NoError(t, err)
		if o, _ := discovery.LeaseOwner(l.ID); o == 0 {
			mine = l
		}
	}
	rs.Kill(0)
	rs.StartWith(0, false)
	require.Eventually(t, func() bool { return strings.Contains(rs.Nodes[0].Logs.String(), "leases restored") },
		10*time.Second, 10*time.Millisecond, "replica 0 restores its leases")
	_, err := rs.Client(1).Renew(ctx, mine.ID, time.Minute)
	require.True(t, dclient.IsReplicasUnavailable(err), "renewal before the index loads: %v", err)

	rs.Nodes[0].Store.ReplaceAll(rs.Fleet)
	r, err := rs.Client(1).Renew(ctx, mine.ID, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, mine.Proxy.IP, r.Proxy.IP)
}

// BenchmarkReplicatedAcquireRelease measures acquire+release pairs over HTTP on loopback
// through the Go client, 64 concurrent crawlers, 1,000 proxies with 4 slots each: one
// discovery alone (the baseline) and three replicas (each crawler on one replica, as a
// keep-alive connection through a Service is), all in this process on the same cores.
//
//	go test ./discovery -run '^$' -bench ReplicatedAcquireRelease -benchtime 20000x
func BenchmarkReplicatedAcquireRelease(b *testing.B) {
	const crawlers = 64
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			rs := newReplicaSet(b, n, replicaFleet(1000, 4))
			tr := &http.Transport{MaxIdleConnsPerHost: crawlers}
			clients := make([]*dclient.Client, n)
			for i := range clients {
				clients[i] = dclient.New(rs.URLs[i], testToken, dclient.WithHTTPClient(&http.Client{Transport: tr}))
			}
			ctx := context.Background()
			var next atomic.Int64
			lat := make([][]time.Duration, crawlers)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for g := range crawlers {
				wg.Go(func() {
					c := clients[g%n]
					for next.Add(1) <= int64(b.N) {
						t0 := time.Now()
						l, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: time.Minute})
						if err != nil {
							b.Error(err)
							return
						}
						lat[g] = append(lat[g], time.Since(t0))
						if err := c.Release(ctx, l.ID); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			var all []time.Duration
			for _, l := range lat {
				all = append(all, l...)
			}
			slices.Sort(all)
			b.ReportMetric(float64(b.N)/took.Seconds(), "pairs/s")
			b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-acquire-ms")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-acquire-ms")
		})
	}
}

// TestReplicasHoldClientLimits: a client's lease cap holds across the replicas (each
// counts the client's leases in the whole table), and a request one replica forwards to
// the lease's owner is counted against the client's rate where it arrived, not twice.
func TestReplicasHoldClientLimits(t *testing.T) {
	cfgs, err := discovery.ParseClients([]byte(fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n    maxLeases: 3\n"+
		"  - name: news\n    token: %s\n    requestsPerSecond: 0.001\n    burst: 1\n", shopToken, newsToken)))
	require.NoError(t, err)
	rs := newReplicaSet(t, 3, replicaFleet(9, 4), func(c *discovery.Config) {
		c.Token, c.Clients = "", discovery.NewClients(cfgs)
	})
	ctx := context.Background()
	shop := func(i int) *dclient.Client { return dclient.New(rs.URLs[i], shopToken) }
	for i := range 3 {
		_, err := shop(i).Acquire(ctx, dclient.AcquireRequest{})
		require.NoError(t, err)
	}
	for i := range 3 {
		_, err := shop(i).Acquire(ctx, dclient.AcquireRequest{})
		var e *dclient.Error
		require.True(t, errors.As(err, &e), "%v", err)
		assert.Equal(t, "lease_limit", e.Code, "through replica %d", i)
		assert.Equal(t, http.StatusTooManyRequests, e.Status)
	}

	// Each replica has its own bucket for news, of one request.
	news := func(i int) *dclient.Client { return dclient.New(rs.URLs[i], newsToken) }
	l, err := news(1).Acquire(ctx, dclient.AcquireRequest{})
	require.NoError(t, err)
	owner, _ := discovery.LeaseOwner(l.ID)
	if owner != 1 {
		_, err := news(owner).ListProxies(ctx, nil, nil)
		require.NoError(t, err, "spends the owner's request")
	}
	via := 0
	if owner != 1 {
		via = 3 - 1 - owner
	}
	_, err = news(via).Renew(ctx, l.ID, time.Minute)
	require.NoError(t, err, "a renewal through replica %d, forwarded to replica %d whose bucket is empty, is counted once", via, owner)
	_, err = news(via).Renew(ctx, l.ID, time.Minute)
	var e *dclient.Error
	require.True(t, errors.As(err, &e), "%v", err)
	assert.Equal(t, "too_many_requests", e.Code, "replica %d's own bucket is spent", via)
	assert.Positive(t, e.RetryAfter())
}
