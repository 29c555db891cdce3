package peer

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// Internal paths between replicas, outside /v1: crawlers' tokens do not open them.
const (
	peerLeasesPath = "/peer/v1/leases"
	peerGrantPath  = "/peer/v1/grant"
	// peerReleasePath ends a lease granted for a crawler that left before it got it.
	peerReleasePath = "/peer/v1/release"
	// PeerDemandPath answers a replica's own part of a selector's demand.
	PeerDemandPath = "/peer/v1/demand"
	// ForwardedHeader marks a request of one replica to another, with the number of the
	// replica that sent it: a crawler's request forwarded to the lease's owner, which must
	// answer it itself, or a copy of lease changes.
	ForwardedHeader = "Proxyfleet-Forwarded-By"
	// peerTokenHeader proves a forwarded crawler's request comes from a replica (its
	// Authorization is the crawler's): the request was rate limited where it arrived.
	peerTokenHeader = "Proxyfleet-Peer-Token"
)

// Set is this process's side of the replica set: it implements discovery.Peers, copies
// this replica's lease changes to the others and catches up those that fall behind, and
// restores the leases this replica owns when it starts. A nil *Set is discovery alone.
type Set struct {
	cfg   discovery.ReplicaConfig
	store *discovery.Store
	log   *slog.Logger
	hc    *http.Client
	// restored is set once this replica holds every lease it owns (see Restore).
	restored atomic.Bool
	mu       sync.Mutex
	// downUntil marks peers that just failed a call: their proxies are passed over
	// until then instead of costing each acquire a timeout.
	downUntil map[int]time.Time
	// links batch the lease changes bound for each peer (nil for this replica).
	links   []*peerLink
	metrics *metrics
}

// New builds this replica's side of the set cfg describes, over its store; nil when
// discovery runs alone (one peer or none). Its metrics go to reg (when not nil) either way,
// so that a dashboard sees them at zero.
func New(cfg discovery.ReplicaConfig, store *discovery.Store, log *slog.Logger, reg prometheus.Registerer) *Set {
	m := newMetrics(reg)
	if len(cfg.Peers) <= 1 {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.RestoreLimit <= 0 {
		// The longest TTL a lease can have by default: by then every lease granted before
		// this replica stopped has expired unless renewed. Giving up sooner would serve
		// without leases crawlers still hold. (service.NewAPI passes the configured one.)
		cfg.RestoreLimit = discovery.DefaultMaxTTL
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
	r := &Set{cfg: cfg, store: store, log: log, hc: &http.Client{Timeout: cfg.Timeout, Transport: tr},
		downUntil: map[int]time.Time{}, metrics: m, links: make([]*peerLink, len(cfg.Peers))}
	for i := range r.links {
		if i != cfg.Self {
			r.links[i] = &peerLink{peer: i}
		}
	}
	return r
}

func (r *Set) markDown(peer int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downUntil[peer] = time.Now().Add(d)
}

// CanGrant reports whether replica can grant leases now: this one once ready (see
// Ready), a peer unless it just failed.
func (r *Set) CanGrant(replica int) bool {
	if replica == r.cfg.Self {
		return r.Ready() == nil
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
func (r *Set) call(ctx context.Context, peer int, method, path string, body []byte, header http.Header) (*http.Response, error) {
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
	req.Header.Set(ForwardedHeader, strconv.Itoa(r.cfg.Self))
	req.Header.Set(peerTokenHeader, r.cfg.Tokens[0])
	return r.hc.Do(req)
}

// Replicate copies lease changes to every peer and succeeds if at least one took them: a
// replica that restarts takes its leases back from all its peers, so one copy outlives
// the owner's memory. It waits for every peer that is keeping up rather than the first,
// so that each of them holds every change, and losing a second replica loses only what
// the first could not copy to the third. It waits half the peer timeout at most: a peer
// that has not taken the copy by then (hung, or slow) is behind, and is waited for no
// more until it has taken every lease this replica owns again (see catchUp). A hung
// peer so costs one wait, not one for every change while it hangs, and an owner answers a
// forwarded grant or renewal before the replica that forwarded it gives up on it.
func (r *Set) Replicate(rec discovery.LeaseRecord) error {
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
	rec discovery.LeaseRecord
	ack chan error
}

// maxBatch caps the records in one request to a peer (about 150 KiB).
const maxBatch = 512

// BodyLimit caps the bodies of the replicas' routes: batches of lease changes, maxBatch
// records of well under 1 KiB each.
const BodyLimit = maxBatch << 10

// send queues rec for the peer and returns where the outcome of its request arrives, or
// nil when the peer is behind: then it starts catching the peer up, if it is time to try
// again.
func (r *Set) send(l *peerLink, rec discovery.LeaseRecord) <-chan error {
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

// errLate stands for a copy a peer did not take in time (see Replicate).
var errLate = errors.New("the replica did not take the copy in time")

// errBehind answers the changes queued for a peer when it fell behind: the catch-up
// carries them.
var errBehind = errors.New("the replica fell behind")

// fallBehind marks the peer behind (see peerLink.behind): the changes queued for it are
// answered as not taken, and new ones are not queued.
func (r *Set) fallBehind(l *peerLink) {
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
func (r *Set) drain(l *peerLink) {
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
		recs := make([]discovery.LeaseRecord, n)
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
func (r *Set) catchUp(l *peerLink) bool {
	if err := r.post(l.peer, []discovery.LeaseRecord{}); err != nil {
		return false
	}
	l.mu.Lock()
	l.behind = false
	l.mu.Unlock()
	recs := r.store.Owned()
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
func (r *Set) post(peer int, recs []discovery.LeaseRecord) error {
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

// Restore takes back the leases this replica owns from every peer before it grants,
// renews or ends any: until then it would count its proxies' slots as free while crawlers
// still hold them. It waits for all peers, since a change needs only one peer's copy to be
// answered; past RestoreLimit every lease it could have missed has expired, and it starts
// with what it has. A peer that is restoring too answers with what it holds: when every
// replica restarted at once nothing more is to be had, and waiting on each other would
// keep them all unready.
func (r *Set) Restore(ctx context.Context) {
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

func (r *Set) snapshot(ctx context.Context, peer int) ([]discovery.LeaseRecord, error) {
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
	var recs []discovery.LeaseRecord
	if err := json.NewDecoder(resp.Body).Decode(&recs); err != nil {
		return nil, fmt.Errorf("replica %d: %w", peer, err)
	}
	return recs, nil
}

// Demand is sel's demand over the whole replica set: this replica's view of the leases
// (copied to every replica) and every replica's own waiting and refused requests, asked
// of the others at once. A replica that does not answer within the peer timeout is left
// out, and the answer says it is partial. Asking watches sel on every replica that
// answers: their gateways then wait for the proxies it describes to grow.
func (r *Set) Demand(ctx context.Context, d discovery.Demand) discovery.Demand {
	parts := make(chan *discovery.DemandPart, len(r.cfg.Peers))
	query := url.Values{}
	for k, v := range d.Selector {
		query.Set("attr."+k, v)
	}
	for peer := range r.cfg.Peers {
		if peer == r.cfg.Self {
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
			defer cancel()
			var part discovery.DemandPart
			resp, err := r.call(ctx, peer, http.MethodGet, PeerDemandPath+"?"+query.Encode(), nil, nil)
			if err == nil {
				err = peerAnswer(resp, http.StatusOK, &part)
			}
			if err != nil {
				r.log.Info("a replica did not answer its part of the demand", "replica", peer, "error", err)
				parts <- nil
				return
			}
			parts <- &part
		}()
	}
	for range len(r.cfg.Peers) - 1 {
		if p := <-parts; p != nil {
			d.Add(*p)
		} else {
			d.Partial = true
		}
	}
	return d
}

// GrantRequest asks the owner of a proxy to grant a lease on it (POST /peer/v1/grant).
type GrantRequest struct {
	ProxyID    string             `json:"proxyID"`
	Selector   discovery.Selector `json:"selector"`
	Target     string             `json:"target,omitempty"`
	Session    string             `json:"session,omitempty"`
	TTLSeconds int                `json:"ttlSeconds"`
	// Client and MaxLeases are the asking crawler's identity and its cap.
	Client    string `json:"client,omitempty"`
	MaxLeases int    `json:"maxLeases,omitempty"`
}

// EndGrantRequest asks a lease's owner to end it for the replica that asked for the grant
// (POST /peer/v1/release).
type EndGrantRequest struct {
	LeaseID string `json:"leaseID"`
	Client  string `json:"client,omitempty"`
}

// peerAnswer reads another replica's answer: into v (when not nil) if it has the status
// want, else as the *discovery.APIError it carries, which the caller answers with as it is.
func peerAnswer(resp *http.Response, want int, v any) error {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return discovery.Unavailable("another replica's answer was cut off: %v", err)
	}
	if resp.StatusCode == want {
		if v == nil {
			return nil
		}
		if err := json.Unmarshal(body, v); err != nil {
			return discovery.Unavailable("another replica answered what this one cannot read: %v", err)
		}
		return nil
	}
	var ae discovery.APIError
	if err := json.Unmarshal(body, &ae); err != nil || ae.Code == "" {
		return discovery.Unavailable("another replica answered %d", resp.StatusCode)
	}
	return &ae
}

// Ready says whether this replica can act on the leases it owns: once it holds them all
// again and its index is loaded. Before the index is, a renewal would find the lease's
// proxy missing and end the lease as if the proxy had left the fleet.
func (r *Set) Ready() error {
	switch {
	case !r.restored.Load():
		return discovery.Unavailable("this replica is restoring its leases from the others")
	case !r.store.Loaded():
		return discovery.Unavailable("this replica is still loading its proxy index from Temporal")
	}
	return nil
}

// Authorized reports whether r bears a replicas' token as its Authorization: only they
// may call the replicas' routes.
func (r *Set) Authorized(req *http.Request) bool {
	scheme, got, _ := strings.Cut(req.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "Bearer") && r.validToken(got)
}

// FromPeer reports whether another replica forwarded req (false alone).
func (r *Set) FromPeer(req *http.Request) bool {
	return r.validToken(req.Header.Get(peerTokenHeader))
}

// validToken reports whether t is a replicas' token, compared in constant time.
func (r *Set) validToken(t string) bool {
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

// Self is this replica's number.
func (r *Set) Self() int { return r.cfg.Self }

// Len counts the replicas, this one included.
func (r *Set) Len() int { return len(r.cfg.Peers) }

// Restored reports whether this replica holds every lease it owns (true alone).
func (r *Set) Restored() bool { return r == nil || r.restored.Load() }

// Apply takes lease changes from their owner, the replica from (ForwardedHeader's value),
// which can grant again: only a restored owner sends its changes.
func (r *Set) Apply(recs []discovery.LeaseRecord, from string) {
	r.store.Apply(recs)
	if from, err := strconv.Atoi(from); err == nil {
		r.markDown(from, 0)
	}
}

// Snapshot is what this replica sends replica owner while it starts (Store.Snapshot).
func (r *Set) Snapshot(owner int) []discovery.LeaseRecord { return r.store.Snapshot(owner) }

// Grant asks owner to grant a lease on proxyID for w (see discovery.Peers).
func (r *Set) Grant(ctx context.Context, owner int, proxyID string, w discovery.Want) (*discovery.LeaseResponse, *discovery.APIError, error) {
	body, _ := json.Marshal(GrantRequest{ProxyID: proxyID, Selector: w.Selector, Target: w.Target, Session: w.Session,
		TTLSeconds: int(w.TTL / time.Second), Client: w.Client, MaxLeases: w.MaxLeases})
	resp, err := r.call(context.WithoutCancel(ctx), owner, http.MethodPost, peerGrantPath, body, nil)
	if err != nil {
		r.markDown(owner, 2*time.Second)
		return nil, discovery.Unavailable("replica %d, which owns the proxy picked, did not answer", owner), nil
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		resp.Body.Close()
		return nil, nil, discovery.ErrProxyUnavailable
	case http.StatusServiceUnavailable:
		r.markDown(owner, time.Second)
		resp.Body.Close()
		return nil, discovery.Unavailable("replica %d, which owns the proxy picked, cannot grant now", owner), nil
	}
	var granted discovery.LeaseResponse
	if err := peerAnswer(resp, http.StatusCreated, &granted); err != nil {
		return nil, nil, err
	}
	return &granted, nil, nil
}

// EndGrant ends lease id on owner, granted for client's crawler that left before it got it.
func (r *Set) EndGrant(ctx context.Context, owner int, client, id string) error {
	body, _ := json.Marshal(EndGrantRequest{LeaseID: id, Client: client})
	resp, err := r.call(context.WithoutCancel(ctx), owner, http.MethodPost, peerReleasePath, body, nil)
	if err == nil {
		err = peerAnswer(resp, http.StatusNoContent, nil)
	}
	return err
}

// Renew forwards a crawler's renewal of lease id to its owner.
func (r *Set) Renew(ctx context.Context, owner int, auth, id string, d time.Duration) (*discovery.LeaseResponse, error) {
	var out discovery.LeaseResponse
	if err := r.onOwner(ctx, owner, auth, http.MethodPost, leasePath(id, "/renew"),
		discovery.RenewRequest{TTLSeconds: int(d / time.Second)}, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Release forwards a crawler's release of lease id to its owner.
func (r *Set) Release(ctx context.Context, owner int, auth, id string) error {
	return r.onOwner(ctx, owner, auth, http.MethodDelete, leasePath(id, ""), nil, http.StatusNoContent, nil)
}

// Report forwards a crawler's report on lease id to its owner.
func (r *Set) Report(ctx context.Context, owner int, auth, id, result, target string) error {
	return r.onOwner(ctx, owner, auth, http.MethodPost, leasePath(id, "/report"),
		discovery.ReportRequest{Result: result, Target: target}, http.StatusNoContent, nil)
}

// onOwner sends a request on lease id to its owner and reads the answer into v.
func (r *Set) onOwner(ctx context.Context, owner int, auth, method, path string, body any, want int, v any) error {
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	var h http.Header
	if auth != "" {
		h = http.Header{"Authorization": {auth}}
	}
	resp, err := r.call(context.WithoutCancel(ctx), owner, method, path, raw, h)
	if err != nil {
		r.markDown(owner, 2*time.Second)
		return discovery.Unavailable("replica %d, which owns the lease, did not answer", owner)
	}
	r.metrics.forwarded.Inc()
	return peerAnswer(resp, want, v)
}

func leasePath(id, op string) string { return "/v1/leases/" + url.PathEscape(id) + op }

// Forward sends a crawler's request on a lease, as it came (method, requestURI, body and
// its Authorization values auth), to the lease's owner, whose answer the caller relays
// and closes. A replica that does not answer is passed over for a while.
func (r *Set) Forward(ctx context.Context, owner int, method, requestURI string, body []byte, auth []string) (*http.Response, error) {
	resp, err := r.call(context.WithoutCancel(ctx), owner, method, requestURI, body, http.Header{"Authorization": auth})
	if err != nil {
		r.markDown(owner, 2*time.Second)
		return nil, err
	}
	r.metrics.forwarded.Inc()
	return resp, nil
}
