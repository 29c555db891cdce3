package activities

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyruns"
)

// A monitor shard watches many proxies in one long activity, so that a healthy fleet costs
// Temporal one heartbeat per shard instead of one per proxy. A proxy's workflow publishes what to watch
// under MonitorMemoKey; the shard that owns the workflow ID (ShardOf) watches it with the
// same loop a Monitor activity runs, and signals the workflow only when something is worth
// writing down. This file holds the members' side: one goroutine per watched proxy.

// MonitorMemoKey is the memo field where a ProxyWorkflow watched by a shard publishes its
// MonitorMemo. It sits beside contract.MemoKey, so discovery never decodes it.
const MonitorMemoKey = "monitor"

// MonitorMemo is what a shard needs to watch one proxy. Epoch names the watch: it changes
// whenever the input does (apart from Last), so a report about an instance the workflow has
// since replaced is recognised as stale and ignored.
type MonitorMemo struct {
	Epoch string       `json:"epoch"`
	Input MonitorInput `json:"input"`
}

// VerdictMemoKey is the memo field where a ProxyWorkflow watched by a shard keeps the
// verdict it holds now. The watch carries the verdict of its epoch's start, for it is
// written only when the epoch changes; a member started later (its shard moved to another
// worker, or the worker restarted) starts from this one instead. From a stale one it would
// never report a recovery (or a failure) that the workflow has not been told: it would
// think it had.
const VerdictMemoKey = "verdict"

// Verdict is a watched workflow's current verdict, for the watch of Epoch.
type Verdict struct {
	Epoch         string    `json:"epoch"`
	Healthy       bool      `json:"healthy"`
	Since         time.Time `json:"since,omitempty"`
	LatencyMillis int64     `json:"latencyMillis,omitempty"`
	// FailureReason is the reason a healthy verdict carries (ReasonHealthCheckTargetDown
	// while its target is judged down), from workflows that publish it. Without it a
	// member that starts while the workflow holds that reason cannot know it, and if the
	// target has recovered meanwhile it never reports the reason gone.
	FailureReason string `json:"failureReason,omitempty"`
}

// MonitorReport is the signal a shard sends a proxy's workflow: what its watch found, for
// the epoch it watched.
type MonitorReport struct {
	Epoch  string        `json:"epoch"`
	Result MonitorResult `json:"result"`
}

// WorkflowSignaller is the part of the Temporal client a shard reports through.
type WorkflowSignaller interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// ShardOf is the shard, of count, that watches the ProxyWorkflow workflowID: a hash, so
// every worker agrees without asking anyone.
func ShardOf(workflowID string, count int) int {
	if count <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(workflowID))
	return int(h.Sum32() % uint32(count))
}

// members runs one watch per proxy a shard owns.
type members struct {
	a      *Activities
	signal WorkflowSignaller
	name   string // the signal's name
	// retry is the first pause before a failed report is sent again (doubling to 30 s).
	retry time.Duration

	mu   sync.Mutex
	byID map[string]*member
	// targets judges the members' health-check targets: the feed's, shared by every shard
	// of the process, once the shard subscribed (see targets.go).
	targets *targetBoard
	wg      sync.WaitGroup
}

type member struct {
	watching
	cancel context.CancelFunc
	done   chan struct{}
}

// watching is what a member watches: the epoch, and the run that published it (the run
// the member's reports were meant for, though they reach whichever run of the workflow
// ID is current).
type watching struct {
	epoch, run string
}

// memberChange is what a member does when its workflow's watch is read again.
type memberChange int

const (
	memberKeep    memberChange = iota // carries on (or, with no member and no watch, nothing)
	memberStart                       // none runs: one starts
	memberRestart                     // the running one stops, and one starts on the new watch
	memberStop                        // the running one stops: nothing to watch
)

// follow decides what the member watching cur (nil: none) does when its workflow's watch
// reads w. A member runs on (or stays ended: a lost instance, a workflow gone) until a new
// epoch. The same epoch from another run is the same watch when that run knows a verdict
// (it continued as new, carrying it on). One that knows none (a run started again after a
// terminate, which adopts the instance) must be told one, and the member may have told it
// to the run before, which ended before it published anything else: the new run would
// wait for a report that never comes, so the member starts again.
func follow(cur *watching, w watch) memberChange {
	switch {
	case cur == nil && w.memo == nil:
		return memberKeep
	case cur == nil:
		return memberStart
	case w.memo == nil:
		return memberStop
	case cur.epoch == w.memo.Epoch && (cur.run == w.run || w.memo.Input.Last.Known):
		return memberKeep
	}
	return memberRestart
}

// A watch is a MonitorMemo as one run of a workflow published it.
type watch struct {
	memo *MonitorMemo // nil: nothing to watch
	run  string
}

func newMembers(a *Activities, signal WorkflowSignaller, name string) *members {
	return &members{a: a, signal: signal, name: name, retry: time.Second, byID: map[string]*member{}, targets: newTargetBoard(a.Metrics)}
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
func (ms *members) run(ctx context.Context, workflowID string, memo MonitorMemo, resumed bool, targets *targetBoard) {
	in := memo.Input
	judge, forget := targets.judgeFor(workflowID, in.HealthCheck, in.Last.Known && in.Last.Healthy)
	defer forget()
	st := monitorProgress{Health: in.Last, LastReport: time.Now(), Reported: in.Last.FailureReason}
	pause := ms.retry
	for {
		// The provider check an unhealthy start makes is made on every start: a member
		// that takes over (its shard moved, its worker restarted) cannot know whether the
		// one before it made it, and a lost instance would wait for the next drift check.
		res, err := ms.a.watch(ctx, in, &st, resumed, true, judge, nil)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// A config the schema should have refused, or a provider that is not
			// configured: tried again later, never in a tight loop.
			ms.a.log().WarnContext(ctx, "cannot watch the proxy; trying again", "workflow", workflowID, "error", err)
			if !sleepCtx(ctx, pause) {
				return
			}
			pause = min(2*pause, 30*time.Second)
			continue
		}
		pause, resumed = ms.retry, false
		if !ms.report(ctx, workflowID, MonitorReport{Epoch: memo.Epoch, Result: res}) {
			return
		}
		switch res.Reason {
		case MonitorGone, MonitorStopped:
			return
		case MonitorCredentials:
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
func (ms *members) report(ctx context.Context, workflowID string, r MonitorReport) bool {
	pause := ms.retry
	for {
		err := ms.signal.SignalWorkflow(ctx, workflowID, "", ms.name, r)
		var notFound *serviceerror.NotFound
		switch {
		case err == nil:
			ms.a.Metrics.reported(r.Result.Reason)
			return true
		case errors.As(err, &notFound):
			return false
		case ctx.Err() != nil:
			return false
		}
		ms.a.log().WarnContext(ctx, "reporting to the proxy's workflow failed; trying again", "workflow", workflowID, "error", err)
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

// ShardInput configures one monitor shard.
type ShardInput struct {
	// Index of Count: the shard watches the workflows ShardOf gives Index.
	Index int `json:"index"`
	Count int `json:"count"`
	// Refresh is how often the shard reads what changed in its membership while changes
	// come (default 1s), IdleRefresh how often once none has for Quiet (default 5s after
	// 30s),
	// Full how often it reads all of it (default 5m), Overlap how far back each read
	// reaches, for visibility's lag (default 5s).
	Refresh     time.Duration `json:"refresh,omitempty"`
	IdleRefresh time.Duration `json:"idleRefresh,omitempty"`
	Quiet       time.Duration `json:"quiet,omitempty"`
	Full        time.Duration `json:"full,omitempty"`
	Overlap     time.Duration `json:"overlap,omitempty"`
}

// withDefaults fills in the paces in leaves unset. The idle pace is never faster than the
// busy one.
func (in ShardInput) withDefaults() ShardInput {
	in.Refresh, in.Full, in.Overlap = orDefault(in.Refresh, time.Second), orDefault(in.Full, 5*time.Minute), orDefault(in.Overlap, 5*time.Second)
	in.IdleRefresh, in.Quiet = max(orDefault(in.IdleRefresh, 5*time.Second), in.Refresh), orDefault(in.Quiet, 30*time.Second)
	return in
}

// pace is how long a read of the membership waits after the one before it began, when the
// last change was sinceChange ago. An idle fleet's reads are what its visibility store
// pays for (each scans the queue's proxies on the dev server's SQLite); a fleet in motion
// wants new watches picked up fast.
func (in ShardInput) pace(sinceChange time.Duration) time.Duration {
	if sinceChange < in.Quiet {
		return in.Refresh
	}
	return in.IdleRefresh
}

// MonitorShard watches every proxy whose workflow the shard owns, until it is cancelled or
// its worker dies (Temporal then starts it on another worker after the heartbeat timeout).
// It learns its members from visibility, as discovery does: the running ProxyWorkflows
// with a MonitorMemo, all of them at start and every Full, what changed every Refresh.
// The shards a process runs for one task queue share one reader (a feed), so the
// visibility store answers one query per Refresh per worker, not per shard. The shard
// heartbeats once a Refresh with no details; that heartbeat, throttled by the SDK to one
// per 0.8 × the heartbeat timeout, is the whole cost of a healthy fleet.
func (a *Activities) MonitorShard(ctx context.Context, in ShardInput) error {
	if in.Count < 1 || in.Index < 0 || in.Index >= in.Count {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("monitor shard %d of %d does not exist", in.Index, in.Count), ErrTypePermanent, nil)
	}
	if a.Temporal == nil || a.Signaller == nil {
		return temporal.NewNonRetryableApplicationError("this worker has no Temporal client for monitor shards", ErrTypePermanent, nil)
	}
	in = in.withDefaults()
	ms := newMembers(a, a.Signaller, contract.SignalMonitor)
	defer ms.stopAll()
	f, sub := a.feeds().subscribe(ctx, a, activity.GetInfo(ctx).TaskQueue, in, ms)
	defer f.unsubscribe(sub)
	tick := time.NewTicker(in.Refresh)
	defer tick.Stop()
	for {
		activity.RecordHeartbeat(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// A feed reads the watches of one task queue's proxies for every shard of this process:
// the whole membership at its first read and every Full, what changed every Refresh, and
// hands each shard the changes to the proxies it owns. It runs while a shard subscribes.
type feed struct {
	a     *Activities
	feeds *shardFeeds // the registry it is in
	in    ShardInput  // Refresh, Full and Overlap of the shard that started it
	queue string

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

// shardFeeds are the feeds of one worker's shards, by task queue. They belong to the
// worker (its Activities), not to the process: the shards a worker holds for one queue
// share one feed, so visibility answers one read per refresh per worker and the shards
// judge health-check targets together; two workers in one process (tests, a benchmark's
// fleet) each read their own.
type shardFeeds struct {
	mu      sync.Mutex
	byQueue map[string]*feed
}

// feeds returns a's registry of feeds, made at its first shard.
func (a *Activities) feeds() *shardFeeds {
	a.feedsOnce.Do(func() { a.shardFeeds = &shardFeeds{byQueue: map[string]*feed{}} })
	return a.shardFeeds
}

// subscribe subscribes a shard to the feed of queue, started if none runs. It holds the
// registry's lock throughout, so a feed whose last shard is leaving is never joined.
func (fs *shardFeeds) subscribe(ctx context.Context, a *Activities, queue string, in ShardInput, ms *members) (*feed, *feedSub) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.byQueue[queue]
	if f == nil {
		fctx, cancel := context.WithCancel(context.Background())
		f = &feed{a: a, feeds: fs, in: in, queue: queue, subs: map[*feedSub]bool{}, known: map[string]watch{},
			targets: newTargetBoard(a.Metrics), stop: cancel, done: make(chan struct{})}
		fs.byQueue[queue] = f
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
	f.feeds.mu.Lock()
	f.mu.Lock()
	delete(f.subs, sub)
	last := len(f.subs) == 0
	f.mu.Unlock()
	if last && f.feeds.byQueue[f.queue] == f {
		delete(f.feeds.byQueue, f.queue)
	}
	f.feeds.mu.Unlock()
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
			f.a.log().WarnContext(ctx, "reading the monitor shards' members failed; watching those known", "taskQueue", f.queue, "error", err)
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

// watchOf is the watch a run listed as the workflow's asks for: none once it is closed.
func watchOf(r proxyruns.Latest[*MonitorMemo]) watch {
	w := watch{run: r.RunID}
	if r.Running {
		w.memo = r.Value
	}
	return w
}

// watchesOf is the membership a full read lists: every workflow whose run asks for a
// watch.
func watchesOf(latest []proxyruns.Latest[*MonitorMemo]) map[string]watch {
	want := map[string]watch{}
	for _, r := range latest {
		if w := watchOf(r); w.memo != nil {
			want[r.WorkflowID] = w
		}
	}
	return want
}

// fullSyncs is what the members of a shard (owns) follow after a full read that found
// want where known was: every owned watch of want, and no watch for an owned workflow
// that is no longer listed (it closed, or publishes nothing to watch).
func fullSyncs(known, want map[string]watch, owns func(id string) bool) map[string]watch {
	out := map[string]watch{}
	for id, w := range known {
		if _, ok := want[id]; !ok && owns(id) {
			out[id] = watch{run: w.run}
		}
	}
	for id, w := range want {
		if owns(id) {
			out[id] = w
		}
	}
	return out
}

// fullChanged reports whether a full read that found want where known was found a
// change: one is what keeps the feed at its busy pace.
func fullChanged(known, want map[string]watch) bool {
	if len(want) != len(known) {
		return true
	}
	for id, w := range want {
		if !sameWatch(known[id], w) {
			return true
		}
	}
	return false
}

// sameWatch reports whether two watches (no memo: none) are the same epoch of the same run.
func sameWatch(x, y watch) bool {
	if x.memo == nil || y.memo == nil {
		return x.memo == y.memo
	}
	return x.memo.Epoch == y.memo.Epoch && x.run == y.run
}

// list lists query on the feed's task queue and returns, for each workflow ID, the run that
// is the workflow (proxyruns.List) with its MonitorMemo (nil without one), and the latest
// change seen, never before the feed's watermark.
func (f *feed) list(ctx context.Context, query string) ([]proxyruns.Latest[*MonitorMemo], time.Time, error) {
	runs, high, _, err := proxyruns.List(ctx, f.a.Temporal, proxyruns.Query{PageSize: 1000, Query: contract.OnTaskQueue(query, f.queue)}, monitorMemoOf)
	return runs, later(high, f.watermark), err
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// monitorMemoOf decodes what a member needs of a run: its MonitorMemo (nil without one;
// the run is listed anyway, so that its watch stops), with the workflow's verdict folded in
// when it is of the memo's epoch.
func monitorMemoOf(r proxyruns.Run) (*MonitorMemo, bool) {
	var m MonitorMemo
	if !proxyruns.Decode(r, MonitorMemoKey, &m) || m.Epoch == "" {
		return nil, true
	}
	var v Verdict
	if proxyruns.Decode(r, VerdictMemoKey, &v) {
		m = startFrom(m, v)
	}
	return &m, true
}

// startFrom is the watch m starting from the workflow's verdict v when v is of m's epoch:
// a member starts from the verdict the workflow holds now, not the one of the watch's
// start. The probe counters start afresh, so it reports what differs from it. A verdict of
// another epoch (about an instance since replaced) says nothing about this watch.
func startFrom(m MonitorMemo, v Verdict) MonitorMemo {
	if v.Epoch != m.Epoch {
		return m
	}
	last := &m.Input.Last
	last.Known, last.Healthy, last.Since, last.LatencyMillis = true, v.Healthy, v.Since, v.LatencyMillis
	if v.Healthy {
		last.LastFailure, last.FailureKind, last.FailureReason = "", "", v.FailureReason
	}
	return m
}
