package discovery_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// Tokens of the named clients in these tests; each is a canary that must never show in
// a log line or a metric.
const (
	shopToken = "shop-token-canary-5d1e0b7a"
	newsToken = "news-token-canary-c2f94e13"
)

func sha(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// TestParseClients: a clients file with a mistake is refused with a message naming the
// client and the field, before anything is admitted.
func TestParseClients(t *testing.T) {
	good := fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n    maxLeases: 3\n    requestsPerSecond: 2.5\n"+
		"  - name: news\n    tokenSHA256: %s\n", shopToken, sha(newsToken))
	cfgs, err := discovery.ParseClients([]byte(good))
	require.NoError(t, err)
	require.Len(t, cfgs, 2)
	assert.Equal(t, 3, cfgs[0].MaxLeases)
	assert.InDelta(t, 2.5, cfgs[0].RequestsPerSecond, 1e-9)

	for _, tc := range []struct{ file, want string }{
		{"", "no clients"},
		{"clients: []", "no clients"},
		{"clients:\n  - name: Shop\n    token: " + shopToken, `client "Shop": name must be`},
		{"clients:\n  - name: a\n    token: " + shopToken + "\n  - name: a\n    token: " + newsToken, `client "a": name is used twice`},
		{"clients:\n  - name: a", `client "a": set exactly one of token and tokenSHA256`},
		{"clients:\n  - name: a\n    token: " + shopToken + "\n    tokenSHA256: " + sha(shopToken), "exactly one"},
		{"clients:\n  - name: a\n    token: short", "at least 16"},
		{"clients:\n  - name: a\n    tokenSHA256: abc", "64 hexadecimal"},
		{"clients:\n  - name: a\n    token: " + shopToken + "\n    maxLeases: -1", "must not be negative"},
		{"clients:\n  - name: a\n    token: " + shopToken + "\n  - name: b\n    tokenSHA256: " + sha(shopToken), `client "b": has the same token as client "a"`},
		{"clients:\n  - name: a\n    token: " + shopToken + "\n    maxLease: 1", "maxLease"},
	} {
		_, err := discovery.ParseClients([]byte(tc.file))
		require.Error(t, err, tc.file)
		assert.Contains(t, err.Error(), tc.want, tc.file)
		assert.NotContains(t, err.Error(), shopToken, "an error never repeats a token")
	}
}

// namedHarness serves the fleet to the clients of a clients file.
func namedHarness(t *testing.T, file string, proxies ...discovery.Proxy) *harness {
	t.Helper()
	cfgs, err := discovery.ParseClients([]byte(file))
	require.NoError(t, err)
	cfg := defaultConfig()
	cfg.Token, cfg.Clients = "", discovery.NewClients(cfgs)
	return newHarness(t, cfg, proxies...)
}

// TestNamedClients: each client authenticates with its own token, is named in the request
// log and the metrics (never its token), and is held to its limits: a 429 lease_limit
// past its leases, a 429 too_many_requests past its rate, each with a Retry-After.
// Another client is not affected by either.
func TestNamedClients(t *testing.T) {
	p := proxy("p", 1, true, nil)
	p.MaxLeases = 10
	h := namedHarness(t, fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n    maxLeases: 2\n"+
		"  - name: news\n    tokenSHA256: %s\n    requestsPerSecond: 0.01\n    burst: 3\n", shopToken, sha(newsToken)), p)
	shop := func(method, path, body string) *httptest.ResponseRecorder {
		return h.doAuth(method, path, body, "Bearer "+shopToken)
	}
	news := func(method, path, body string) *httptest.ResponseRecorder {
		return h.doAuth(method, path, body, "Bearer "+newsToken)
	}

	requireError(t, h.doAuth(http.MethodGet, "/v1/proxies", "", "Bearer "+testToken), http.StatusUnauthorized, "unauthorized")

	var ids []string
	for range 2 {
		rec := shop(http.MethodPost, "/v1/leases", `{"ttlSeconds":90}`)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		var l discovery.LeaseResponse
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &l))
		ids = append(ids, l.LeaseID)
	}
	body := requireError(t, shop(http.MethodPost, "/v1/leases", `{}`), http.StatusTooManyRequests, "lease_limit")
	assert.Contains(t, body["message"], `"shop"`)
	assert.EqualValues(t, 90, body["retryAfterSeconds"], "the first of its leases expires in 90s")
	require.Equal(t, http.StatusNoContent, shop(http.MethodDelete, "/v1/leases/"+ids[0], "").Code)
	assert.Equal(t, http.StatusCreated, shop(http.MethodPost, "/v1/leases", `{}`).Code, "a released lease frees the client's slot")

	for i := range 3 {
		assert.Equal(t, http.StatusOK, news(http.MethodGet, "/v1/proxies", "").Code, "request %d is within the burst", i)
	}
	rec := news(http.MethodGet, "/v1/proxies", "")
	body = requireError(t, rec, http.StatusTooManyRequests, "too_many_requests")
	retry, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	require.NoError(t, err)
	assert.InDelta(t, 100, retry, 1, "the next token comes in 1/0.01 s")
	assert.Contains(t, body["message"], `"news"`)
	assert.Equal(t, http.StatusOK, shop(http.MethodGet, "/v1/proxies", "").Code, "another client is not throttled")

	logs := h.logs.String()
	assert.Contains(t, logs, "client=shop")
	assert.Contains(t, logs, "client=news")
	metrics := h.do(http.MethodGet, "/metrics", "").Body.String()
	assert.Contains(t, metrics, `proxyfleet_discovery_client_leases{client="shop"} 2`)
	assert.Contains(t, metrics, `proxyfleet_discovery_client_leases{client="news"} 0`)
	assert.Contains(t, metrics, `proxyfleet_discovery_client_throttled_total{client="news",limit="requests"} 1`)
	assert.Contains(t, metrics, `proxyfleet_discovery_client_throttled_total{client="shop",limit="leases"} 1`)
	assert.Contains(t, metrics, `proxyfleet_discovery_client_requests_total{client="shop",code="201"} 3`)
	for _, tok := range []string{shopToken, newsToken, sha(newsToken)} {
		assert.NotContains(t, logs, tok, "a token in the logs")
		assert.NotContains(t, metrics, tok, "a token in the metrics")
	}
}

// TestSessionsArePerClient: two clients using the same session name have two sessions,
// so one cannot move the other's: client news taking session "s" while shop holds its
// proxy does not send shop elsewhere on its next lease.
func TestSessionsArePerClient(t *testing.T) {
	var fleet []discovery.Proxy
	for i := range 8 {
		fleet = append(fleet, proxy(fmt.Sprintf("p%d", i), 1, true, nil))
	}
	h := namedHarness(t, fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n  - name: news\n    token: %s\n", shopToken, newsToken), fleet...)
	acquire := func(token string) discovery.LeaseResponse {
		rec := h.doAuth(http.MethodPost, "/v1/leases", `{"session":"s"}`, "Bearer "+token)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		var l discovery.LeaseResponse
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &l))
		return l
	}
	first := acquire(shopToken)
	// While shop holds its proxy (one slot each), news's session "s" goes elsewhere.
	other := acquire(newsToken)
	require.NotEqual(t, first.Proxy.Name, other.Proxy.Name)
	for _, l := range []struct{ id, token string }{{first.LeaseID, shopToken}, {other.LeaseID, newsToken}} {
		require.Equal(t, http.StatusNoContent, h.doAuth(http.MethodDelete, "/v1/leases/"+l.id, "", "Bearer "+l.token).Code)
	}
	// Both proxies are free now: a session table shared by name would send shop to the
	// proxy news's "s" moved to.
	assert.Equal(t, first.Proxy.Name, acquire(shopToken).Proxy.Name, "shop's session is where it was")
}

// TestClientsReload: the clients file is read again while discovery runs: a client added
// is admitted, one removed is refused, a changed limit applies, and a file that no longer
// parses changes nothing (and says so).
func TestClientsReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clients.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o600)) }
	write(fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n", shopToken))
	clients, err := discovery.LoadClients(path)
	require.NoError(t, err)
	cfg := defaultConfig()
	cfg.Token, cfg.Clients = "", clients
	h := newHarness(t, cfg, fleet()...)
	status := func(token string) int { return h.doAuth(http.MethodGet, "/v1/proxies", "", "Bearer "+token).Code }
	require.Equal(t, http.StatusOK, status(shopToken))
	require.Equal(t, http.StatusUnauthorized, status(newsToken))

	changed, err := clients.Reload(path)
	require.NoError(t, err)
	assert.False(t, changed, "an unchanged file is not applied again")

	write(fmt.Sprintf("clients:\n  - name: news\n    token: %s\n    requestsPerSecond: 0.01\n    burst: 1\n", newsToken))
	changed, err = clients.Reload(path)
	require.NoError(t, err)
	require.True(t, changed)
	assert.Equal(t, []string{"news"}, clients.Names())
	assert.Equal(t, http.StatusUnauthorized, status(shopToken), "a removed client is refused at once")
	assert.Equal(t, http.StatusOK, status(newsToken), "an added client is admitted")
	assert.Equal(t, http.StatusTooManyRequests, status(newsToken), "with its limit")

	write("clients:\n  - name: news\n    token: short\n")
	_, err = clients.Reload(path)
	require.ErrorContains(t, err, "at least 16")
	assert.Equal(t, []string{"news"}, clients.Names(), "a bad file changes nothing")
	assert.Equal(t, http.StatusTooManyRequests, status(newsToken), "not even the limiter's state")
}

// TestClientsWatch: Watch picks a change of the file up by itself, as a mounted Secret
// changes under a running pod.
func TestClientsWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clients.yaml")
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf("clients:\n  - name: shop\n    token: %s\n", shopToken)), 0o600))
	clients, err := discovery.LoadClients(path)
	require.NoError(t, err)
	ctx := t.Context()
	go clients.Watch(ctx, path, 10*time.Millisecond, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf("clients:\n  - name: news\n    token: %s\n", newsToken)), 0o600))
	require.Eventually(t, func() bool { return strings.Join(clients.Names(), ",") == "news" }, 5*time.Second, 10*time.Millisecond)
}
