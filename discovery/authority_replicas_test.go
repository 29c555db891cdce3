package discovery_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// The invariant "one authority per lease" (docs/architecture.md, Replicas) over three
// real replicas talking HTTP. The store-level halves are in authority_test.go.

// TestReplicasRenewalRacingAPeerSweepSurvivesOwnerRestart: a lease granted by replica A
// (its owner) whose copy on peer B is swept as expired just as the crawler renews through
// A. B's clock runs ahead of A's, so B's sweeper ends its copy, and only then does A's
// renewal reach it: the order of a real race in which the sweep wins, made deterministic.
// B keeps the owner's version when it ends its copy, so the renewal still applies there.
// Then A is killed and restarted, restoring its leases from B first (the lower replica
// number of its peers) and C: the crawler's next renewal, through any replica, succeeds,
// and every replica counts the lease on its proxy, which no acquire is given.
//
// Before, B bumped the version as it swept, dropped A's renewal as stale, and A came back
// with the lease ended: the renewal answered 410 lease_expired and its slot was free.
func TestReplicasRenewalRacingAPeerSweepSurvivesOwnerRestart(t *testing.T) {
	const n = 6
	rs := newReplicaSet(t, 3, replicaFleet(n, 1))
	ctx := context.Background()
	const ttl = time.Minute
	l, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: ttl})
	require.NoError(t, err)
	a, ok := discovery.LeaseOwner(l.ID)
	require.True(t, ok)
	// B is the peer A restores from first, C the other.
	others := []int{}
	for i := range 3 {
		if i != a {
			others = append(others, i)
		}
	}
	b, c := others[0], others[1]
	for i := range 3 {
		require.Eventually(t, func() bool { rec, ok := rs.Nodes[i].Store.Record(l.ID); return ok && !rec.Ended },
			5*time.Second, 5*time.Millisecond, "replica %d holds the lease", i)
	}
	granted, _ := rs.Nodes[a].Store.Record(l.ID)

	// B's clock reaches the lease's expiry (not the end of its report window) while A's
	// and C's do not, and B sweeps.
	clk := testenv.NewClock(rs.Nodes[b].Store.Now().Add(ttl + time.Minute))
	rs.Nodes[b].Store.SetClock(clk.Now)
	rs.Nodes[b].Store.Sweep()
	swept, ok := rs.Nodes[b].Store.Record(l.ID)
	require.True(t, ok, "B keeps its ended copy for reports")
	require.True(t, swept.Ended, "B's sweep ended its copy: the race is on")
	assert.Equal(t, granted.Version, swept.Version, "only the owner changes a lease's version")

	// The crawler renews through A, the owner, which copies the renewal to both peers
	// before it answers.
	r, err := rs.Client(a).Renew(ctx, l.ID, 5*time.Minute)
	require.NoError(t, err, "the renewal before the restart")
	assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
	for i := range 3 {
		rec, ok := rs.Nodes[i].Store.Record(l.ID)
		assert.True(t, ok && !rec.Ended, "replica %d holds the renewed lease: %+v", i, rec)
	}

	rs.Kill(a)
	rs.Start(a)
	rs.WaitReady(a)

	for _, via := range []int{a, b, c} {
		r, err := rs.Client(via).Renew(ctx, l.ID, 5*time.Minute)
		require.NoError(t, err, "renewal through replica %d after owner %d restarted (B=%d swept)", via, a, b)
		assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
	}
	for i := range 3 {
		list, err := rs.Client(i).ListProxies(ctx, map[string]string{"region": "eu"}, nil)
		require.NoError(t, err)
		held := -1
		for _, p := range list.Proxies {
			if p.IP == l.Proxy.IP {
				held = p.ActiveLeases
			}
		}
		assert.Equal(t, 1, held, "replica %d counts the lease on its proxy %s", i, l.Proxy.IP)
	}
	// Through the replica that swept, every other slot is granted, and this one is not.
	more := acquireAll(t, rs.Client(b))
	assert.Len(t, more, n-1, "every other proxy's slot")
	for _, m := range more {
		assert.NotEqual(t, l.Proxy.IP, m.Proxy.IP, "the held lease's proxy was granted again: counted free")
	}
}

// TestReplicasKeepSessionsKnownWhileRenewed: a session's lease renewed by its owner keeps
// the session known on all three replicas, past the time a session is kept idle
// (StoreConfig.SessionIdle, 1h): a report by session through every replica finds it at
// each renewal. The replicas share a clock that the test moves.
//
// Before, only the owner's renewals touched the session; the peers forgot it an hour
// after the grant and answered 404 unknown_session.
func TestReplicasKeepSessionsKnownWhileRenewed(t *testing.T) {
	rs := newReplicaSet(t, 3, replicaFleet(6, 2))
	clk := testenv.NewClock(time.Now())
	for i := range 3 {
		rs.Nodes[i].Store.SetClock(clk.Now)
	}
	ctx := context.Background()
	const session = "basket-7"
	l, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, Session: session, TTL: 30 * time.Minute})
	require.NoError(t, err)
	owner, ok := discovery.LeaseOwner(l.ID)
	require.True(t, ok)
	for i := range 3 {
		status, body := reportBySession(t, rs.URLs[i], session)
		require.Equal(t, http.StatusNoContent, status, "replica %d right after the grant: %s", i, body)
	}

	const step = 20 * time.Minute
	idle := discovery.DefaultSessionIdle
	for elapsed := step; elapsed <= idle+2*step; elapsed += step {
		clk.Advance(step)
		r, err := rs.Client(owner).Renew(ctx, l.ID, 30*time.Minute)
		require.NoError(t, err, "renewal %v after the grant", elapsed)
		assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
		for i := range 3 {
			status, body := reportBySession(t, rs.URLs[i], session)
			require.Equal(t, http.StatusNoContent, status,
				"report by session through replica %d (owner %d), %v after the grant: %s", i, owner, elapsed, body)
			id, ok := rs.Nodes[i].Store.SessionLease(discovery.DefaultClientName, session)
			require.True(t, ok, "replica %d knows the session", i)
			assert.Equal(t, l.ID, id, "replica %d's session is the renewed lease", i)
		}
	}
}

// reportBySession reports a success on session through the replica at base, with the
// crawlers' token, and returns the status and the error code, if any.
func reportBySession(t *testing.T, base, session string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/sessions/"+session+"/report", strings.NewReader(`{"result":"ok"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var ae discovery.APIError
	if json.Unmarshal(body, &ae) == nil && ae.Code != "" {
		return resp.StatusCode, ae.Code
	}
	return resp.StatusCode, string(body)
}
