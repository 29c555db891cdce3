package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/discovery/temporal/temporaltest"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

const (
	testToken   = "s3cret-token"
	keepExpired = 30 * time.Minute
)

// testClock is the store's clock: it moves only when a test advances it.
type testClock = testenv.Clock

// fakeSignaler stands in for Temporal.
type fakeSignaler struct {
	report func(ctx context.Context, namespace, name string, sig contract.ReportSignal) error
}

var _ discovery.Signaler = (*fakeSignaler)(nil)

func (f *fakeSignaler) Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error {
	return f.report(ctx, namespace, name, sig)
}

// forwarded is one report the Signaler was given.
type forwarded struct {
	namespace, name string
	sig             contract.ReportSignal
}

type harness struct {
	t       *testing.T
	store   *discovery.Store
	clock   *testClock
	srv     *service.API
	handler http.Handler
	logs    *testenv.LogBuffer
	signals chan forwarded
	reg     *prometheus.Registry
}

// newHarness serves proxies, loaded as the first full pass from Temporal loads them.
func newHarness(t *testing.T, cfg discovery.Config, proxies ...discovery.Proxy) *harness {
	t.Helper()
	h := newLoadingHarness(t, cfg)
	h.store.ReplaceAll(proxies)
	return h
}

// newLoadingHarness serves a store whose index has not been loaded yet, as every replica
// does between its start and its first full pass.
func newLoadingHarness(t *testing.T, cfg discovery.Config) *harness {
	t.Helper()
	h := &harness{
		t:       t,
		store:   discovery.NewStore(keepExpired),
		clock:   testenv.NewClock(time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)),
		logs:    &testenv.LogBuffer{},
		signals: make(chan forwarded, 16),
		reg:     prometheus.NewRegistry(),
	}
	h.store.SetClock(h.clock.Now)
	sig := &fakeSignaler{report: func(_ context.Context, namespace, name string, sig contract.ReportSignal) error {
		h.signals <- forwarded{namespace, name, sig}
		return nil
	}}
	h.srv = service.NewAPI(cfg, h.store, sig, slog.New(slog.NewTextHandler(h.logs, nil)), h.reg)
	h.handler = h.srv.Handler()
	return h
}

func defaultConfig() discovery.Config {
	return discovery.Config{Token: testToken, DefaultTTL: 5 * time.Minute, MaxTTL: time.Hour,
		CooldownRateLimited: 5 * time.Minute, CooldownBanned: 30 * time.Minute}
}

func proxy(name string, latency int64, healthy bool, attrs map[string]string) discovery.Proxy {
	return discovery.Proxy{Name: name, Namespace: "crawl", IP: "10.1.2.3", Port: 3128, Attributes: attrs,
		LatencyMillis: latency, Healthy: healthy, Phase: "Ready", MaxLeases: 1}
}

// fleet: eu-fast and eu-slow healthy in eu; us-sick unhealthy in us; us-ok healthy in us.
func fleet() []discovery.Proxy {
	return []discovery.Proxy{
		proxy("eu-fast", 10, true, map[string]string{"region": "eu", "country": "de"}),
		proxy("eu-slow", 50, true, map[string]string{"region": "eu", "country": "fr"}),
		proxy("us-sick", 5, false, map[string]string{"region": "us"}),
		proxy("us-ok", 20, true, map[string]string{"region": "us"}),
	}
}

// do sends a request with the right token; use doAuth to choose the Authorization header.
func (h *harness) do(method, path, body string) *httptest.ResponseRecorder {
	h.t.Helper()
	return h.doAuth(method, path, body, "Bearer "+testToken)
}

func (h *harness) doAuth(method, path, body, auth string) *httptest.ResponseRecorder {
	h.t.Helper()
	return serve(h.handler, method, path, body, auth)
}

// serve sends one request to handler: a JSON body when body is set, an Authorization
// header when auth is.
func serve(handler http.Handler, method, path, body, auth string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	return rec
}

func (h *harness) acquire(body string) discovery.LeaseResponse {
	h.t.Helper()
	rec := h.do(http.MethodPost, "/v1/leases", body)
	require.Equal(h.t, http.StatusCreated, rec.Code, rec.Body.String())
	var l discovery.LeaseResponse
	require.NoError(h.t, json.Unmarshal(rec.Body.Bytes(), &l))
	return l
}

// requireError checks an error answer: the status, and a JSON body {"error": code,
// "message": "..."} (plus the NoMatch numbers on a 409).
func requireError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	assert.Contains(t, rec.Header().Get("Content-Type"), "application/json")
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	assert.Equal(t, code, body["error"], rec.Body.String())
	msg, _ := body["message"].(string)
	assert.NotEmpty(t, msg, "message")
	for k := range body {
		switch k {
		case "error", "message":
		case "considered", "atCapacity", "inCooldown", "unhealthy":
			assert.Equal(t, "no_match", code, "NoMatch numbers only on a 409")
		case "retryAfterSeconds":
			assert.Equal(t, fmt.Sprint(body[k]), rec.Header().Get("Retry-After"), "the header and the field agree")
		case "reason":
			assert.Equal(t, "proxy_gone", code, "a reason only on proxy_gone")
		default:
			t.Errorf("unexpected field %q in error body %s", k, rec.Body.String())
		}
	}
	return body
}

func TestHealthz(t *testing.T) {
	h := newHarness(t, defaultConfig())
	rec := h.doAuth(http.MethodGet, "/healthz", "", "")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"status":"ok"}`, rec.Body.String())
}

// TestIndexLoading: until the first full pass, the answers that depend on the whole index
// are 503 index_loading with a Retry-After, never an empty list or a no_match; afterwards
// the same requests are served as usual.
func TestIndexLoading(t *testing.T) {
	h := newLoadingHarness(t, defaultConfig())
	// An incremental pass alone does not make the index whole.
	h.store.Upsert(fleet()[0])

	loading := func(t *testing.T, rec *httptest.ResponseRecorder) {
		t.Helper()
		body := requireError(t, rec, http.StatusServiceUnavailable, "index_loading")
		assert.Equal(t, "1", rec.Header().Get("Retry-After"))
		assert.Contains(t, body["message"], "still loading")
	}
	t.Run("before", func(t *testing.T) {
		loading(t, h.do(http.MethodGet, "/v1/proxies", ""))
		loading(t, h.do(http.MethodGet, "/v1/proxies?attr.region=eu&healthy=true", ""))
		loading(t, h.do(http.MethodPost, "/v1/leases", `{"selector":{"region":"eu"}}`))
		loading(t, h.do(http.MethodPost, "/v1/leases", ""))
		loading(t, h.doAuth(http.MethodGet, "/readyz", "", ""))

		rec := h.doAuth(http.MethodHead, "/readyz", "", "")
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Equal(t, "1", rec.Header().Get("Retry-After"))
		assert.Empty(t, rec.Body.String(), "HEAD has no body")

		// Liveness does not depend on Temporal: restarting would not load the index sooner.
		rec = h.doAuth(http.MethodGet, "/healthz", "", "")
		assert.Equal(t, http.StatusOK, rec.Code)

		// Authentication comes first: without a token nothing about the index is told.
		requireError(t, h.doAuth(http.MethodGet, "/v1/proxies", "", ""), http.StatusUnauthorized, "unauthorized")
		requireError(t, h.doAuth(http.MethodPost, "/v1/leases", "", ""), http.StatusUnauthorized, "unauthorized")

		// Leases live in memory: the lease routes answer as ever (none is known yet).
		id := "0123456789abcdef0123456789abcdef"
		requireError(t, h.do(http.MethodPost, "/v1/leases/"+id+"/renew", ""), http.StatusNotFound, "unknown_lease")
		requireError(t, h.do(http.MethodPost, "/v1/leases/"+id+"/report", `{"result":"banned"}`),
			http.StatusNotFound, "unknown_lease")
		assert.Equal(t, http.StatusNoContent, h.do(http.MethodDelete, "/v1/leases/"+id, "").Code)
	})

	h.store.ReplaceAll(fleet())

	t.Run("after", func(t *testing.T) {
		rec := h.doAuth(http.MethodGet, "/readyz", "", "")
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		assert.JSONEq(t, `{"status":"ok"}`, rec.Body.String())
		assert.Empty(t, rec.Header().Get("Retry-After"))
		rec = h.doAuth(http.MethodHead, "/readyz", "", "")
		assert.Equal(t, http.StatusOK, rec.Code)
		assert.Empty(t, rec.Body.String())

		rec = h.do(http.MethodGet, "/v1/proxies?attr.region=eu", "")
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var list discovery.ProxyList
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &list))
		assert.Equal(t, 2, list.Count)
		l := h.acquire(`{"selector":{"region":"eu"}}`)
		assert.Contains(t, []string{"eu-fast", "eu-slow"}, l.Proxy.Name)
		assert.Equal(t, http.StatusOK, h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/renew", "").Code)
	})

	t.Run("counted, not logged", func(t *testing.T) {
		rec := h.doAuth(http.MethodGet, "/metrics", "", "")
		require.Equal(t, http.StatusOK, rec.Code)
		assert.Contains(t, rec.Body.String(),
			`proxyfleet_discovery_http_requests_total{code="503",method="POST",route="/v1/leases"} 2`)
		assert.Contains(t, rec.Body.String(),
			`proxyfleet_discovery_http_requests_total{code="503",method="GET",route="/readyz"} 1`)
		assert.NotContains(t, h.logs.String(), "route=/readyz", "probes would drown the request log")
		assert.Contains(t, h.logs.String(), "route=/v1/proxies")
	})
}

// TestEmptyFleetIsLoaded: a full pass that finds no proxies is a true answer, so it is
// served as one (an empty list, a no_match), not as index_loading.
func TestEmptyFleetIsLoaded(t *testing.T) {
	h := newHarness(t, defaultConfig())
	assert.Equal(t, http.StatusOK, h.doAuth(http.MethodGet, "/readyz", "", "").Code)
	rec := h.do(http.MethodGet, "/v1/proxies", "")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"proxies":[],"count":0}`, rec.Body.String())
	body := requireError(t, h.do(http.MethodPost, "/v1/leases", ""), http.StatusConflict, "no_match")
	assert.EqualValues(t, 0, body["considered"])
}

func TestListProxies(t *testing.T) {
	h := newHarness(t, defaultConfig(), fleet()...)
	h.acquire(`{"selector":{"country":"de"}}`) // eu-fast: 1 active lease
	tests := []struct {
		name  string
		query string
		want  []string
		code  string // error code when the request is refused
	}{
		{name: "all", query: "", want: []string{"eu-fast", "eu-slow", "us-ok", "us-sick"}},
		{name: "one attribute", query: "attr.region=eu", want: []string{"eu-fast", "eu-slow"}},
		{name: "two attributes", query: "attr.region=eu&attr.country=fr", want: []string{"eu-slow"}},
		{name: "healthy", query: "healthy=true", want: []string{"eu-fast", "eu-slow", "us-ok"}},
		{name: "unhealthy", query: "healthy=false", want: []string{"us-sick"}},
		{name: "attribute and health", query: "attr.region=us&healthy=true", want: []string{"us-ok"}},
		{name: "unknown parameter refused", query: "limit=3&attr.region=us", code: "invalid"},
		{name: "attribute without attr. refused", query: "region=eu", code: "invalid"},
		{name: "nothing matches", query: "attr.region=mars", want: []string{}},
		{name: "unknown key matches nothing", query: "attr.tier=gold", want: []string{}},
		{name: "uppercase key", query: "attr.Region=eu", code: "invalid_selector"},
		{name: "empty key", query: "attr.=eu", code: "invalid_selector"},
		{name: "bad value", query: "attr.region=e%20u", code: "invalid_selector"},
		{name: "repeated attribute", query: "attr.region=eu&attr.region=us", code: "invalid_selector"},
		{name: "repeated same value", query: "attr.region=eu&attr.region=eu", code: "invalid_selector"},
		{name: "healthy=maybe", query: "healthy=maybe", code: "invalid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := h.do(http.MethodGet, "/v1/proxies?"+tc.query, "")
			if tc.code != "" {
				requireError(t, rec, http.StatusBadRequest, tc.code)
				return
			}
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			var list discovery.ProxyList
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &list))
			names := []string{}
			for _, p := range list.Proxies {
				names = append(names, p.Name)
			}
			assert.Equal(t, tc.want, names)
			assert.Equal(t, len(tc.want), list.Count)
			if len(tc.want) == 0 {
				assert.JSONEq(t, `{"proxies":[],"count":0}`, rec.Body.String(), "an empty list, not null")
			}
		})
	}

	t.Run("fields", func(t *testing.T) {
		rec := h.do(http.MethodGet, "/v1/proxies?attr.country=de", "")
		require.Equal(t, http.StatusOK, rec.Code)
		assert.JSONEq(t, `{"count":1,"proxies":[{
			"name":"eu-fast","namespace":"crawl","url":"http://10.1.2.3:3128","ip":"10.1.2.3","port":3128,
			"attributes":{"region":"eu","country":"de"},"latencyMillis":10,
			"healthy":true,"phase":"Ready","activeLeases":1,"maxLeases":1}]}`, rec.Body.String())
	})
}

func TestAcquire(t *testing.T) {
	h := newHarness(t, defaultConfig(), fleet()...)
	now := h.clock.Now()

	rec := h.do(http.MethodPost, "/v1/leases", `{"selector":{"region":"eu","country":"de"},"ttlSeconds":60,"target":"shop.example"}`)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &raw))
	var id string
	require.NoError(t, json.Unmarshal(raw["leaseID"], &id))
	assert.Len(t, id, 32)
	assert.JSONEq(t, `{"name":"eu-fast","namespace":"crawl","url":"http://10.1.2.3:3128","ip":"10.1.2.3",
		"port":3128,"attributes":{"region":"eu","country":"de"},"latencyMillis":10}`, string(raw["proxy"]))
	assert.JSONEq(t, `60`, string(raw["ttlSeconds"]))
	assert.JSONEq(t, `"shop.example"`, string(raw["target"]))
	var exp time.Time
	require.NoError(t, json.Unmarshal(raw["expiresAt"], &exp))
	assert.True(t, now.Add(time.Minute).Equal(exp), "expiresAt %v", exp)

	t.Run("empty body takes the default TTL and any proxy", func(t *testing.T) {
		l := h.acquire("")
		assert.Equal(t, 300, l.TTLSeconds)
		assert.True(t, now.Add(5*time.Minute).Equal(l.ExpiresAt))
		assert.Contains(t, []string{"us-ok", "eu-slow"}, l.Proxy.Name, "a free healthy proxy")
		assert.Empty(t, l.Target)
		second := h.acquire(`{}`)
		assert.ElementsMatch(t, []string{"us-ok", "eu-slow"}, []string{l.Proxy.Name, second.Proxy.Name}, "then the other")
	})
	t.Run("max TTL is allowed", func(t *testing.T) {
		h := newHarness(t, defaultConfig(), fleet()...)
		l := h.acquire(`{"ttlSeconds":3600}`)
		assert.Equal(t, 3600, l.TTLSeconds)
	})
	t.Run("attributes are an object even when the proxy has none", func(t *testing.T) {
		h := newHarness(t, defaultConfig(), proxy("bare", 1, true, nil))
		rec := h.do(http.MethodPost, "/v1/leases", `{}`)
		require.Equal(t, http.StatusCreated, rec.Code)
		assert.Contains(t, rec.Body.String(), `"attributes":{}`)
	})
}

func TestAcquireRefused(t *testing.T) {
	tooBigString := `{"target":"` + strings.Repeat("a", 70<<10) + `"}`
	tooBigPadding := `{"ttlSeconds":60}` + strings.Repeat(" ", 70<<10)
	tests := []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"malformed JSON", `{"ttlSeconds":`, http.StatusBadRequest, "invalid"},
		{"not JSON", `ttl=60`, http.StatusBadRequest, "invalid"},
		{"wrong type", `{"ttlSeconds":"x"}`, http.StatusBadRequest, "invalid"},
		{"fractional TTL", `{"ttlSeconds":1.5}`, http.StatusBadRequest, "invalid"},
		{"selector value not a string", `{"selector":{"region":1}}`, http.StatusBadRequest, "invalid"},
		{"array", `[]`, http.StatusBadRequest, "invalid"},
		{"unknown field", `{"ttlSeconds":60,"ttl":60}`, http.StatusBadRequest, "invalid"},
		{"trailing object", `{"ttlSeconds":60}{"ttlSeconds":60}`, http.StatusBadRequest, "invalid"},
		{"trailing garbage", `{"ttlSeconds":60} x`, http.StatusBadRequest, "invalid"},
		{"oversize", tooBigString, http.StatusRequestEntityTooLarge, "too_large"},
		{"oversize after the object", tooBigPadding, http.StatusRequestEntityTooLarge, "too_large"},
		{"TTL above max", `{"ttlSeconds":3601}`, http.StatusBadRequest, "invalid"},
		{"TTL overflowing a Duration", `{"ttlSeconds":9223372037}`, http.StatusBadRequest, "invalid"},
		{"negative TTL", `{"ttlSeconds":-1}`, http.StatusBadRequest, "invalid"},
		{"invalid selector key", `{"selector":{"Region":"eu"}}`, http.StatusBadRequest, "invalid_selector"},
		{"invalid selector value", `{"selector":{"region":"e u"}}`, http.StatusBadRequest, "invalid_selector"},
		{"target with a path", `{"target":"shop.example/cart"}`, http.StatusBadRequest, "invalid"},
		{"target too long", `{"target":"` + strings.Repeat("a", 254) + `"}`, http.StatusBadRequest, "invalid"},
	}
	h := newHarness(t, defaultConfig(), fleet()...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := h.do(http.MethodPost, "/v1/leases", tc.body)
			body := requireError(t, rec, tc.status, tc.code)
			if tc.name == "unknown field" {
				assert.Contains(t, body["message"], `"ttl"`)
			}
		})
	}
	assert.Equal(t, 0, h.store.Stats().Leases, "no refused request leased anything")
}

func TestAcquireNoMatch(t *testing.T) {
	const target = "shop.example"
	eu := map[string]string{"region": "eu"}
	full := proxy("full", 1, true, eu)
	cooling := proxy("cooling", 2, true, eu)
	durable := proxy("cooling-durable", 3, true, eu)
	h := newHarness(t, defaultConfig(), full, proxy("sick", 1, false, eu), proxy("us", 1, true, map[string]string{"region": "us"}))
	h.acquire(`{"selector":{"region":"eu"}}`)
	h.store.Upsert(cooling)
	h.store.Cooldown(cooling.ID(), target, h.clock.Now().Add(time.Minute))
	durable.Cooldowns = map[string]time.Time{"": h.clock.Now().Add(time.Minute)}
	h.store.Upsert(durable)

	tests := []struct {
		name string
		body string
		want map[string]any
	}{
		// The cooldowns end in a minute, before the full proxy's lease (5 minutes).
		{"every reason", `{"selector":{"region":"eu"},"target":"shop.example"}`,
			map[string]any{"considered": 4.0, "unhealthy": 1.0, "atCapacity": 1.0, "inCooldown": 2.0, "retryAfterSeconds": 60.0}},
		// Nothing will free up by waiting: no Retry-After.
		{"nothing matches", `{"selector":{"region":"mars"}}`,
			map[string]any{"considered": 0.0, "unhealthy": 0.0, "atCapacity": 0.0, "inCooldown": 0.0, "retryAfterSeconds": nil}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := requireError(t, h.do(http.MethodPost, "/v1/leases", tc.body), http.StatusConflict, "no_match")
			for k, v := range tc.want {
				assert.Equal(t, v, body[k], k)
			}
			assert.Equal(t, body["considered"], body["unhealthy"].(float64)+body["atCapacity"].(float64)+body["inCooldown"].(float64))
		})
	}
	t.Run("another target is served", func(t *testing.T) {
		l := h.acquire(`{"selector":{"region":"eu"},"target":"news.example"}`)
		assert.Equal(t, "cooling", l.Proxy.Name)
	})
}

func TestAuthentication(t *testing.T) {
	h := newHarness(t, defaultConfig(), fleet()...)
	l := h.acquire(`{}`)
	routes := []struct{ method, path, body string }{
		{http.MethodGet, "/v1/proxies", ""},
		{http.MethodPost, "/v1/leases", `{}`},
		{http.MethodPost, "/v1/leases/" + l.LeaseID + "/renew", `{}`},
		{http.MethodDelete, "/v1/leases/" + l.LeaseID, ""},
		{http.MethodPost, "/v1/leases/" + l.LeaseID + "/report", `{"result":"banned"}`},
	}
	headers := []struct{ name, auth string }{
		{"missing", ""},
		{"wrong token", "Bearer nope"},
		{"prefix of the token", "Bearer " + testToken[:len(testToken)-1]},
		{"same length, one byte off", "Bearer " + testToken[:len(testToken)-1] + "X"},
		{"token with trailing space", "Bearer " + testToken + " "},
		{"other scheme", "Basic " + testToken},
		{"no scheme", testToken},
	}
	for _, r := range routes {
		for _, hd := range headers {
			t.Run(r.method+" "+r.path+"/"+hd.name, func(t *testing.T) {
				rec := h.doAuth(r.method, r.path, r.body, hd.auth)
				requireError(t, rec, http.StatusUnauthorized, "unauthorized")
				assert.Equal(t, `Bearer realm="proxyfleet"`, rec.Header().Get("WWW-Authenticate"))
			})
		}
	}
	assert.Equal(t, 1, h.store.Stats().Leases, "no unauthenticated request changed anything")
	assert.Equal(t, 0, h.store.Stats().Cooldowns)

	t.Run("no token configured", func(t *testing.T) {
		cfg := defaultConfig()
		cfg.Token = ""
		h := newHarness(t, cfg, fleet()...)
		assert.Contains(t, h.logs.String(), "WITHOUT authentication")
		rec := h.doAuth(http.MethodGet, "/v1/proxies", "", "")
		assert.Equal(t, http.StatusOK, rec.Code)
		rec = h.doAuth(http.MethodPost, "/v1/leases", `{}`, "Bearer anything")
		assert.Equal(t, http.StatusCreated, rec.Code)
	})
}

func TestRenew(t *testing.T) {
	h := newHarness(t, defaultConfig(), fleet()...)
	start := h.clock.Now()
	l := h.acquire(`{"ttlSeconds":60}`)
	path := "/v1/leases/" + l.LeaseID + "/renew"

	h.clock.Advance(30 * time.Second)
	rec := h.do(http.MethodPost, path, `{"ttlSeconds":120}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var r discovery.LeaseResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r))
	assert.Equal(t, l.LeaseID, r.LeaseID)
	assert.Equal(t, l.Proxy, r.Proxy)
	assert.Equal(t, 120, r.TTLSeconds)
	assert.True(t, start.Add(150*time.Second).Equal(r.ExpiresAt), "expiresAt %v", r.ExpiresAt)

	t.Run("empty body takes the default TTL", func(t *testing.T) {
		rec := h.do(http.MethodPost, path, "")
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r))
		assert.True(t, h.clock.Now().Add(5*time.Minute).Equal(r.ExpiresAt))
	})
	refused := []struct {
		name, id, body string
		status         int
		code           string
	}{
		{"TTL above max", l.LeaseID, `{"ttlSeconds":7200}`, http.StatusBadRequest, "invalid"},
		{"negative TTL", l.LeaseID, `{"ttlSeconds":-5}`, http.StatusBadRequest, "invalid"},
		{"bad JSON", l.LeaseID, `{`, http.StatusBadRequest, "invalid"},
		{"unknown field", l.LeaseID, `{"selector":{}}`, http.StatusBadRequest, "invalid"},
		{"unknown lease", "0123456789abcdef0123456789abcdef", `{}`, http.StatusNotFound, "unknown_lease"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			requireError(t, h.do(http.MethodPost, "/v1/leases/"+tc.id+"/renew", tc.body), tc.status, tc.code)
		})
	}
	t.Run("expired", func(t *testing.T) {
		h.clock.Advance(5 * time.Minute)
		requireError(t, h.do(http.MethodPost, path, `{}`), http.StatusGone, "lease_expired")
		h.store.Sweep()
		requireError(t, h.do(http.MethodPost, path, `{}`), http.StatusGone, "lease_expired")
		h.clock.Advance(keepExpired)
		h.store.Sweep()
		requireError(t, h.do(http.MethodPost, path, `{}`), http.StatusNotFound, "unknown_lease")
	})
}

func TestRelease(t *testing.T) {
	h := newHarness(t, defaultConfig(), proxy("only", 1, true, nil))
	l := h.acquire(`{}`)
	requireError(t, h.do(http.MethodPost, "/v1/leases", `{}`), http.StatusConflict, "no_match")
	for _, name := range []string{"release", "again", "unknown"} {
		t.Run(name, func(t *testing.T) {
			id := l.LeaseID
			if name == "unknown" {
				id = "no-such-lease"
			}
			rec := h.do(http.MethodDelete, "/v1/leases/"+id, "")
			assert.Equal(t, http.StatusNoContent, rec.Code)
			assert.Empty(t, rec.Body.String())
		})
	}
	assert.Equal(t, "only", h.acquire(`{}`).Proxy.Name, "offered again")
	// A crawler often learns of a ban as it finishes: a released lease still takes a report
	// for the cooldown window, but can no longer be renewed.
	rec := h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", `{"result":"ok"}`)
	assert.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	requireError(t, h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/renew", `{}`), http.StatusGone, "lease_expired")
}

func TestReport(t *testing.T) {
	h := newHarness(t, defaultConfig(), fleet()...)
	l := h.acquire(`{"ttlSeconds":60}`)
	path := "/v1/leases/" + l.LeaseID + "/report"
	tests := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"ok", path, `{"result":"ok"}`, http.StatusNoContent, ""},
		{"ok with target", path, `{"result":"ok","target":"shop.example"}`, http.StatusNoContent, ""},
		{"invalid result", path, `{"result":"meh"}`, http.StatusBadRequest, "invalid_result"},
		{"no result", path, `{}`, http.StatusBadRequest, "invalid_result"},
		{"missing body", path, "", http.StatusBadRequest, "invalid"},
		{"malformed body", path, `{"result":`, http.StatusBadRequest, "invalid"},
		{"unknown field", path, `{"result":"ok","reason":"x"}`, http.StatusBadRequest, "invalid"},
		{"invalid target", path, `{"result":"banned","target":"a b"}`, http.StatusBadRequest, "invalid"},
		{"unknown lease", "/v1/leases/nope/report", `{"result":"banned"}`, http.StatusNotFound, "unknown_lease"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := h.do(http.MethodPost, tc.path, tc.body)
			if tc.code == "" {
				assert.Equal(t, tc.status, rec.Code, rec.Body.String())
				assert.Empty(t, rec.Body.String())
				return
			}
			requireError(t, rec, tc.status, tc.code)
		})
	}
	assert.Equal(t, 0, h.store.Stats().Cooldowns, "ok and refused reports cool nothing down")

	t.Run("expired within the window", func(t *testing.T) {
		h.clock.Advance(time.Minute + keepExpired - time.Second)
		rec := h.do(http.MethodPost, path, `{"result":"rate_limited"}`)
		assert.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	})
	t.Run("expired longer ago than the window", func(t *testing.T) {
		h.clock.Advance(time.Second)
		requireError(t, h.do(http.MethodPost, path, `{"result":"rate_limited"}`), http.StatusNotFound, "unknown_lease")
		h.store.Sweep()
		requireError(t, h.do(http.MethodPost, path, `{"result":"rate_limited"}`), http.StatusNotFound, "unknown_lease")
	})
}

func TestReportSignalsAndCoolsDown(t *testing.T) {
	tests := []struct {
		name          string
		leaseTarget   string
		reportTarget  string
		result        string
		wantTarget    string
		window        time.Duration
		blockedTarget string // a target the proxy must now be refused for
		freeTarget    string // a target it is still offered for ("" = none)
	}{
		{"banned for the reported target", "news.example", "shop.example", contract.ReportBanned,
			"shop.example", 30 * time.Minute, "shop.example", "news.example"},
		{"rate limited for the lease's target", "news.example", "", contract.ReportRateLimited,
			"news.example", 5 * time.Minute, "news.example", "shop.example"},
		{"no target anywhere: every target", "", "", contract.ReportBanned,
			"", 30 * time.Minute, "any.example", ""},
		// One site, however it is written: case, port and a trailing dot make no new key,
		// neither in discovery nor in the signal that makes the cooldown durable.
		{"one site however written", "news.example", "Shop.Example:443", contract.ReportBanned,
			"shop.example", 30 * time.Minute, "shop.example.", "news.example"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, defaultConfig(), proxy("only", 1, true, map[string]string{"region": "eu"}))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { h.srv.RunReports(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })

			l := h.acquire(fmt.Sprintf(`{"target":%q}`, tc.leaseTarget))
			path := "/v1/leases/" + l.LeaseID + "/report"
			// An ok report is not forwarded: the first signal is the bad one.
			require.Equal(t, http.StatusNoContent, h.do(http.MethodPost, path, `{"result":"ok"}`).Code)
			rec := h.do(http.MethodPost, path, fmt.Sprintf(`{"result":%q,"target":%q}`, tc.result, tc.reportTarget))
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())

			select {
			case got := <-h.signals:
				assert.Equal(t, "crawl", got.namespace)
				assert.Equal(t, "only", got.name)
				assert.Equal(t, tc.wantTarget, got.sig.Target)
				assert.Equal(t, tc.result, got.sig.Result)
				assert.True(t, h.clock.Now().Add(tc.window).Equal(got.sig.Until), "until %v", got.sig.Until)
			case <-time.After(10 * time.Second):
				t.Fatal("no signal forwarded")
			}

			h.do(http.MethodDelete, "/v1/leases/"+l.LeaseID, "")
			body := requireError(t, h.do(http.MethodPost, "/v1/leases", fmt.Sprintf(`{"target":%q}`, tc.blockedTarget)),
				http.StatusConflict, "no_match")
			assert.Equal(t, 1.0, body["inCooldown"])
			if tc.freeTarget != "" {
				free := h.acquire(fmt.Sprintf(`{"target":%q}`, tc.freeTarget))
				assert.Equal(t, "only", free.Proxy.Name)
				h.do(http.MethodDelete, "/v1/leases/"+free.LeaseID, "")
			}
			h.clock.Advance(tc.window)
			h.acquire(fmt.Sprintf(`{"target":%q,"ttlSeconds":1}`, tc.blockedTarget))
		})
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	h := newHarness(t, defaultConfig(), fleet()...)
	tests := []struct {
		name, method, path string
		status             int
		code               string
	}{
		{"unknown path", http.MethodGet, "/nope", http.StatusNotFound, "not_found"},
		{"unknown API path", http.MethodGet, "/v1/nope", http.StatusNotFound, "not_found"},
		{"unknown lease action", http.MethodPost, "/v1/leases/x/nope", http.StatusNotFound, "not_found"},
		{"PUT a lease", http.MethodPut, "/v1/leases", http.StatusMethodNotAllowed, "method_not_allowed"},
		{"GET a renewal", http.MethodGet, "/v1/leases/x/renew", http.StatusMethodNotAllowed, "method_not_allowed"},
		{"POST proxies", http.MethodPost, "/v1/proxies", http.StatusMethodNotAllowed, "method_not_allowed"},
		{"DELETE healthz", http.MethodDelete, "/healthz", http.StatusMethodNotAllowed, "method_not_allowed"},
		{"POST readyz", http.MethodPost, "/readyz", http.StatusMethodNotAllowed, "method_not_allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := h.do(tc.method, tc.path, "")
			requireError(t, rec, tc.status, tc.code)
			if tc.status == http.StatusMethodNotAllowed {
				assert.NotEmpty(t, rec.Header().Get("Allow"))
			}
		})
	}
}

// TestPanicIsInternal makes the store panic (its clock does, standing in for any bug behind
// a handler): the answer is a plain internal error, the panic text goes to the log only, the
// 500 is counted, and the server keeps serving.
func TestPanicIsInternal(t *testing.T) {
	const secret = "clock exploded: db password hunter2"
	h := newHarness(t, defaultConfig(), fleet()...)
	h.store.SetClock(func() time.Time { panic(secret) })

	rec := h.do(http.MethodPost, "/v1/leases", `{}`)
	requireError(t, rec, http.StatusInternalServerError, "internal")
	assert.JSONEq(t, `{"error":"internal","message":"internal error"}`, rec.Body.String())
	assert.NotContains(t, rec.Body.String(), "hunter2")
	assert.Contains(t, h.logs.String(), secret, "the panic is logged for operators")

	rec = h.doAuth(http.MethodGet, "/metrics", "", "")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, rec.Body.String(),
		`proxyfleet_discovery_http_requests_total{code="500",method="POST",route="/v1/leases"} 1`)

	h.store.SetClock(h.clock.Now)
	h.acquire(`{}`)
}

// TestConcurrentAcquires leases from many clients at once: exactly the fleet's capacity is
// granted, never more.
func TestConcurrentAcquires(t *testing.T) {
	var ps []discovery.Proxy
	for i := range 4 {
		p := proxy(fmt.Sprintf("p%d", i), int64(i), true, nil)
		p.MaxLeases = 2
		ps = append(ps, p)
	}
	h := newHarness(t, defaultConfig(), ps...)
	const clients = 32
	codes := make([]int, clients)
	names := make([]string, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest(http.MethodPost, "/v1/leases", strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer "+testToken)
			rec := httptest.NewRecorder()
			h.handler.ServeHTTP(rec, req)
			codes[i] = rec.Code
			var l discovery.LeaseResponse
			if json.Unmarshal(rec.Body.Bytes(), &l) == nil {
				names[i] = l.Proxy.Name
			}
		}()
	}
	wg.Wait()
	per := map[string]int{}
	granted := 0
	for i, c := range codes {
		switch c {
		case http.StatusCreated:
			granted++
			per[names[i]]++
		case http.StatusConflict:
		default:
			t.Errorf("client %d: status %d", i, c)
		}
	}
	assert.Equal(t, 8, granted)
	assert.Equal(t, map[string]int{"p0": 2, "p1": 2, "p2": 2, "p3": 2}, per)
}

func TestNormalizeTarget(t *testing.T) {
	for in, want := range map[string]string{
		"":                  "",
		"shop.example":      "shop.example",
		"Shop.Example":      "shop.example",
		"shop.example.":     "shop.example",
		"shop.example:443":  "shop.example",
		"SHOP.example:8080": "shop.example",
		"[2001:db8::1]:443": "2001:db8::1",
		"2001:db8::1":       "2001:db8::1",
		"203.0.113.7":       "203.0.113.7",
		// IDNA: an internationalised name and its ASCII form are one site.
		"Bücher.Example":           "xn--bcher-kva.example",
		"bücher.example:443":       "xn--bcher-kva.example",
		"xn--bcher-kva.example":    "xn--bcher-kva.example",
		"[2001:DB8:0:0:0:0:0:1]:1": "2001:db8::1",
		"shop\u200b.example":       "shop.example", // UTS 46 drops a zero-width space, as browsers do
	} {
		got, err := discovery.NormalizeTarget(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{
		"https://shop.example/", "shop.example/path", "shop example", "shop.example\x00", "shop\texample",
		"shop.example:", "shop.example:http", "shop.example:70000", "user@shop.example", ".", "a..b",
		strings.Repeat("a", 260), "bü cher.example", "b\u00fc\x7fcher.example", "-ü-.example",
	} {
		_, err := discovery.NormalizeTarget(in)
		assert.Error(t, err, "%q", in)
	}
}

// TestServerLimits: headers past MaxHeaderBytes are refused before any handler runs.
func TestServerLimits(t *testing.T) {
	svc := service.New(service.Config{API: discovery.Config{Token: "t"}}, quietTemporal{&temporaltest.Lister{}}, slog.New(slog.DiscardHandler), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })

	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/healthz", nil)
	require.NoError(t, err)
	req.Header.Set("X-Padding", strings.Repeat("x", 2*service.MaxHeaderBytes))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

// quietTemporal lists no workflows and takes every signal.
type quietTemporal struct{ *temporaltest.Lister }

func (quietTemporal) SignalWorkflow(context.Context, string, string, string, any) error { return nil }

// TestSessionsAndGoneOverHTTP: the API takes a session and answers with it, refuses a
// malformed one, answers a renewal of a lease whose proxy was replaced with 410
// proxy_gone and its reason, and caps the cooldowns one lease may report with a 429.
func TestSessionsAndGoneOverHTTP(t *testing.T) {
	p, o := proxy("only", 1, true, nil), proxy("other", 1, true, nil)
	p.MaxLeases, o.MaxLeases = 5, 5
	h := newHarness(t, defaultConfig(), p, o)

	l := h.acquire(`{"session":"crawl-7:a_b.c~d"}`)
	assert.Equal(t, "crawl-7:a_b.c~d", l.Session)
	for range 3 {
		again := h.acquire(`{"session":"crawl-7:a_b.c~d"}`)
		assert.Equal(t, l.Proxy.Name, again.Proxy.Name, "a session keeps its proxy")
	}
	for _, bad := range []string{`"has space"`, `"` + strings.Repeat("s", 129) + `"`, `"a/b"`, `"tab\t"`} {
		body := requireError(t, h.do(http.MethodPost, "/v1/leases", `{"session":`+bad+`}`), http.StatusBadRequest, "invalid")
		assert.Contains(t, body["message"], "session")
	}

	moved := p
	if l.Proxy.Name != p.Name {
		moved = o
	}
	moved.IP = "10.9.9.9"
	h.store.Upsert(moved)
	body := requireError(t, h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/renew", `{}`), http.StatusGone, "proxy_gone")
	assert.Equal(t, "replaced", body["reason"])
	assert.Contains(t, body["message"], "replaced")

	l = h.acquire(`{"selector":{},"target":"shop.example"}`)
	for i := range discovery.DefaultMaxReportsPerLease {
		rec := h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", fmt.Sprintf(`{"result":"banned","target":"t%d.example"}`, i))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	}
	requireError(t, h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", `{"result":"banned","target":"last.example"}`),
		http.StatusTooManyRequests, "report_limit")
	rec := h.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", `{"result":"ok"}`)
	assert.Equal(t, http.StatusNoContent, rec.Code, "successes are not capped")
}
