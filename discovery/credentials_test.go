package discovery_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/api/enums/v1"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/discovery/temporal/temporaltest"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// newKeyring is a fresh fleet key, as an operator generates one.
func newKeyring(t testing.TB) *proxyauth.Keyring {
	t.Helper()
	b := make([]byte, proxyauth.MinKeyBytes)
	_, err := rand.Read(b)
	require.NoError(t, err)
	kr, err := proxyauth.Parse(base64.StdEncoding.EncodeToString(b))
	require.NoError(t, err)
	return kr
}

func running(m contract.ProxyMemo) temporaltest.Run {
	return temporaltest.Run{Memo: m, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// credsFixture is the API over an index the refresher loads from scripted memos, with
// credentials resolved by its keyring, as in a running discovery.
type credsFixture struct {
	*harness
	lister *temporaltest.Scripted
	ref    *temporal.Refresher
}

func newCredsFixture(t *testing.T, kr *proxyauth.Keyring, memos ...contract.ProxyMemo) *credsFixture {
	t.Helper()
	h := newLoadingHarness(t, defaultConfig())
	f := &credsFixture{harness: h, lister: &temporaltest.Scripted{}}
	f.ref = &temporal.Refresher{Client: f.lister, Namespace: "default", Store: h.store, Keyring: kr,
		Log: slog.New(slog.NewTextHandler(h.logs, nil))}
	f.set(memos...)
	require.NoError(t, f.ref.Full(t.Context()))
	return f
}

// set makes memos the running workflows Temporal lists.
func (f *credsFixture) set(memos ...contract.ProxyMemo) {
	runs := make([]temporaltest.Run, 0, len(memos))
	for _, m := range memos {
		runs = append(runs, running(m))
	}
	f.lister.Set(runs...)
}

func (f *credsFixture) metrics() string {
	f.t.Helper()
	rec := f.doAuth(http.MethodGet, "/metrics", "", "")
	require.Equal(f.t, http.StatusOK, rec.Code)
	return rec.Body.String()
}

// authProxy is a forward proxy on loopback that serves only requests presenting want (or,
// when want is empty, none): it stands in for an instance configured with them.
func authProxy(t *testing.T, want proxyauth.Credentials) (string, int32) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Proxy-Authorization")
		if (want.Empty() && got != "") || (!want.Empty() && !want.Match(got)) {
			w.Header().Set("Proxy-Authenticate", `Basic realm="proxy"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		_, _ = io.WriteString(w, "through the proxy to "+r.Host)
	}))
	t.Cleanup(srv.Close)
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return host, int32(p)
}

// fetchVia sends one plain http request with proxyURL as the client's proxy, and returns
// the status.
func fetchVia(t *testing.T, proxyURL string) int {
	t.Helper()
	u, err := url.Parse(proxyURL)
	require.NoError(t, err)
	tr := &http.Transport{Proxy: http.ProxyURL(u)}
	defer tr.CloseIdleConnections()
	// The proxy answers itself: nothing leaves loopback.
	resp, err := (&http.Client{Transport: tr}).Get("http://shop.example/")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// TestLeaseCarriesCredentials: a lease answer carries the credentials the proxy's memo
// points to, resolved with the fleet key, in its url and in separate fields; they get a
// request through a proxy that demands them. A listing never carries them.
func TestLeaseCarriesCredentials(t *testing.T) {
	kr := newKeyring(t)
	const instance = "pf-crawl-m1-7f3a9c"
	managed, err := kr.Managed(kr.PrimaryID(), instance)
	require.NoError(t, err)
	external := proxyauth.Credentials{Username: "ext-user", Password: "s3aled p@ss/with:odd%41chars#é"}

	tests := []struct {
		name string
		want proxyauth.Credentials
		auth func(m contract.ProxyMemo) *contract.ProxyAuth
	}{
		{name: "managed: derived from the fleet key and the instance", want: managed,
			auth: func(contract.ProxyMemo) *contract.ProxyAuth {
				return &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: instance}
			}},
		{name: "external: sealed for the Proxy, opened", want: external,
			auth: func(m contract.ProxyMemo) *contract.ProxyAuth {
				sealed, err := kr.Seal(external, m.UID)
				require.NoError(t, err)
				return &contract.ProxyAuth{Sealed: sealed}
			}},
		{name: "no auth: a proxy that takes none",
			auth: func(contract.ProxyMemo) *contract.ProxyAuth { return nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := temporaltest.ReadyMemo("p")
			m.IP, m.Port = authProxy(t, tc.want)
			m.Auth = tc.auth(m)
			f := newCredsFixture(t, kr, m)
			hostPort := net.JoinHostPort(m.IP, strconv.Itoa(int(m.Port)))

			rec := f.do(http.MethodPost, "/v1/leases", `{}`)
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			var raw struct {
				Proxy map[string]any `json:"proxy"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &raw))
			var l discovery.LeaseResponse
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &l))
			u, err := url.Parse(l.Proxy.URL)
			require.NoError(t, err)
			assert.Equal(t, hostPort, u.Host)

			if tc.want.Empty() {
				assert.NotContains(t, raw.Proxy, "username", "left out for a proxy that takes none")
				assert.NotContains(t, raw.Proxy, "password", "left out for a proxy that takes none")
				assert.Equal(t, "http://"+hostPort, l.Proxy.URL)
			} else {
				assert.Equal(t, tc.want.Username, raw.Proxy["username"])
				assert.Equal(t, tc.want.Password, raw.Proxy["password"])
				require.NotNil(t, u.User, "the url has the credentials as userinfo")
				assert.Equal(t, tc.want.Username, u.User.Username())
				pw, _ := u.User.Password()
				assert.Equal(t, tc.want.Password, pw, "escaped in the url, and unescaped the same")
			}
			assert.Equal(t, http.StatusOK, fetchVia(t, l.Proxy.URL), "the lease's url gets through the proxy")
			if !tc.want.Empty() {
				assert.Equal(t, http.StatusProxyAuthRequired, fetchVia(t, "http://"+hostPort),
					"and the proxy does demand them")
			}

			rec = f.do(http.MethodGet, "/v1/proxies", "")
			require.Equal(t, http.StatusOK, rec.Code)
			var list discovery.ProxyList
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &list))
			require.Len(t, list.Proxies, 1)
			assert.Equal(t, "http://"+hostPort, list.Proxies[0].URL)
			assert.True(t, list.Proxies[0].Healthy)
			assert.NotContains(t, rec.Body.String(), "username")
			assert.NotContains(t, rec.Body.String(), "password")
			if !tc.want.Empty() {
				assert.NotContains(t, rec.Body.String(), tc.want.Password)
			}
			assert.NotContains(t, f.logs.String(), "cannot be resolved")
		})
	}
}

// TestUnresolvedCredentialsAreNotLeased: a proxy whose memo points to credentials
// discovery cannot resolve is never leased (it counts as unhealthy), is counted by reason
// in proxyfleet_discovery_credentials_unresolved, and is logged once, with its name, the
// reason and the key ID, never the credentials.
func TestUnresolvedCredentialsAreNotLeased(t *testing.T) {
	kr, other := newKeyring(t), newKeyring(t)
	secret := proxyauth.Credentials{Username: "ext-user", Password: "never-logged-pw"}
	sealedFor := func(kr *proxyauth.Keyring, uid string) string {
		s, err := kr.Seal(secret, uid)
		require.NoError(t, err)
		return s
	}
	tests := []struct {
		name    string
		keyring *proxyauth.Keyring
		auth    *contract.ProxyAuth
		reason  string
		keyID   string // the key ID the warning names, if the memo names one
	}{
		{name: "managed, key rotated out", keyring: kr, reason: discovery.CredentialsUnknownKey, keyID: other.PrimaryID(),
			auth: &contract.ProxyAuth{KeyID: other.PrimaryID(), Instance: "pf-crawl-p-1"}},
		{name: "sealed with an unknown key", keyring: kr, reason: discovery.CredentialsUnknownKey, keyID: other.PrimaryID(),
			auth: &contract.ProxyAuth{Sealed: sealedFor(other, "uid-p")}},
		{name: "sealed for another proxy", keyring: kr, reason: discovery.CredentialsCannotOpen, keyID: kr.PrimaryID(),
			auth: &contract.ProxyAuth{Sealed: sealedFor(kr, "uid-someone-else")}},
		{name: "sealed value altered", keyring: kr, reason: discovery.CredentialsCannotOpen, keyID: kr.PrimaryID(),
			auth: &contract.ProxyAuth{Sealed: sealedFor(kr, "uid-p") + "AAAA"}},
		{name: "sealed value not one", keyring: kr, reason: discovery.CredentialsMalformed,
			auth: &contract.ProxyAuth{Sealed: "plaintext-password"}},
		{name: "empty auth", keyring: kr, reason: discovery.CredentialsMalformed,
			auth: &contract.ProxyAuth{}},
		{name: "key ID without an instance", keyring: kr, reason: discovery.CredentialsMalformed,
			auth: &contract.ProxyAuth{KeyID: kr.PrimaryID()}},
		{name: "derived and sealed", keyring: kr, reason: discovery.CredentialsMalformed,
			auth: &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: "pf-crawl-p-1", Sealed: sealedFor(kr, "uid-p")}},
		{name: "no fleet key", keyring: nil, reason: discovery.CredentialsNoFleetKey, keyID: kr.PrimaryID(),
			auth: &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: "pf-crawl-p-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := temporaltest.ReadyMemo("p")
			m.Auth = tc.auth
			f := newCredsFixture(t, tc.keyring, m)
			// More passes over the same memo: the warning is not repeated.
			require.NoError(t, f.ref.Full(t.Context()))
			require.NoError(t, f.ref.Incremental(t.Context()))

			body := requireError(t, f.do(http.MethodPost, "/v1/leases", `{}`), http.StatusConflict, "no_match")
			assert.EqualValues(t, 1, body["considered"])
			assert.EqualValues(t, 1, body["unhealthy"], "counted as unhealthy")

			rec := f.do(http.MethodGet, "/v1/proxies", "")
			require.Equal(t, http.StatusOK, rec.Code)
			assert.Contains(t, rec.Body.String(), `"healthy":false`)
			assert.Contains(t, rec.Body.String(), `"phase":"Ready"`, "the phase still says what the workflow says")

			metrics := f.metrics()
			for _, r := range []string{discovery.CredentialsNoFleetKey, discovery.CredentialsUnknownKey,
				discovery.CredentialsCannotOpen, discovery.CredentialsMalformed} {
				want := 0
				if r == tc.reason {
					want = 1
				}
				assert.Contains(t, metrics, fmt.Sprintf("proxyfleet_discovery_credentials_unresolved{reason=%q} %d\n", r, want))
			}
			assert.Contains(t, metrics, "proxyfleet_discovery_index_healthy_proxies 0\n")

			logs := f.logs.String()
			assert.Equal(t, 1, strings.Count(logs, "proxy credentials cannot be resolved"), "warned once:\n%s", logs)
			assert.Contains(t, logs, "proxy=crawl/p")
			assert.Contains(t, logs, "reason="+tc.reason)
			if tc.keyID != "" {
				assert.Contains(t, logs, "keyID="+tc.keyID)
			}
			assert.NotContains(t, logs, secret.Password)
			if tc.auth.Sealed != "" {
				assert.NotContains(t, logs, tc.auth.Sealed, "not even the ciphertext")
			}
		})
	}
}

// TestUnresolvedCredentialsLoggedPerChange: the warning comes again only when the memo's
// auth changes, and an info line says when the proxy can be leased again.
func TestUnresolvedCredentialsLoggedPerChange(t *testing.T) {
	kr, old := newKeyring(t), newKeyring(t)
	m := temporaltest.ReadyMemo("p")
	m.Auth = &contract.ProxyAuth{KeyID: old.PrimaryID(), Instance: "pf-crawl-p-1"}
	f := newCredsFixture(t, kr, m)
	warnings := func() int { return strings.Count(f.logs.String(), "proxy credentials cannot be resolved") }
	require.Equal(t, 1, warnings())

	// A replacement made with the same stale key: a new instance, a new warning.
	m.Auth = &contract.ProxyAuth{KeyID: old.PrimaryID(), Instance: "pf-crawl-p-2"}
	f.set(m)
	require.NoError(t, f.ref.Incremental(t.Context()))
	require.NoError(t, f.ref.Full(t.Context()))
	assert.Equal(t, 2, warnings())

	// The worker has the key discovery has: leased again, and said so once.
	m.Auth = &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: "pf-crawl-p-3"}
	f.set(m)
	require.NoError(t, f.ref.Incremental(t.Context()))
	require.NoError(t, f.ref.Full(t.Context()))
	assert.Equal(t, 2, warnings())
	assert.Equal(t, 1, strings.Count(f.logs.String(), "proxy credentials resolved"))
	want, err := kr.Managed(kr.PrimaryID(), "pf-crawl-p-3")
	require.NoError(t, err)
	l := f.acquire(`{}`)
	assert.Equal(t, want.Password, l.Proxy.Password)
	assert.Contains(t, f.metrics(), `proxyfleet_discovery_credentials_unresolved{reason="unknown_key"} 0`)

	// A proxy that leaves the index is forgotten: back with the stale key, warned again.
	f.set()
	require.NoError(t, f.ref.Full(t.Context()))
	m.Auth = &contract.ProxyAuth{KeyID: old.PrimaryID(), Instance: "pf-crawl-p-2"}
	f.set(m)
	require.NoError(t, f.ref.Full(t.Context()))
	assert.Equal(t, 3, warnings())
}

// TestRenewCarriesCurrentCredentials: a renewal carries the credentials the proxy takes
// now (an External proxy's Secret may be rotated), and keeps the last ones while they
// cannot be resolved rather than answer without any. A replacement (a new instance, even
// at the same address) ends the lease instead: proxy_gone, reason replaced.
func TestRenewCarriesCurrentCredentials(t *testing.T) {
	kr := newKeyring(t)
	m := temporaltest.ReadyMemo("p")
	m.Auth = &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: "pf-crawl-p-1"}
	f := newCredsFixture(t, kr, m)
	first, err := kr.Managed(kr.PrimaryID(), "pf-crawl-p-1")
	require.NoError(t, err)
	l := f.acquire(`{}`)
	require.Equal(t, first.Password, l.Proxy.Password)
	renew := func() discovery.LeaseResponse {
		t.Helper()
		rec := f.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/renew", `{}`)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var r discovery.LeaseResponse
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r))
		return r
	}

	// discovery loses the key (rotated out of its keyring too early): the proxy still
	// takes the credentials it was configured with, so the renewal keeps them.
	f.ref.Keyring = newKeyring(t)
	require.NoError(t, f.ref.Full(t.Context()))
	r := renew()
	assert.Equal(t, first.Password, r.Proxy.Password)
	assert.Equal(t, "127.0.0.1", r.Proxy.IP)
	requireError(t, f.do(http.MethodPost, "/v1/leases", `{}`), http.StatusConflict, "no_match")
	f.ref.Keyring = kr
	require.NoError(t, f.ref.Full(t.Context()))

	// Replaced by a new instance at the same address: the lease ends.
	m.Auth.Instance = "pf-crawl-p-2"
	f.set(m)
	require.NoError(t, f.ref.Incremental(t.Context()))
	body := requireError(t, f.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/renew", `{}`), http.StatusGone, "proxy_gone")
	assert.Equal(t, "replaced", body["reason"])

	// An External proxy whose Secret was rotated: same address, new credentials.
	seal := func(password string) string {
		s, err := kr.Seal(proxyauth.Credentials{Username: "user", Password: password}, "uid-ext")
		require.NoError(t, err)
		return s
	}
	ext := temporaltest.ReadyMemo("ext")
	ext.Provider, ext.Attributes = "external", map[string]string{"kind": "ext"}
	ext.Auth = &contract.ProxyAuth{Sealed: seal("old-password")}
	f.set(m, ext)
	require.NoError(t, f.ref.Incremental(t.Context()))
	l = f.acquire(`{"selector":{"kind":"ext"}}`)
	require.Equal(t, "old-password", l.Proxy.Password)
	ext.Auth = &contract.ProxyAuth{Sealed: seal("new-password")}
	f.set(m, ext)
	require.NoError(t, f.ref.Incremental(t.Context()))
	r = renew()
	assert.Equal(t, "new-password", r.Proxy.Password)
	assert.Equal(t, (&url.URL{Scheme: "http", Host: "127.0.0.1:3128", User: url.UserPassword("user", "new-password")}).String(),
		r.Proxy.URL)
}

// TestServiceWithoutFleetKey: a discovery assembled without a fleet key leases proxies
// that take no credentials, never one that does, and says so when it starts; with the key,
// the same memos make both leasable.
func TestServiceWithoutFleetKey(t *testing.T) {
	kr := newKeyring(t)
	locked := temporaltest.ReadyMemo("locked")
	locked.Auth = &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: "pf-crawl-locked-1"}
	locked.MaxLeases, locked.LatencyMillis = 10, 1 // the better proxy, were it leasable
	open := temporaltest.ReadyMemo("open")
	open.MaxLeases, open.LatencyMillis = 10, 50

	for _, tc := range []struct {
		name    string
		keyring *proxyauth.Keyring
		want    map[string]int
	}{
		{name: "without a key", want: map[string]int{"open": 6}},
		{name: "with the key", keyring: kr, want: map[string]int{"locked": 3, "open": 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			temporal := &slowTemporal{}
			temporal.Set(running(locked), running(open))
			logs := &testenv.LogBuffer{}
			svc := service.New(service.Config{API: defaultConfig(), Namespace: "default",
				RefreshInterval: time.Hour, FullResyncInterval: time.Hour, Keyring: tc.keyring},
				temporal, slog.New(slog.NewTextHandler(logs, nil)), nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			served := make(chan error, 1)
			go func() { served <- svc.Serve(ctx, ln) }()
			t.Cleanup(func() { cancel(); require.NoError(t, <-served) })
			require.Eventually(t, svc.Store.Loaded, 10*time.Second, 5*time.Millisecond)

			got := map[string]int{}
			for range 6 {
				req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/leases", nil)
				require.NoError(t, err)
				req.Header.Set("Authorization", "Bearer "+testToken)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				var l discovery.LeaseResponse
				decodeJSON(t, resp, &l)
				got[l.Proxy.Name]++
				assert.Equal(t, l.Proxy.Name == "locked", l.Proxy.Password != "", "credentials exactly for the proxy taking them")
			}
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.keyring == nil, strings.Contains(logs.String(), "without a fleet key"), "the warning at start")
		})
	}
}

// TestCredentialsOnlyInLeaseAnswers drives every route with proxies whose passwords are
// recognisable, with logs at debug level, spans and metrics recorded, and the signals sent
// to Temporal kept: the passwords appear in lease and renewal answers, and nowhere else.
func TestCredentialsOnlyInLeaseAnswers(t *testing.T) {
	// otelgin takes the global provider when the handler is built.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	kr := newKeyring(t)
	const canary = "CANARY-pw/with:odd@chars%41é"
	extCreds := proxyauth.Credentials{Username: "canary-user", Password: canary}
	ext := temporaltest.ReadyMemo("ext")
	ext.MaxLeases, ext.Attributes = 4, map[string]string{"kind": "ext"}
	sealed, err := kr.Seal(extCreds, ext.UID)
	require.NoError(t, err)
	ext.Auth = &contract.ProxyAuth{Sealed: sealed}
	mgd := temporaltest.ReadyMemo("mgd")
	mgd.MaxLeases, mgd.Attributes = 4, map[string]string{"kind": "mgd"}
	mgd.Auth = &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: "pf-crawl-mgd-1"}
	mgdCreds, err := kr.Managed(kr.PrimaryID(), "pf-crawl-mgd-1")
	require.NoError(t, err)
	// ext's sealed credentials copied into another Proxy's memo: they must not open, and
	// the warning about them must not leak them.
	stolen := temporaltest.ReadyMemo("stolen")
	stolen.Attributes = map[string]string{"kind": "stolen"}
	stolen.Auth = &contract.ProxyAuth{Sealed: sealed}

	logs := &testenv.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store := discovery.NewStore(keepExpired)
	signals := make(chan contract.ReportSignal, 64)
	sig := &fakeSignaler{report: func(_ context.Context, _, _ string, s contract.ReportSignal) error {
		signals <- s
		return nil
	}}
	srv := service.NewAPI(defaultConfig(), store, sig, log, prometheus.NewRegistry())
	handler := srv.Handler()
	ctx, cancel := context.WithCancel(t.Context())
	reportsDone := make(chan struct{})
	go func() { srv.RunReports(ctx); close(reportsDone) }()
	t.Cleanup(func() { cancel(); <-reportsDone })
	lister := &temporaltest.Scripted{}
	lister.Set(running(ext), running(mgd), running(stolen))
	ref := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Keyring: kr, Log: log}
	require.NoError(t, ref.Full(t.Context()))
	require.NoError(t, ref.Incremental(t.Context()))

	var leaseBodies, otherBodies []string
	send := func(method, path, body string, wantStatus int) string {
		t.Helper()
		auth := "Bearer " + testToken
		if strings.HasPrefix(path, "/metrics") || strings.HasPrefix(path, "/healthz") || strings.HasPrefix(path, "/readyz") {
			auth = ""
		}
		rec := serve(handler, method, path, body, auth)
		require.Equal(t, wantStatus, rec.Code, "%s %s: %s", method, path, rec.Body.String())
		return rec.Body.String()
	}
	lease := func(body string) discovery.LeaseResponse {
		t.Helper()
		raw := send(http.MethodPost, "/v1/leases", body, http.StatusCreated)
		leaseBodies = append(leaseBodies, raw)
		var l discovery.LeaseResponse
		require.NoError(t, json.Unmarshal([]byte(raw), &l))
		return l
	}
	renew := func(id string) discovery.LeaseResponse {
		t.Helper()
		raw := send(http.MethodPost, "/v1/leases/"+id+"/renew", `{"ttlSeconds":120}`, http.StatusOK)
		leaseBodies = append(leaseBodies, raw)
		var l discovery.LeaseResponse
		require.NoError(t, json.Unmarshal([]byte(raw), &l))
		return l
	}
	other := func(method, path, body string, wantStatus int) {
		t.Helper()
		otherBodies = append(otherBodies, send(method, path, body, wantStatus))
	}

	other(http.MethodGet, "/v1/proxies", "", http.StatusOK)
	other(http.MethodGet, "/v1/proxies?healthy=true", "", http.StatusOK)
	other(http.MethodGet, "/v1/proxies?attr.kind=ext", "", http.StatusOK)
	le := lease(`{"selector":{"kind":"ext"},"target":"shop.example"}`)
	lm := lease(`{"selector":{"kind":"mgd"}}`)
	assert.Equal(t, extCreds.Password, le.Proxy.Password, "the sealed credentials, opened")
	assert.Equal(t, mgdCreds.Password, lm.Proxy.Password, "the derived credentials")
	assert.Equal(t, extCreds.Password, renew(le.LeaseID).Proxy.Password)
	assert.Equal(t, mgdCreds.Password, renew(lm.LeaseID).Proxy.Password)
	other(http.MethodPost, "/v1/leases", `{"selector":{"kind":"stolen"}}`, http.StatusConflict)
	other(http.MethodPost, "/v1/leases", `{"selector":{"kind":"ext"},"ttlSeconds":-1}`, http.StatusBadRequest)
	other(http.MethodPost, "/v1/leases/"+le.LeaseID+"/report", `{"result":"ok"}`, http.StatusNoContent)
	other(http.MethodPost, "/v1/leases/"+le.LeaseID+"/report", `{"result":"rate_limited"}`, http.StatusNoContent)
	other(http.MethodPost, "/v1/leases/"+lm.LeaseID+"/report", `{"result":"banned","target":"news.example"}`, http.StatusNoContent)
	other(http.MethodPost, "/v1/leases/"+le.LeaseID+"/report", `{"result":"blocked"}`, http.StatusBadRequest)
	other(http.MethodDelete, "/v1/leases/"+le.LeaseID, "", http.StatusNoContent)
	other(http.MethodPost, "/v1/leases/"+le.LeaseID+"/renew", `{}`, http.StatusGone)
	other(http.MethodPost, "/v1/leases/0123456789abcdef0123456789abcdef/renew", `{}`, http.StatusNotFound)
	other(http.MethodPost, "/v1/leases/0123456789abcdef0123456789abcdef/report", `{"result":"ok"}`, http.StatusNotFound)
	other(http.MethodDelete, "/v1/leases/"+lm.LeaseID, "", http.StatusNoContent)
	other(http.MethodGet, "/v1/nothing", "", http.StatusNotFound)
	other(http.MethodPut, "/v1/leases", "", http.StatusMethodNotAllowed)
	other(http.MethodGet, "/healthz", "", http.StatusOK)
	other(http.MethodGet, "/readyz", "", http.StatusOK)
	metrics := send(http.MethodGet, "/metrics", "", http.StatusOK)

	var forwarded []string
	for range 2 { // rate_limited and banned; ok is not forwarded
		select {
		case s := <-signals:
			forwarded = append(forwarded, fmt.Sprintf("%+v %#v", s, s))
		case <-time.After(10 * time.Second):
			t.Fatal("a report was not forwarded")
		}
	}

	var spanText strings.Builder
	ended := spans.Ended()
	require.NotEmpty(t, ended, "the server's requests were traced")
	for _, s := range ended {
		fmt.Fprintf(&spanText, "%s %s %v\n", s.Name(), s.Status().Description, s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintf(&spanText, "%s %v\n", e.Name, e.Attributes)
		}
	}

	assert.Contains(t, metrics, `proxyfleet_discovery_credentials_unresolved{reason="cannot_open"} 1`, "the stolen sealed value")
	assert.Contains(t, logs.String(), `"proxy":"crawl/stolen"`, "the stolen sealed value is warned about")
	assert.Contains(t, logs.String(), `"route":"/v1/leases/:id/renew"`, "requests are logged")

	for _, creds := range []proxyauth.Credentials{extCreds, mgdCreds} {
		secrets := []string{
			creds.Password,
			url.UserPassword("", creds.Password).String()[1:], // as escaped in a url
			strings.TrimPrefix(creds.Header(), "Basic "),      // as a Proxy-Authorization header
		}
		for _, b := range leaseBodies {
			if strings.Contains(b, creds.Username) {
				assert.Contains(t, b, creds.Password, "the lease answer carries the password")
			}
		}
		for _, secret := range secrets {
			for _, b := range otherBodies {
				assert.NotContains(t, b, secret)
			}
			assert.NotContains(t, logs.String(), secret, "logs")
			assert.NotContains(t, spanText.String(), secret, "spans")
			assert.NotContains(t, metrics, secret, "metrics")
			assert.NotContains(t, strings.Join(forwarded, "\n"), secret, "signals to Temporal")
		}
	}
	assert.NotContains(t, logs.String(), sealed, "nor the ciphertext")
	assert.NotContains(t, spanText.String(), sealed)
}
