package local_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// serve runs a daemon's control API on loopback and returns a Provider for it.
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

func fetchVia(proxyAddr, u string) (*http.Response, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr}), DisableKeepAlives: true,
	}}
	return c.Get(u)
}

func req(name, uid string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: name, ProxyUID: uid, Installation: "inst-a", Namespace: "ns",
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}},
	}
}

func TestProviderLifecycle(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	p := serve(t, d)
	ctx := context.Background()
	tgt := target(t)

	inst, err := p.Create(ctx, req("px-a-1", "uid-a"))
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, inst.State)
	assert.Equal(t, "127.0.0.1", inst.IP)
	assert.Equal(t, "uid-a", inst.ProxyUID())
	assert.Equal(t, "inst-a", inst.Labels[provider.LabelInstallation])

	// A real proxy: a request through it reaches the target.
	resp, err := fetchVia(net.JoinHostPort(inst.IP, strconv.Itoa(int(inst.Port))), tgt.URL+"/x")
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
	_, err = fetchVia(net.JoinHostPort(inst.IP, strconv.Itoa(int(inst.Port))), tgt.URL+"/x")
	require.Error(t, err)

	require.NoError(t, p.Delete(ctx, "px-a-1"))
	_, err = p.Get(ctx, "px-a-1")
	assert.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, p.Delete(ctx, "px-a-1"), "deleting a missing instance succeeds")
}

func TestProviderErrors(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	p := serve(t, d)
	_, err = p.Create(context.Background(), req("Not_A_Name", "u"))
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
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	p := serve(t, d)
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
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	defer d.Close()
	p := serve(t, d)
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
