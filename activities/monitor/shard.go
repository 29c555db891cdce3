package monitor

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyruns"
)

// A monitor shard watches many proxies in one long activity, so that a healthy fleet costs
// Temporal one heartbeat per shard instead of one per proxy. A proxy's workflow publishes what to watch
// under MemoKey; the shard that owns the workflow ID (ShardOf) watches it with the same
// loop the Monitor activity runs, and signals the workflow only when something is worth
// writing down. This file holds the running parts: a worker's Shards, the feed that reads
// their membership from visibility, and the members, one goroutine per watched proxy.
// What they decide is in membership.go.

// Signaller is the part of the Temporal client a shard reports through.
type Signaller interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// Shards are the monitor shards one worker runs. They belong to the worker, not to the
// process: the shards a worker holds for one task queue share one feed, so visibility
// answers one read per refresh per worker rather than per shard, and the shards judge
// health-check targets together (targets.go); two workers in one process (tests, a
// benchmark's fleet) each read their own.
type Shards struct {
	env    Env
	lister proxyruns.Lister

	mu      sync.Mutex
	byQueue map[string]*feed
}

// NewShards returns the shards of a worker whose watches run in env, whose membership is
// read from lister.
func NewShards(env Env, lister proxyruns.Lister) *Shards {
	return &Shards{env: env, lister: lister, byQueue: map[string]*feed{}}
}

// Serve runs shard in.Index of in.Count on queue's proxies until ctx ends, and returns
// ctx's error: it watches every proxy whose workflow the shard owns. It learns its members
// from visibility, as discovery does: the running ProxyWorkflows with a Memo, all of them
// at start and every Full, what changed every Refresh. The shards of this worker for one
// task queue share one reader (a feed). beat is called at once and every Refresh, for the
// activity to heartbeat. in must name a shard of its count (0 <= Index < Count).
// Its members' reports go to signaller, the worker's as it is when the shard starts.
func (s *Shards) Serve(ctx context.Context, queue string, in ShardInput, signaller Signaller, beat func()) error {
	in = in.withDefaults()
	ms := newMembers(s.env, signaller)
	defer ms.stopAll()
	f, sub := s.subscribe(ctx, queue, in, ms)
	defer f.unsubscribe(sub)
	tick := time.NewTicker(in.Refresh)
	defer tick.Stop()
	for {
		beat()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// members runs one watch per proxy a shard owns.
type members struct {
	env    Env
	signal Signaller
	// retry is the first pause before a failed report is sent again (doubling to 30 s).
	retry time.Duration

	mu   sync.Mutex
	byID map[string]*member
	// targets judges the members' health-check targets: the feed's, shared by every shard
	// of the worker, once the shard subscribed (see targets.go).
	targets *targetBoard
	wg      sync.WaitGroup
}

type member struct {
	watching
	cancel context.CancelFunc
	done   chan struct{}
}

func newMembers(env Env, signal Signaller) *members {
	return &members{env: env, signal: signal, retry: time.Second, byID: map[string]*member{}, targets: newTargetBoard(env.Metrics)}
}

// share makes the members judge targets on b, shared with other shards. It is called
// before any member starts.
func (ms *members) share(b *targetBoard) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.targets = b
}

// sync makes the watch of workflowID follow w: started if new, restarted if its epoch
// changed, stopped if w has no memo (the workflow ended or no longer wants a shard's
// watch). resumed says the watch takes over from another process (a shard that moved
// workers), so overdue probes are spread over the interval rather than all sent at once.
func (ms *members) sync(ctx context.Context, workflowID string, w watch, resumed bool) {
	memo := w.memo
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.byID[workflowID]
	var cur *watching
	if m != nil {
		cur = &m.watching
	}
	switch follow(cur, w) {
	case memberKeep:
		if m != nil {
			m.run = w.run
		}
		return
	case memberStop, memberRestart:
		m.cancel()
		<-m.done
		delete(ms.byID, workflowID)
	}
	if memo == nil {
		return
	}
	mctx, cancel := context.WithCancel(ctx)
	m = &member{watching: watching{epoch: memo.Epoch, run: w.run}, cancel: cancel, done: make(chan struct{})}
	ms.byID[workflowID] = m
	ms.wg.Add(1)
	targets := ms.targets
	go func() {
		defer ms.wg.Done()
		defer close(m.done)
		ms.run(mctx, workflowID, *memo, resumed, targets)
	}()
}

// stopAll stops every watch and waits for them.
func (ms *members) stopAll() {
	ms.mu.Lock()
	for _, m := range ms.byID {
		m.cancel()
	}
	ms.byID = map[string]*member{}
	ms.mu.Unlock()
	ms.wg.Wait()
}

// run watches one proxy and reports each change to its workflow, carrying the counters on
// from one change to the next. It ends when ctx does, when the workflow is gone, or when
// the instance is lost (the workflow then publishes a new epoch for the next one). Its
// probes count on targets towards its health-check target's judgement, until it ends.
func (ms *members) run(ctx context.Context, workflowID string, memo Memo, resumed bool, targets *targetBoard) {
	in := memo.Input
	judge, forget := targets.judgeFor(workflowID, in.HealthCheck, in.Last.Known && in.Last.Healthy)
	defer forget()
	st := Progress{Health: in.Last, LastReport: time.Now(), Reported: in.Last.FailureReason}
	pause := ms.retry
	for {
		// The provider check an unhealthy start makes is made on every start: a member
		// that takes over (its shard moved, its worker restarted) cannot know whether the
		// one before it made it, and a lost instance would wait for the next drift check.
		res, err := watchProxy(ctx, ms.env, in, &st, resumed, true, judge, nil)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// A config the schema should have refused, or a provider that is not
			// configured: tried again later, never in a tight loop.
			ms.env.log().WarnContext(ctx, "cannot watch the proxy; trying again", "workflow", workflowID, "error", err)
			if !sleepCtx(ctx, pause) {
				return
			}
			pause = min(2*pause, 30*time.Second)
			continue
		}
		pause, resumed = ms.retry, false
		if !ms.report(ctx, workflowID, Report{Epoch: memo.Epoch, Result: res}) {
			return
		}
		switch res.Reason {
		case ReasonGone, ReasonStopped:
			return
		case ReasonCredentials:
			if in.Auth != nil {
				in.Auth.Sealed = res.Sealed
			}
		}
		in.Last = st.Health
	}
}

// report signals the workflow until it takes the report. A workflow that no longer exists
// (or is closed) ends the watch; anything else is retried with backoff, so a Temporal
// outage delays a verdict but never loses it.
func (ms *members) report(ctx context.Context, workflowID string, r Report) bool {
	pause := ms.retry
	for {
		err := ms.signal.SignalWorkflow(ctx, workflowID, "", contract.SignalMonitor, r)
		var notFound *serviceerror.NotFound
		switch {
		case err == nil:
			ms.env.Metrics.reported(r.Result.Reason)
			return true
		case errors.As(err, &notFound):
			return false
		case ctx.Err() != nil:
			return false
		}
		ms.env.log().WarnContext(ctx, "reporting to the proxy's workflow failed; trying again", "workflow", workflowID, "error", err)
		if !sleepCtx(ctx, pause) {
			return false
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// sleepCtx waits d unless ctx ends first, and reports whether the wait was complete.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// A feed reads the watches of one task queue's proxies for every shard of its worker:
// the whole membership at its first read and every Full, what changed every Refresh, and
// hands each shard the changes to the proxies it owns. It runs while a shard subscribes.
type feed struct {
	shards *Shards    // the worker's, whose registry it is in
	in     ShardInput // Refresh, Full and Overlap of the shard that started it
	queue  string

	mu   sync.Mutex
	subs map[*feedSub]bool
	// known is every running ProxyWorkflow with a watch, as last read; read says a full
	// read has completed since the feed started.
	known     map[string]watch
	read      bool
	watermark time.Time
	lastFull  time.Time
	// lastChange is when a read last found a change.
	lastChange time.Time
	// targets is the judgement of health-check targets every shard of the feed shares.
	targets *targetBoard
	stop    context.CancelFunc
	done    chan struct{}
}

// feedSub is one shard's subscription. fresh: it has not been given its members yet, which
// then start spread over their interval (the shard took over from another worker, or
// starts a fleet whose probes are all due).
type feedSub struct {
	ctx          context.Context // the shard's: its watches live as long as it does
	index, count int
	ms           *members
	fresh        bool
}

// subscribe subscribes a shard to the feed of queue, started if none runs. It holds the
// registry's lock throughout, so a feed whose last shard is leaving is never joined.
func (s *Shards) subscribe(ctx context.Context, queue string, in ShardInput, ms *members) (*feed, *feedSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.byQueue[queue]
	if f == nil {
		fctx, cancel := context.WithCancel(context.Background())
		f = &feed{shards: s, in: in, queue: queue, subs: map[*feedSub]bool{}, known: map[string]watch{},
			targets: newTargetBoard(s.env.Metrics), stop: cancel, done: make(chan struct{})}
		s.byQueue[queue] = f
		go f.run(fctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ms.share(f.targets)
	sub := &feedSub{ctx: ctx, index: in.Index, count: in.Count, ms: ms, fresh: true}
	f.subs[sub] = true
	if f.read {
		f.handOver(sub)
	}
	return f, sub
}

// unsubscribe ends a shard's subscription; the last one stops the feed.
func (f *feed) unsubscribe(sub *feedSub) {
	s := f.shards
	s.mu.Lock()
	f.mu.Lock()
	delete(f.subs, sub)
	last := len(f.subs) == 0
	f.mu.Unlock()
	if last && s.byQueue[f.queue] == f {
		delete(s.byQueue, f.queue)
	}
	s.mu.Unlock()
	if last {
		f.stop()
		<-f.done
	}
}

// handOver gives a fresh subscriber every known proxy it owns. f.mu is held.
func (f *feed) handOver(sub *feedSub) {
	for id, w := range f.known {
		if sub.owns(id) {
			sub.ms.sync(sub.ctx, id, w, true)
		}
	}
	sub.fresh = false
}

func (s *feedSub) owns(id string) bool { return ShardOf(id, s.count) == s.index }

func (f *feed) run(ctx context.Context) {
	defer close(f.done)
	for {
		t0 := time.Now()
		var err error
		if time.Since(f.lastFull) >= f.in.Full {
			err = f.full(ctx)
		} else {
			err = f.changed(ctx)
		}
		if err != nil && ctx.Err() == nil {
			f.shards.env.log().WarnContext(ctx, "reading the monitor shards' members failed; watching those known", "taskQueue", f.queue, "error", err)
		}
		if !sleepCtx(ctx, max(f.in.pace(time.Since(f.lastChange))-time.Since(t0), 0)) {
			return
		}
	}
}

// full reads every running ProxyWorkflow and makes each shard's watches follow: started,
// restarted for a new epoch, stopped for a workflow gone or no longer watched by shards.
func (f *feed) full(ctx context.Context) error {
	start := time.Now()
	latest, high, err := f.list(ctx, contract.RunningProxiesQuery)
	if err != nil {
		return err
	}
	want := watchesOf(latest)
	f.mu.Lock()
	defer f.mu.Unlock()
	for sub := range f.subs {
		if sub.fresh {
			continue
		}
		for id, w := range fullSyncs(f.known, want, sub.owns) {
			sub.ms.sync(sub.ctx, id, w, false)
		}
	}
	if !f.read || fullChanged(f.known, want) {
		f.lastChange = time.Now()
	}
	f.known, f.watermark, f.lastFull, f.read = want, high, start, true
	for sub := range f.subs {
		if sub.fresh {
			f.handOver(sub)
		}
	}
	return nil
}

// changed reads the ProxyWorkflows whose memo changed (or that closed) since the last read.
// One workflow ID can have a closed run and a running one (continue-as-new, a Proxy made
// again, a run started again after a terminate): the latest run wins; a run that continued
// as new is left to its successor.
func (f *feed) changed(ctx context.Context) error {
	latest, high, err := f.list(ctx, contract.ProxiesUpdatedSinceQuery(f.watermark.Add(-f.in.Overlap)))
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range latest {
		id, w := r.WorkflowID, watchOf(r)
		if !sameWatch(f.known[id], w) {
			// Not every row is news: each read reaches back Overlap, so the last
			// changes are read again, unchanged.
			f.lastChange = time.Now()
		}
		if w.memo != nil {
			f.known[id] = w
		} else {
			delete(f.known, id)
		}
		for sub := range f.subs {
			if !sub.fresh && sub.owns(id) {
				sub.ms.sync(sub.ctx, id, w, false)
			}
		}
	}
	f.watermark = high
	return nil
}

// list lists query on the feed's task queue and returns, for each workflow ID, the run that
// is the workflow (proxyruns.List) with its Memo (nil without one), and the latest change
// seen, never before the feed's watermark.
func (f *feed) list(ctx context.Context, query string) ([]proxyruns.Latest[*Memo], time.Time, error) {
	runs, high, _, err := proxyruns.List(ctx, f.shards.lister, proxyruns.Query{PageSize: 1000, Query: contract.OnTaskQueue(query, f.queue)}, memoOf)
	return runs, later(high, f.watermark), err
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
