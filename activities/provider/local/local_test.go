package local_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// keyring derives the instances' credentials as the worker does.
var keyring = func() *proxyauth.Keyring {
	kr, err := proxyauth.Parse(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, proxyauth.MinKeyBytes)))
	if err != nil {
		panic(err)
	}
	return kr
}()

// credsFor are the credentials of the instance named name.
func credsFor(name string) proxyauth.Credentials {
	c, err := keyring.Managed(keyring.PrimaryID(), name)
	if err != nil {
		panic(err) // only an empty name fails
	}
	return c
}

// serve runs a daemon's control API on loopback and returns a Provider for it.
// newDaemon runs a daemon with default options on a loopback port for the test, and
// returns it with a provider talking to it.
func newDaemon(t *testing.T) (*localproxy.Daemon, *local.Provider) {
	t.Helper()
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d, serve(t, d)
}

func serve(t *testing.T, d *localproxy.Daemon) *local.Provider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return local.NewProvider("http://" + ln.Addr().String())
}

func target(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "target "+r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fetchVia gets u through the proxy at proxyAddr as an ordinary Go client does: with the
// credentials in the proxy URL (none when c is empty), on every plain request and on
// CONNECT for https targets. Its transport is client's (for a TLS target's trust), or a
// new one.
func fetchVia(proxyAddr, u string, c proxyauth.Credentials, client *http.Client) (*http.Response, error) {
	proxyURL := &url.URL{Scheme: "http", Host: proxyAddr}
	if !c.Empty() {
		proxyURL.User = url.UserPassword(c.Username, c.Password)
	}
	tr := &http.Transport{}
	if client != nil {
		tr = client.Transport.(*http.Transport).Clone()
	}
	tr.Proxy, tr.DisableKeepAlives = http.ProxyURL(proxyURL), true
	return (&http.Client{Timeout: 5 * time.Second, Transport: tr}).Get(u)
}

// addr is the instance's proxy address.
func addr(inst provider.Instance) string {
	return net.JoinHostPort(inst.IP, strconv.Itoa(int(inst.Port)))
}

// req is a create request as the worker makes it, with the instance's credentials.
func req(name, uid string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: name, ProxyUID: uid, Installation: "inst-a", Namespace: "ns",
		Spec:        v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}},
		Credentials: credsFor(name), KeyID: keyring.PrimaryID(),
	}
}

func TestProviderLifecycle(t *testing.T) {
	d, p := newDaemon(t)
	ctx := context.Background()
	tgt := target(t)

	inst, err := p.Create(ctx, req("px-a-1", "uid-a"))
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, inst.State)
	assert.Equal(t, "127.0.0.1", inst.IP)
	assert.Equal(t, "uid-a", inst.ProxyUID())
	assert.Equal(t, "inst-a", inst.Labels[provider.LabelInstallation])

	// A real proxy: a request through it with the instance's credentials reaches the target.
	resp, err := fetchVia(addr(inst), tgt.URL+"/x", credsFor("px-a-1"), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "target /x", string(body))

	again, err := p.Create(ctx, req("px-a-1", "uid-a"))
	require.NoError(t, err, "create is idempotent")
	assert.Equal(t, inst.Port, again.Port)
	assert.Len(t, d.List(nil), 1)

	_, err = p.Create(ctx, req("px-b-1", "uid-b"))
	require.NoError(t, err)
	other := req("px-c-1", "uid-c")
	other.Installation = "inst-b"
	_, err = p.Create(ctx, other)
	require.NoError(t, err)
	mine, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	assert.Len(t, mine, 2, "only this installation's instances")

	// A killed instance is Stopped and refuses connections.
	require.NoError(t, p.Kill(ctx, "px-a-1"))
	got, err := p.Get(ctx, "px-a-1")
	require.NoError(t, err)
	assert.Equal(t, provider.StateStopped, got.State)
	_, err = fetchVia(addr(inst), tgt.URL+"/x", credsFor("px-a-1"), nil)
	require.Error(t, err)

	require.NoError(t, p.Delete(ctx, "px-a-1"))
	_, err = p.Get(ctx, "px-a-1")
	assert.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, p.Delete(ctx, "px-a-1"), "deleting a missing instance succeeds")
}

func TestProviderErrors(t *testing.T) {
	_, p := newDaemon(t)
	_, err := p.Create(context.Background(), req("Not_A_Name", "u"))
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := local.NewProvider("http://" + ln.Addr().String())
	require.NoError(t, ln.Close())
	_, err = down.Get(context.Background(), "px-a-1")
	require.Error(t, err)
	assert.False(t, errors.Is(err, provider.ErrNotFound))
	assert.Equal(t, provider.KindTransient, provider.Class(err), "a daemon that is down is a wait")
}

func TestListOwnedByProxy(t *testing.T) {
	_, p := newDaemon(t)
	ctx := context.Background()

	elsewhere := req("px-a-9", "uid-a") // the same UID in another installation
	elsewhere.Installation = "inst-b"
	for _, r := range []provider.CreateRequest{req("px-a-1", "uid-a"), req("px-a-2", "uid-a"), req("px-b-1", "uid-b"), elsewhere} {
		_, err := p.Create(ctx, r)
		require.NoError(t, err)
	}

	mine, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a", ProxyUID: "uid-a"})
	require.NoError(t, err)
	var names []string
	for _, inst := range mine {
		names = append(names, inst.Name)
		assert.Equal(t, "uid-a", inst.ProxyUID())
		assert.Equal(t, "inst-a", inst.Labels[provider.LabelInstallation])
	}
	assert.ElementsMatch(t, []string{"px-a-1", "px-a-2"}, names)

	all, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	assert.Len(t, all, 3, "without a UID the whole installation is listed")

	none, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a", ProxyUID: "uid-z"})
	require.NoError(t, err)
	assert.Empty(t, none)

	_, err = p.ListOwned(ctx, provider.Owner{ProxyUID: "uid-a"})
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err), "nobody's instances are never listed")
}

// The sweeper deletes what a list returns, so an answer wider than the query asked for
// (an older daemon's, say) must not get through.
func TestListOwnedChecksLabelsItself(t *testing.T) {
	all := []local.InstanceInfo{
		{Name: "px-a-1", Labels: map[string]string{provider.LabelInstallation: "inst-a", provider.LabelProxyUID: "uid-a"}},
		{Name: "px-b-1", Labels: map[string]string{provider.LabelInstallation: "inst-a", provider.LabelProxyUID: "uid-b"}},
		{Name: "px-a-9", Labels: map[string]string{provider.LabelInstallation: "inst-b", provider.LabelProxyUID: "uid-a"}},
		{Name: "hand-made"},
	}
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Query())
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"instances": all})
	}))
	t.Cleanup(srv.Close)
	p := local.NewProvider(srv.URL)

	got, err := p.ListOwned(context.Background(), provider.Owner{Installation: "inst-a", ProxyUID: "uid-a"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "px-a-1", got[0].Name)
	require.Len(t, queries, 1)
	assert.Equal(t, url.Values{
		"label." + provider.LabelInstallation: {"inst-a"},
		"label." + provider.LabelProxyUID:     {"uid-a"},
	}, queries[0], "both labels are asked for")

	got, err = p.ListOwned(context.Background(), provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	var names []string
	for _, inst := range got {
		names = append(names, inst.Name)
	}
	assert.ElementsMatch(t, []string{"px-a-1", "px-b-1"}, names)
}

func TestCreateLabelsTheSpecHash(t *testing.T) {
	_, p := newDaemon(t)
	ctx := context.Background()

	withHash := req("px-a-1", "uid-a")
	withHash.SpecHash = "0123456789abcdef"
	inst, err := p.Create(ctx, withHash)
	require.NoError(t, err)
	assert.Equal(t, "0123456789abcdef", inst.Labels[provider.LabelSpecHash])

	list, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a", ProxyUID: "uid-a"})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "0123456789abcdef", list[0].Labels[provider.LabelSpecHash], "a run without state reads it back from the list")

	without, err := p.Create(ctx, req("px-b-1", "uid-b"))
	require.NoError(t, err)
	assert.NotContains(t, without.Labels, provider.LabelSpecHash, "no hash, no label")
}

func TestCreateRequiresCredentials(t *testing.T) {
	d, p := newDaemon(t)

	for name, c := range map[string]proxyauth.Credentials{
		"none":        {},
		"no password": {Username: proxyauth.ManagedUsername},
		"no username": {Password: "p"},
	} {
		t.Run(name, func(t *testing.T) {
			r := req("px-a-1", "uid-a")
			r.Credentials = c
			_, err := p.Create(context.Background(), r)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err), "retrying cannot supply credentials")
			assert.Contains(t, err.Error(), "no credentials")
		})
	}
	assert.Empty(t, d.List(nil), "nothing was created")
}

// TestControlAPIRefusesCreateWithoutAuth: a caller of the control API that sends no
// credentials (an older client) gets a permanent error naming the field.
func TestControlAPIRefusesCreateWithoutAuth(t *testing.T) {
	d, p := newDaemon(t)

	_, err := p.CreateRaw(context.Background(), "px-raw-1", local.CreateRequest{Labels: map[string]string{"k": "v"}})
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	assert.Contains(t, err.Error(), "auth is required")
	assert.Empty(t, d.List(nil))

	info, err := p.CreateRaw(context.Background(), "px-raw-1", local.CreateRequest{Auth: local.NewAuth(credsFor("px-raw-1"))})
	require.NoError(t, err)
	assert.True(t, info.Auth)
}

func TestInstanceRequiresItsCredentials(t *testing.T) {
	_, p := newDaemon(t)
	inst, err := p.Create(context.Background(), req("px-a-1", "uid-a"))
	require.NoError(t, err)

	plain := target(t)
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "secure "+r.URL.Path)
	}))
	t.Cleanup(secure.Close)

	right := credsFor("px-a-1")
	cases := []struct {
		name  string
		creds proxyauth.Credentials
		ok    bool
	}{
		{"no credentials", proxyauth.Credentials{}, false},
		{"wrong password", proxyauth.Credentials{Username: right.Username, Password: right.Password + "x"}, false},
		{"wrong username", proxyauth.Credentials{Username: "someone", Password: right.Password}, false},
		{"another instance's", credsFor("px-a-2"), false},
		{"right", right, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := fetchVia(addr(inst), plain.URL+"/plain", tc.creds, nil)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.ok {
				assert.Equal(t, http.StatusOK, resp.StatusCode, "plain HTTP")
				assert.Equal(t, "target /plain", string(body))
			} else {
				assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "plain HTTP")
				assert.Equal(t, `Basic realm="proxyfleet"`, resp.Header.Get("Proxy-Authenticate"))
			}

			// https: Go's client sends the proxy URL's credentials on CONNECT.
			resp, err = fetchVia(addr(inst), secure.URL+"/tunnel", tc.creds, secure.Client())
			if !tc.ok {
				require.Error(t, err, "CONNECT")
				assert.Contains(t, err.Error(), "Proxy Authentication Required")
				return
			}
			require.NoError(t, err, "CONNECT")
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, "secure /tunnel", string(body))
		})
	}
}

func TestInstanceStripsHeaders(t *testing.T) {
	_, p := newDaemon(t)
	inst, err := p.Create(context.Background(), req("px-a-1", "uid-a"))
	require.NoError(t, err)

	seen := make(chan http.Header, 1)
	tgt := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
	}))
	t.Cleanup(tgt.Close)

	c := credsFor("px-a-1")
	proxyURL := &url.URL{Scheme: "http", Host: addr(inst), User: url.UserPassword(c.Username, c.Password)}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}}
	r, err := http.NewRequest(http.MethodGet, tgt.URL+"/", nil)
	require.NoError(t, err)
	r.Header.Set("X-Forwarded-For", "203.0.113.7")
	r.Header.Set("Via", "1.1 crawler")
	r.Header.Set("Forwarded", "for=203.0.113.7")
	resp, err := client.Do(r)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var got http.Header
	select {
	case got = <-seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the target saw no request")
	}
	for _, k := range []string{"X-Forwarded-For", "Via", "Forwarded", "Proxy-Authorization", "Proxy-Connection"} {
		assert.Empty(t, got.Values(k), "the target saw %s", k)
	}
}

// TestCreateKeepsAnInstancesCredentials: creating a name that exists returns the instance
// as it is; it goes on requiring the credentials it was created with.
func TestCreateKeepsAnInstancesCredentials(t *testing.T) {
	_, p := newDaemon(t)
	ctx := context.Background()
	first, err := p.Create(ctx, req("px-a-1", "uid-a"))
	require.NoError(t, err)

	other := req("px-a-1", "uid-a")
	other.Credentials = credsFor("px-other-1")
	again, err := p.Create(ctx, other)
	require.NoError(t, err)
	assert.Equal(t, first.Port, again.Port)

	tgt := target(t)
	resp, err := fetchVia(addr(first), tgt.URL+"/", other.Credentials, nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "the second request's credentials were not taken")
	resp, err = fetchVia(addr(first), tgt.URL+"/", credsFor("px-a-1"), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestCredentialsSurviveADaemonRestart: the daemon keeps what an instance requires in its
// state file, as a hash: a restarted daemon still requires the credentials, and the file
// never holds the password.
func TestCredentialsSurviveADaemonRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	d1, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	p1 := serve(t, d1)
	r := req("px-a-1", "uid-a")
	const canary = "canary-7d41e0-never-stored"
	r.Credentials.Password = canary
	inst, err := p1.Create(context.Background(), r)
	require.NoError(t, err)
	require.NoError(t, d1.Close())

	raw, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), canary, "the state file holds no password")
	assert.NotContains(t, string(raw), strings.TrimPrefix(r.Credentials.Header(), "Basic "), "nor the header that carries it")

	d2, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	defer d2.Close()
	p2 := serve(t, d2)
	got, err := p2.Get(context.Background(), "px-a-1")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, got.State)
	require.Equal(t, addr(inst), addr(got), "the instance comes back on its address")

	tgt := target(t)
	resp, err := fetchVia(addr(got), tgt.URL+"/", proxyauth.Credentials{}, nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "still requires credentials")
	resp, err = fetchVia(addr(got), tgt.URL+"/", r.Credentials, nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "and still takes the right ones")
}
