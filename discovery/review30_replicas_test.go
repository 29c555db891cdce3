package discovery_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
)

// review30FleetOwnedBy is count proxies of maxLeases max, every one owned by replica owner
// of a set of n.
func review30FleetOwnedBy(owner, n, count, max int) []discovery.Proxy {
	var ps []discovery.Proxy
	for i := 0; len(ps) < count; i++ {
		name := fmt.Sprintf("q%03d", i)
		if discovery.OwnerOf("crawl/"+name, n) != owner {
			continue
		}
		p := proxy(name, 10, true, map[string]string{"region": "eu"})
		p.IP, p.MaxLeases = fmt.Sprintf("10.0.1.%d", len(ps)+1), max
		ps = append(ps, p)
	}
	return ps
}

// TestReview30SlowPeerLeavesOrphanGrants: with one replica hung (not down: it accepts and
// never answers), a crawler that acquires through replica 0 a proxy that replica 1 owns is
// told 503 replicas_unavailable, yet replica 1 did grant the lease: it waited for the hung
// replica's copy for as long as replica 0 waited for it (both the peer timeout), so
// replica 0 gave up first. Nobody holds that lease, and its slot stays taken for the
// whole TTL (5 minutes here, up to an hour): the only slot of the fleet is gone, and the
// crawler's retry gets a 409. Expected: a grant whose asker gave up holds no slot (the
// owner answers within the asker's timeout, or ends a grant its asker never received).
//
// Met by the first: an owner waits for its peers' copies half the peer timeout at most,
// so the crawler gets the lease (replica 0 holds the copy), and the slot it holds is the
// crawler's, freed by its release. The second is TestReview30AskerGoneEndsTheGrant.
func TestReview30SlowPeerLeavesOrphanGrants(t *testing.T) {
	fleet := review30FleetOwnedBy(1, 3, 1, 1)
	rs := newReplicaSet(t, 3, fleet)
	rs.BlackHole(2)
	ctx := context.Background()
	l, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}})
	require.NoError(t, err, "replica 1 answers before replica 0 gives up")
	_, ok := rs.Nodes[0].Store.Record(l.ID)
	require.True(t, ok, "replica 0 holds the lease's copy")
	require.Equal(t, 1, rs.Nodes[1].Store.Stats().Leases)
	require.NoError(t, rs.Client(0).Release(ctx, l.ID))
	require.Zero(t, rs.Nodes[1].Store.Stats().Leases, "the crawler's release freed the only slot")
	l, err = rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}})
	require.NoError(t, err, "the slot is free again")
	require.NoError(t, rs.Client(0).Release(ctx, l.ID))
}

// TestReview30AskerGoneEndsTheGrant: a replica that asked an owner for a grant and gave up
// before the answer (its timeout, shorter here than the owner's wait for a hung peer's
// copy) received no lease, so the owner ends the one it granted instead of holding its
// slot for the TTL.
func TestReview30AskerGoneEndsTheGrant(t *testing.T) {
	rs := newReplicaSet(t, 3, review30FleetOwnedBy(1, 3, 1, 1))
	rs.BlackHole(2)
	body := `{"proxyID":"` + review30FleetOwnedBy(1, 3, 1, 1)[0].Namespace + "/" + review30FleetOwnedBy(1, 3, 1, 1)[0].Name +
		`","selector":{"region":"eu"},"ttlSeconds":300}`
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rs.URLs[1]+"/peer/v1/grant", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+peerToken)
	req.Header.Set("Content-Type", "application/json")
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err, "the owner answers once it stopped waiting for the hung replica's copy")
	require.Eventually(t, func() bool { return rs.Nodes[1].Store.Stats().Leases == 0 }, 5*time.Second, 10*time.Millisecond,
		"replica 1 holds a lease no replica received")
	// Replica 0 picks over the copies it holds: the ended lease's copy reaches it after
	// the owner ended it.
	require.Eventually(t, func() bool { return rs.Nodes[0].Store.Stats().Leases == 0 }, 5*time.Second, 10*time.Millisecond,
		"replica 0 never learnt that the grant ended")
	l, err := rs.Client(0).Acquire(context.Background(), dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}})
	require.NoError(t, err, "the only slot is free")
	require.NoError(t, rs.Client(0).Release(context.Background(), l.ID))
}

// TestReview30SessionsForgottenByARestartedReplica: a session is remembered for an hour
// after its last lease, on every replica, and a report by session works through any of
// them. But a replica that restarts (a rollout restarts them all) restores only leases:
// a session whose latest lease has ended (the gateway's per-request leases end as each
// request does, and an API crawler releases when done) comes back with no session, since
// an ended lease's copy drops it. A report by session through the restarted replica
// answers 404 unknown_session, for a lease that still takes reports on its owner.
// Expected: the restarted replica knows the session as its peers still do (204).
func TestReview30SessionsForgottenByARestartedReplica(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(6, 2))
	ctx := context.Background()
	const session = "basket-9"
	l, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, Session: session})
	require.NoError(t, err)
	require.NoError(t, rs.Client(0).Release(ctx, l.ID))
	for i := range 3 {
		status, body := reportBySession(t, rs.URLs[i], session)
		require.Equal(t, http.StatusNoContent, status, "replica %d right after the release: %s", i, body)
	}
	for i := range 3 {
		rs.Kill(i)
		rs.Start(i)
		rs.WaitReady(i)
		status, body := reportBySession(t, rs.URLs[i], session)
		require.Equal(t, http.StatusNoContent, status, "replica %d after its restart: %s", i, body)
	}
}

// TestReview30HangUpMarksAHealthyOwnerDown: a replica that asks a proxy's owner for a
// grant on behalf of a crawler does so in the crawler's request context; when the crawler
// hangs up meanwhile the call fails, and the replica marks the owner down for 2 s, passing
// over every proxy it owns: the next crawlers through that replica get 503
// replicas_unavailable though the owner is fine. A crawler that sends an acquire and hangs
// up (a client timeout, a crawler killed, the gateway's crawlers hanging up as they wait)
// so takes a healthy replica's proxies away from everyone, for as long as it goes on. And
// if the owner had granted already, that lease is nobody's and holds its slot for its
// TTL. Expected: a crawler leaving marks nobody down, and leaves no lease behind.
func TestReview30HangUpMarksAHealthyOwnerDown(t *testing.T) {
	rs := newReplicaSet(t, 3, review30FleetOwnedBy(1, 3, 4, 4))
	ctx := context.Background()
	body := `{"selector":{"region":"eu"},"ttlSeconds":600}`
	unavailable := 0
	for range 50 {
		c, err := net.Dial("tcp", rs.Addrs[0])
		require.NoError(t, err)
		_, err = io.WriteString(c, "POST /v1/leases HTTP/1.1\r\nHost: "+rs.Addrs[0]+"\r\nAuthorization: Bearer "+testToken+
			"\r\nContent-Type: application/json\r\nContent-Length: "+fmt.Sprint(len(body))+"\r\n\r\n"+body)
		require.NoError(t, err)
		require.NoError(t, c.Close()) // the crawler gives up at once
		l, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}})
		if dclient.IsReplicasUnavailable(err) {
			unavailable++
			continue
		}
		if dclient.IsNoMatch(err) {
			continue // the hung-up crawlers' leases took the slots (see below)
		}
		require.NoError(t, err)
		require.NoError(t, rs.Client(0).Release(ctx, l.ID))
	}
	t.Logf("leases replica 1 holds for crawlers that hung up: %d", rs.Nodes[1].Store.Stats().Leases)
	require.Zero(t, unavailable, "acquires through replica 0 refused as if replica 1, which owns every proxy and answers, were down")
}
