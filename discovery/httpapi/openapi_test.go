package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// The tests in this file hold openapi.yaml to the server: the same routes, the same
// security, and for real requests a documented status and a body of the documented shape.
// Names carry a spec prefix: other tests of this package live beside them.

const specToken = "spec-token"

type specSignaler struct{}

var _ discovery.Signaler = specSignaler{}

func (specSignaler) Report(context.Context, string, string, contract.ReportSignal) error { return nil }

// specDoc is openapi.yaml as generic maps, the way JSON decodes it.
type specDoc map[string]any

func loadSpec(t *testing.T) specDoc {
	t.Helper()
	raw, err := os.ReadFile("openapi.yaml")
	require.NoError(t, err)
	var doc specDoc
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	require.Regexp(t, `^3\.0\.\d+$`, doc["openapi"])
	return doc
}

// resolve follows a local $ref ("#/components/...") until it reaches a node without one.
func (d specDoc) resolve(t *testing.T, node any) map[string]any {
	t.Helper()
	m, ok := node.(map[string]any)
	require.True(t, ok, "not an object: %v", node)
	for {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		var cur any = map[string]any(d)
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			obj, ok := cur.(map[string]any)
			require.True(t, ok, "$ref %s", ref)
			cur, ok = obj[part]
			require.True(t, ok, "$ref %s does not resolve", ref)
		}
		m, ok = cur.(map[string]any)
		require.True(t, ok, "$ref %s", ref)
	}
}

var specMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// operations maps "METHOD /path" to each documented operation.
func (d specDoc) operations(t *testing.T) map[string]map[string]any {
	t.Helper()
	paths, ok := d["paths"].(map[string]any)
	require.True(t, ok, "paths")
	ops := map[string]map[string]any{}
	for path, item := range paths {
		for method, op := range d.resolve(t, item) {
			if !slices.Contains(specMethods, method) {
				continue
			}
			ops[strings.ToUpper(method)+" "+path] = d.resolve(t, op)
		}
	}
	return ops
}

// secured reports whether an operation requires a credential: its own security, or the
// document's when it has none.
func (d specDoc) secured(op map[string]any) bool {
	sec, ok := op["security"]
	if !ok {
		sec = d["security"]
	}
	reqs, _ := sec.([]any)
	for _, r := range reqs {
		if m, _ := r.(map[string]any); len(m) > 0 {
			return true
		}
	}
	return false
}

// check lists how v (decoded JSON) breaks schema. It knows the keywords openapi.yaml uses:
// $ref, allOf, type, format date-time, enum, required, properties, additionalProperties,
// maxProperties, items, minimum, maxLength and pattern.
func (d specDoc) check(t *testing.T, schema any, v any, at string) []string {
	t.Helper()
	s := d.resolve(t, schema)
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, args...)) }
	for _, sub := range asSlice(s["allOf"]) {
		errs = append(errs, d.check(t, sub, v, at)...)
	}
	if typ, ok := s["type"].(string); ok && !specHasType(v, typ) {
		fail("want %s, got %T %v", typ, v, v)
		return errs
	}
	if enum, ok := s["enum"].([]any); ok && !slices.ContainsFunc(enum, func(e any) bool { return reflect.DeepEqual(e, v) }) {
		fail("%v is not one of %v", v, enum)
	}
	switch v := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for _, r := range asSlice(s["required"]) {
			if _, ok := v[r.(string)]; !ok {
				fail("required property %q is missing", r)
			}
		}
		if limit, ok := s["maxProperties"].(float64); ok && float64(len(v)) > limit {
			fail("%d properties, at most %v", len(v), limit)
		}
		for _, k := range sortedKeys(v) {
			if ps, ok := props[k]; ok {
				errs = append(errs, d.check(t, ps, v[k], at+"."+k)...)
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					fail("property %q is not allowed", k)
				}
			case map[string]any:
				errs = append(errs, d.check(t, ap, v[k], at+"."+k)...)
			}
		}
	case []any:
		if items, ok := s["items"]; ok {
			for i, e := range v {
				errs = append(errs, d.check(t, items, e, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	case float64:
		if limit, ok := s["minimum"].(float64); ok && v < limit {
			fail("%v is below the minimum %v", v, limit)
		}
	case string:
		if limit, ok := s["maxLength"].(float64); ok && float64(len([]rune(v))) > limit {
			fail("%d characters, at most %v", len([]rune(v)), limit)
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(v) {
			fail("%q does not match %s", v, p)
		}
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
				fail("not a date-time: %v", err)
			}
		}
	}
	return errs
}

func specHasType(v any, typ string) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f)
	}
	return false
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// specServer is a real server over a small fleet: eu-1 is healthy with one lease slot and
// takes credentials (so lease answers carry them and listings must not), ap-1 is
// unhealthy.
type specServer struct {
	store   *discovery.Store
	handler http.Handler
	// client is the name of specToken's client, whose leases the cases act on.
	client string
}

// specFleet is the spec server's fleet.
func specFleet() []discovery.Proxy {
	return []discovery.Proxy{
		{Name: "eu-1", Namespace: "crawl", IP: "10.0.0.1", Port: 3128, Healthy: true,
			Phase: "Ready", MaxLeases: 1, LatencyMillis: 12, Attributes: map[string]string{"region": "eu"},
			Credentials: proxyauth.Credentials{Username: "proxyfleet", Password: "spec/p@ss"}},
		{Name: "ap-1", Namespace: "crawl", IP: "10.0.0.2", Port: 3128, Healthy: false,
			Phase: "Ready", MaxLeases: 1, Attributes: map[string]string{"region": "ap"}},
	}
}

// newSpecServer serves specFleet, loaded as a full pass from Temporal would load it.
func newSpecServer(t *testing.T) *specServer {
	t.Helper()
	s := newLoadingSpecServer(t)
	s.store.ReplaceAll(specFleet())
	return s
}

// newLoadingSpecServer is a server whose index has not been loaded yet: what every replica
// is right after it starts. Upserts do not load it: only a full pass knows the whole fleet.
func newLoadingSpecServer(t *testing.T) *specServer {
	t.Helper()
	store := discovery.NewStore(30 * time.Minute)
	for _, p := range specFleet() {
		store.Upsert(p)
	}
	srv := service.NewAPI(discovery.Config{Token: specToken}, store, specSignaler{},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	return &specServer{store: store, handler: srv.Handler(), client: discovery.DefaultClientName}
}

// newRestoringSpecServer is replica 0 of two, serving specFleet, that has not taken its
// leases back from replica 1 (which does not answer): what a replica is after a restart
// while a peer is down.
func newRestoringSpecServer(t *testing.T) *specServer {
	t.Helper()
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll(specFleet())
	rc := discovery.ReplicaConfig{Peers: []string{"http://" + testenv.FreeAddr(t), "http://" + testenv.FreeAddr(t)}, Self: 0, Tokens: []string{"peer"}}
	srv := service.NewReplica(discovery.Config{Token: specToken}, rc, store, specSignaler{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	return &specServer{store: store, handler: srv.Handler(), client: discovery.DefaultClientName}
}

// newLimitedSpecServer serves specFleet to one named client, "spec", with the given limits.
// A rate-limited client has spent its one request of the burst already.
func newLimitedSpecServer(t *testing.T, c discovery.ClientConfig) *specServer {
	t.Helper()
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll(specFleet())
	c.Name, c.Token = "spec", specToken
	srv := service.NewAPI(discovery.Config{Clients: discovery.NewClients([]discovery.ClientConfig{c})}, store, specSignaler{},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	s := &specServer{store: store, handler: srv.Handler(), client: c.Name}
	if c.RequestsPerSecond > 0 {
		require.Equal(t, http.StatusOK, s.serve(http.MethodGet, "/v1/proxies", "", specToken).Code)
	}
	if c.MaxLeases > 0 {
		_, err := store.Lease(discovery.Want{Client: "spec", MaxLeases: c.MaxLeases, TTL: time.Hour})
		require.NoError(t, err)
	}
	return s
}

// lease grants specToken's client a lease directly in the store and returns its ID.
func (s *specServer) lease(t *testing.T, ttl time.Duration) string {
	t.Helper()
	l, err := s.store.Lease(discovery.Want{Client: s.client, Target: "shop.example", TTL: ttl})
	require.NoError(t, err)
	return l.ID
}

func (s *specServer) serve(method, path, body, token string) *httptest.ResponseRecorder {
	auth := ""
	if token != "" {
		auth = "Bearer " + token
	}
	return serve(s.handler, method, path, body, auth)
}

// serve sends one request to handler, with a JSON body and an Authorization when given.
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

var ginParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

func TestOpenAPIRoutes(t *testing.T) {
	doc := loadSpec(t)
	h := newSpecServer(t).handler
	engine, ok := h.(*gin.Engine)
	require.True(t, ok, "Handler returns %T, not a *gin.Engine: list its routes another way", h)

	var served []string
	for _, r := range engine.Routes() {
		served = append(served, r.Method+" "+ginParam.ReplaceAllString(r.Path, "{$1}"))
	}
	documented := sortedKeys(doc.operations(t))
	assert.ElementsMatch(t, served, documented, "routes served (first) and documented (second)")
}

func TestOpenAPISecurity(t *testing.T) {
	doc := loadSpec(t)
	s := newSpecServer(t)
	id := s.lease(t, time.Hour)
	for key, op := range doc.operations(t) {
		method, path, _ := strings.Cut(key, " ")
		t.Run(key, func(t *testing.T) {
			// Every route under /v1 is for crawlers holding the token; health and metrics
			// are for probes and Prometheus, which hold none.
			assert.Equal(t, strings.HasPrefix(path, "/v1/"), doc.secured(op), "documented security")
			rec := s.serve(method, strings.ReplaceAll(path, "{id}", id), "", "")
			if doc.secured(op) {
				assert.Equal(t, http.StatusUnauthorized, rec.Code, "without a token")
			} else {
				assert.Equal(t, http.StatusOK, rec.Code, "without a token")
			}
		})
	}
}

// specCase is one request and what the document says of it.
type specCase struct {
	name string
	// op is the documented operation ("POST /v1/leases/{id}/renew"); {id} becomes the
	// lease prepare returns. Empty for requests no operation serves, which component
	// (under components/responses) documents instead, sent as method and path.
	op           string
	component    string
	method, path string
	prepare      func(t *testing.T, s *specServer) string
	query        string
	body         string
	noToken      bool
	// loading sends the request before the index is loaded (newLoadingSpecServer),
	// restoring to a replica taking its leases back (newRestoringSpecServer); throttled
	// as a client over its rate, limited as one holding its one lease
	// (newLimitedSpecServer).
	loading, restoring, throttled, limited bool
	wantStatus                             int
	wantCode                               string
	// bodyConforms, when set, is whether the request body fits the documented schema: a
	// request the server refuses for a reason the schema can express must not fit it.
	bodyConforms *bool
	// wantHeaders must be in the answer, beyond the ones the spec requires.
	wantHeaders []string
}

func TestOpenAPIResponses(t *testing.T) {
	doc := loadSpec(t)
	yes, no := new(bool), new(bool)
	*yes = true
	live := func(t *testing.T, s *specServer) string { return s.lease(t, time.Hour) }
	expired := func(t *testing.T, s *specServer) string {
		id := s.lease(t, time.Minute)
		s.store.SetClock(func() time.Time { return time.Now().Add(2 * time.Minute) })
		return id
	}
	unknown := func(*testing.T, *specServer) string { return "0123456789abcdef0123456789abcdef" }
	gone := func(t *testing.T, s *specServer) string {
		id := s.lease(t, time.Hour)
		l, err := s.store.Lookup(s.client, id)
		require.NoError(t, err)
		s.store.Remove(l.ProxyID)
		return id
	}
	reported := func(t *testing.T, s *specServer) string {
		id := s.lease(t, time.Hour)
		for i := range discovery.DefaultMaxReportsPerLease {
			_, _, err := s.store.Report(s.client, id, fmt.Sprintf("t%d.example", i), time.Now().Add(time.Minute))
			require.NoError(t, err)
		}
		return id
	}
	full := func(t *testing.T, s *specServer) string {
		for {
			if _, err := s.store.Acquire(discovery.Selector{"region": "eu"}, "", time.Hour); err != nil {
				return ""
			}
		}
	}
	// sessioned leases for the session crawl-7 of the client "default" (the token's).
	sessioned := func(t *testing.T, s *specServer) string {
		_, err := s.store.Lease(discovery.Want{Client: discovery.DefaultClientName, Session: "crawl-7", Target: "shop.example",
			TTL: time.Hour})
		require.NoError(t, err)
		return "crawl-7"
	}
	sessionReported := func(t *testing.T, s *specServer) string {
		name := sessioned(t, s)
		id, ok := s.store.SessionLease(discovery.DefaultClientName, name)
		require.True(t, ok)
		for i := range discovery.DefaultMaxReportsPerLease {
			_, _, err := s.store.Report(s.client, id, fmt.Sprintf("t%d.example", i), time.Now().Add(time.Minute))
			require.NoError(t, err)
		}
		return name
	}
	noSession := func(*testing.T, *specServer) string { return "crawl-8" }
	huge := `{"target":"` + strings.Repeat("a", 70<<10) + `"}`

	cases := []specCase{
		{name: "health", op: "GET /healthz", noToken: true, wantStatus: 200},
		{name: "health head", op: "HEAD /healthz", noToken: true, wantStatus: 200},
		{name: "ready", op: "GET /readyz", noToken: true, wantStatus: 200},
		{name: "ready head", op: "HEAD /readyz", noToken: true, wantStatus: 200},
		{name: "ready loading", op: "GET /readyz", noToken: true, loading: true, wantStatus: 503,
			wantCode: "index_loading"},
		{name: "ready head loading", op: "HEAD /readyz", noToken: true, loading: true, wantStatus: 503},
		{name: "ready restoring", op: "GET /readyz", noToken: true, restoring: true, wantStatus: 503,
			wantCode: "replicas_unavailable", wantHeaders: []string{"Retry-After"}},
		{name: "metrics", op: "GET /metrics", noToken: true, wantStatus: 200},

		{name: "list all", op: "GET /v1/proxies", wantStatus: 200},
		{name: "list filtered", op: "GET /v1/proxies", query: "attr.region=eu&healthy=true", wantStatus: 200},
		{name: "list bad selector", op: "GET /v1/proxies", query: "attr.Region=eu", wantStatus: 400, wantCode: "invalid_selector"},
		{name: "list bad healthy", op: "GET /v1/proxies", query: "healthy=maybe", wantStatus: 400, wantCode: "invalid"},
		{name: "list without token", op: "GET /v1/proxies", noToken: true, wantStatus: 401, wantCode: "unauthorized"},
		{name: "list loading", op: "GET /v1/proxies", loading: true, wantStatus: 503, wantCode: "index_loading"},
		{name: "list throttled", op: "GET /v1/proxies", throttled: true, wantStatus: 429, wantCode: "too_many_requests",
			wantHeaders: []string{"Retry-After"}},

		{name: "demand", op: "GET /v1/demand", query: "attr.region=eu", wantStatus: 200},
		{name: "demand of everything", op: "GET /v1/demand", wantStatus: 200},
		{name: "demand bad selector", op: "GET /v1/demand", query: "attr.Region=eu", wantStatus: 400, wantCode: "invalid_selector"},
		{name: "demand unknown parameter", op: "GET /v1/demand", query: "region=eu", wantStatus: 400, wantCode: "invalid"},
		{name: "demand without token", op: "GET /v1/demand", noToken: true, wantStatus: 401, wantCode: "unauthorized"},
		{name: "demand loading", op: "GET /v1/demand", loading: true, wantStatus: 503, wantCode: "index_loading"},
		{name: "demand throttled", op: "GET /v1/demand", throttled: true, wantStatus: 429, wantCode: "too_many_requests",
			wantHeaders: []string{"Retry-After"}},

		{name: "acquire", op: "POST /v1/leases", body: `{"selector":{"region":"eu"},"ttlSeconds":60,"target":"shop.example"}`,
			wantStatus: 201, bodyConforms: yes},
		{name: "acquire empty body", op: "POST /v1/leases", wantStatus: 201},
		{name: "acquire with a session", op: "POST /v1/leases", body: `{"session":"crawl-7"}`, wantStatus: 201,
			bodyConforms: yes},
		{name: "acquire bad session", op: "POST /v1/leases", body: `{"session":"crawl 7"}`, wantStatus: 400,
			wantCode: "invalid", bodyConforms: no},
		{name: "acquire unknown field", op: "POST /v1/leases", body: `{"ttl":60}`, wantStatus: 400, wantCode: "invalid",
			bodyConforms: no},
		{name: "acquire wrong type", op: "POST /v1/leases", body: `{"ttlSeconds":"60"}`, wantStatus: 400, wantCode: "invalid",
			bodyConforms: no},
		{name: "acquire negative ttl", op: "POST /v1/leases", body: `{"ttlSeconds":-1}`, wantStatus: 400, wantCode: "invalid",
			bodyConforms: no},
		{name: "acquire bad target", op: "POST /v1/leases", body: `{"target":"shop.example/cart"}`, wantStatus: 400,
			wantCode: "invalid", bodyConforms: no},
		{name: "acquire bad selector value", op: "POST /v1/leases", body: `{"selector":{"region":"eu west"}}`, wantStatus: 400,
			wantCode: "invalid_selector", bodyConforms: no},
		{name: "acquire ttl over the maximum", op: "POST /v1/leases", body: `{"ttlSeconds":7200}`, wantStatus: 400,
			wantCode: "invalid"},
		{name: "acquire with a wait", op: "POST /v1/leases", body: `{"selector":{"region":"eu"},"waitSeconds":5}`,
			wantStatus: 201, bodyConforms: yes},
		{name: "acquire wait over the maximum", op: "POST /v1/leases", body: `{"waitSeconds":3600}`, wantStatus: 400,
			wantCode: "invalid"},
		{name: "acquire negative wait", op: "POST /v1/leases", body: `{"waitSeconds":-1}`, wantStatus: 400,
			wantCode: "invalid", bodyConforms: no},
		{name: "acquire no match after a wait", op: "POST /v1/leases", prepare: full, body: `{"selector":{"region":"eu"},"waitSeconds":1}`,
			wantStatus: 409, wantCode: "no_match", wantHeaders: []string{"Retry-After"}},
		{name: "acquire without token", op: "POST /v1/leases", noToken: true, wantStatus: 401, wantCode: "unauthorized"},
		{name: "acquire no match", op: "POST /v1/leases", body: `{"selector":{"region":"ap"}}`, wantStatus: 409,
			wantCode: "no_match", bodyConforms: yes},
		{name: "acquire no match, frees up", op: "POST /v1/leases", prepare: full, body: `{"selector":{"region":"eu"}}`,
			wantStatus: 409, wantCode: "no_match", wantHeaders: []string{"Retry-After"}},
		{name: "acquire too large", op: "POST /v1/leases", body: huge, wantStatus: 413, wantCode: "too_large"},
		{name: "acquire loading", op: "POST /v1/leases", body: `{"selector":{"region":"eu"}}`, loading: true,
			wantStatus: 503, wantCode: "index_loading", bodyConforms: yes},
		{name: "acquire throttled", op: "POST /v1/leases", throttled: true, wantStatus: 429, wantCode: "too_many_requests",
			wantHeaders: []string{"Retry-After"}},
		{name: "acquire over the client's leases", op: "POST /v1/leases", limited: true, wantStatus: 429, wantCode: "lease_limit",
			wantHeaders: []string{"Retry-After"}},
		{name: "renew throttled", op: "POST /v1/leases/{id}/renew", prepare: live, throttled: true, wantStatus: 429,
			wantCode: "too_many_requests", wantHeaders: []string{"Retry-After"}},
		{name: "release throttled", op: "DELETE /v1/leases/{id}", prepare: live, throttled: true, wantStatus: 429,
			wantCode: "too_many_requests", wantHeaders: []string{"Retry-After"}},
		{name: "report throttled", op: "POST /v1/leases/{id}/report", prepare: live, throttled: true, body: `{"result":"ok"}`,
			wantStatus: 429, wantCode: "too_many_requests", wantHeaders: []string{"Retry-After"}},
		{name: "acquire, owners restoring", op: "POST /v1/leases", body: `{"selector":{"region":"eu"}}`, restoring: true,
			wantStatus: 503, wantCode: "replicas_unavailable", wantHeaders: []string{"Retry-After"}},
		{name: "renew, owner restoring", op: "POST /v1/leases/{id}/renew", prepare: live, restoring: true,
			wantStatus: 503, wantCode: "replicas_unavailable", wantHeaders: []string{"Retry-After"}},
		{name: "release, owner restoring", op: "DELETE /v1/leases/{id}", prepare: live, restoring: true,
			wantStatus: 503, wantCode: "replicas_unavailable", wantHeaders: []string{"Retry-After"}},
		{name: "report, owner restoring", op: "POST /v1/leases/{id}/report", prepare: live, restoring: true,
			body: `{"result":"ok"}`, wantStatus: 503, wantCode: "replicas_unavailable", wantHeaders: []string{"Retry-After"}},

		{name: "renew", op: "POST /v1/leases/{id}/renew", prepare: live, body: `{"ttlSeconds":120}`, wantStatus: 200,
			bodyConforms: yes},
		{name: "renew empty body", op: "POST /v1/leases/{id}/renew", prepare: live, wantStatus: 200},
		{name: "renew unknown field", op: "POST /v1/leases/{id}/renew", prepare: live, body: `{"ttlSeconds":1,"target":"x"}`,
			wantStatus: 400, wantCode: "invalid", bodyConforms: no},
		{name: "renew without token", op: "POST /v1/leases/{id}/renew", prepare: live, noToken: true, wantStatus: 401,
			wantCode: "unauthorized"},
		{name: "renew unknown", op: "POST /v1/leases/{id}/renew", prepare: unknown, wantStatus: 404, wantCode: "unknown_lease"},
		{name: "renew expired", op: "POST /v1/leases/{id}/renew", prepare: expired, wantStatus: 410, wantCode: "lease_expired"},
		{name: "renew proxy gone", op: "POST /v1/leases/{id}/renew", prepare: gone, wantStatus: 410, wantCode: "proxy_gone"},
		{name: "renew too large", op: "POST /v1/leases/{id}/renew", prepare: live, body: huge, wantStatus: 413,
			wantCode: "too_large"},

		{name: "release", op: "DELETE /v1/leases/{id}", prepare: live, wantStatus: 204},
		{name: "release unknown", op: "DELETE /v1/leases/{id}", prepare: unknown, wantStatus: 204},
		{name: "release without token", op: "DELETE /v1/leases/{id}", prepare: live, noToken: true, wantStatus: 401,
			wantCode: "unauthorized"},

		{name: "report", op: "POST /v1/leases/{id}/report", prepare: live, body: `{"result":"banned","target":"shop.example"}`,
			wantStatus: 204, bodyConforms: yes},
		{name: "report expired lease", op: "POST /v1/leases/{id}/report", prepare: expired, body: `{"result":"rate_limited"}`,
			wantStatus: 204, bodyConforms: yes},
		{name: "report bad result", op: "POST /v1/leases/{id}/report", prepare: live, body: `{"result":"blocked"}`,
			wantStatus: 400, wantCode: "invalid_result", bodyConforms: no},
		{name: "report no result", op: "POST /v1/leases/{id}/report", prepare: live, body: `{}`,
			wantStatus: 400, wantCode: "invalid_result", bodyConforms: no},
		{name: "report no body", op: "POST /v1/leases/{id}/report", prepare: live, wantStatus: 400, wantCode: "invalid",
			bodyConforms: no},
		{name: "report without token", op: "POST /v1/leases/{id}/report", prepare: live, noToken: true, wantStatus: 401,
			wantCode: "unauthorized"},
		{name: "report over the limit", op: "POST /v1/leases/{id}/report", prepare: reported,
			body: `{"result":"banned","target":"more.example"}`, wantStatus: 429, wantCode: "report_limit"},
		{name: "report unknown", op: "POST /v1/leases/{id}/report", prepare: unknown, body: `{"result":"ok"}`,
			wantStatus: 404, wantCode: "unknown_lease"},
		{name: "report too large", op: "POST /v1/leases/{id}/report", prepare: live, body: huge, wantStatus: 413,
			wantCode: "too_large"},

		{name: "report a session", op: "POST /v1/sessions/{session}/report", prepare: sessioned, body: `{"result":"banned"}`,
			wantStatus: 204, bodyConforms: yes},
		{name: "report a session, bad result", op: "POST /v1/sessions/{session}/report", prepare: sessioned,
			body: `{"result":"blocked"}`, wantStatus: 400, wantCode: "invalid_result", bodyConforms: no},
		{name: "report a session without token", op: "POST /v1/sessions/{session}/report", prepare: sessioned, noToken: true,
			body: `{"result":"banned"}`, wantStatus: 401, wantCode: "unauthorized"},
		{name: "report an unknown session", op: "POST /v1/sessions/{session}/report", prepare: noSession,
			body: `{"result":"banned"}`, wantStatus: 404, wantCode: "unknown_session"},
		{name: "report a session too large", op: "POST /v1/sessions/{session}/report", prepare: sessioned, body: huge,
			wantStatus: 413, wantCode: "too_large"},
		{name: "report a session throttled", op: "POST /v1/sessions/{session}/report", prepare: sessioned, throttled: true,
			body: `{"result":"ok"}`, wantStatus: 429, wantCode: "too_many_requests", wantHeaders: []string{"Retry-After"}},
		{name: "report a session over the limit", op: "POST /v1/sessions/{session}/report", prepare: sessionReported,
			body: `{"result":"banned","target":"more.example"}`, wantStatus: 429, wantCode: "report_limit"},
		{name: "report a session, owner restoring", op: "POST /v1/sessions/{session}/report", prepare: sessioned,
			restoring: true, body: `{"result":"banned"}`, wantStatus: 503, wantCode: "replicas_unavailable",
			wantHeaders: []string{"Retry-After"}},

		{name: "unknown path", component: "NotFound", method: "GET", path: "/v1/nothing", noToken: true, wantStatus: 404,
			wantCode: "not_found"},
		{name: "method not allowed", component: "MethodNotAllowed", method: "GET", path: "/v1/leases", noToken: true,
			wantStatus: 405, wantCode: "method_not_allowed"},
	}

	ops := doc.operations(t)
	exercised := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSpecServer(t)
			if tc.loading {
				s = newLoadingSpecServer(t)
			}
			if tc.restoring {
				s = newRestoringSpecServer(t)
			}
			if tc.throttled {
				s = newLimitedSpecServer(t, discovery.ClientConfig{RequestsPerSecond: 0.001, Burst: 1})
			}
			if tc.limited {
				s = newLimitedSpecServer(t, discovery.ClientConfig{MaxLeases: 1})
			}
			var responses map[string]any
			method, path := tc.method, tc.path
			if tc.op != "" {
				op, ok := ops[tc.op]
				require.True(t, ok, "%s is not documented", tc.op)
				responses = doc.resolve(t, op["responses"])
				method, path, _ = strings.Cut(tc.op, " ")
				if tc.prepare != nil {
					id := tc.prepare(t, s)
					path = strings.ReplaceAll(strings.ReplaceAll(path, "{id}", id), "{session}", id)
				}
				if tc.bodyConforms != nil {
					checkRequestBody(t, doc, op, tc.body, *tc.bodyConforms)
				}
			}
			if tc.query != "" {
				path += "?" + tc.query
			}
			token := specToken
			if tc.noToken {
				token = ""
			}

			rec := s.serve(method, path, tc.body, token)
			require.Equal(t, tc.wantStatus, rec.Code, "%s", rec.Body)
			for _, h := range tc.wantHeaders {
				assert.NotEmpty(t, rec.Header().Get(h), "header %s", h)
			}

			if tc.op != "" {
				code := strconv.Itoa(rec.Code)
				resp, ok := responses[code]
				require.True(t, ok, "%s answered %d, which is not documented", tc.op, rec.Code)
				exercised[tc.op+" "+code] = true
				checkResponse(t, doc, resp, rec, tc.wantCode)
				return
			}
			shared, _ := doc.resolve(t, doc["components"])["responses"].(map[string]any)
			resp, ok := shared[tc.component]
			require.True(t, ok, "components/responses/%s is not documented", tc.component)
			checkResponse(t, doc, resp, rec, tc.wantCode)
		})
	}

	// Every documented answer is exercised above, except the 500 of a bug.
	for key, op := range ops {
		for code := range doc.resolve(t, op["responses"]) {
			if code != "500" {
				assert.True(t, exercised[key+" "+code], "no case answers %s with %s", key, code)
			}
		}
	}
}

// checkRequestBody asserts whether body fits the operation's documented request body.
func checkRequestBody(t *testing.T, doc specDoc, op map[string]any, body string, conforms bool) {
	t.Helper()
	rb, ok := op["requestBody"]
	require.True(t, ok, "the operation documents no request body")
	rbm := doc.resolve(t, rb)
	var errs []string
	if body == "" {
		if rbm["required"] == true {
			errs = append(errs, "the body is required")
		}
	} else {
		media, ok := doc.resolve(t, rbm["content"])["application/json"]
		require.True(t, ok, "no application/json request body")
		var v any
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		errs = doc.check(t, doc.resolve(t, media)["schema"], v, "request")
	}
	if conforms {
		assert.Empty(t, errs, "the request body should fit the documented schema")
	} else {
		assert.NotEmpty(t, errs, "the server refuses %s; the documented schema should too", body)
	}
}

// checkResponse asserts that rec fits the documented response: its headers, its media
// type, and a JSON body of the documented schema with the expected error code.
func checkResponse(t *testing.T, doc specDoc, response any, rec *httptest.ResponseRecorder, wantCode string) {
	t.Helper()
	r := doc.resolve(t, response)
	if headers, ok := r["headers"].(map[string]any); ok {
		for name, h := range headers {
			if hm, _ := doc.resolve(t, h)["required"].(bool); !hm {
				if _, said := doc.resolve(t, h)["required"]; said {
					continue // documented as optional
				}
			}
			assert.NotEmpty(t, rec.Header().Get(name), "documented header %s", name)
		}
	}
	content, ok := r["content"].(map[string]any)
	if !ok {
		assert.Empty(t, rec.Body.String(), "the response documents no body")
		return
	}
	mt, _, err := mime.ParseMediaType(rec.Header().Get("Content-Type"))
	require.NoError(t, err)
	media, ok := content[mt]
	require.True(t, ok, "Content-Type %s is not documented (%v)", mt, sortedKeys(content))
	if mt != "application/json" {
		return
	}
	var body any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	assert.Empty(t, doc.check(t, doc.resolve(t, media)["schema"], body, "response"), "%s", rec.Body)
	if wantCode != "" {
		obj, _ := body.(map[string]any)
		assert.Equal(t, wantCode, obj["error"])
	}
}

// TestSpecErrorCodesAreTheTable: the codes openapi.yaml documents for error answers are
// exactly the lease API's codes of the one table the server, the gateway and the Go client
// read (package codes).
func TestSpecErrorCodesAreTheTable(t *testing.T) {
	doc := loadSpec(t)
	errSchema := doc.resolve(t, map[string]any{"$ref": "#/components/schemas/Error"})
	props, _ := errSchema["properties"].(map[string]any)
	field, _ := props["error"].(map[string]any)
	var documented []string
	for _, v := range asSlice(field["enum"]) {
		documented = append(documented, v.(string))
	}
	assert.ElementsMatch(t, codes.API(), documented)
}
