package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Leases belong to the client that took them (issue 30): to any other client a lease is
// as unknown as an ID never granted, whichever replica the request reaches.

// ownerFleet is replicaFleet with credentials, so that an answer that carries them shows.
func ownerFleet(n, max int) []discovery.Proxy {
	fleet := replicaFleet(n, max)
	for i := range fleet {
		fleet[i].Credentials = proxyauth.Credentials{Username: "proxyfleet", Password: fmt.Sprintf("owner-secret-%d-Kq2", i)}
	}
	return fleet
}

// twoClients configures the clients shop and news.
func twoClients(t testing.TB) func(*discovery.Config) {
	cfgs, err := discovery.ParseClients([]byte(fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n  - name: news\n    token: %s\n",
		shopToken, newsToken)))
	require.NoError(t, err)
	return func(c *discovery.Config) { c.Token, c.Clients = "", discovery.NewClients(cfgs) }
}

// answer is what a crawler sees of an answer.
type answer struct {
	status                  int
	contentType, retryAfter string
	body                    string
}

// ask sends one request to a replica at base with token, and reads the answer.
func ask(t *testing.T, base, token, method, path, body string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		retryAfter: resp.Header.Get("Retry-After"), body: string(b)}
}

// unknownLike is a lease ID never granted that the same replica owns as id, so that a
// request on it takes the same way through the replicas.
func unknownLike(id string) string { return id[:2] + strings.Repeat("5a", 15) }

// leaseOp is one request on a lease, by ID.
type leaseOp struct {
	name, method, suffix, body string
	// wantCode is what it answers on an unknown lease ("" for a 204).
	wantCode string
}

var leaseOps = []leaseOp{
	{"renew", http.MethodPost, "/renew", `{"ttlSeconds":600}`, "unknown_lease"},
	{"report banned", http.MethodPost, "/report", `{"result":"banned","target":"shop.example"}`, "unknown_lease"},
	{"report ok", http.MethodPost, "/report", `{"result":"ok"}`, "unknown_lease"},
	{"release", http.MethodDelete, "", "", ""},
}

// requireAsUnknown checks that a request on lease id got exactly the answer the same
// request got on unknown, an ID never granted: status, headers and body, but for the ID
// it names.
func requireAsUnknown(t *testing.T, op leaseOp, got answer, id string, asUnknown answer, unknown string, msgAndArgs ...any) {
	t.Helper()
	if op.wantCode == "" {
		require.Equal(t, http.StatusNoContent, asUnknown.status, "%s of an unknown lease: %s", op.name, asUnknown.body)
	} else {
		require.Equal(t, http.StatusNotFound, asUnknown.status, "%s of an unknown lease: %s", op.name, asUnknown.body)
		var e discovery.APIError
		require.NoError(t, json.Unmarshal([]byte(asUnknown.body), &e))
		require.Equal(t, op.wantCode, e.Code)
	}
	assert.Equal(t, asUnknown.status, got.status, msgAndArgs...)
	assert.Equal(t, asUnknown.contentType, got.contentType, msgAndArgs...)
	assert.Equal(t, asUnknown.retryAfter, got.retryAfter, msgAndArgs...)
	assert.Equal(t, strings.ReplaceAll(asUnknown.body, unknown, "<id>"), strings.ReplaceAll(got.body, id, "<id>"), msgAndArgs...)
	assert.NotContains(t, got.body, "owner-secret", msgAndArgs...)
}

// cooldowns are the cooldowns of the proxy at ip as the replica at base lists them.
func cooldowns(t *testing.T, base, ip string) map[string]time.Time {
	t.Helper()
	list, err := dclient.New(base, shopToken).ListProxies(context.Background(), nil, nil)
	require.NoError(t, err)
	for _, p := range list.Proxies {
		if p.IP == ip {
			return p.Cooldowns
		}
	}
	t.Fatalf("no proxy at %s", ip)
	return nil
}

// TestLeasesBelongToTheirClient: over HTTP, client news cannot renew, release or report on
// client shop's lease, live or ended, nor report on shop's session: each answer is the
// one an unknown lease or session gets, byte for byte but for the name, and changes
// nothing. shop still can.
func TestLeasesBelongToTheirClient(t *testing.T) {
	rs := newReplicaSet(t, 1, ownerFleet(4, 2), twoClients(t))
	base, ctx := rs.URLs[0], context.Background()
	shop := dclient.New(base, shopToken)
	l, err := shop.Acquire(ctx, dclient.AcquireRequest{Target: "shop.example", Session: "cart", TTL: 5 * time.Minute})
	require.NoError(t, err)
	unknown := unknownLike(l.ID)

	for _, op := range leaseOps {
		got := ask(t, base, newsToken, op.method, "/v1/leases/"+l.ID+op.suffix, op.body)
		asUnknown := ask(t, base, newsToken, op.method, "/v1/leases/"+unknown+op.suffix, op.body)
		requireAsUnknown(t, op, got, l.ID, asUnknown, unknown, "news's %s of shop's lease", op.name)
	}
	// news's session of that name is not shop's.
	for _, result := range []string{"banned", "ok"} {
		body := `{"result":"` + result + `"}`
		got := ask(t, base, newsToken, http.MethodPost, "/v1/sessions/cart/report", body)
		asUnknown := ask(t, base, newsToken, http.MethodPost, "/v1/sessions/never/report", body)
		require.Equal(t, http.StatusNotFound, asUnknown.status, asUnknown.body)
		assert.Equal(t, asUnknown.status, got.status)
		assert.Equal(t, strings.ReplaceAll(asUnknown.body, "never", "<s>"), strings.ReplaceAll(got.body, "cart", "<s>"))
	}

	assert.Empty(t, cooldowns(t, base, l.Proxy.IP), "news's ban reports rested nothing")
	r, err := shop.Renew(ctx, l.ID, 5*time.Minute)
	require.NoError(t, err, "news's release ended nothing")
	assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
	assert.Equal(t, l.Proxy.Password, r.Proxy.Password)
	require.NoError(t, shop.Report(ctx, l.ID, "ok", ""))
	assert.Equal(t, http.StatusNoContent, ask(t, base, shopToken, http.MethodPost, "/v1/sessions/cart/report", `{"result":"ok"}`).status)
	require.NoError(t, shop.Release(ctx, l.ID))

	// Ended, the lease still takes its holder's reports and tells it the lease expired;
	// to news it is still unknown, not expired.
	for _, op := range leaseOps {
		got := ask(t, base, newsToken, op.method, "/v1/leases/"+l.ID+op.suffix, op.body)
		asUnknown := ask(t, base, newsToken, op.method, "/v1/leases/"+unknown+op.suffix, op.body)
		requireAsUnknown(t, op, got, l.ID, asUnknown, unknown, "news's %s of shop's ended lease", op.name)
	}
	_, err = shop.Renew(ctx, l.ID, time.Minute)
	assert.True(t, dclient.IsLeaseGone(err) && !strings.Contains(err.Error(), "unknown_lease"), "shop's renewal: %v", err)
	require.NoError(t, shop.Report(ctx, l.ID, "banned", ""), "shop reports on its ended lease")
	assert.Contains(t, cooldowns(t, base, l.Proxy.IP), "shop.example")
}

// TestReplicasKeepLeasesToTheirClient: with three replicas, news's renewal, report or
// release of shop's lease through any replica, the owner or not, answers as an unknown
// lease of the same owner does, and changes nothing on any replica; shop's go through
// every replica. Sessions are shop's on every replica too.
func TestReplicasKeepLeasesToTheirClient(t *testing.T) {
	rs := newReplicaSet(t, 3, ownerFleet(12, 2), twoClients(t))
	ctx := context.Background()
	// One lease of shop's owned by each replica.
	byOwner := map[int]*dclient.Lease{}
	for i := 0; len(byOwner) < 3; i++ {
		require.Less(t, i, 12, "every replica owns one of the 12 proxies")
		l, err := dclient.New(rs.URLs[0], shopToken).Acquire(ctx, dclient.AcquireRequest{Target: "shop.example", TTL: 5 * time.Minute})
		require.NoError(t, err)
		o, _ := discovery.LeaseOwner(l.ID)
		if byOwner[o] == nil {
			byOwner[o] = l
		}
	}
	for owner, l := range byOwner {
		unknown := unknownLike(l.ID)
		for via := range 3 {
			for _, op := range leaseOps {
				got := ask(t, rs.URLs[via], newsToken, op.method, "/v1/leases/"+l.ID+op.suffix, op.body)
				asUnknown := ask(t, rs.URLs[via], newsToken, op.method, "/v1/leases/"+unknown+op.suffix, op.body)
				requireAsUnknown(t, op, got, l.ID, asUnknown, unknown, "news's %s through replica %d of shop's lease owned by %d", op.name, via, owner)
			}
		}
		assert.Empty(t, cooldowns(t, rs.URLs[owner], l.Proxy.IP), "news's ban reports rested nothing")
		for via := range 3 {
			r, err := dclient.New(rs.URLs[via], shopToken).Renew(ctx, l.ID, 5*time.Minute)
			require.NoError(t, err, "shop renews its lease owned by %d through %d", owner, via)
			assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
			require.NoError(t, dclient.New(rs.URLs[via], shopToken).Report(ctx, l.ID, "ok", ""))
		}
	}

	s, err := dclient.New(rs.URLs[0], shopToken).Acquire(ctx, dclient.AcquireRequest{Session: "cart", TTL: 5 * time.Minute})
	require.NoError(t, err)
	for via := range 3 {
		got := ask(t, rs.URLs[via], newsToken, http.MethodPost, "/v1/sessions/cart/report", `{"result":"banned"}`)
		asUnknown := ask(t, rs.URLs[via], newsToken, http.MethodPost, "/v1/sessions/never/report", `{"result":"banned"}`)
		require.Equal(t, http.StatusNotFound, asUnknown.status, asUnknown.body)
		assert.Equal(t, asUnknown.status, got.status, "news's report of shop's session through %d", via)
		assert.Equal(t, strings.ReplaceAll(asUnknown.body, "never", "<s>"), strings.ReplaceAll(got.body, "cart", "<s>"))
		assert.Equal(t, http.StatusNoContent, ask(t, rs.URLs[via], shopToken, http.MethodPost, "/v1/sessions/cart/report", `{"result":"ok"}`).status,
			"shop's report of its session through %d", via)
	}
	o, _ := discovery.LeaseOwner(s.ID)
	assert.Empty(t, cooldowns(t, rs.URLs[o], s.Proxy.IP), "news's session reports rested nothing")
}

// TestLeaseCopyWithoutClientIsNobodys: a copy of a lease from a replica too old to send
// the lease's client (the record has no "client") is no client's: neither shop nor news
// can renew, release or report on it, through its owner or another replica; it expires
// by itself.
func TestLeaseCopyWithoutClientIsNobodys(t *testing.T) {
	fleet := ownerFleet(2, 2)
	rs := newReplicaSet(t, 2, fleet, twoClients(t))
	id := "01" + strings.Repeat("3c", 15)
	rec := fmt.Sprintf(`[{"id":%q,"version":1,"proxyID":"crawl/p00","ip":%q,"port":%d,"target":"shop.example","expires":%q}]`,
		id, fleet[0].IP, fleet[0].Port, time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
	for _, to := range rs.URLs {
		req, err := http.NewRequest(http.MethodPost, to+"/peer/v1/leases", strings.NewReader(rec))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+peerToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
	}
	unknown := unknownLike(id)
	for _, token := range []string{shopToken, newsToken} {
		for via := range 2 {
			for _, op := range leaseOps {
				got := ask(t, rs.URLs[via], token, op.method, "/v1/leases/"+id+op.suffix, op.body)
				asUnknown := ask(t, rs.URLs[via], token, op.method, "/v1/leases/"+unknown+op.suffix, op.body)
				requireAsUnknown(t, op, got, id, asUnknown, unknown, "%s through replica %d", op.name, via)
			}
		}
	}
	list, err := dclient.New(rs.URLs[1], shopToken).ListProxies(context.Background(), nil, nil)
	require.NoError(t, err)
	for _, p := range list.Proxies {
		if p.Name == "p00" {
			assert.Equal(t, 1, p.ActiveLeases, "the copy still holds its slot: no release ended it")
			assert.Empty(t, p.Cooldowns, "no report rested the proxy")
		}
	}
}

// TestLeasesWithoutAuthentication: discovery run without authentication (no token, no
// clients file) keeps serving every lease to every request, alone and through replicas.
func TestLeasesWithoutAuthentication(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			rs := newReplicaSet(t, n, ownerFleet(6, 2), func(c *discovery.Config) { c.Token, c.Clients = "", nil })
			ctx := context.Background()
			l, err := dclient.New(rs.URLs[0], "").Acquire(ctx, dclient.AcquireRequest{Session: "cart", Target: "shop.example"})
			require.NoError(t, err)
			for via := range n {
				c := dclient.New(rs.URLs[via], "anything")
				r, err := c.Renew(ctx, l.ID, time.Minute)
				require.NoError(t, err, "renew through %d", via)
				assert.Equal(t, l.Proxy.Password, r.Proxy.Password)
				require.NoError(t, c.Report(ctx, l.ID, "ok", ""), "report through %d", via)
				assert.Equal(t, http.StatusNoContent, ask(t, rs.URLs[via], "", http.MethodPost, "/v1/sessions/cart/report", `{"result":"ok"}`).status)
			}
			require.NoError(t, dclient.New(rs.URLs[n-1], "").Release(ctx, l.ID))
			_, err = dclient.New(rs.URLs[0], "").Renew(ctx, l.ID, time.Minute)
			assert.True(t, dclient.IsLeaseGone(err), "released: %v", err)
		})
	}
}
