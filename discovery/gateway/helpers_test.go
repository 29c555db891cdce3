package gateway_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// testToken is the API's token in the tests that run the gateway beside the API.
const testToken = "s3cret-token"

// fakeSignaler stands in for Temporal.
type fakeSignaler struct {
	report func(ctx context.Context, namespace, name string, sig contract.ReportSignal) error
}

var _ discovery.Signaler = (*fakeSignaler)(nil)

func (f *fakeSignaler) Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error {
	if f.report == nil {
		return nil
	}
	return f.report(ctx, namespace, name, sig)
}

// forwarded is one report the Signaler was given.
type forwarded struct {
	namespace, name string
	sig             contract.ReportSignal
}

// replicaSet runs discovery replicas in this process, each serving the API on its own
// loopback port over the same fleet, for the gateway's tests in a replica set (discovery's
// own replica tests have the fuller harness, with kills and restarts).
type replicaSet struct {
	t     *testing.T
	addrs []string
	urls  []string
	nodes []*replicaNode
}

type replicaNode struct {
	store  *discovery.Store
	srv    *service.API
	hs     *http.Server
	cancel context.CancelFunc
}

func newReplicaSet(t *testing.T, n int, fleet []discovery.Proxy) *replicaSet {
	t.Helper()
	rs := &replicaSet{t: t}
	for range n {
		addr := testenv.FreeAddr(t)
		rs.addrs = append(rs.addrs, addr)
		rs.urls = append(rs.urls, "http://"+addr)
	}
	for i := range n {
		store := discovery.NewStoreWith(discovery.StoreConfig{KeepEnded: 30 * time.Minute, Replica: byte(i)})
		store.ReplaceAll(fleet)
		cfg := discovery.Config{Token: testToken, DefaultTTL: 5 * time.Minute, MaxTTL: time.Hour,
			CooldownRateLimited: 5 * time.Minute, CooldownBanned: 30 * time.Minute}
		rc := discovery.ReplicaConfig{Peers: slices.Clone(rs.urls), Self: i, Tokens: []string{"peer-token"},
			Timeout: time.Second, RestoreLimit: time.Hour}
		srv := service.NewReplica(cfg, rc, store, &fakeSignaler{}, slog.New(slog.DiscardHandler), nil)
		ln, err := net.Listen("tcp", rs.addrs[i])
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		hs := &http.Server{Handler: srv.Handler()}
		go func() { _ = hs.Serve(ln) }()
		go srv.RunReplicas(ctx)
		rs.nodes = append(rs.nodes, &replicaNode{store: store, srv: srv, hs: hs, cancel: cancel})
	}
	t.Cleanup(func() {
		for i := range rs.nodes {
			rs.kill(i)
		}
	})
	for i := range n {
		require.Eventually(t, func() bool {
			resp, err := http.Get(rs.urls[i] + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, 20*time.Second, 10*time.Millisecond, "replica %d ready", i)
	}
	return rs
}

// kill stops replica i at once, as kill -9 does: no request is finished, nothing handed
// over.
func (rs *replicaSet) kill(i int) {
	if n := rs.nodes[i]; n != nil {
		n.cancel()
		_ = n.hs.Close()
		rs.nodes[i] = nil
	}
}

func (rs *replicaSet) client(i int) *dclient.Client { return dclient.New(rs.urls[i], testToken) }
