package peer

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// TestBehindPeerCatchesUp: an owner waits for a hung peer's copy once, half the peer
// timeout, and then not at all while the peer is behind, its changes still copied to the
// peer that answers; once the hung peer answers again, the next change catches it up with
// every lease the owner holds, the changes it missed included.
func TestBehindPeerCatchesUp(t *testing.T) {
	var hang atomic.Bool
	var mu sync.Mutex
	got := map[int]map[string]uint64{1: {}, 2: {}}
	peer := func(i int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err == nil && i == 2 && hang.Load() {
				<-r.Context().Done() // the body is read: a client that hangs up ends it
				return
			}
			var recs []discovery.LeaseRecord
			if err := json.Unmarshal(body, &recs); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			mu.Lock()
			for _, rec := range recs {
				got[i][rec.ID] = max(got[i][rec.ID], rec.Version)
			}
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	has := func(i int, id string, version uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		return got[i][id] >= version
	}
	p1, p2 := peer(1), peer(2)
	store := discovery.NewStoreWith(discovery.StoreConfig{KeepEnded: time.Minute, Replica: 0})
	store.ReplaceAll([]discovery.Proxy{{Name: "p", Namespace: "crawl", IP: "10.0.0.1", Port: 3128, Healthy: true, Phase: "Ready", MaxLeases: 8}})
	const timeout = 400 * time.Millisecond
	s := New(discovery.ReplicaConfig{Peers: []string{"http://127.0.0.1:1", p1.URL, p2.URL}, Self: 0,
		Tokens: []string{"t"}, Timeout: timeout}, store, slog.New(slog.DiscardHandler), nil)
	// replicate copies a lease as the lease operations do (discovery.Server.replicateLease).
	replicate := func(id string) error {
		rec, ok := store.Record(id)
		require.True(t, ok)
		return s.Replicate(rec)
	}
	grant := func() string {
		l, err := store.Grant("crawl/p", discovery.Want{TTL: time.Minute})
		require.NoError(t, err)
		return l.ID
	}

	hang.Store(true)
	first := grant()
	start := time.Now()
	require.NoError(t, replicate(first), "replica 1 took the copy")
	require.GreaterOrEqual(t, time.Since(start), timeout/2, "the owner waited for the hung replica's copy")
	require.Less(t, time.Since(start), timeout, "but not for the whole peer timeout")
	second := grant()
	start = time.Now()
	require.NoError(t, replicate(second))
	require.Less(t, time.Since(start), timeout/4, "a replica behind is not waited for")
	require.True(t, has(1, first, 1) && has(1, second, 1))
	require.False(t, has(2, second, 1), "the hung replica took nothing")

	hang.Store(false)
	var renewed *discovery.Lease
	require.Eventually(t, func() bool {
		// Every change tries the replica behind again, at most once a timeout.
		var err error
		renewed, err = store.Renew("", first, time.Minute)
		require.NoError(t, err)
		require.NoError(t, replicate(first))
		return has(2, second, 1)
	}, 10*time.Second, 20*time.Millisecond, "the replica that answers again is caught up")
	rec, ok := store.Record(renewed.ID)
	require.True(t, ok)
	require.Eventually(t, func() bool { return has(2, first, rec.Version) }, 5*time.Second, 10*time.Millisecond,
		"and takes the owner's changes again")
}
