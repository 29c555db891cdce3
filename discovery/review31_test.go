package discovery_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// TestReview31NewServerHonoursReplicas: before the split, discovery.NewServer built the
// replica set its Config.Replicas describes (a826caa: NewServer called newReplicas), so a
// server of a three-replica set granted nothing until it had restored its leases from its
// peers, and a proxy another replica owns was granted by that owner only. The split keeps
// NewServer's signature and Config.Replicas, but NewServer now ignores Replicas (only
// service.NewAPI builds the set, into Config.Peers): the same call yields a server that
// grants every proxy locally, unrestored, as if it ran alone. Expected: NewServer refuses
// such a config (a panic naming service.NewAPI) rather than run alone.
func TestReview31NewServerHonoursReplicas(t *testing.T) {
	store := discovery.NewStoreWith(discovery.StoreConfig{KeepEnded: keepExpired, Replica: 0})
	p := proxy("p0", 10, true, map[string]string{"region": "eu"})
	p.MaxLeases = 1
	store.ReplaceAll([]discovery.Proxy{p})
	cfg := defaultConfig()
	cfg.Replicas = discovery.ReplicaConfig{Peers: []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"},
		Self: 0, Tokens: []string{peerToken}, Timeout: 200 * time.Millisecond, RestoreLimit: time.Hour}
	assert.PanicsWithValue(t, "discovery: Config.Replicas names peers but Config.Peers is nil; build the server with service.NewAPI", func() {
		discovery.NewServer(cfg, store, nil, slog.New(slog.DiscardHandler), nil)
	}, "a replica built without its peers would grant every proxy as if it ran alone")
}
