package peer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/peer"
)

// TestReview31RestoreWaitsByDefault: ReplicaConfig.RestoreLimit documents "default: the
// longest TTL". Before the split the default was applied where the replica set was built
// (a826caa NewServer: RestoreLimit = MaxTTL when unset), so every replica set waited for
// its peers' copies. peer.New, the exported constructor of the set now, applies the
// Timeout default but not this one (only service.NewAPI does): a Set built with
// RestoreLimit unset gives up on its peers after the first failed round and declares
// itself restored, serving without the leases it granted before it stopped (slots counted
// free that crawlers hold). Expected: with every peer unreachable, Restore is still
// waiting a second later, and the replica is not restored.
func TestReview31RestoreWaitsByDefault(t *testing.T) {
	store := discovery.NewStoreWith(discovery.StoreConfig{KeepEnded: time.Hour})
	store.ReplaceAll(nil)
	set := peer.New(discovery.ReplicaConfig{Peers: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, Self: 0,
		Tokens: []string{"peer-token"}, Timeout: 100 * time.Millisecond}, store, slog.New(slog.DiscardHandler), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { set.Restore(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	assert.Never(t, set.Restored, time.Second, 20*time.Millisecond, "restored without any peer's copy of its leases")
	assert.Error(t, set.Ready(), "ready without any peer's copy of its leases")
}
