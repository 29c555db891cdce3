// Package temporal is discovery's adapter to Temporal: it builds the lease store's index
// from the proxies' workflows as visibility lists them (memos and search attributes, never
// Kubernetes), and forwards crawlers' reports to those workflows as signals. It is the
// only discovery package that speaks to Temporal, so the domain and the other adapters
// can be tested without it.
package temporal

import (
	"context"
	"log/slog"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyruns"
)

// Lister is the part of the Temporal client the refresher uses.
type Lister = proxyruns.Lister

// Defaults of the refresher; cmd/discovery's flags default to them too.
const (
	DefaultRefreshInterval    = time.Second
	DefaultFullResyncInterval = 5 * time.Minute
)

// Refresher keeps a Store's index in step with the running ProxyWorkflows. It lists only
// what changed since the last pass (by ProxyUpdatedAt, with an overlap for visibility lag),
// and lists everything at start and every FullEvery, so nothing is missed for long.
type Refresher struct {
	Client    Lister
	Namespace string
	Store     *discovery.Store
	// Interval between incremental passes (default 1s), FullEvery between full ones
	// (default 5m), Overlap re-reads a little of the past (default 5s).
	Interval, FullEvery, Overlap time.Duration
	PageSize                     int32
	Log                          *slog.Logger
	// Observe, if set, is told the duration and kind ("full", "incremental") of each pass
	// and how many workflows it read.
	Observe func(kind string, took time.Duration, read int, err error)
	// Keyring resolves the credentials memos point to. Without one, no proxy that takes
	// credentials is leased.
	Keyring *proxyauth.Keyring

	watermark time.Time
	lastFull  time.Time
	// warned maps the ID of each proxy in the index whose credentials did not resolve to
	// what its memo said then, so each change is logged once, not at every pass.
	warned map[string]string
}

// orDefault sets a zero or negative duration to def.
func orDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

func (r *Refresher) defaults() {
	orDefault(&r.Interval, DefaultRefreshInterval)
	orDefault(&r.FullEvery, DefaultFullResyncInterval)
	orDefault(&r.Overlap, 5*time.Second)
	if r.PageSize <= 0 {
		r.PageSize = 1000
	}
	if r.Log == nil {
		r.Log = slog.Default()
	}
	if r.warned == nil {
		r.warned = map[string]string{}
	}
}

// Run refreshes until ctx ends, starting with a full pass. Until a full pass succeeds the
// Store is not Loaded (the API answers 503 index_loading), and every tick tries a full pass
// again: an incremental one would only bring what changed, never the whole fleet.
func (r *Refresher) Run(ctx context.Context) error {
	r.defaults()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		var err error
		if time.Since(r.lastFull) >= r.FullEvery {
			err = r.Full(ctx)
		} else {
			err = r.Incremental(ctx)
		}
		if err != nil && ctx.Err() == nil {
			if r.Store.Loaded() {
				r.Log.Warn("index refresh failed; serving the last known index", "error", err)
			} else {
				r.Log.Warn("first index load failed; listings and acquires answer 503 index_loading until one succeeds", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Full replaces the index with every running ProxyWorkflow.
func (r *Refresher) Full(ctx context.Context) error {
	r.defaults()
	start := time.Now()
	runs, high, n, err := r.latestRuns(ctx, contract.RunningProxiesQuery)
	r.observe("full", start, n, err)
	if err != nil {
		return err
	}
	var all []discovery.Proxy
	var notes []*discovery.CredentialsNote
	for _, run := range runs {
		if run.Running {
			all = append(all, run.Value.Proxy)
			notes = append(notes, run.Value.note)
		}
	}
	first := !r.Store.Loaded()
	r.Store.ReplaceAll(all)
	listed := make(map[string]bool, len(all))
	for i := range all {
		listed[all[i].ID()] = true
		r.noteCredentials(&all[i], notes[i])
	}
	for id := range r.warned {
		if !listed[id] {
			delete(r.warned, id)
		}
	}
	if first {
		// The moment discovery starts answering crawlers: worth a line in the log.
		r.Log.Info("proxy index loaded from Temporal", "proxies", len(all), "took", time.Since(start).Round(time.Millisecond).String())
	}
	r.lastFull = start
	if high.After(r.watermark) {
		r.watermark = high
	}
	return nil
}

// Incremental applies the workflows updated since the last pass.
func (r *Refresher) Incremental(ctx context.Context) error {
	r.defaults()
	start := time.Now()
	runs, high, n, err := r.latestRuns(ctx, contract.ProxiesUpdatedSinceQuery(r.watermark.Add(-r.Overlap)))
	r.observe("incremental", start, n, err)
	if err != nil {
		return err
	}
	for _, run := range runs {
		if run.Running {
			r.Store.Upsert(run.Value.Proxy)
			r.noteCredentials(&run.Value.Proxy, run.Value.note)
		} else {
			id := run.Value.ID()
			r.Store.Remove(id)
			delete(r.warned, id)
		}
	}
	if high.After(r.watermark) {
		r.watermark = high
	}
	return nil
}

// latestRuns lists query and returns, for each proxy listed, the run that is its
// workflow (proxyruns.List), high, the latest change among all listed, and n, how many
// were read. A run without a memo yet (just started) has nothing to offer and is skipped.
func (r *Refresher) latestRuns(ctx context.Context, query string) ([]proxyruns.Latest[memoProxy], time.Time, int, error) {
	return proxyruns.List(ctx, r.Client, proxyruns.Query{Namespace: r.Namespace, PageSize: r.PageSize, Query: query},
		func(run proxyruns.Run) (memoProxy, bool) {
			p, ok := decode(run, r.Keyring)
			if ok && p.Namespace == "" {
				p.Namespace, p.Name, _ = contract.ParseProxyWorkflowID(run.WorkflowID)
			}
			return p, ok
		})
}

// memoProxy is a proxy as a run's memo describes it, with, when its credentials did not
// resolve, what the refresher logs about them (the store has no use for it).
type memoProxy struct {
	discovery.Proxy
	note *discovery.CredentialsNote
}

func (r *Refresher) observe(kind string, start time.Time, n int, err error) {
	if r.Observe != nil {
		r.Observe(kind, time.Since(start), n, err)
	}
}

// noteCredentials logs, once per proxy and per change of its memo's auth, that a proxy in
// the index cannot be leased because its credentials did not resolve, and once more when
// they resolve again. It logs the proxy, the reason and the key ID, never a credential.
func (r *Refresher) noteCredentials(p *discovery.Proxy, n *discovery.CredentialsNote) {
	id := p.ID()
	if p.CredentialsUnresolved == "" {
		if _, ok := r.warned[id]; ok {
			delete(r.warned, id)
			r.Log.Info("proxy credentials resolved; the proxy can be leased again", "proxy", id)
		}
		return
	}
	var note discovery.CredentialsNote
	if n != nil {
		note = *n
	}
	seen := p.CredentialsUnresolved + "\x00" + note.Ref
	if r.warned[id] == seen {
		return
	}
	r.warned[id] = seen
	attrs := []any{"proxy", id, "reason", p.CredentialsUnresolved, "keyID", note.KeyID}
	if note.Err != nil {
		attrs = append(attrs, "error", note.Err.Error())
	}
	r.Log.Warn("proxy credentials cannot be resolved; the proxy is not leased until they can", attrs...)
}

// decode turns a run's memo into a Proxy, with the credentials its memo points to
// resolved with kr. Workflows without a memo yet (just started) are skipped: they have
// nothing to offer.
func decode(run proxyruns.Run, kr *proxyauth.Keyring) (memoProxy, bool) {
	var m contract.ProxyMemo
	if !proxyruns.Decode(run, contract.MemoKey, &m) {
		return memoProxy{}, false
	}
	p := discovery.Proxy{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, IP: m.IP, Port: m.Port,
		Attributes: m.Attributes, LatencyMillis: m.LatencyMillis,
		Healthy: m.Healthy && (m.Phase == contract.PhaseReady || m.Phase == contract.PhaseReplacing) && m.IP != "",
		Phase:   m.Phase, MaxLeases: int(m.MaxLeases), Provider: m.Provider,
		Cooldowns: m.Cooldowns,
	}
	if m.Auth != nil {
		p.Instance = m.Auth.Instance
	}
	// The memo's UID owns sealed credentials: a sealed value copied into another Proxy's
	// memo does not open.
	// A proxy whose credentials do not resolve keeps the health its checks gave: the
	// store never leases it (Store.Upsert), but still renews leases already on it.
	var note *discovery.CredentialsNote
	p.Credentials, note, p.CredentialsUnresolved = discovery.ResolveCredentials(kr, m.Auth, m.UID)
	return memoProxy{Proxy: p, note: note}, true
}
