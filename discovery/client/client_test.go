package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

const testToken = "s3cret"

// fakeSignaler stands in for the proxies' workflows.
type fakeSignaler struct {
	report func(namespace, name string, sig contract.ReportSignal) error
}

var _ discovery.Signaler = (*fakeSignaler)(nil)

func (f *fakeSignaler) Report(_ context.Context, namespace, name string, sig contract.ReportSignal) error {
	if f.report == nil {
		return nil
	}
	return f.report(namespace, name, sig)
}

// signals records what the server forwards to the workflows.
type signals struct {
	mu  sync.Mutex
	got []contract.ReportSignal
}

func (s *signals) record(_, _ string, sig contract.ReportSignal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, sig)
	return nil
}

func (s *signals) list() []contract.ReportSignal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]contract.ReportSignal(nil), s.got...)
}

type fixture struct {
	store   *discovery.Store
	signals *signals
	url     string
	client  *Client
}

// newFixture runs the real discovery server on 127.0.0.1 over a store holding proxies,
// loaded as a full pass from Temporal loads them, with a client using the right token.
func newFixture(t *testing.T, proxies ...discovery.Proxy) *fixture {
	t.Helper()
	f := newLoadingFixture(t)
	f.store.ReplaceAll(proxies)
	return f
}

// newLoadingFixture is newFixture before the server's index is loaded, as right after a
// restart of discovery.
func newLoadingFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{store: discovery.NewStore(30 * time.Minute), signals: &signals{}}
	srv := service.NewAPI(discovery.Config{Token: testToken}, f.store,
		&fakeSignaler{report: f.signals.record}, slog.New(slog.DiscardHandler), nil)
	go srv.RunReports(t.Context())
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	f.url = hs.URL
	f.client = New(hs.URL, testToken, WithHTTPClient(hs.Client()))
	return f
}

func proxy(name string, healthy bool, maxLeases int, attrs map[string]string) discovery.Proxy {
	return discovery.Proxy{Name: name, Namespace: "crawl", IP: "10.0.0.1", Port: 3128,
		Attributes: attrs, LatencyMillis: 20, Healthy: healthy, Phase: "Ready", MaxLeases: maxLeases}
}

func apiError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	require.ErrorAs(t, err, &e)
	return e
}

func TestListProxies(t *testing.T) {
	f := newFixture(t,
		proxy("eu-1", true, 2, map[string]string{"region": "eu"}),
		proxy("eu-2", false, 2, map[string]string{"region": "eu"}),
		proxy("us-1", true, 2, map[string]string{"region": "us"}),
	)
	yes, no := true, false
	tests := []struct {
		name     string
		selector map[string]string
		healthy  *bool
		want     []string
	}{
		{name: "all", want: []string{"eu-1", "eu-2", "us-1"}},
		{name: "selector", selector: map[string]string{"region": "eu"}, want: []string{"eu-1", "eu-2"}},
		{name: "healthy", healthy: &yes, want: []string{"eu-1", "us-1"}},
		{name: "unhealthy in region", selector: map[string]string{"region": "eu"}, healthy: &no, want: []string{"eu-2"}},
		{name: "no match", selector: map[string]string{"region": "ap"}, want: []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			list, err := f.client.ListProxies(t.Context(), tc.selector, tc.healthy)
			require.NoError(t, err)
			names := []string{}
			for _, p := range list.Proxies {
				names = append(names, p.Name)
			}
			assert.Equal(t, tc.want, names)
			assert.Equal(t, len(tc.want), list.Count)
		})
	}

	t.Run("fields", func(t *testing.T) {
		list, err := f.client.ListProxies(t.Context(), map[string]string{"region": "us"}, nil)
		require.NoError(t, err)
		require.Len(t, list.Proxies, 1)
		assert.Equal(t, ListedProxy{
			Proxy: Proxy{Name: "us-1", Namespace: "crawl", URL: "http://10.0.0.1:3128", IP: "10.0.0.1", Port: 3128,
				Attributes: map[string]string{"region": "us"}, LatencyMillis: 20},
			Healthy: true, Phase: "Ready", ActiveLeases: 0, MaxLeases: 2,
		}, list.Proxies[0])
	})

	t.Run("invalid selector", func(t *testing.T) {
		_, err := f.client.ListProxies(t.Context(), map[string]string{"Region": "eu"}, nil)
		e := apiError(t, err)
		assert.Equal(t, http.StatusBadRequest, e.Status)
		assert.Equal(t, CodeInvalidSelector, e.Code)
		assert.Contains(t, e.Message, "Region")
	})
}

func TestLeaseLifecycle(t *testing.T) {
	f := newFixture(t, proxy("eu-1", true, 1, map[string]string{"region": "eu"}))
	ctx := t.Context()

	before := time.Now()
	l, err := f.client.Acquire(ctx, AcquireRequest{Selector: map[string]string{"region": "eu"}, TTL: 90 * time.Second,
		Target: "shop.example"})
	require.NoError(t, err)
	assert.Len(t, l.ID, 32)
	assert.Equal(t, LeasedProxy{Proxy: Proxy{Name: "eu-1", Namespace: "crawl", URL: "http://10.0.0.1:3128", IP: "10.0.0.1",
		Port: 3128, Attributes: map[string]string{"region": "eu"}, LatencyMillis: 20}}, l.Proxy, "no credentials: it takes none")
	assert.Equal(t, "shop.example", l.Target)
	assert.Equal(t, 90, l.TTLSeconds)
	assert.WithinRange(t, l.ExpiresAt, before.Add(90*time.Second), time.Now().Add(90*time.Second))

	t.Run("renew keeps the proxy", func(t *testing.T) {
		before := time.Now()
		r, err := f.client.Renew(ctx, l.ID, 10*time.Minute)
		require.NoError(t, err)
		assert.Equal(t, l.ID, r.ID)
		assert.Equal(t, l.Proxy, r.Proxy)
		assert.Equal(t, 600, r.TTLSeconds)
		assert.WithinRange(t, r.ExpiresAt, before.Add(10*time.Minute), time.Now().Add(10*time.Minute))
	})

	t.Run("renew beyond the maximum", func(t *testing.T) {
		_, err := f.client.Renew(ctx, l.ID, 2*time.Hour)
		e := apiError(t, err)
		assert.Equal(t, http.StatusBadRequest, e.Status)
		assert.Equal(t, CodeInvalid, e.Code)
	})

	t.Run("the only proxy is taken", func(t *testing.T) {
		_, err := f.client.Acquire(ctx, AcquireRequest{Selector: map[string]string{"region": "eu"}})
		require.True(t, IsNoMatch(err), "%v", err)
		assert.Equal(t, 1, apiError(t, err).AtCapacity)
	})

	t.Run("report", func(t *testing.T) {
		require.NoError(t, f.client.Report(ctx, l.ID, ResultOK, ""))
		require.NoError(t, f.client.Report(ctx, l.ID, ResultBanned, ""))
		// The report went to the proxy's workflow, for the lease's target.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := f.signals.list()
			if assert.Len(c, got, 1) {
				assert.Equal(c, "shop.example", got[0].Target)
				assert.Equal(c, ResultBanned, got[0].Result)
				assert.WithinRange(c, got[0].Until, time.Now().Add(29*time.Minute), time.Now().Add(31*time.Minute))
			}
		}, 5*time.Second, 10*time.Millisecond)

		err := f.client.Report(ctx, l.ID, "blocked", "")
		e := apiError(t, err)
		assert.Equal(t, http.StatusBadRequest, e.Status)
		assert.Equal(t, CodeInvalidResult, e.Code)

		err = f.client.Report(ctx, l.ID, ResultOK, "https://shop.example/")
		assert.Equal(t, CodeInvalid, apiError(t, err).Code)
	})

	t.Run("release is idempotent", func(t *testing.T) {
		require.NoError(t, f.client.Release(ctx, l.ID))
		require.NoError(t, f.client.Release(ctx, l.ID))
		require.NoError(t, f.client.Release(ctx, "never-granted"))
		_, err := f.client.Renew(ctx, l.ID, 0)
		assert.True(t, IsLeaseGone(err), "%v", err)
		assert.Equal(t, http.StatusGone, apiError(t, err).Status, "a released lease cannot be renewed")
	})

	t.Run("the ban holds for the target only", func(t *testing.T) {
		_, err := f.client.Acquire(ctx, AcquireRequest{Target: "shop.example"})
		require.True(t, IsNoMatch(err), "%v", err)
		assert.Equal(t, 1, apiError(t, err).InCooldown)

		other, err := f.client.Acquire(ctx, AcquireRequest{Target: "news.example"})
		require.NoError(t, err)
		assert.Equal(t, 300, other.TTLSeconds, "the default TTL")
	})
}

func TestAcquireNoMatchCounts(t *testing.T) {
	pool := map[string]string{"pool": "p"}
	tests := []struct {
		name    string
		proxies []discovery.Proxy
		prepare func(t *testing.T, f *fixture)
		target  string
		want    Error
	}{
		{
			name:    "nothing matches",
			proxies: []discovery.Proxy{proxy("other", true, 1, map[string]string{"pool": "q"})},
			want:    Error{Status: 409, Code: CodeNoMatch},
		},
		{
			name:    "unhealthy",
			proxies: []discovery.Proxy{proxy("a", false, 1, pool), proxy("b", false, 1, pool)},
			want:    Error{Status: 409, Code: CodeNoMatch, Considered: 2, Unhealthy: 2},
		},
		{
			name:    "one of each",
			proxies: []discovery.Proxy{proxy("sick", false, 1, pool), proxy("busy", true, 1, pool), proxy("rest", true, 1, pool)},
			prepare: func(t *testing.T, f *fixture) {
				f.store.Cooldown("crawl/rest", "shop.example", time.Now().Add(time.Hour))
				l, err := f.client.Acquire(t.Context(), AcquireRequest{Selector: pool, Target: "shop.example"})
				require.NoError(t, err)
				require.Equal(t, "busy", l.Proxy.Name)
			},
			target: "shop.example",
			// busy's lease (the default 5 minutes) ends before rest's cooldown (an hour).
			want: Error{Status: 409, Code: CodeNoMatch, Considered: 3, Unhealthy: 1, AtCapacity: 1, InCooldown: 1,
				RetryAfterSeconds: 300},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.proxies...)
			if tc.prepare != nil {
				tc.prepare(t, f)
			}
			_, err := f.client.Acquire(t.Context(), AcquireRequest{Selector: pool, Target: tc.target})
			require.True(t, IsNoMatch(err), "%v", err)
			got := *apiError(t, err)
			assert.NotEmpty(t, got.Message)
			got.Message = ""
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestIndexLoading: right after discovery starts, listing and acquiring fail with an error
// IsIndexLoading recognises (and IsNoMatch does not: there may well be proxies); once the
// index is loaded the same calls succeed.
func TestIndexLoading(t *testing.T) {
	f := newLoadingFixture(t)

	_, err := f.client.Acquire(t.Context(), AcquireRequest{Selector: map[string]string{"region": "eu"}})
	require.Error(t, err)
	assert.True(t, IsIndexLoading(err), "%v", err)
	assert.False(t, IsNoMatch(err))
	assert.False(t, IsLeaseGone(err))
	e := apiError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, e.Status)
	assert.Equal(t, CodeIndexLoading, e.Code)
	assert.NotEmpty(t, e.Message)

	_, err = f.client.ListProxies(t.Context(), nil, nil)
	assert.True(t, IsIndexLoading(err), "%v", err)

	f.store.ReplaceAll([]discovery.Proxy{proxy("eu-1", true, 1, map[string]string{"region": "eu"})})
	l, err := f.client.Acquire(t.Context(), AcquireRequest{Selector: map[string]string{"region": "eu"}})
	require.NoError(t, err)
	assert.Equal(t, "eu-1", l.Proxy.Name)
	list, err := f.client.ListProxies(t.Context(), nil, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, list.Count)

	assert.False(t, IsIndexLoading(nil))
	assert.False(t, IsIndexLoading(errors.New("index_loading")), "only an API error carries a code")
	assert.False(t, IsIndexLoading(&Error{Status: http.StatusServiceUnavailable, Message: "Service Unavailable"}),
		"a 503 from a load balancer in between is not discovery loading")
}

func TestUnauthorized(t *testing.T) {
	f := newFixture(t, proxy("eu-1", true, 1, nil))
	l, err := f.client.Acquire(t.Context(), AcquireRequest{})
	require.NoError(t, err)

	for name, token := range map[string]string{"wrong token": "guess", "no token": ""} {
		t.Run(name, func(t *testing.T) {
			c := New(f.url+"/", token)
			calls := map[string]func(ctx context.Context) error{
				"list": func(ctx context.Context) error { _, err := c.ListProxies(ctx, nil, nil); return err },
				"acquire": func(ctx context.Context) error {
					_, err := c.Acquire(ctx, AcquireRequest{})
					return err
				},
				"renew":   func(ctx context.Context) error { _, err := c.Renew(ctx, l.ID, 0); return err },
				"release": func(ctx context.Context) error { return c.Release(ctx, l.ID) },
				"report":  func(ctx context.Context) error { return c.Report(ctx, l.ID, ResultBanned, "") },
			}
			for call, do := range calls {
				err := do(t.Context())
				assert.True(t, IsUnauthorized(err), "%s: %v", call, err)
				var e *Error
				if assert.ErrorAs(t, err, &e, call) {
					assert.Equal(t, http.StatusUnauthorized, e.Status, call)
				}
			}
		})
	}

	// Nothing happened to the lease.
	r, err := f.client.Renew(t.Context(), l.ID, 0)
	require.NoError(t, err)
	assert.Equal(t, l.Proxy, r.Proxy)
	assert.Empty(t, f.signals.list())
}

func TestExpiredLease(t *testing.T) {
	f := newFixture(t, proxy("eu-1", true, 1, nil))
	l, err := f.client.Acquire(t.Context(), AcquireRequest{TTL: time.Minute, Target: "shop.example"})
	require.NoError(t, err)
	f.store.SetClock(func() time.Time { return time.Now().Add(2 * time.Minute) })

	_, err = f.client.Renew(t.Context(), l.ID, 0)
	assert.True(t, IsLeaseGone(err), "%v", err)
	e := apiError(t, err)
	assert.Equal(t, http.StatusGone, e.Status)
	assert.Equal(t, CodeLeaseExpired, e.Code)

	// A late report still counts: it arrives exactly when the target pushes back.
	require.NoError(t, f.client.Report(t.Context(), l.ID, ResultRateLimited, ""))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Len(c, f.signals.list(), 1)
	}, 5*time.Second, 10*time.Millisecond)
}

func TestInvalidAcquire(t *testing.T) {
	f := newFixture(t, proxy("eu-1", true, 1, nil))
	tests := []struct {
		name string
		req  AcquireRequest
		code string
	}{
		{name: "ttl over the maximum", req: AcquireRequest{TTL: time.Hour + time.Second}, code: CodeInvalid},
		{name: "negative ttl", req: AcquireRequest{TTL: -time.Millisecond}, code: CodeInvalid},
		{name: "target with a slash", req: AcquireRequest{Target: "shop.example/cart"}, code: CodeInvalid},
		{name: "selector value", req: AcquireRequest{Selector: map[string]string{"pool": "a b"}}, code: CodeInvalidSelector},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.Acquire(t.Context(), tc.req)
			e := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, e.Status)
			assert.Equal(t, tc.code, e.Code)
			assert.False(t, IsNoMatch(err))
		})
	}

	l, err := f.client.Acquire(t.Context(), AcquireRequest{TTL: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, 3600, l.TTLSeconds, "the maximum itself is allowed")
}

func TestSeconds(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want int
	}{
		{0, 0},
		{time.Millisecond, 1},
		{time.Second, 1},
		{1500 * time.Millisecond, 2},
		{5 * time.Minute, 300},
		{-time.Millisecond, -1},
		{-2 * time.Second, -2},
	}
	for _, tc := range tests {
		t.Run(tc.in.String(), func(t *testing.T) {
			assert.Equal(t, tc.want, seconds(tc.in))
		})
	}
}

func TestErrorFromOtherServers(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream unavailable", http.StatusBadGateway)
	}))
	t.Cleanup(hs.Close)
	_, err := New(hs.URL, testToken).ListProxies(t.Context(), nil, nil)
	e := apiError(t, err)
	assert.Equal(t, http.StatusBadGateway, e.Status)
	assert.Empty(t, e.Code)
	assert.Equal(t, "Bad Gateway upstream unavailable", e.Message)
	assert.Equal(t, "discovery: 502: Bad Gateway upstream unavailable", e.Error())
}

func TestLeaseHTTPClient(t *testing.T) {
	// A forward proxy: plain http requests reach it in absolute form.
	var seen []string
	var mu sync.Mutex
	fwd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.RequestURI)
		mu.Unlock()
		_, _ = w.Write([]byte("via proxy"))
	}))
	t.Cleanup(fwd.Close)
	host, p := hostPort(t, fwd)

	f := newFixture(t, discovery.Proxy{Name: "local", Namespace: "crawl", IP: host, Port: p, Healthy: true, MaxLeases: 1})
	l, err := f.client.Acquire(t.Context(), AcquireRequest{})
	require.NoError(t, err)
	want := &url.URL{Scheme: "http", Host: fwd.Listener.Addr().String()}
	assert.Equal(t, want, l.ProxyURL())

	hc := l.HTTPClient()
	defer hc.CloseIdleConnections()
	tr, ok := hc.Transport.(*http.Transport)
	require.True(t, ok, "transport is %T", hc.Transport)
	for _, target := range []string{"http://shop.example/", "https://shop.example/cart"} {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		got, err := tr.Proxy(req)
		require.NoError(t, err)
		assert.Equal(t, want, got, target)
	}
	assert.NotSame(t, tr, l.HTTPClient().Transport, "every client has its own connection pool")

	resp, err := hc.Get("http://shop.example/cart?item=1")
	require.NoError(t, err)
	var body bytes.Buffer
	_, err = body.ReadFrom(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "via proxy", body.String())
	mu.Lock()
	assert.Equal(t, []string{"http://shop.example/cart?item=1"}, seen)
	mu.Unlock()

	t.Run("without a URL field", func(t *testing.T) {
		l := &Lease{Proxy: LeasedProxy{Proxy: Proxy{IP: "2001:db8::1", Port: 3128}}}
		assert.Equal(t, "http://[2001:db8::1]:3128", l.ProxyURL().String())
	})
	t.Run("without an address", func(t *testing.T) {
		l := &Lease{}
		assert.Nil(t, l.ProxyURL())
		_, err := l.HTTPClient().Transport.(*http.Transport).Proxy(httptest.NewRequest(http.MethodGet, "http://x/", nil))
		assert.Error(t, err)
	})
}

// TestLeaseCredentials: a lease of a proxy that takes credentials carries them, and the
// Lease's HTTP client presents them to the proxy, for plain http and for CONNECT; a
// listing does not carry them, and printing or logging the Lease does not show them.
func TestLeaseCredentials(t *testing.T) {
	// Every character that needs escaping in a URL's userinfo.
	creds := proxyauth.Credentials{Username: "crawler", Password: "p@ss:w/rd%41?#é+ x"}
	var mu sync.Mutex
	var auths []string // Proxy-Authorization of each request the proxy got, by method
	fwd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Method+" "+r.Header.Get("Proxy-Authorization"))
		mu.Unlock()
		if !creds.Match(r.Header.Get("Proxy-Authorization")) {
			w.Header().Set("Proxy-Authenticate", `Basic realm="proxy"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		if r.Method == http.MethodConnect {
			// The credentials are what this test is about, not tunnelling.
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_, _ = w.Write([]byte("via proxy"))
	}))
	t.Cleanup(fwd.Close)
	host, p := hostPort(t, fwd)

	f := newFixture(t, discovery.Proxy{Name: "auth", Namespace: "crawl", IP: host, Port: p, Healthy: true,
		MaxLeases: 1, Credentials: creds})
	l, err := f.client.Acquire(t.Context(), AcquireRequest{})
	require.NoError(t, err)
	assert.Equal(t, creds.Username, l.Proxy.Username)
	assert.Equal(t, creds.Password, l.Proxy.Password)
	u, err := url.Parse(l.Proxy.URL)
	require.NoError(t, err)
	pw, _ := u.User.Password()
	assert.Equal(t, creds.Password, pw, "the URL's userinfo, unescaped")
	assert.Equal(t, u, l.ProxyURL())

	hc := l.HTTPClient()
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://shop.example/cart")
	require.NoError(t, err)
	var body bytes.Buffer
	_, err = body.ReadFrom(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "via proxy", body.String())
	_, err = hc.Get("https://shop.example/cart")
	require.Error(t, err, "the test proxy does not tunnel")
	mu.Lock()
	assert.Equal(t, []string{"GET " + creds.Header(), "CONNECT " + creds.Header()}, auths)
	mu.Unlock()

	t.Run("renewal", func(t *testing.T) {
		r, err := f.client.Renew(t.Context(), l.ID, 0)
		require.NoError(t, err)
		assert.Equal(t, l.Proxy, r.Proxy)
	})
	t.Run("listing", func(t *testing.T) {
		list, err := f.client.ListProxies(t.Context(), nil, nil)
		require.NoError(t, err)
		require.Len(t, list.Proxies, 1)
		assert.NotContains(t, list.Proxies[0].URL, "@")
		raw, err := json.Marshal(list)
		require.NoError(t, err)
		assert.NotContains(t, string(raw), "w/rd")
	})
	t.Run("printed and logged redacted", func(t *testing.T) {
		var out bytes.Buffer
		for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
			fmt.Fprintf(&out, format+"\n", l)
			fmt.Fprintf(&out, format+"\n", *l)
			fmt.Fprintf(&out, format+"\n", l.Proxy)
			fmt.Fprintf(&out, format+"\n", []*Lease{l})
		}
		slog.New(slog.NewTextHandler(&out, nil)).Info("leased", "lease", l, "proxy", l.Proxy)
		slog.New(slog.NewJSONHandler(&out, nil)).Info("leased", "lease", l, "proxy", l.Proxy)
		assert.Contains(t, out.String(), "crawl/auth", "the proxy is named")
		assert.Contains(t, out.String(), "crawler", "the user name is shown")
		for _, secret := range []string{creds.Password, url.UserPassword("", creds.Password).String()[1:], "w/rd", "rd%2541"} {
			assert.NotContains(t, out.String(), secret)
		}
	})
}

// --- the wire types stay in step with the server's -------------------------------------

// decodeStrict fails on a field the target type lacks, as the server does for requests.
func decodeStrict(t *testing.T, data []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), "%s", data)
}

func TestWireTypesRoundTripServerJSON(t *testing.T) {
	expires := time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)
	serverProxy := discovery.ProxyInfo{Name: "eu-1", Namespace: "crawl", URL: "http://10.0.0.1:3128", IP: "10.0.0.1",
		Port: 3128, Attributes: map[string]string{"region": "eu"}, LatencyMillis: 42}
	clientProxy := Proxy{Name: "eu-1", Namespace: "crawl", URL: "http://10.0.0.1:3128", IP: "10.0.0.1",
		Port: 3128, Attributes: map[string]string{"region": "eu"}, LatencyMillis: 42}
	serverLeased := discovery.LeasedProxy{ProxyInfo: serverProxy, Username: "u", Password: "p"}
	serverLeased.URL = "http://u:p@10.0.0.1:3128"
	clientLeased := LeasedProxy{Proxy: clientProxy, Username: "u", Password: "p"}
	clientLeased.URL = "http://u:p@10.0.0.1:3128"

	t.Run("responses", func(t *testing.T) {
		tests := []struct {
			name   string
			server any
			into   any
			want   any
		}{
			{
				name: "lease",
				server: discovery.LeaseResponse{LeaseID: "abc", Proxy: serverLeased, ExpiresAt: expires, TTLSeconds: 300,
					Target: "shop.example"},
				into: &Lease{},
				want: &Lease{ID: "abc", Proxy: clientLeased, ExpiresAt: expires, TTLSeconds: 300, Target: "shop.example"},
			},
			{
				name:   "lease of a proxy without credentials",
				server: discovery.LeaseResponse{LeaseID: "abc", Proxy: discovery.LeasedProxy{ProxyInfo: serverProxy}, ExpiresAt: expires},
				into:   &Lease{},
				want:   &Lease{ID: "abc", Proxy: LeasedProxy{Proxy: clientProxy}, ExpiresAt: expires},
			},
			{
				name: "list",
				server: discovery.ProxyList{Count: 1, Proxies: []discovery.ListedProxy{{ProxyInfo: serverProxy, Healthy: true,
					Phase: "Ready", ActiveLeases: 2, MaxLeases: 4}}},
				into: &ProxyList{},
				want: &ProxyList{Count: 1, Proxies: []ListedProxy{{Proxy: clientProxy, Healthy: true, Phase: "Ready",
					ActiveLeases: 2, MaxLeases: 4}}},
			},
			{
				name: "no match",
				server: &discovery.APIError{Code: CodeNoMatch, Message: "none",
					NoMatch: &discovery.NoMatch{Considered: 9, AtCapacity: 2, InCooldown: 3, Unhealthy: 4}},
				into: &Error{},
				want: &Error{Code: CodeNoMatch, Message: "none", Considered: 9, AtCapacity: 2, InCooldown: 3, Unhealthy: 4},
			},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				data, err := json.Marshal(tc.server)
				require.NoError(t, err)
				decodeStrict(t, data, tc.into)
				assert.Equal(t, tc.want, tc.into)
			})
		}
	})

	t.Run("requests", func(t *testing.T) {
		tests := []struct {
			name   string
			client any
			into   any
			want   any
		}{
			{
				name:   "lease",
				client: leaseRequest{Selector: map[string]string{"region": "eu"}, TTLSeconds: 60, Target: "shop.example"},
				into:   &discovery.LeaseRequest{},
				want:   &discovery.LeaseRequest{Selector: discovery.Selector{"region": "eu"}, TTLSeconds: 60, Target: "shop.example"},
			},
			{
				name:   "renew",
				client: renewRequest{TTLSeconds: 60},
				into:   &discovery.RenewRequest{},
				want:   &discovery.RenewRequest{TTLSeconds: 60},
			},
			{
				name:   "report",
				client: reportRequest{Result: ResultBanned, Target: "shop.example"},
				into:   &discovery.ReportRequest{},
				want:   &discovery.ReportRequest{Result: ResultBanned, Target: "shop.example"},
			},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				data, err := json.Marshal(tc.client)
				require.NoError(t, err)
				// The server's own strict decoder, unknown fields rejected.
				require.NoError(t, discovery.DecodeJSON(bytes.NewReader(data), tc.into, false), "%s", data)
				assert.Equal(t, tc.want, tc.into)
			})
		}
	})

	// Values only catch a field one side has and the other lacks if the test sets it; the
	// field lists catch it even when nobody updates the values above.
	t.Run("same fields", func(t *testing.T) {
		pairs := []struct{ server, client any }{
			{discovery.ProxyInfo{}, Proxy{}},
			{discovery.LeasedProxy{}, LeasedProxy{}},
			{discovery.ListedProxy{}, ListedProxy{}},
			{discovery.ProxyList{}, ProxyList{}},
			{discovery.LeaseResponse{}, Lease{}},
			{discovery.LeaseRequest{}, leaseRequest{}},
			{discovery.RenewRequest{}, renewRequest{}},
			{discovery.ReportRequest{}, reportRequest{}},
			{discovery.APIError{}, Error{}},
		}
		for _, p := range pairs {
			st, ct := reflect.TypeOf(p.server), reflect.TypeOf(p.client)
			assert.ElementsMatch(t, jsonFields(st), jsonFields(ct), "%s and %s", st, ct)
		}
	})
}

// jsonFields lists the JSON names encoding/json uses for t's fields, embedded structs
// flattened.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			out = append(out, jsonFields(ft)...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// TestThrottled: a client over its lease cap or its requests per second gets an error
// IsThrottled recognises, with the server's Retry-After; other errors are not throttling.
func TestThrottled(t *testing.T) {
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll([]discovery.Proxy{proxy("eu-1", true, 4, nil)})
	const leaser, caller = "leaser-token-0123456789", "caller-token-0123456789"
	clients := discovery.NewClients([]discovery.ClientConfig{
		{Name: "leaser", Token: leaser, MaxLeases: 1},
		{Name: "caller", Token: caller, RequestsPerSecond: 0.001, Burst: 1},
	})
	srv := service.NewAPI(discovery.Config{Clients: clients}, store, &fakeSignaler{report: (&signals{}).record},
		slog.New(slog.DiscardHandler), nil)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	c := New(hs.URL, leaser, WithHTTPClient(hs.Client()))
	_, err := c.Acquire(t.Context(), AcquireRequest{TTL: time.Minute})
	require.NoError(t, err)
	_, err = c.Acquire(t.Context(), AcquireRequest{})
	require.True(t, IsThrottled(err), "%v", err)
	e := apiError(t, err)
	assert.Equal(t, CodeLeaseLimit, e.Code)
	assert.Equal(t, time.Minute, e.RetryAfter(), "when its lease expires")

	c = New(hs.URL, caller, WithHTTPClient(hs.Client()))
	_, err = c.ListProxies(t.Context(), nil, nil)
	require.NoError(t, err)
	_, err = c.ListProxies(t.Context(), nil, nil)
	require.True(t, IsThrottled(err), "%v", err)
	e = apiError(t, err)
	assert.Equal(t, CodeTooManyRequests, e.Code)
	assert.Equal(t, http.StatusTooManyRequests, e.Status)
	assert.Greater(t, e.RetryAfter(), 15*time.Minute, "1,000 s until the next request at 0.001/s")

	assert.False(t, IsThrottled(&Error{Status: http.StatusTooManyRequests, Code: CodeReportLimit}), "a report limit is the lease's, not the client's")
}

// TestAcquireWait: Wait reaches discovery as waitSeconds: an acquire on a full proxy waits
// and gets the slot a release frees, one that none frees gets the 409 once the wait is
// over, and an HTTP client's Timeout shorter than the wait does not cut the wait short.
func TestAcquireWait(t *testing.T) {
	f := newFixture(t, proxy("only", true, 1, nil))
	ctx := t.Context()
	held, err := f.client.Acquire(ctx, AcquireRequest{})
	require.NoError(t, err)

	short := New(f.url, testToken, WithHTTPClient(&http.Client{Timeout: 300 * time.Millisecond}))
	start := time.Now()
	_, err = short.Acquire(ctx, AcquireRequest{Wait: time.Second})
	require.True(t, IsNoMatch(err), "the 409 after the wait, not the client's timeout: %v", err)
	assert.GreaterOrEqual(t, time.Since(start), time.Second)

	got := make(chan error, 1)
	go func() {
		l, err := short.Acquire(ctx, AcquireRequest{Wait: 30 * time.Second})
		if err == nil && l.Proxy.Name != "only" {
			err = fmt.Errorf("leased %s", l.Proxy.Name)
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return f.store.Picks() >= 4 }, 10*time.Second, 5*time.Millisecond,
		"the waiting acquire's first look")
	require.NoError(t, f.client.Release(ctx, held.ID))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting acquire was not granted the freed slot")
	}

	_, err = f.client.Acquire(ctx, AcquireRequest{Wait: 2 * time.Hour})
	e := apiError(t, err)
	assert.Equal(t, CodeInvalid, e.Code)
	assert.Contains(t, e.Message, "waitSeconds")
}
