// Package servicetest runs discovery replica sets in a test process, built by
// service.NewReplica as the process builds them, each serving the HTTP API on its own
// loopback port. Discovery's tests and its gateway's share it, so a replica in every test
// is wired as deployed, and killing, restarting or hanging one works the same everywhere.
package servicetest

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// PeerToken authenticates the replicas of a set to each other.
const PeerToken = "peer-token"

// Options shape the replicas of a set.
type Options struct {
	// Config is every replica's API configuration (its Token is the one Client uses);
	// Configure, when set, changes it before each replica starts.
	Config    discovery.Config
	Configure func(*discovery.Config)
	// KeepEnded is how long a replica's store keeps ended leases (default 30m).
	KeepEnded time.Duration
	// Signaler takes the reports (default: one that drops them).
	Signaler discovery.Signaler
}

// ReplicaSet is n replicas over the same fleet. A replica can be killed (its listener and
// connections closed, its memory dropped) and started afresh on the same address, as a
// pod restarts, or made to hang.
type ReplicaSet struct {
	t     testing.TB
	opts  Options
	Addrs []string
	URLs  []string
	Fleet []discovery.Proxy
	// Nodes are the running replicas; a killed one is nil until started again.
	Nodes []*Replica
}

// Replica is one running replica.
type Replica struct {
	Store *discovery.Store
	API   *service.API
	// Logs holds what the replica logged.
	Logs   *testenv.LogBuffer
	hs     *http.Server
	cancel context.CancelFunc
}

// NewReplicaSet starts n replicas over fleet and waits until each is ready; the test's
// cleanup kills them.
func NewReplicaSet(t testing.TB, n int, fleet []discovery.Proxy, opts Options) *ReplicaSet {
	t.Helper()
	if opts.KeepEnded <= 0 {
		opts.KeepEnded = 30 * time.Minute
	}
	if opts.Signaler == nil {
		opts.Signaler = dropReports{}
	}
	rs := &ReplicaSet{t: t, opts: opts, Fleet: fleet, Nodes: make([]*Replica, n)}
	for range n {
		addr := testenv.FreeAddr(t)
		rs.Addrs = append(rs.Addrs, addr)
		rs.URLs = append(rs.URLs, "http://"+addr)
	}
	t.Cleanup(func() {
		for i := range rs.Nodes {
			rs.Kill(i)
		}
	})
	for i := range n {
		rs.Start(i)
	}
	for i := range n {
		rs.WaitReady(i)
	}
	return rs
}

// Start starts replica i with the fleet loaded.
func (rs *ReplicaSet) Start(i int) {
	rs.t.Helper()
	rs.StartWith(i, true)
}

// StartWith starts replica i; unless loaded, its index stays empty and unloaded (Temporal
// not reached yet) until the test loads it.
func (rs *ReplicaSet) StartWith(i int, loaded bool) {
	t := rs.t
	t.Helper()
	store := discovery.NewStoreWith(discovery.StoreConfig{KeepEnded: rs.opts.KeepEnded, Replica: byte(i)})
	if loaded {
		store.ReplaceAll(rs.Fleet)
	}
	cfg := rs.opts.Config
	if rs.opts.Configure != nil {
		rs.opts.Configure(&cfg)
	}
	rc := discovery.ReplicaConfig{Peers: slices.Clone(rs.URLs), Self: i, Tokens: []string{PeerToken},
		Timeout: time.Second, RestoreLimit: time.Hour}
	logs := &testenv.LogBuffer{}
	api := service.NewReplica(cfg, rc, store, rs.opts.Signaler, slog.New(slog.NewTextHandler(logs, nil)), nil)
	ln, err := net.Listen("tcp", rs.Addrs[i])
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	hs := &http.Server{Handler: api.Handler()}
	go func() { _ = hs.Serve(ln) }()
	go api.RunReplicas(ctx)
	rs.Nodes[i] = &Replica{Store: store, API: api, Logs: logs, hs: hs, cancel: cancel}
}

// Kill stops replica i at once, as kill -9 does: no request is finished, nothing handed
// over.
func (rs *ReplicaSet) Kill(i int) {
	if n := rs.Nodes[i]; n != nil {
		n.cancel()
		_ = n.hs.Close()
		rs.Nodes[i] = nil
	}
}

// WaitReady waits until replica i's /readyz answers 200.
func (rs *ReplicaSet) WaitReady(i int) {
	rs.t.Helper()
	require.Eventually(rs.t, func() bool {
		resp, err := http.Get(rs.URLs[i] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 10*time.Millisecond, "replica %d ready", i)
}

// Client is a crawler's client of replica i, with the set's token.
func (rs *ReplicaSet) Client(i int) *dclient.Client {
	return dclient.New(rs.URLs[i], rs.opts.Config.Token)
}

// BlackHole takes replica i's address over with a listener that accepts connections and
// never answers: a replica that hangs (a stuck process, a network that drops its
// packets), not one that refuses at once.
func (rs *ReplicaSet) BlackHole(i int) {
	rs.t.Helper()
	rs.Kill(i)
	ln, err := net.Listen("tcp", rs.Addrs[i])
	require.NoError(rs.t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	rs.t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
}

// dropReports is a Signaler that takes every report and does nothing.
type dropReports struct{}

func (dropReports) Report(context.Context, string, string, contract.ReportSignal) error { return nil }
