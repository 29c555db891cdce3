package localproxy_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// creds are what the tests' instances require. The password is a canary: it must never
// show up in the daemon's state file.
var creds = proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "canary-3f9a1c-never-stored"}

// withAuth is a create request for an instance that requires creds.
func withAuth(req local.CreateRequest) local.CreateRequest {
	req.Auth = local.NewAuth(creds)
	return req
}

// strippedHeaders are the headers no target may see, whatever the client sent.
var strippedHeaders = []string{"X-Forwarded-For", "Via", "Forwarded", "Proxy-Authorization", "Proxy-Connection"}

// target is a loopback server that answers with the path and records the headers of the
// last request it saw.
func target(t *testing.T) (*httptest.Server, <-chan http.Header) {
	t.Helper()
	seen := make(chan http.Header, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = io.WriteString(w, "target "+r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

// fetchVia sends a plain HTTP request for u through the proxy at proxyAddr with headers h
// (Proxy-Authorization included, as the test sets it).
func fetchVia(t *testing.T, proxyAddr, u string, h http.Header) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr}), DisableKeepAlives: true,
	}}
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusProxyAuthRequired {
		assert.Equal(t, `Basic realm="proxyfleet"`, resp.Header.Get("Proxy-Authenticate"))
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// connectVia opens a CONNECT tunnel to hostport through the proxy at proxyAddr with headers
// h, and, if the proxy opens it, sends a plain GET for /tunnel through it. It returns the
// proxy's status and the target's body.
func connectVia(t *testing.T, proxyAddr, hostport string, h http.Header) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	if h == nil {
		h = http.Header{}
	}
	connect := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: hostport}, Host: hostport, Header: h}
	require.NoError(t, connect.Write(conn))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, connect)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode == http.StatusProxyAuthRequired {
			assert.Equal(t, `Basic realm="proxyfleet"`, resp.Header.Get("Proxy-Authenticate"))
		}
		resp.Body.Close()
		return resp.StatusCode, ""
	}
	get, err := http.NewRequest(http.MethodGet, "http://"+hostport+"/tunnel", nil)
	require.NoError(t, err)
	require.NoError(t, get.Write(conn))
	inner, err := http.ReadResponse(br, get)
	require.NoError(t, err)
	defer inner.Body.Close()
	body, _ := io.ReadAll(inner.Body)
	return resp.StatusCode, string(body)
}

func authHeader(value string) http.Header {
	return http.Header{"Proxy-Authorization": {value}}
}

func addr(info local.InstanceInfo) string {
	return net.JoinHostPort(info.IP, strconv.Itoa(info.Port))
}

func TestForwardProxyRequiresCredentials(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	info, _, err := d.Create("px-auth-1", withAuth(local.CreateRequest{}))
	require.NoError(t, err)
	assert.True(t, info.Auth, "the instance reports that it requires credentials")
	tgt, _ := target(t)
	hostport := tgt.Listener.Addr().String()

	basic := func(userpass string) http.Header {
		return authHeader("Basic " + base64.StdEncoding.EncodeToString([]byte(userpass)))
	}
	cases := []struct {
		name string
		h    http.Header
		want int
	}{
		{"no credentials", nil, http.StatusProxyAuthRequired},
		{"wrong password", basic(creds.Username + ":" + creds.Password + "x"), http.StatusProxyAuthRequired},
		{"wrong username", basic("someone:" + creds.Password), http.StatusProxyAuthRequired},
		{"empty password", basic(creds.Username + ":"), http.StatusProxyAuthRequired},
		{"not basic", authHeader("Bearer " + creds.Password), http.StatusProxyAuthRequired},
		{"not base64", authHeader("Basic !!!"), http.StatusProxyAuthRequired},
		{"twice", http.Header{"Proxy-Authorization": {creds.Header(), creds.Header()}}, http.StatusProxyAuthRequired},
		{"right", authHeader(creds.Header()), http.StatusOK},
		{"right, scheme in lower case", authHeader("basic " + strings.TrimPrefix(creds.Header(), "Basic ")), http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := fetchVia(t, addr(info), tgt.URL+"/plain", tc.h.Clone())
			assert.Equal(t, tc.want, status, "plain HTTP")
			if tc.want == http.StatusOK {
				assert.Equal(t, "target /plain", body)
			}
			status, body = connectVia(t, addr(info), hostport, tc.h.Clone())
			assert.Equal(t, tc.want, status, "CONNECT")
			if tc.want == http.StatusOK {
				assert.Equal(t, "target /tunnel", body)
			}
		})
	}

	// The injected fault still refuses everyone, the right credentials included.
	_, _, err = d.SetFault("px-auth-1", local.FaultAuth)
	require.NoError(t, err)
	status, _ := fetchVia(t, addr(info), tgt.URL+"/plain", authHeader(creds.Header()))
	assert.Equal(t, http.StatusProxyAuthRequired, status)
}

// TestForwardProxyStripsHeaders: a target learns neither the client's address, nor that a
// proxy is in the way, nor the proxy's credentials, even from headers the client sent
// itself.
func TestForwardProxyStripsHeaders(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	info, _, err := d.Create("px-strip-1", withAuth(local.CreateRequest{}))
	require.NoError(t, err)
	tgt, seen := target(t)

	cases := []struct {
		name string
		h    http.Header
	}{
		{"the client sends none", authHeader(creds.Header())},
		{"the client sends them all", http.Header{
			"Proxy-Authorization": {creds.Header()},
			"X-Forwarded-For":     {"203.0.113.7"},
			"Via":                 {"1.1 crawler-proxy"},
			"Forwarded":           {"for=203.0.113.7;proto=http"},
			"Proxy-Connection":    {"keep-alive"},
			"X-Kept":              {"yes"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, _ := fetchVia(t, addr(info), tgt.URL+"/headers", tc.h)
			require.Equal(t, http.StatusOK, status)
			var got http.Header
			select {
			case got = <-seen:
			case <-time.After(5 * time.Second):
				t.Fatal("the target saw no request")
			}
			for _, k := range strippedHeaders {
				assert.Empty(t, got.Values(k), "the target saw %s", k)
			}
			assert.Equal(t, tc.h.Get("X-Kept"), got.Get("X-Kept"), "other headers pass")
		})
	}
}

func TestDaemonKeepsInstancesAcrossRestarts(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	d1, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	info, _, err := d1.Create("px-keep-1", withAuth(local.CreateRequest{Labels: map[string]string{"k": "v"}}))
	require.NoError(t, err)
	_, _, err = d1.Create("px-dead-1", withAuth(local.CreateRequest{}))
	require.NoError(t, err)
	_, _, err = d1.Kill("px-dead-1")
	require.NoError(t, err)
	require.NoError(t, d1.Close())

	raw, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), creds.Password, "the state file holds no password")
	assert.NotContains(t, string(raw), strings.TrimPrefix(creds.Header(), "Basic "), "nor the header that carries it")
	assert.Contains(t, string(raw), local.NewAuth(creds).PasswordSHA256, "it holds the password's hash")

	d2, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	defer d2.Close()
	got, ok := d2.Get("px-keep-1")
	require.True(t, ok)
	assert.Equal(t, local.StateRunning, got.State)
	assert.Equal(t, info.Port, got.Port, "an instance comes back on its port")
	assert.Equal(t, "v", got.Labels["k"])
	assert.True(t, got.Auth, "and with its credentials")
	dead, ok := d2.Get("px-dead-1")
	require.True(t, ok)
	assert.Equal(t, local.StateStopped, dead.State, "a killed instance stays killed")

	tgt, _ := target(t)
	status, _ := fetchVia(t, addr(got), tgt.URL+"/after-restart", nil)
	assert.Equal(t, http.StatusProxyAuthRequired, status, "credentials are still required after a restart")
	status, body := fetchVia(t, addr(got), tgt.URL+"/after-restart", authHeader(creds.Header()))
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "target /after-restart", body)
}

// TestStateFromBeforeCredentials: an instance saved by a daemon that knew no credentials
// still loads, and refuses every request until the worker replaces it: it has nothing to
// require, and an open proxy is what no provider ever runs.
func TestStateFromBeforeCredentials(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	// Port 0: the instance comes back on a free port, as no old port is taken here.
	old := `[{"name":"px-old-1","state":"Running","ip":"127.0.0.1","port":0,"labels":{"k":"v"},"createdAt":"2025-01-02T03:04:05Z"}]`
	require.NoError(t, os.WriteFile(state, []byte(old), 0o600))

	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	defer d.Close()
	info, ok := d.Get("px-old-1")
	require.True(t, ok)
	assert.Equal(t, local.StateRunning, info.State)
	assert.False(t, info.Auth, "it reports that it has no credentials")
	assert.Equal(t, "v", info.Labels["k"])

	tgt, _ := target(t)
	for _, h := range []http.Header{nil, authHeader(creds.Header())} {
		status, _ := fetchVia(t, addr(info), tgt.URL+"/", h)
		assert.Equal(t, http.StatusProxyAuthRequired, status)
		status, _ = connectVia(t, addr(info), tgt.Listener.Addr().String(), h)
		assert.Equal(t, http.StatusProxyAuthRequired, status)
	}

	// Creating it again does not give it credentials: an instance keeps its own.
	again, created, err := d.Create("px-old-1", withAuth(local.CreateRequest{}))
	require.NoError(t, err)
	assert.False(t, created)
	assert.False(t, again.Auth)
}

func TestControlAPIRefusesCreateWithoutAuth(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	api := httptest.NewServer(d.Handler())
	defer api.Close()

	put := func(name, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, api.URL+"/v1/instances/"+name, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := api.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Error string `json:"error"`
		}
		if resp.StatusCode >= 300 {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		}
		return resp.StatusCode, out.Error
	}
	hash := local.NewAuth(creds).PasswordSHA256
	cases := []struct {
		name, body, field string
	}{
		{"no body", "", `auth is required`},
		{"no auth", `{"labels":{"k":"v"}}`, `auth is required`},
		{"a plaintext password", `{"auth":{"username":"proxyfleet","password":"p"}}`, `auth.passwordSHA256`},
		{"a short hash", `{"auth":{"username":"proxyfleet","passwordSHA256":"abcd"}}`, `auth.passwordSHA256`},
		{"no username", `{"auth":{"passwordSHA256":"` + hash + `"}}`, `auth.username`},
		{"a colon in the username", `{"auth":{"username":"a:b","passwordSHA256":"` + hash + `"}}`, `auth.username`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, msg := put("px-refused-1", tc.body)
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Contains(t, msg, tc.field)
		})
	}
	assert.Empty(t, d.List(nil), "nothing was created")

	status, _ := put("px-ok-1", `{"auth":{"username":"proxyfleet","passwordSHA256":"`+hash+`"}}`)
	assert.Equal(t, http.StatusCreated, status)
	resp, err := api.Client().Get(api.URL + "/v1/instances/px-ok-1")
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(raw), `"auth":true`)
	assert.NotContains(t, string(raw), hash, "the API never reports the hash")
}

func TestProvisionDelay(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{ProvisionDelay: 200 * time.Millisecond})
	require.NoError(t, err)
	defer d.Close()
	info, _, err := d.Create("px-slow-1", withAuth(local.CreateRequest{}))
	require.NoError(t, err)
	assert.Equal(t, local.StateProvisioning, info.State)
	require.Eventually(t, func() bool {
		got, _ := d.Get("px-slow-1")
		return got.State == local.StateRunning && got.Port > 0
	}, 5*time.Second, 10*time.Millisecond)
}

func TestBackdatedCreate(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	old := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
	info, _, err := d.Create("px-old-1", withAuth(local.CreateRequest{CreatedAt: &old}))
	require.NoError(t, err)
	assert.True(t, info.CreatedAt.Equal(old))
}

// TestForwardProxyStaysOnLoopback: the local proxy refuses targets beyond loopback, so a
// local fleet cannot send traffic elsewhere by accident. The address is checked before any
// connection is attempted.
func TestForwardProxyStaysOnLoopback(t *testing.T) {
	srv := httptest.NewServer(&localproxy.ForwardProxy{Auth: local.NewAuth(creds)})
	defer srv.Close()
	status, body := fetchVia(t, srv.Listener.Addr().String(), "http://192.0.2.1/", authHeader(creds.Header()))
	assert.Equal(t, http.StatusBadGateway, status)
	assert.Contains(t, body, "loopback targets only")
}

// TestForwardProxyWithoutAuthIsClosed: a ForwardProxy given no credentials refuses every
// request before doing anything else, rather than being an open proxy.
func TestForwardProxyWithoutAuthIsClosed(t *testing.T) {
	srv := httptest.NewServer(&localproxy.ForwardProxy{})
	defer srv.Close()
	tgt, seen := target(t)
	status, _ := fetchVia(t, srv.Listener.Addr().String(), tgt.URL+"/", authHeader(creds.Header()))
	assert.Equal(t, http.StatusProxyAuthRequired, status)
	assert.Empty(t, seen, "the target was never reached")
}

// TestForwardProxyRefusesAnUnaskedSwitch: a target that answers 101 Switching Protocols
// (the proxy never passes an Upgrade on, so it is never asked) gets a 502, and neither the
// client nor the proxy waits on the open connection.
func TestForwardProxyRefusesAnUnaskedSwitch(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	info, _, err := d.Create("px-switch-1", withAuth(local.CreateRequest{}))
	require.NoError(t, err)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
		_ = buf.Flush()
		_, _ = io.Copy(io.Discard, conn)
	}))
	defer site.Close()
	status, body := fetchVia(t, addr(info), site.URL+"/switch", authHeader(creds.Header()))
	assert.Equal(t, http.StatusBadGateway, status, body)
	assert.Contains(t, body, "switched protocols")
}

// TestSlowSite: /slow answers after the seconds asked, and refuses what it will not wait.
func TestSlowSite(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	api := httptest.NewServer(d.Handler())
	defer api.Close()

	start := time.Now()
	resp, err := http.Get(api.URL + "/slow?seconds=0.2")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

	for _, q := range []string{"seconds=31", "seconds=-1", "seconds=soon"} {
		resp, err := http.Get(api.URL + "/slow?" + q)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
	}
}
