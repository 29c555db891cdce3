package localproxy_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
)

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

func TestDaemonKeepsInstancesAcrossRestarts(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	d1, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	info, _, err := d1.Create("px-keep-1", local.CreateRequest{Labels: map[string]string{"k": "v"}})
	require.NoError(t, err)
	_, _, err = d1.Create("px-dead-1", local.CreateRequest{})
	require.NoError(t, err)
	_, _, err = d1.Kill("px-dead-1")
	require.NoError(t, err)
	require.NoError(t, d1.Close())

	d2, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: state})
	require.NoError(t, err)
	defer d2.Close()
	got, ok := d2.Get("px-keep-1")
	require.True(t, ok)
	assert.Equal(t, local.StateRunning, got.State)
	assert.Equal(t, info.Port, got.Port, "an instance comes back on its port")
	assert.Equal(t, "v", got.Labels["k"])
	dead, ok := d2.Get("px-dead-1")
	require.True(t, ok)
	assert.Equal(t, local.StateStopped, dead.State, "a killed instance stays killed")

	tgt := target(t)
	resp, err := fetchVia(net.JoinHostPort(got.IP, strconv.Itoa(got.Port)), tgt.URL+"/after-restart")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestProvisionDelay(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{ProvisionDelay: 200 * time.Millisecond})
	require.NoError(t, err)
	defer d.Close()
	info, _, err := d.Create("px-slow-1", local.CreateRequest{})
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
	info, _, err := d.Create("px-old-1", local.CreateRequest{CreatedAt: &old})
	require.NoError(t, err)
	assert.True(t, info.CreatedAt.Equal(old))
}

// TestForwardProxyStaysOnLoopback: the local proxy refuses targets beyond loopback, so a
// local fleet cannot send traffic elsewhere by accident. The address is checked before any
// connection is attempted.
func TestForwardProxyStaysOnLoopback(t *testing.T) {
	srv := httptest.NewServer(&localproxy.ForwardProxy{})
	defer srv.Close()
	resp, err := fetchVia(srv.Listener.Addr().String(), "http://192.0.2.1/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, string(body), "loopback targets only")
}
