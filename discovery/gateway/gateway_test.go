package gateway_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

const (
	gwClient = "shop-crawler"
	gwToken  = "shop-crawler-token-0123456789"
	// otherClient's token is valid, but not with gwClient's name.
	otherClient = "news-crawler"
	otherToken  = "news-crawler-token-0123456789"
)

// gatewayEnv is a gateway in front of real forward proxies on loopback (the local
// provider's), each leaving from an address of its own, and a site that sees which.
type gatewayEnv struct {
	t       *testing.T
	store   *discovery.Store
	srv     *service.API
	reg     *prometheus.Registry
	logs    *testenv.LogBuffer
	gw      *gateway.Gateway
	addr    string
	proxies []*fleetProxy
	signals chan forwarded
	site    *site
}

// fleetProxy is one proxy of the fleet: a real local forward proxy, which refuses the
// destinations it is told to deny as Squid does.
type fleetProxy struct {
	name   string
	fp     *localproxy.ForwardProxy
	ln     *trackedListener
	egress string
	creds  proxyauth.Credentials

	mu     sync.Mutex
	denied map[string]bool
}

func (p *fleetProxy) id() string { return "crawl/" + p.name }

// deny makes the proxy refuse requests to hostport itself, as the fleet's Squid refuses
// a destination its http_access rules deny.
func (p *fleetProxy) deny(hostport string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.denied[hostport] = true
}

// ServeHTTP checks the proxy's credentials first, as Squid does, then answers a denied
// destination as Squid does, with its own error page named in X-Squid-Error (which is
// all a client can tell it from a site's 403 by); it hands everything else to the local
// forward proxy.
func (p *fleetProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	denied := p.denied[r.Host]
	p.mu.Unlock()
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.creds.Username+":"+p.creds.Password))
	if denied && r.Header.Get("Proxy-Authorization") == want && p.fp.Fault() == "" {
		w.Header().Set("Server", "squid")
		w.Header().Set("Mime-Version", "1.0")
		w.Header().Set("X-Squid-Error", "ERR_ACCESS_DENIED 0")
		w.Header().Set("Content-Type", "text/html;charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, "<html><body><h1>ERROR</h1><p>Access Denied.</p></body></html>")
		return
	}
	p.fp.ServeHTTP(w, r)
}

// reset breaks every connection the proxy has, as a proxy that crashes or is cut off
// does: the peers get a reset, not an end of stream.
func (p *fleetProxy) reset() { p.ln.resetAll() }

// trackedListener remembers the connections it accepted, to break them.
type trackedListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		l.mu.Lock()
		l.conns = append(l.conns, tc)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackedListener) resetAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.SetLinger(0) // close sends a reset
		_ = c.Close()
	}
	l.conns = nil
}

// site is an HTTP site on loopback that records what it was sent and from where, and
// answers 403 to the addresses it bans.
type site struct {
	*httptest.Server
	mu      sync.Mutex
	seen    []seenRequest
	banned  map[string]bool
	tlsSite *httptest.Server
}

type seenRequest struct {
	from   string
	header http.Header
}

func (s *site) handle(w http.ResponseWriter, r *http.Request) {
	from, _, _ := net.SplitHostPort(r.RemoteAddr)
	s.mu.Lock()
	s.seen = append(s.seen, seenRequest{from: from, header: r.Header.Clone()})
	banned := s.banned[from]
	s.mu.Unlock()
	if banned {
		http.Error(w, "banned", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodPost {
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "posted %s", b)
		return
	}
	_, _ = fmt.Fprintf(w, "hello from %s", r.URL.Path)
}

func (s *site) ban(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.banned[addr] = true
}

func (s *site) last() seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[len(s.seen)-1]
}

type gatewayOption func(*discovery.Config, *gateway.Config, []discovery.Proxy)

func newGatewayEnv(t *testing.T, n int, opts ...gatewayOption) *gatewayEnv {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the fleet's distinct egress addresses need Linux's 127.0.0.0/8")
	}
	e := &gatewayEnv{t: t, reg: prometheus.NewRegistry(), logs: &testenv.LogBuffer{}, signals: make(chan forwarded, 64)}
	e.site = &site{banned: map[string]bool{}}
	e.site.Server = httptest.NewServer(http.HandlerFunc(e.site.handle))
	t.Cleanup(e.site.Close)
	e.site.tlsSite = httptest.NewTLSServer(http.HandlerFunc(e.site.handle))
	t.Cleanup(e.site.tlsSite.Close)

	var fleet []discovery.Proxy
	e.proxies, fleet = startFleet(t, n)
	cfg := discovery.Config{Clients: discovery.NewClients([]discovery.ClientConfig{
		{Name: gwClient, Token: gwToken}, {Name: otherClient, Token: otherToken}}),
		CooldownBanned: 30 * time.Minute, CooldownRateLimited: 5 * time.Minute}
	// No wait for a free slot unless a test asks: refusals are answered at once.
	gcfg := gateway.Config{Wait: -1}
	for _, o := range opts {
		o(&cfg, &gcfg, fleet)
	}
	e.store = discovery.NewStore(30 * time.Minute)
	e.store.ReplaceAll(fleet)
	sig := &fakeSignaler{report: func(_ context.Context, namespace, name string, sig contract.ReportSignal) error {
		e.signals <- forwarded{namespace, name, sig}
		return nil
	}}
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.srv = service.NewAPI(cfg, e.store, sig, log, e.reg)
	ctx, cancel := context.WithCancel(context.Background())
	reported := make(chan struct{})
	go func() { defer close(reported); e.srv.RunReports(ctx) }()
	t.Cleanup(func() { cancel(); <-reported })
	e.gw, e.addr = serveGatewayOf(t, e.srv, gcfg, log, e.reg)
	return e
}

// startFleet runs n real forward proxies on loopback, each leaving from an address of
// its own, and returns them and the index's view of them.
func startFleet(t *testing.T, n int) ([]*fleetProxy, []discovery.Proxy) {
	t.Helper()
	var proxies []*fleetProxy
	var fleet []discovery.Proxy
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		creds := proxyauth.Credentials{Username: "proxyfleet", Password: fmt.Sprintf("fleet-secret-%d-Zq8", i)}
		p := &fleetProxy{name: fmt.Sprintf("p%d", i), ln: &trackedListener{Listener: ln}, creds: creds,
			egress: localproxy.EgressIP(port).String(), denied: map[string]bool{},
			fp: &localproxy.ForwardProxy{Auth: local.NewAuth(creds), SourceIP: localproxy.EgressIP(port)}}
		hs := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(p.ln) }()
		t.Cleanup(func() { _ = hs.Close() })
		proxies = append(proxies, p)
		fleet = append(fleet, discovery.Proxy{Name: p.name, Namespace: "crawl", IP: "127.0.0.1", Port: int32(port),
			Healthy: true, Phase: "Ready", MaxLeases: 8, Attributes: map[string]string{"region": "eu"}, Credentials: creds})
	}
	return proxies, fleet
}

// serveGateway runs the gateway of srv on a loopback port until the test ends and
// returns its address.
func serveGateway(t *testing.T, srv *service.API, cfg gateway.Config) string {
	t.Helper()
	_, addr := serveGatewayOf(t, srv, cfg, slog.New(slog.DiscardHandler), nil)
	return addr
}

// serveGatewayOf is serveGateway, logging to log and counting in reg (when not nil), and
// returns the gateway too.
func serveGatewayOf(t *testing.T, srv *service.API, cfg gateway.Config, log *slog.Logger, reg prometheus.Registerer,
	before ...func(*gateway.Gateway)) (*gateway.Gateway, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	g := gateway.New(cfg, srv, log, reg)
	for _, f := range before {
		f(g)
	}
	go func() { defer close(served); _ = g.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	return g, ln.Addr().String()
}

// client is an HTTP client whose proxy is the gateway, as a crawler sets it up.
func (e *gatewayEnv) client(user, password string) *http.Client {
	u := &url.URL{Scheme: "http", Host: e.addr}
	if user != "" {
		u.User = url.UserPassword(user, password)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: e.site.tlsSite.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// proxyByEgress is the fleet proxy that leaves from addr.
func (e *gatewayEnv) proxyByEgress(addr string) *fleetProxy {
	for _, p := range e.proxies {
		if p.egress == addr {
			return p
		}
	}
	e.t.Fatalf("no fleet proxy leaves from %s", addr)
	return nil
}

// metric is the value of the series of a counter or gauge with these label pairs (0
// when it has not been written).
func (e *gatewayEnv) metric(name string, labels ...string) float64 {
	e.t.Helper()
	families, err := e.reg.Gather()
	require.NoError(e.t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func (e *gatewayEnv) leases() int { return e.store.Stats().Leases }

// waitNoLeases waits for every lease the gateway held to be released: the store counts
// none, and neither does the gateway's gauge of the leases it holds.
func (e *gatewayEnv) waitNoLeases() {
	e.t.Helper()
	held := func() float64 { return e.metric("proxyfleet_gateway_leases_held") }
	require.Eventually(e.t, func() bool { return e.leases() == 0 && held() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the store counts %d leases, the gateway holds %v", e.leases(), held())
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// gatewayError reads a gateway's own error answer.
func gatewayError(t *testing.T, resp *http.Response, body string) discovery.APIError {
	t.Helper()
	var ae discovery.APIError
	require.NoError(t, json.Unmarshal([]byte(body), &ae), "body %q", body)
	assert.Equal(t, ae.Code, resp.Header.Get(gateway.ErrorHeader), "the header names the body's code")
	assert.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	return ae
}

// reportSession reports a ban on a session through the API at base, and returns the status.
func reportSession(t *testing.T, base, token, session string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/sessions/"+session+"/report", strings.NewReader(`{"result":"banned"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestGatewayForwardsPlainRequestsThroughTheFleet(t *testing.T) {
	e := newGatewayEnv(t, 3)
	c := e.client(gwClient, gwToken)
	used := map[string]bool{}
	for i := range 6 {
		req, err := http.NewRequest(http.MethodGet, e.site.URL+"/page/"+strconv.Itoa(i), nil)
		require.NoError(t, err)
		req.Header.Set("User-Agent", "shop-crawler/1.0")
		req.Header.Set("X-Forwarded-For", "192.0.2.7")
		resp, err := c.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		assert.Equal(t, "hello from /page/"+strconv.Itoa(i), string(body))

		seen := e.site.last()
		p := e.proxyByEgress(seen.from)
		assert.Equal(t, p.id(), resp.Header.Get(gateway.ProxyHeader), "the answer names the proxy that carried it")
		used[p.id()] = true
		assert.Equal(t, "shop-crawler/1.0", seen.header.Get("User-Agent"), "the crawler's own headers go through")
		for _, h := range []string{"Proxy-Authorization", "Via", "Forwarded", "X-Forwarded-For", "Proxy-Connection"} {
			assert.Empty(t, seen.header.Get(h), "the site must not see %s", h)
		}
	}
	assert.Len(t, used, 3, "consecutive requests rotate over the fleet, as leases do")
	e.waitNoLeases()
	assert.Equal(t, 6.0, e.metric("proxyfleet_gateway_requests_total", "client", gwClient, "kind", "http", "outcome", "ok"))
}

func TestGatewayTunnelsHoldALeaseWhileOpen(t *testing.T) {
	e := newGatewayEnv(t, 2)
	c := e.client(gwClient, gwToken)
	resp, body := get(t, c, e.site.tlsSite.URL+"/secure")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "hello from /secure", body)
	e.proxyByEgress(e.site.last().from)
	assert.Empty(t, e.site.last().header.Get("Proxy-Authorization"))

	// The client keeps its tunnel for the next request: its lease stays held.
	assert.Equal(t, 1, e.leases(), "an open tunnel holds its lease")
	assert.Equal(t, 1.0, e.metric("proxyfleet_gateway_tunnels_open"))
	c.Transport.(*http.Transport).CloseIdleConnections()
	e.waitNoLeases()
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_tunnels_open") == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Positive(t, e.metric("proxyfleet_gateway_tunnel_bytes_total", "direction", "upstream"))
	assert.Positive(t, e.metric("proxyfleet_gateway_tunnel_bytes_total", "direction", "downstream"))
}

// newOneSlotGatewayEnv is a gateway without authentication over one real fleet proxy that
// takes one lease: the second request or tunnel has to wait.
func newOneSlotGatewayEnv(t *testing.T, cfg gateway.Config) *gatewayEnv {
	proxies, fleet := startFleet(t, 1)
	fleet[0].MaxLeases = 1
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll(fleet)
	reg := prometheus.NewRegistry()
	srv := service.NewAPI(discovery.Config{}, store, &fakeSignaler{}, slog.New(slog.DiscardHandler), reg)
	gw, addr := serveGatewayOf(t, srv, cfg, slog.New(slog.DiscardHandler), reg)
	return &gatewayEnv{t: t, store: store, srv: srv, reg: reg, gw: gw, addr: addr, proxies: proxies}
}

// connect opens a raw CONNECT tunnel through the gateway and returns the connection
// and the gateway's answer.
func (e *gatewayEnv) connect(user, password, hostport string) (net.Conn, *http.Response) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.addr)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	head := "CONNECT " + hostport + " HTTP/1.1\r\nHost: " + hostport + "\r\n"
	if user != "" {
		head += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)) + "\r\n"
	}
	_, err = io.WriteString(c, head+"\r\n")
	require.NoError(e.t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(e.t, err)
	return c, resp
}

func TestGatewayTunnelsCountAgainstMaxLeases(t *testing.T) {
	e := newGatewayEnv(t, 2, func(_ *discovery.Config, _ *gateway.Config, fleet []discovery.Proxy) {
		for i := range fleet {
			fleet[i].MaxLeases = 1
		}
	})
	host := strings.TrimPrefix(e.site.URL, "http://")
	first, resp := e.connect(gwClient, gwToken, host)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, resp = e.connect(gwClient, gwToken, host)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	_, resp = e.connect(gwClient, gwToken, host)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	ae := gatewayError(t, resp, string(body))
	assert.Equal(t, "no_match", ae.Code)
	assert.Equal(t, 2, ae.AtCapacity, "both proxies hold a tunnel")
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	first.Close()
	require.Eventually(t, func() bool { return e.leases() == 1 }, 5*time.Second, 5*time.Millisecond)
	_, resp = e.connect(gwClient, gwToken, host)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a closed tunnel frees its slot")
}

func TestGatewayRequiresClientCredentials(t *testing.T) {
	e := newGatewayEnv(t, 1)
	for _, tc := range []struct {
		name, user, password string
		want                 int
		code                 string
	}{
		{"none", "", "", http.StatusProxyAuthRequired, "proxy_auth_required"},
		{"wrong token", gwClient, "not-the-token-0123456789", http.StatusProxyAuthRequired, "proxy_auth_required"},
		{"another client's token", gwClient, otherToken, http.StatusProxyAuthRequired, "proxy_auth_required"},
		{"bad option", gwClient + ";session=a b", gwToken, http.StatusBadRequest, "invalid"},
		{"bad selector", gwClient + ";Region=eu", gwToken, http.StatusBadRequest, "invalid"},
		{"dash options uneven", gwClient + "-session", gwToken, http.StatusBadRequest, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, e.client(tc.user, tc.password), e.site.URL+"/")
			require.Equal(t, tc.want, resp.StatusCode, body)
			ae := gatewayError(t, resp, body)
			assert.Equal(t, tc.code, ae.Code)
			if tc.want == http.StatusProxyAuthRequired {
				assert.Equal(t, `Basic realm="proxyfleet"`, resp.Header.Get("Proxy-Authenticate"))
			}
			_, cresp := e.connect(tc.user, tc.password, strings.TrimPrefix(e.site.URL, "http://"))
			assert.Equal(t, tc.want, cresp.StatusCode, "CONNECT")
		})
	}
	assert.Equal(t, 0, e.leases(), "a refused request leases nothing")
}

func TestGatewayTriesAnotherProxyWhenOneRefuses(t *testing.T) {
	for _, fault := range []struct {
		name   string
		kind   string
		inject func(p *fleetProxy)
	}{
		{"down", "unreachable", func(p *fleetProxy) { p.ln.Close() }},
		{"refuses its credentials", "auth", func(p *fleetProxy) { p.fp.SetFault(local.FaultAuth) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			e := newGatewayEnv(t, 2)
			fault.inject(e.proxies[0])
			c := e.client(gwClient, gwToken)
			for range 4 {
				resp, body := get(t, c, e.site.URL+"/plain")
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				assert.Equal(t, e.proxies[1].id(), resp.Header.Get(gateway.ProxyHeader))
				resp, body = get(t, c, e.site.tlsSite.URL+"/tunnel")
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				assert.Equal(t, e.proxies[1].egress, e.site.last().from)
				c.Transport.(*http.Transport).CloseIdleConnections()
			}
			assert.Positive(t, e.metric("proxyfleet_gateway_upstream_failures_total", "kind", fault.kind))
			assert.Positive(t, e.metric("proxyfleet_gateway_retries_total"))
			e.waitNoLeases()
		})
	}
}

func TestGatewaySaysWhyWhenNoProxyCarriesTheRequest(t *testing.T) {
	e := newGatewayEnv(t, 2)
	e.proxies[0].ln.Close()
	e.proxies[1].fp.SetFault(local.FaultAuth)
	c := e.client(gwClient, gwToken)

	resp, body := get(t, c, e.site.URL+"/plain")
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	ae := gatewayError(t, resp, body)
	assert.Equal(t, "upstream_failed", ae.Code)
	assert.Contains(t, ae.Message, "crawl/p0: connection refused")
	assert.Contains(t, ae.Message, "crawl/p1: refused its credentials (407)")

	_, cresp := e.connect(gwClient, gwToken, strings.TrimPrefix(e.site.URL, "http://"))
	cbody, _ := io.ReadAll(cresp.Body)
	require.Equal(t, http.StatusBadGateway, cresp.StatusCode, "%s", cbody)
	assert.Equal(t, "upstream_failed", gatewayError(t, cresp, string(cbody)).Code)

	// A request with a body is not sent twice: one proxy is tried, and the crawler told.
	presp, err := c.Post(e.site.URL+"/form", "text/plain", strings.NewReader("q=1"))
	require.NoError(t, err)
	pbody, _ := io.ReadAll(presp.Body)
	presp.Body.Close()
	require.Equal(t, http.StatusBadGateway, presp.StatusCode)
	assert.Equal(t, 1, strings.Count(gatewayError(t, presp, string(pbody)).Message, "crawl/p"), "%s", pbody)
	e.waitNoLeases()
	assert.NotContains(t, e.logs.String(), gwToken, "the crawler's token in the logs")
	for _, p := range e.proxies {
		assert.NotContains(t, e.logs.String(), p.creds.Password, "a fleet proxy's password in the logs")
		assert.NotContains(t, body+string(cbody)+string(pbody), p.creds.Password)
	}
}

func TestGatewayReportsStatusesAndMovesOn(t *testing.T) {
	e := newGatewayEnv(t, 2)
	e.site.ban(e.proxies[0].egress)
	c := e.client(gwClient, gwToken)
	var banned int
	for range 6 {
		resp, body := get(t, c, e.site.URL+"/item")
		if resp.StatusCode == http.StatusForbidden {
			// The site's answer itself goes to the crawler: it is the site's to give.
			assert.Equal(t, "banned\n", body)
			assert.Empty(t, resp.Header.Get(gateway.ErrorHeader))
			assert.Equal(t, e.proxies[0].id(), resp.Header.Get(gateway.ProxyHeader))
			banned++
			continue
		}
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	assert.Equal(t, 1, banned, "after its 403 the banned proxy rests for the site")
	select {
	case f := <-e.signals:
		assert.Equal(t, "p0", f.name)
		assert.Equal(t, contract.ReportBanned, f.sig.Result)
		assert.Equal(t, "127.0.0.1", f.sig.Target, "the report is for the request's host")
	case <-time.After(5 * time.Second):
		t.Fatal("the 403 was not reported to the proxy's workflow")
	}
	assert.Equal(t, 1.0, e.metric("proxyfleet_gateway_reports_total", "result", "banned"))
	e.waitNoLeases()
}

func TestGatewaySessionsKeepTheirProxyUntilReported(t *testing.T) {
	e := newGatewayEnv(t, 3)
	for _, user := range []string{gwClient + ";session=cart-7", gwClient + "-session-cart8"} {
		t.Run(user, func(t *testing.T) {
			c := e.client(user, gwToken)
			var first string
			for i := range 4 {
				resp, body := get(t, c, e.site.tlsSite.URL+"/step")
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				c.Transport.(*http.Transport).CloseIdleConnections()
				if i == 0 {
					first = e.site.last().from
				}
				assert.Equal(t, first, e.site.last().from, "a session keeps its proxy")
			}
			// The crawler learns inside the tunnel that the site banned it, and says so.
			session := strings.TrimPrefix(strings.TrimPrefix(user, gwClient+";session="), gwClient+"-session-")
			api := httptest.NewServer(e.srv.Handler())
			defer api.Close()
			require.Equal(t, http.StatusNoContent, reportSession(t, api.URL, gwToken, session))

			resp, body := get(t, c, e.site.tlsSite.URL+"/step")
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			moved := e.site.last().from
			assert.NotEqual(t, first, moved, "the session moves off the proxy it reported")
			c.Transport.(*http.Transport).CloseIdleConnections()
			resp, _ = get(t, c, e.site.tlsSite.URL+"/step")
			assert.Equal(t, moved, e.site.last().from, "and stays on its new one")
			resp.Body.Close()
			select {
			case f := <-e.signals:
				assert.Equal(t, e.proxyByEgress(first).name, f.name)
				assert.Equal(t, "127.0.0.1", f.sig.Target, "the report is for the session's site")
			case <-time.After(5 * time.Second):
				t.Fatal("the session's report was not forwarded")
			}
			// Another client's session of the same name is another session.
			assert.Equal(t, http.StatusNotFound, reportSession(t, api.URL, otherToken, session))
		})
	}
}

func TestGatewaySelectsByAttributes(t *testing.T) {
	e := newGatewayEnv(t, 3, func(_ *discovery.Config, _ *gateway.Config, fleet []discovery.Proxy) {
		fleet[2].Attributes = map[string]string{"region": "us", "tier": "residential"}
	})
	for _, user := range []string{gwClient + ";region=us;tier=residential", gwClient + "-region-us-tier-residential"} {
		c := e.client(user, gwToken)
		for range 3 {
			resp, body := get(t, c, e.site.URL+"/")
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			assert.Equal(t, e.proxies[2].id(), resp.Header.Get(gateway.ProxyHeader), user)
		}
	}
	resp, body := get(t, e.client(gwClient+";region=ap", gwToken), e.site.URL+"/")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	ae := gatewayError(t, resp, body)
	assert.Equal(t, "no_match", ae.Code)
	assert.Equal(t, 0, ae.Considered)
}

func TestGatewayHoldsClientsToTheirLimits(t *testing.T) {
	e := newGatewayEnv(t, 2, func(cfg *discovery.Config, _ *gateway.Config, _ []discovery.Proxy) {
		cfg.Clients = discovery.NewClients([]discovery.ClientConfig{{Name: gwClient, Token: gwToken, MaxLeases: 1},
			{Name: otherClient, Token: otherToken, RequestsPerSecond: 0.001, Burst: 1}})
	})
	host := strings.TrimPrefix(e.site.URL, "http://")
	_, resp := e.connect(gwClient, gwToken, host)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, resp = e.connect(gwClient, gwToken, host)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
	assert.Equal(t, "lease_limit", gatewayError(t, resp, string(body)).Code)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	resp2, body2 := get(t, e.client(otherClient, otherToken), e.site.URL+"/")
	require.Equal(t, http.StatusOK, resp2.StatusCode, body2)
	resp2, body2 = get(t, e.client(otherClient, otherToken), e.site.URL+"/")
	require.Equal(t, http.StatusTooManyRequests, resp2.StatusCode, body2)
	assert.Equal(t, "too_many_requests", gatewayError(t, resp2, body2).Code)
	assert.NotEmpty(t, resp2.Header.Get("Retry-After"))
}

func TestGatewayRefusesWhatIsNotAProxyRequest(t *testing.T) {
	e := newGatewayEnv(t, 1)
	req, err := http.NewRequest(http.MethodGet, "http://"+e.addr+"/", nil)
	require.NoError(t, err)
	req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(gwClient+":"+gwToken)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, gatewayError(t, resp, string(body)).Message, "forward proxy")

	_, cresp := e.connect(gwClient, gwToken, "127.0.0.1")
	assert.Equal(t, http.StatusBadRequest, cresp.StatusCode, "CONNECT without a port")
	assert.Equal(t, 0, e.leases())
}

// TestGatewayInAReplicaSet runs the gateway on one replica of two: the proxies the other
// owns are granted, released and reported by their owner, and both replicas count every
// tunnel against maxLeases.
func TestGatewayInAReplicaSet(t *testing.T) {
	proxies, fleet := startFleet(t, 4)
	for i := range fleet {
		fleet[i].MaxLeases = 1
	}
	rs := newReplicaSet(t, 2, fleet)
	e := &gatewayEnv{t: t, proxies: proxies, addr: serveGateway(t, rs.Nodes[0].API, gateway.Config{Wait: -1})}
	s := &site{banned: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	host := strings.TrimPrefix(s.URL, "http://")

	user := discovery.DefaultClientName + ";session=basket"
	var tunnels []net.Conn
	for range 4 {
		c, resp := e.connect(user, testToken, host)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		tunnels = append(tunnels, c)
	}
	_, resp := e.connect(discovery.DefaultClientName, testToken, host)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "every proxy holds a tunnel")
	for i := range 2 {
		assert.Equal(t, 4, rs.Nodes[i].Store.Stats().Leases, "replica %d counts every tunnel", i)
	}
	_, err := rs.Client(1).Acquire(context.Background(), dclient.AcquireRequest{})
	require.Error(t, err, "the API on the other replica finds the fleet full too")

	// The session's latest lease may be owned by either replica: the report goes to it.
	require.Equal(t, http.StatusNoContent, reportSession(t, rs.URLs[1], testToken, "basket"))

	for _, c := range tunnels {
		c.Close()
	}
	for i := range 2 {
		require.Eventually(t, func() bool { return rs.Nodes[i].Store.Stats().Leases == 0 }, 10*time.Second, 5*time.Millisecond,
			"replica %d still counts tunnels that closed", i)
	}
}

func TestListingShowsCooldowns(t *testing.T) {
	e := newGatewayEnv(t, 2)
	e.site.ban(e.proxies[0].egress)
	c := e.client(gwClient, gwToken)
	for range 2 {
		get(t, c, e.site.URL+"/x") // one of the two is the banned proxy's 403
	}
	api := httptest.NewServer(e.srv.Handler())
	defer api.Close()
	req, err := http.NewRequest(http.MethodGet, api.URL+"/v1/proxies", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+gwToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var list discovery.ProxyList
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	require.Len(t, list.Proxies, 2)
	assert.Contains(t, list.Proxies[0].Cooldowns, "127.0.0.1", "the banned proxy rests for the site")
	assert.WithinDuration(t, time.Now().Add(30*time.Minute), list.Proxies[0].Cooldowns["127.0.0.1"], time.Minute)
	assert.Empty(t, list.Proxies[1].Cooldowns)
}

func TestGatewayWaitsForAFreeSlot(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].MaxLeases = 1
		g.Wait = 30 * time.Second
	})
	host := strings.TrimPrefix(e.site.URL, "http://")
	first, resp := e.connect(gwClient, gwToken, host)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	got := make(chan int, 1)
	go func() {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			got <- 0
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "CONNECT "+host+" HTTP/1.1\r\nHost: "+host+"\r\nProxy-Authorization: Basic "+
			base64.StdEncoding.EncodeToString([]byte(gwClient+":"+gwToken))+"\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			got <- 0
			return
		}
		got <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == 1 }, 10*time.Second, 5*time.Millisecond,
		"the second tunnel should wait for the proxy's one slot")
	first.Close()
	select {
	case status := <-got:
		assert.Equal(t, http.StatusOK, status, "the slot the first tunnel freed goes to the one waiting")
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting tunnel was never opened")
	}
}

func TestGatewayRenewsTheLeaseOfAnOpenTunnel(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, _ []discovery.Proxy) {
		g.LeaseTTL = 600 * time.Millisecond
	})
	_, resp := e.connect(gwClient, gwToken, strings.TrimPrefix(e.site.URL, "http://"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	expires := func() time.Time {
		recs := e.store.Snapshot(0)
		require.Len(t, recs, 1)
		return recs[0].Expires
	}
	first := expires()
	require.Eventually(t, func() bool { return expires().After(first.Add(time.Second)) }, 10*time.Second, 20*time.Millisecond,
		"the open tunnel's lease was not renewed past several of its TTLs")
	e.store.Sweep()
	assert.Equal(t, 1, e.leases(), "an open tunnel keeps its lease for as long as it lasts")
	assert.Zero(t, e.metric("proxyfleet_gateway_leases_lost_total"))
}

// blindProxy runs a forward proxy on loopback that sends each request on to its site and
// relays the site's bytes back untouched, switches of protocol included; it returns its
// port.
func blindProxy(t *testing.T) int {
	t.Helper()
	return serveConns(t, func(conn net.Conn) {
		br := bufio.NewReader(conn)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		site, err := net.Dial("tcp", req.URL.Host)
		if err != nil {
			return
		}
		defer site.Close()
		req.Header.Del("Proxy-Authorization")
		if err := req.Write(site); err != nil {
			return
		}
		go func() { _, _ = io.Copy(site, br) }()
		_, _ = io.Copy(conn, site)
	}).Port
}

// TestGatewaySendsNothingAgainThatTheSiteAnswered407: a 407 is a retry on another proxy
// only when the fleet proxy gave it (with its challenge, before anything reached the
// site). A site's own 407 is the site's answer: a request without a body that is not
// idempotent (a DELETE) went to the site once, and its answer goes to the crawler.
func TestGatewaySendsNothingAgainThatTheSiteAnswered407(t *testing.T) {
	e := newGatewayEnv(t, 3)
	var mu sync.Mutex
	hits := 0
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		w.Header().Set("Proxy-Authenticate", `Basic realm="proxyfleet"`)
		http.Error(w, "the site wants other credentials", http.StatusProxyAuthRequired)
	}))
	t.Cleanup(site.Close)
	c := e.client(gwClient, gwToken)
	req, err := http.NewRequest(http.MethodDelete, site.URL+"/cart/7", nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "%s", body)
	assert.Equal(t, "the site wants other credentials\n", string(body), "the site's own answer")
	assert.Empty(t, resp.Header.Get(gateway.ErrorHeader), "not the gateway's refusal")
	assert.NotEmpty(t, resp.Header.Get(gateway.ProxyHeader))
	mu.Lock()
	assert.Equal(t, 1, hits, "the DELETE reached the site exactly once")
	mu.Unlock()
	assert.Zero(t, e.metric("proxyfleet_gateway_upstream_failures_total", "kind", "auth"), "no fleet proxy refused anything")
	e.waitNoLeases()

	// The fleet proxy's own 407 is still one: such a DELETE goes to another proxy. (Leases
	// rotate, so the refusing proxies come up first in turn.)
	e.proxies[0].fp.SetFault(local.FaultAuth)
	e.proxies[1].fp.SetFault(local.FaultAuth)
	for i := range 3 {
		req, err = http.NewRequest(http.MethodDelete, e.site.URL+"/cart/"+strconv.Itoa(i), nil)
		require.NoError(t, err)
		resp, err = c.Do(req)
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		assert.Equal(t, e.proxies[2].id(), resp.Header.Get(gateway.ProxyHeader))
	}
	assert.Positive(t, e.metric("proxyfleet_gateway_upstream_failures_total", "kind", "auth"))
	e.waitNoLeases()
}

// TestGatewayStripsEveryXForwardedHeader: no X-Forwarded-* header of the crawler's
// reaches the site, whichever its name, as docs/api.md says; its other headers do.
func TestGatewayStripsEveryXForwardedHeader(t *testing.T) {
	e := newGatewayEnv(t, 1)
	req, err := http.NewRequest(http.MethodGet, e.site.URL+"/page", nil)
	require.NoError(t, err)
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port",
		"X-Forwarded-Server", "X-Forwarded-Prefix", "X-Forwarded-Ssl", "X-Forwarded-Scheme", "X-Forwarded-Uri"} {
		req.Header.Set(h, "crawler.internal")
	}
	req.Header["x-forwarded-client-cert"] = []string{"raw, not canonical"}
	req.Header.Set("X-Forwarded", "for=192.0.2.7") // not an X-Forwarded-* name: the crawler's own
	req.Header.Set("X-Shop-Trace", "abc")
	resp, err := e.client(gwClient, gwToken).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	seen := e.site.last().header
	for h := range seen {
		assert.False(t, strings.HasPrefix(http.CanonicalHeaderKey(h), "X-Forwarded-"), "the site saw %s", h)
	}
	assert.Equal(t, "abc", seen.Get("X-Shop-Trace"), "the crawler's own headers go through")
	e.waitNoLeases()
}

// TestGatewayNeverReportsTheFleetProxysOwnRefusal: a fleet proxy that refuses a
// destination itself (Squid's 403, ERR_ACCESS_DENIED) is no ban of the site: nothing is
// reported, the proxy does not rest for the site, and no other proxy is tried (they all
// apply the same rules). The crawler gets the gateway's 502 saying which proxy refused.
func TestGatewayNeverReportsTheFleetProxysOwnRefusal(t *testing.T) {
	e := newGatewayEnv(t, 2)
	denied := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a denied destination was reached")
	}))
	t.Cleanup(denied.Close)
	for _, p := range e.proxies {
		p.deny(strings.TrimPrefix(denied.URL, "http://"))
	}
	c := e.client(gwClient, gwToken)
	resp, body := get(t, c, denied.URL+"/admin")
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	ae := gatewayError(t, resp, body)
	assert.Equal(t, "upstream_failed", ae.Code)
	assert.Equal(t, "refused", ae.Reason)
	assert.Contains(t, ae.Message, "refused the request itself (403 Forbidden)")
	assert.Equal(t, 1, strings.Count(ae.Message, "crawl/p"), "one proxy tried: %s", ae.Message)
	assert.Zero(t, e.metric("proxyfleet_gateway_reports_total", "result", "banned"))
	e.waitNoLeases()

	// Had it been a ban, each proxy tried would now rest for 127.0.0.1, every site here.
	for range 2 {
		resp, body = get(t, c, e.site.URL+"/allowed")
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	select {
	case f := <-e.signals:
		t.Fatalf("a report reached the proxy's workflow: %+v", f)
	default:
	}
	e.waitNoLeases()
}

// connectAsync opens a CONNECT tunnel through the gateway on its own goroutine: the
// returned channel gets the gateway's status (0 when the connection failed) and keeps the
// tunnel open until the test ends.
func (e *gatewayEnv) connectAsync(user, hostport string) <-chan int {
	got := make(chan int, 1)
	c, err := net.Dial("tcp", e.addr)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	go func() {
		_, _ = io.WriteString(c, "CONNECT "+hostport+" HTTP/1.1\r\nHost: "+hostport+"\r\nProxy-Authorization: Basic "+
			base64.StdEncoding.EncodeToString([]byte(user+":"+gwToken))+"\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			got <- 0
			return
		}
		got <- resp.StatusCode
	}()
	return got
}

func status(t *testing.T, got <-chan int, what string) int {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer", what)
		return 0
	}
}

// TestGatewayTunnelsWaitCheaplyForASlot: with every slot taken, a CONNECT waits, and gets
// a slot as soon as a tunnel releases one. The waiters look only when a lease ends (their
// own check, every waitPoll, is set beyond the test here), first come first served, and a
// slot the first waiter cannot use goes on to one that can; a wait that comes to nothing
// did not scan the fleet over and over meanwhile.
func TestGatewayTunnelsWaitCheaplyForASlot(t *testing.T) {
	proxies, fleet := startFleet(t, 2)
	for i := range fleet {
		fleet[i].MaxLeases = 1
		fleet[i].Attributes = map[string]string{"slot": fleet[i].Name}
	}
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll(fleet)
	reg := prometheus.NewRegistry()
	srv := service.NewAPI(discovery.Config{Clients: discovery.NewClients([]discovery.ClientConfig{{Name: gwClient, Token: gwToken}})},
		store, &fakeSignaler{}, slog.New(slog.DiscardHandler), reg)
	gw, addr := serveGatewayOf(t, srv, gateway.Config{Wait: 30 * time.Second}, slog.New(slog.DiscardHandler), reg,
		func(g *gateway.Gateway) { g.SetWaitPoll(time.Hour) })
	e := &gatewayEnv{t: t, store: store, srv: srv, reg: reg, gw: gw, addr: addr, proxies: proxies}
	s := &site{banned: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	host := strings.TrimPrefix(s.URL, "http://")

	p0, resp := e.connect(gwClient+";slot=p0", gwToken, host)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p1, resp := e.connect(gwClient+";slot=p1", gwToken, host)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// First in the queue: one that wants p0; behind it, one that takes either.
	first := e.connectAsync(gwClient+";slot=p0", host)
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == 1 }, 10*time.Second, 5*time.Millisecond)
	second := e.connectAsync(gwClient, host)
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == 2 }, 10*time.Second, 5*time.Millisecond)

	p1.Close()
	assert.Equal(t, http.StatusOK, status(t, second, "the waiter p1's slot suits"), "p0's waiter passed p1's slot on")
	select {
	case s := <-first:
		t.Fatalf("the waiter for p0 got %d while p0 was full", s)
	default:
	}
	p0.Close()
	assert.Equal(t, http.StatusOK, status(t, first, "p0's waiter"))
	// Each freed slot cost a check by the first waiter, and by the second for p1's (or an
	// extra one when a lease ended as a waiter joined): never one per tick of a clock.
	assert.LessOrEqual(t, gw.WaitChecks(), int64(5))
	assert.Equal(t, 2.0, e.metric("proxyfleet_gateway_leases_held"), "the two waiters' tunnels")
}

// TestGatewayWaitsWithoutScanning: a wait for a slot that never frees up ends after Wait
// with the refusal, having looked at the store once when it began: it did not scan the
// fleet every few milliseconds meanwhile, nor does it hold a place once the crawler left.
func TestGatewayWaitsWithoutScanning(t *testing.T) {
	e := newOneSlotGatewayEnv(t, gateway.Config{Wait: 300 * time.Millisecond})
	gw := e.gw
	host := e.proxies[0].ln.Addr().String() // any address on loopback does

	_, resp := e.connect("", "", host)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	start := time.Now()
	_, resp = e.connect("", "", host)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited")
	assert.Equal(t, "no_match", gatewayError(t, resp, string(body)).Code)
	assert.LessOrEqual(t, gw.WaitChecks(), int64(1), "a scan of the fleet at most each waitPoll (500ms)")
}

// TestGatewayRenewsHeldLeasesInParallel: a pass renews the leases held side by side, so a
// renewal that waits on a slow owner or peer delays none of the others. Here every renewal
// waits until all of them have started: one at a time, the pass never gets past the first.
func TestGatewayRenewsHeldLeasesInParallel(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := service.NewAPI(discovery.Config{}, discovery.NewStore(time.Minute), &fakeSignaler{},
		slog.New(slog.DiscardHandler), reg)
	g := gateway.New(gateway.Config{LeaseTTL: 30 * time.Second}, srv, slog.New(slog.DiscardHandler), reg)
	const n = 10
	var started atomic.Int32
	all := make(chan struct{})
	g.SetRenewHook(func(ctx context.Context, _, _ string) error {
		if started.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	for i := range n {
		g.Hold(fmt.Sprintf("lease-%d", i), "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); g.RenewPass(ctx) }()
	require.Eventually(t, func() bool { return started.Load() == n }, 5*time.Second, time.Millisecond,
		"renewals in flight at once: %d of %d", started.Load(), n)
	<-done
}
