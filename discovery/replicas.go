package discovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// ReplicaConfig places a discovery process among its replicas. They share one lease
// table: each proxy is owned by one replica, chosen by hashing, which alone grants
// leases on it, so its maxLeases is counted in one place; every change to a lease is
// copied to the other replicas before the crawler is answered, so a replica that restarts
// (a rollout, a kill -9) takes its leases back from them before it serves them again.
type ReplicaConfig struct {
	// Peers are the base URLs of every replica, this one included, by replica number (a
	// StatefulSet's pod ordinals). One or none: discovery runs alone, and its leases live
	// only in its memory.
	Peers []string
	// Self is this replica's number, its index in Peers.
	Self int
	// Tokens authenticate replicas to each other: the first is sent, any is accepted
	// (proxyauth.Keyring.PeerTokens).
	Tokens []string
	// RestoreLimit bounds how long a starting replica waits for every peer's copy of its
	// leases (default: the longest TTL). By then each lease it granted before it stopped
	// has expired unless renewed since, so starting without them oversubscribes nothing.
	RestoreLimit time.Duration
	// Timeout bounds each call to a peer (default 2s). An owner waits at most half of it
	// for its peers' copies of a change, so that it answers a replica that forwarded the
	// request before that replica gives up.
	Timeout time.Duration
}

// Validate checks the configuration (cmd/discovery's flags).
func (c ReplicaConfig) Validate() error {
	if len(c.Peers) <= 1 {
		return nil
	}
	if len(c.Peers) > 256 {
		return fmt.Errorf("--peers: at most 256 replicas, got %d", len(c.Peers))
	}
	if c.Self < 0 || c.Self >= len(c.Peers) {
		return fmt.Errorf("--replica %d is not a replica number of --peers (0 to %d)", c.Self, len(c.Peers)-1)
	}
	for i, p := range c.Peers {
		if !strings.HasPrefix(p, "http://") && !strings.HasPrefix(p, "https://") {
			return fmt.Errorf("--peers: replica %d's address %q is not an http:// or https:// URL", i, p)
		}
	}
	if len(c.Tokens) == 0 {
		return errors.New("replicas need the fleet key to authenticate each other")
	}
	return nil
}

// Internal paths between replicas, outside /v1: crawlers' tokens do not open them.
const (
	peerLeasesPath = "/peer/v1/leases"
	peerGrantPath  = "/peer/v1/grant"
	// peerReleasePath ends a lease granted for a crawler that left before it got it.
	peerReleasePath = "/peer/v1/release"
	// forwardedHeader marks a crawler's request one replica forwarded to the lease's
	// owner, which must answer it itself.
	forwardedHeader = "Proxyfleet-Forwarded-By"
	// peerTokenHeader proves a forwarded crawler's request comes from a replica (its
	// Authorization is the crawler's): the request was rate limited where it arrived.
	peerTokenHeader = "Proxyfleet-Peer-Token"
)

// replicas is this process's side of the replica set.
type replicas struct {
	cfg   ReplicaConfig
	store *Store
	log   *slog.Logger
	hc    *http.Client
	// restored is set once this replica holds every lease it owns (see restore).
	restored atomic.Bool
	mu       sync.Mutex
	// downUntil marks peers that just failed a call: their proxies are passed over
	// until then instead of costing each acquire a timeout.
	downUntil map[int]time.Time
	// links batch the lease changes bound for each peer (nil for this replica).
	links   []*peerLink
	metrics *serverMetrics
}

func newReplicas(cfg ReplicaConfig, store *Store, log *slog.Logger, m *serverMetrics) *replicas {
	if len(cfg.Peers) <= 1 {
		return nil
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	peers := make([]string, len(cfg.Peers))
	for i, p := range cfg.Peers {
		peers[i] = strings.TrimSuffix(p, "/")
	}
	cfg.Peers = peers
	// Every grant and renewal calls the peers, many at once under load: keep enough idle
	// connections per peer that they are reused rather than reopened (the default keeps 2).
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	r := &replicas{cfg: cfg, store: store, log: log, hc: &http.Client{Timeout: cfg.Timeout, Transport: tr},
		downUntil: map[int]time.Time{}, metrics: m, links: make([]*peerLink, len(cfg.Peers))}
	for i := range r.links {
		if i != cfg.Self {
			r.links[i] = &peerLink{peer: i}
		}
	}
	return r
}

// ownerOf is the replica that owns a proxy: the highest hash of the proxy's ID with each
// replica's number (rendezvous hashing). Every replica computes the same owner, and adding
// a replica moves only the proxies it now wins.
func (r *replicas) ownerOf(proxyID string) int { return OwnerOf(proxyID, len(r.cfg.Peers)) }

// OwnerOf is the replica of a set of n that owns the proxy proxyID (see replicas.ownerOf):
// the one that alone grants leases on it.
func OwnerOf(proxyID string, n int) int {
	best, owner := uint64(0), 0
	var num [4]byte
	for i := range n {
		h := sha256.New()
		h.Write([]byte(proxyID))
		binary.BigEndian.PutUint32(num[:], uint32(i))
		h.Write(num[:])
		if v := binary.BigEndian.Uint64(h.Sum(nil)[:8]); i == 0 || v > best {
			best, owner = v, i
		}
	}
	return owner
}

func (r *replicas) markDown(peer int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downUntil[peer] = time.Now().Add(d)
}

// canGrant reports whether replica can grant leases now: this one once ready (see
// ready), a peer unless it just failed.
func (r *replicas) canGrant(replica int) bool {
	if replica == r.cfg.Self {
		return r.ready() == nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Now().After(r.downUntil[replica])
}

// --- calls to peers ----------------------------------------------------------------

// call sends a request to a peer with the replicas' token. A nil body sends none.
//
// A call made on a crawler's behalf (a grant, or a renewal, release or report forwarded
// to the lease's owner) runs on a context detached from the crawler's request
// (context.WithoutCancel), bounded by the peer timeout alone: a crawler that hangs up
// must not be taken for a peer that failed, which marks the peer down and passes over
// its proxies for everyone, and a change the owner made meanwhile is answered rather than
// left behind (see handOver).
func (r *replicas) call(ctx context.Context, peer int, method, path string, body []byte, header http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.cfg.Peers[peer]+path, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.Tokens[0])
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(forwardedHeader, strconv.Itoa(r.cfg.Self))
	req.Header.Set(peerTokenHeader, r.cfg.Tokens[0])
	return r.hc.Do(req)
}

// replicate copies lease changes to every peer and succeeds if at least one took them: a
// replica that restarts takes its leases back from all its peers, so one copy outlives
// the owner's memory. It waits for every peer that is keeping up rather than the first,
// so that each of them holds every change, and losing a second replica loses only what
// the first could not copy to the third. It waits half the peer timeout at most: a peer
// that has not taken the copy by then (hung, or slow) is behind, and is waited for no
// more until it has taken every lease this replica owns again (see catchUp). A hung
// peer so costs one wait, not one for every change while it hangs, and an owner answers a
// forwarded grant or renewal before the replica that forwarded it gives up on it.
func (r *replicas) replicate(rec LeaseRecord) error {
	type waiting struct {
		l   *peerLink
		ack <-chan error
	}
	var acks []waiting
	var errs []error
	for _, l := range r.links {
		if l == nil {
			continue
		}
		if ack := r.send(l, rec); ack != nil {
			acks = append(acks, waiting{l, ack})
		} else {
			errs = append(errs, fmt.Errorf("replica %d is behind", l.peer))
		}
	}
	deadline := time.NewTimer(r.cfg.Timeout / 2)
	defer deadline.Stop()
	took, late := 0, false
	for _, w := range acks {
		var err error
		if late {
			select {
			case err = <-w.ack:
			default:
				err = errLate
			}
		} else {
			select {
			case err = <-w.ack:
			case <-deadline.C:
				late, err = true, errLate
			}
		}
		switch {
		case err == errLate:
			r.fallBehind(w.l)
			errs = append(errs, fmt.Errorf("replica %d did not take the copy within %s", w.l.peer, r.cfg.Timeout/2))
		case err != nil:
			errs = append(errs, err)
		default:
			took++
		}
	}
	if took == 0 {
		return fmt.Errorf("no replica took the lease's copy: %w", errors.Join(errs...))
	}
	return nil
}

// peerLink batches the changes bound for one peer: one request in flight at a time, and
// whatever arrives meanwhile goes in the next. Under load a peer gets a few large
// requests instead of one per change, which costs the replicas most of their CPU.
type peerLink struct {
	peer    int
	mu      sync.Mutex
	pending []queued
	sending bool
	// behind is set while the peer may lack some of this replica's changes: a request to
	// it failed, or it took longer than replicate waits. Changes are not queued for it
	// then; the link sends it every lease this replica owns instead, at most once a
	// timeout, until it takes them (catchUp). tried is when it last tried.
	behind bool
	tried  time.Time
}

// queued is one change waiting for its peer, and where its outcome goes.
type queued struct {
	rec LeaseRecord
	ack chan error
}

// maxBatch caps the records in one request to a peer (about 150 KiB).
const maxBatch = 512

// send queues rec for the peer and returns where the outcome of its request arrives, or
// nil when the peer is behind: then it starts catching the peer up, if it is time to try
// again.
func (r *replicas) send(l *peerLink, rec LeaseRecord) <-chan error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.behind {
		if !l.sending && time.Since(l.tried) >= r.cfg.Timeout {
			l.sending = true
			go r.drain(l)
		}
		return nil
	}
	ack := make(chan error, 1)
	l.pending = append(l.pending, queued{rec, ack})
	if !l.sending {
		l.sending = true
		go r.drain(l)
	}
	return ack
}

// errLate stands for a copy a peer did not take in time (see replicate).
var errLate = errors.New("the replica did not take the copy in time")

// errBehind answers the changes queued for a peer when it fell behind: the catch-up
// carries them.
var errBehind = errors.New("the replica fell behind")

// fallBehind marks the peer behind (see peerLink.behind): the changes queued for it are
// answered as not taken, and new ones are not queued.
func (r *replicas) fallBehind(l *peerLink) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.behind {
		return
	}
	l.behind = true
	for _, q := range l.pending {
		q.ack <- errBehind
	}
	l.pending = nil
	r.log.Warn("a replica fell behind: not waiting for its copies until it takes every lease this one owns", "replica", l.peer)
}

// drain sends the peer's queued changes until none are left, then stops: an idle link
// holds no goroutine. A peer that is behind is caught up first; if that fails, the link
// stops until a change after the next timeout tries again.
func (r *replicas) drain(l *peerLink) {
	for {
		l.mu.Lock()
		if l.behind {
			l.mu.Unlock()
			if !r.catchUp(l) {
				l.mu.Lock()
				l.tried, l.sending = time.Now(), false
				l.mu.Unlock()
				return
			}
			continue
		}
		if len(l.pending) == 0 {
			l.sending = false
			l.mu.Unlock()
			return
		}
		n := min(len(l.pending), maxBatch)
		batch := l.pending[:n:n]
		l.pending = l.pending[n:]
		l.mu.Unlock()
		recs := make([]LeaseRecord, n)
		for i, q := range batch {
			recs[i] = q.rec
		}
		err := r.post(l.peer, recs)
		if err != nil {
			r.fallBehind(l)
		}
		for _, q := range batch {
			q.ack <- err
		}
	}
}

// catchUp brings a peer that is behind up to date, and reports whether it did: once the
// peer answers, its changes are queued again, and it is sent every lease this replica
// owns as of then (copies keep the highest version, so the ones it had already change
// nothing). Each change is thus in that copy or queued after it.
func (r *replicas) catchUp(l *peerLink) bool {
	if err := r.post(l.peer, []LeaseRecord{}); err != nil {
		return false
	}
	l.mu.Lock()
	l.behind = false
	l.mu.Unlock()
	recs := r.store.owned()
	for len(recs) > 0 {
		n := min(len(recs), maxBatch)
		if err := r.post(l.peer, recs[:n]); err != nil {
			r.fallBehind(l)
			return false
		}
		recs = recs[n:]
	}
	r.log.Info("a replica caught up with this one's leases", "replica", l.peer)
	return true
}

// post sends records to a peer.
func (r *replicas) post(peer int, recs []LeaseRecord) error {
	body, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	resp, err := r.call(ctx, peer, http.MethodPost, peerLeasesPath, body, nil)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			err = fmt.Errorf("replica %d answered %s", peer, resp.Status)
		}
	}
	if err != nil {
		r.metrics.replicationFailures.Inc()
	}
	return err
}

// restore takes back the leases this replica owns from every peer before it grants,
// renews or ends any: until then it would count its proxies' slots as free while crawlers
// still hold them. It waits for all peers, since a change needs only one peer's copy to be
// answered; past RestoreLimit every lease it could have missed has expired, and it starts
// with what it has. A peer that is restoring too answers with what it holds: when every
// replica restarted at once nothing more is to be had, and waiting on each other would
// keep them all unready.
func (r *replicas) restore(ctx context.Context) {
	start := time.Now()
	got := map[int]bool{}
	for {
		for peer := range r.cfg.Peers {
			if peer == r.cfg.Self || got[peer] {
				continue
			}
			recs, err := r.snapshot(ctx, peer)
			if err != nil {
				r.log.Info("waiting for a replica to restore leases from", "replica", peer, "error", err)
				continue
			}
			r.store.Apply(recs)
			got[peer] = true
		}
		if len(got) == len(r.cfg.Peers)-1 {
			r.log.Info("leases restored from every replica", "replicas", len(r.cfg.Peers), "took", time.Since(start).Round(time.Millisecond).String())
			break
		}
		if time.Since(start) >= r.cfg.RestoreLimit {
			r.log.Warn("serving without every replica's copy of this replica's leases: each lease granted before it stopped has expired by now",
				"reached", len(got), "replicas", len(r.cfg.Peers))
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	r.restored.Store(true)
}

func (r *replicas) snapshot(ctx context.Context, peer int) ([]LeaseRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*r.cfg.Timeout)
	defer cancel()
	resp, err := r.call(ctx, peer, http.MethodGet, peerLeasesPath+"?owner="+strconv.Itoa(r.cfg.Self), nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("replica %d answered %s", peer, resp.Status)
	}
	var recs []LeaseRecord
	if err := json.NewDecoder(resp.Body).Decode(&recs); err != nil {
		return nil, fmt.Errorf("replica %d: %w", peer, err)
	}
	return recs, nil
}

// grantRequest asks the owner of a proxy to grant a lease on it.
type grantRequest struct {
	ProxyID    string   `json:"proxyID"`
	Selector   Selector `json:"selector"`
	Target     string   `json:"target,omitempty"`
	Session    string   `json:"session,omitempty"`
	TTLSeconds int      `json:"ttlSeconds"`
	// Client and MaxLeases are the asking crawler's identity and its cap.
	Client    string `json:"client,omitempty"`
	MaxLeases int    `json:"maxLeases,omitempty"`
}

// relay answers the crawler with a peer's answer as it is.
func relay(c *gin.Context, resp *http.Response) {
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Retry-After", "WWW-Authenticate"} {
		if v := resp.Header.Get(h); v != "" {
			c.Header(h, v)
		}
	}
	c.Status(resp.StatusCode)
	_, _ = io.Copy(c.Writer, resp.Body)
	c.Abort()
}

// --- the server's side ---------------------------------------------------------------

// Unavailable is the answer when the replica that must answer cannot now.
func Unavailable(format string, args ...any) *APIError {
	e := Errorf(codes.ReplicasUnavailable, format, args...)
	e.RetryAfterSeconds = 1
	return e
}

// acquireReplicated grants a lease in a replica set: this replica picks as it would
// alone, over every lease it knows of, and the proxy's owner grants. An owner that refuses
// (the proxy filled up or started resting since this replica heard) or cannot answer has
// that proxy, or all of its proxies, passed over on the next pick.
// Proxies that except names (when not nil) are passed over too.
func (s *Server) acquireReplicated(ctx context.Context, w Want, d time.Duration, except func(string) bool) (*LeaseResponse, error) {
	r := s.replicas
	refused := map[string]bool{}
	var lastErr error
	skip := func(id string) bool {
		if refused[id] || (except != nil && except(id)) {
			return true
		}
		if owner := r.ownerOf(id); !r.canGrant(owner) {
			// Not a 409: this proxy may well be free, its owner will answer soon.
			lastErr = Unavailable("replica %d, which owns proxies that could take the lease, cannot grant now", owner)
			return true
		}
		return false
	}
	for range maxPicks {
		if ctx.Err() != nil {
			return nil, errCrawlerLeft()
		}
		id, err := s.store.pick(w, skip)
		if nm, ok := errors.AsType[*NoMatch](err); ok && lastErr == nil {
			return nil, refusedAsFull(nm, len(refused))
		}
		if err != nil {
			if lastErr != nil {
				return nil, lastErr
			}
			return nil, err
		}
		owner := r.ownerOf(id)
		if owner == r.cfg.Self {
			l, err := s.grantOwned(id, w)
			if errors.Is(err, ErrProxyUnavailable) {
				refused[id] = true
				continue
			}
			if err != nil {
				return nil, err
			}
			resp := leaseResponse(l, d)
			return s.handOver(ctx, owner, w.Client, &resp)
		}
		body, _ := json.Marshal(grantRequest{ProxyID: id, Selector: w.Selector, Target: w.Target, Session: w.Session,
			TTLSeconds: int(d / time.Second), Client: w.Client, MaxLeases: w.MaxLeases})
		resp, err := r.call(context.WithoutCancel(ctx), owner, http.MethodPost, peerGrantPath, body, nil)
		if err != nil {
			r.markDown(owner, 2*time.Second)
			lastErr = Unavailable("replica %d, which owns the proxy picked, did not answer", owner)
			continue
		}
		switch resp.StatusCode {
		case http.StatusConflict:
			refused[id] = true
			resp.Body.Close()
			continue
		case http.StatusServiceUnavailable:
			r.markDown(owner, time.Second)
			lastErr = Unavailable("replica %d, which owns the proxy picked, cannot grant now", owner)
			resp.Body.Close()
			continue
		}
		var granted LeaseResponse
		if err := peerAnswer(resp, http.StatusCreated, &granted); err != nil {
			return nil, err
		}
		return s.handOver(ctx, owner, w.Client, &granted)
	}
	if lastErr == nil {
		// Every pick lost the race for its proxy's last slot to other crawlers: the
		// fleet is as full as this replica can tell, which a 409 says.
		return nil, refusedAsFull(s.store.explain(w), len(refused))
	}
	return nil, lastErr
}

// errCrawlerLeft answers a crawler that hung up before its lease was granted: nobody
// reads it.
func errCrawlerLeft() error { return Unavailable("the crawler left before its lease was granted") }

// handOver hands a lease just granted to the crawler that asked, or, if it has left
// meanwhile, ends it on its owner: nobody would hold it, and it would take its slot for
// its whole TTL.
func (s *Server) handOver(ctx context.Context, owner int, client string, l *LeaseResponse) (*LeaseResponse, error) {
	if ctx.Err() == nil {
		return l, nil
	}
	r := s.replicas
	if owner == r.cfg.Self {
		s.releaseOwned(client, l.LeaseID)
		return nil, errCrawlerLeft()
	}
	body, _ := json.Marshal(peerRelease{LeaseID: l.LeaseID, Client: client})
	resp, err := r.call(context.WithoutCancel(ctx), owner, http.MethodPost, peerReleasePath, body, nil)
	if err == nil {
		err = peerAnswer(resp, http.StatusNoContent, nil)
	}
	if err != nil {
		s.log.Info("a lease granted for a crawler that left was not ended: it frees up when it expires", "lease", l.LeaseID, "error", err)
	}
	return nil, errCrawlerLeft()
}

// peerRelease asks a lease's owner to end it for the replica that asked for the grant.
type peerRelease struct {
	LeaseID string `json:"leaseID"`
	Client  string `json:"client,omitempty"`
}

// peerAnswer reads another replica's answer: into v (when not nil) if it has the status
// want, else as the *APIError it carries, which the caller answers with as it is.
func peerAnswer(resp *http.Response, want int, v any) error {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Unavailable("another replica's answer was cut off: %v", err)
	}
	if resp.StatusCode == want {
		if v == nil {
			return nil
		}
		if err := json.Unmarshal(body, v); err != nil {
			return Unavailable("another replica answered what this one cannot read: %v", err)
		}
		return nil
	}
	var ae APIError
	if err := json.Unmarshal(body, &ae); err != nil || ae.Code == "" {
		return Unavailable("another replica answered %d", resp.StatusCode)
	}
	return &ae
}

// refusedAsFull corrects a NoMatch for the proxies whose owners refused the lease: this
// replica's copy of their leases lagged, and counted them as free (which NoMatch reports
// as resting), when they had just filled up. They will free up soon, so the crawler is
// told to retry within a second at most.
func refusedAsFull(nm *NoMatch, refused int) *NoMatch {
	moved := min(refused, nm.InCooldown)
	nm.InCooldown -= moved
	nm.AtCapacity += moved
	if refused > 0 && (nm.RetryAfter == 0 || nm.RetryAfter > time.Second) {
		nm.RetryAfter = time.Second
	}
	return nm
}

// maxPicks bounds the proxies one acquire tries in a replica set: each refusal is one
// round trip to an owner, and a crawler is better served by a quick answer.
const maxPicks = 6

// grantOwned grants a lease on a proxy this replica owns and copies it to a peer before
// it is handed out: a lease no other replica knows of would be forgotten by a kill -9.
func (s *Server) grantOwned(proxyID string, w Want) (*Lease, error) {
	if err := s.replicas.ready(); err != nil {
		return nil, err
	}
	l, err := s.store.Grant(proxyID, w)
	if err != nil {
		return nil, err
	}
	if err := s.replicateLease(l.ID); err != nil {
		s.store.Release(w.Client, l.ID)
		return nil, err
	}
	return l, nil
}

// ready says whether this replica can act on the leases it owns: once it holds them all
// again and its index is loaded. Before the index is, a renewal would find the lease's
// proxy missing and end the lease as if the proxy had left the fleet.
func (r *replicas) ready() error {
	switch {
	case !r.restored.Load():
		return Unavailable("this replica is restoring its leases from the others")
	case !r.store.Loaded():
		return Unavailable("this replica is still loading its proxy index from Temporal")
	}
	return nil
}

// replicateLease copies a lease's current state to the peers (a no-op alone).
func (s *Server) replicateLease(id string) error {
	if s.replicas == nil {
		return nil
	}
	rec, ok := s.store.Record(id)
	if !ok {
		return nil
	}
	if err := s.replicas.replicate(rec); err != nil {
		s.log.Warn("lease change not copied to any replica", "error", err)
		return Unavailable("no other replica could take a copy of the lease; retry")
	}
	return nil
}

// ownLease routes a request on a lease: it returns true when this replica answers it,
// having forwarded it to the lease's owner and relayed the answer otherwise.
func (s *Server) ownLease(c *gin.Context) bool {
	r := s.replicas
	if r == nil {
		return true
	}
	owner, ok := LeaseOwner(c.Param("id"))
	if !ok || owner >= len(r.cfg.Peers) {
		return true // not a lease ID of this set: answered as unknown
	}
	if owner == r.cfg.Self {
		if err := s.replicas.ready(); err != nil {
			s.fail(c, err)
			return false
		}
		return true
	}
	if c.GetHeader(forwardedHeader) != "" {
		s.fail(c, Unavailable("replica %s forwarded lease %q here, but replica %d owns it: the replicas' --peers differ", c.GetHeader(forwardedHeader), c.Param("id"), owner))
		return false
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		s.fail(c, Errorf(codes.TooLarge, "request body exceeds %d bytes", s.cfg.BodyLimit))
		return false
	}
	if len(body) == 0 {
		body = nil
	}
	resp, err := r.call(context.WithoutCancel(c.Request.Context()), owner, c.Request.Method, c.Request.URL.RequestURI(), body,
		http.Header{"Authorization": c.Request.Header.Values("Authorization")})
	if err != nil {
		r.markDown(owner, 2*time.Second)
		s.fail(c, Unavailable("replica %d, which owns lease %q, did not answer", owner, c.Param("id")))
		return false
	}
	s.metrics.forwarded.Inc()
	relay(c, resp)
	return false
}

// authenticatePeer admits only other replicas.
func (s *Server) authenticatePeer(c *gin.Context) {
	scheme, got, _ := strings.Cut(c.GetHeader("Authorization"), " ")
	if strings.EqualFold(scheme, "Bearer") && s.replicas.validToken(got) {
		c.Next()
		return
	}
	s.fail(c, Errorf(codes.Unauthorized, "only discovery's replicas may call this route"))
}

// fromPeer reports whether another replica forwarded the request.
func (s *Server) fromPeer(c *gin.Context) bool {
	return s.replicas.validToken(c.GetHeader(peerTokenHeader))
}

// validToken reports whether t is a replicas' token, compared in constant time.
func (r *replicas) validToken(t string) bool {
	if r == nil || t == "" {
		return false
	}
	for _, want := range r.cfg.Tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(want)) == 1 {
			return true
		}
	}
	return false
}

// peerApply takes lease changes from their owner.
func (s *Server) peerApply(c *gin.Context) {
	var recs []LeaseRecord
	if err := json.NewDecoder(c.Request.Body).Decode(&recs); err != nil {
		s.fail(c, Errorf(codes.Invalid, "lease records: %v", err))
		return
	}
	s.store.Apply(recs)
	if from, err := strconv.Atoi(c.GetHeader(forwardedHeader)); err == nil {
		// Only a restored owner sends its changes: it can grant again.
		s.replicas.markDown(from, 0)
	}
	c.Status(http.StatusNoContent)
}

// peerSnapshot serves a starting replica its leases.
func (s *Server) peerSnapshot(c *gin.Context) {
	owner, err := strconv.Atoi(c.Query("owner"))
	if err != nil {
		s.fail(c, Errorf(codes.Invalid, "owner must be a replica number"))
		return
	}
	c.JSON(http.StatusOK, s.store.Snapshot(owner))
}

// peerGrant grants a lease on a proxy this replica owns, for the replica a crawler asked.
func (s *Server) peerGrant(c *gin.Context) {
	var req grantRequest
	if err := DecodeJSON(c.Request.Body, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	d, err := ttl(req.TTLSeconds, s.cfg)
	if err != nil {
		s.fail(c, err)
		return
	}
	if s.replicas.ownerOf(req.ProxyID) != s.replicas.cfg.Self {
		s.fail(c, Errorf(codes.ProxyUnavailable, "this replica does not own proxy %q: the replicas' --peers differ", req.ProxyID))
		return
	}
	l, err := s.grantOwned(req.ProxyID, Want{Selector: req.Selector, Target: req.Target, Session: req.Session, TTL: d,
		Client: req.Client, MaxLeases: req.MaxLeases})
	if errors.Is(err, ErrProxyUnavailable) {
		s.fail(c, Errorf(codes.ProxyUnavailable, "proxy %q cannot take the lease now", req.ProxyID))
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	if c.Request.Context().Err() != nil {
		// The replica that asked gave up before the copies were taken (its timeout, or
		// it went away): nobody will hold this lease.
		s.releaseOwned(req.Client, l.ID)
		return
	}
	s.metrics.leaseRequests.WithLabelValues("granted").Inc()
	c.JSON(http.StatusCreated, leaseResponse(l, d))
}

// peerReleaseLease ends a lease this replica granted for another replica whose crawler
// left before it got it.
func (s *Server) peerReleaseLease(c *gin.Context) {
	var req peerRelease
	if err := DecodeJSON(c.Request.Body, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	if owner, ok := LeaseOwner(req.LeaseID); ok && owner == s.replicas.cfg.Self {
		if err := s.replicas.ready(); err != nil {
			s.fail(c, err)
			return
		}
		s.releaseOwned(req.Client, req.LeaseID)
	}
	c.Status(http.StatusNoContent)
}
