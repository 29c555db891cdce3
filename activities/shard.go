package activities

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
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
	wg   sync.WaitGroup
}

type member struct {
	epoch  string
	cancel context.CancelFunc
	done   chan struct{}
}

func newMembers(a *Activities, signal WorkflowSignaller, name string) *members {
	return &members{a: a, signal: signal, name: name, retry: time.Second, byID: map[string]*member{}}
}

// sync makes the watch of workflowID follow memo: started if new, restarted if its epoch
// changed, stopped if memo is nil (the workflow ended or no longer wants a shard's watch).
// resumed says the watch takes over from another process (a shard that moved workers), so
// overdue probes are spread over the interval rather than all sent at once.
func (ms *members) sync(ctx context.Context, workflowID string, memo *MonitorMemo, resumed bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.byID[workflowID]
	if m != nil && memo != nil && m.epoch == memo.Epoch {
		// Running, or ended (a lost instance, a workflow gone): only a new epoch restarts it.
		return
	}
	if m != nil {
		m.cancel()
		<-m.done
		delete(ms.byID, workflowID)
	}
	if memo == nil {
		return
	}
	mctx, cancel := context.WithCancel(ctx)
	m = &member{epoch: memo.Epoch, cancel: cancel, done: make(chan struct{})}
	ms.byID[workflowID] = m
	ms.wg.Add(1)
	go func() {
		defer ms.wg.Done()
		defer close(m.done)
		ms.run(mctx, workflowID, *memo, resumed)
	}()
}

// ids returns the workflow IDs being watched.
func (ms *members) ids() []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make([]string, 0, len(ms.byID))
	for id := range ms.byID {
		out = append(out, id)
	}
	return out
}

// ended reports whether the watch of workflowID has ended by itself (or never existed).
func (ms *members) ended(workflowID string) bool {
	ms.mu.Lock()
	m := ms.byID[workflowID]
	ms.mu.Unlock()
	if m == nil {
		return true
	}
	select {
	case <-m.done:
		return true
	default:
		return false
	}
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
// the instance is lost (the workflow then publishes a new epoch for the next one).
func (ms *members) run(ctx context.Context, workflowID string, memo MonitorMemo, resumed bool) {
	in := memo.Input
	st := monitorProgress{Health: in.Last, LastReport: time.Now()}
	pause := ms.retry
	for {
		res, err := ms.a.watch(ctx, in, &st, resumed, nil)
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
	// Refresh is how often the shard reads what changed in its membership (default 1s),
	// Full how often it reads all of it (default 5m), Overlap how far back each read
	// reaches, for visibility's lag (default 5s).
	Refresh time.Duration `json:"refresh,omitempty"`
	Full    time.Duration `json:"full,omitempty"`
	Overlap time.Duration `json:"overlap,omitempty"`
}

// MonitorShard watches every proxy whose workflow the shard owns, until it is cancelled or
// its worker dies (Temporal then starts it on another worker after the heartbeat timeout).
// It learns its members from visibility, as discovery does: the running ProxyWorkflows
// with a MonitorMemo, all of them at start and every Full, what changed every Refresh. It
// heartbeats once a Refresh with no details; that heartbeat, throttled by the SDK to one
// per 0.8 × the heartbeat timeout, is the whole cost of a healthy fleet.
func (a *Activities) MonitorShard(ctx context.Context, in ShardInput) error {
	if in.Count < 1 || in.Index < 0 || in.Index >= in.Count {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("monitor shard %d of %d does not exist", in.Index, in.Count), ErrTypePermanent, nil)
	}
	if a.Temporal == nil || a.Signaller == nil {
		return temporal.NewNonRetryableApplicationError("this worker has no Temporal client for monitor shards", ErrTypePermanent, nil)
	}
	refresh, full, overlap := orDefault(in.Refresh, time.Second), orDefault(in.Full, 5*time.Minute), orDefault(in.Overlap, 5*time.Second)
	ms := newMembers(a, a.Signaller, contract.SignalMonitor)
	defer ms.stopAll()
	sh := &shardView{a: a, in: in, ms: ms, queue: activity.GetInfo(ctx).TaskQueue}
	// A shard that took over from another worker, or starts a fleet whose probes are all
	// overdue, spreads its first probes over each proxy's interval.
	spread := true
	var lastFull time.Time
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		var err error
		if time.Since(lastFull) >= full {
			start := time.Now()
			if err = sh.full(ctx, spread); err == nil {
				lastFull, spread = start, false
			}
		} else {
			err = sh.changed(ctx, overlap)
		}
		if err != nil && ctx.Err() == nil {
			a.log().WarnContext(ctx, "reading the monitor shard's members failed; watching those known", "shard", in.Index, "error", err)
		}
		activity.RecordHeartbeat(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// shardView is a shard's reading of its membership.
type shardView struct {
	a         *Activities
	in        ShardInput
	ms        *members
	queue     string // the shard watches the proxies whose workflows run on its own queue
	watermark time.Time
}

// full reads every running ProxyWorkflow and makes the watches follow: started, restarted
// for a new epoch, stopped for a workflow gone or no longer watched by shards.
func (sh *shardView) full(ctx context.Context, spread bool) error {
	want := map[string]*MonitorMemo{}
	high := sh.watermark
	err := sh.list(ctx, contract.RunningProxiesQuery, func(id string, running bool, memo *MonitorMemo, changed time.Time) {
		if changed.After(high) {
			high = changed
		}
		if running && memo != nil && ShardOf(id, sh.in.Count) == sh.in.Index {
			want[id] = memo
		}
	})
	if err != nil {
		return err
	}
	for _, id := range sh.ms.ids() {
		if want[id] == nil {
			sh.ms.sync(ctx, id, nil, false)
		}
	}
	for id, memo := range want {
		sh.ms.sync(ctx, id, memo, spread)
	}
	sh.watermark = high
	return nil
}

// changed reads the ProxyWorkflows whose memo changed (or that closed) since the last read.
// One workflow ID can have a closed run and a running one (continue-as-new, a Proxy made
// again): the running run wins; a run that continued as new is left to its successor.
func (sh *shardView) changed(ctx context.Context, overlap time.Duration) error {
	type seen struct {
		memo    *MonitorMemo
		running bool
	}
	byID := map[string]seen{}
	high := sh.watermark
	err := sh.list(ctx, contract.ProxiesUpdatedSinceQuery(sh.watermark.Add(-overlap)), func(id string, running bool, memo *MonitorMemo, changed time.Time) {
		if changed.After(high) {
			high = changed
		}
		if ShardOf(id, sh.in.Count) != sh.in.Index {
			return
		}
		if prev, ok := byID[id]; !ok || running || !prev.running {
			byID[id] = seen{memo, running}
		}
	})
	if err != nil {
		return err
	}
	for id, s := range byID {
		if s.running {
			sh.ms.sync(ctx, id, s.memo, false)
		} else {
			sh.ms.sync(ctx, id, nil, false)
		}
	}
	sh.watermark = high
	return nil
}

// list calls fn for each workflow query selects: its ID, whether it runs, its MonitorMemo
// (nil without one), and when it last changed (its memo's update time, or its close time if
// later). A run that continued as new is skipped: its successor carries its watch.
func (sh *shardView) list(ctx context.Context, query string, fn func(id string, running bool, memo *MonitorMemo, changed time.Time)) error {
	dc := converter.GetDefaultDataConverter()
	var token []byte
	for {
		resp, err := sh.a.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			PageSize: 1000, NextPageToken: token, Query: contract.OnTaskQueue(query, sh.queue),
		})
		if err != nil {
			return fmt.Errorf("list workflows: %w", err)
		}
		for _, ex := range resp.GetExecutions() {
			if ex.GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
				continue
			}
			var changed time.Time
			if f := ex.GetSearchAttributes().GetIndexedFields()[contract.SearchAttrUpdatedAt.GetName()]; f != nil {
				_ = dc.FromPayload(f, &changed)
			}
			if c := ex.GetCloseTime(); c != nil && c.AsTime().After(changed) {
				changed = c.AsTime()
			}
			var memo *MonitorMemo
			if p := ex.GetMemo().GetFields()[MonitorMemoKey]; p != nil {
				var m MonitorMemo
				if err := dc.FromPayload(p, &m); err == nil && m.Epoch != "" {
					memo = &m
				}
			}
			fn(ex.GetExecution().GetWorkflowId(), ex.GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_RUNNING, memo, changed)
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return nil
		}
	}
}
