package workflows

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// recorder counts what a run asks of the server. The SDK's test environment keeps no
// history, so tests bound a run's history from outside: an upper bound on its events and
// bytes, computed from the signals it received and the commands it issued.
// TestRecorderBoundsRealHistories checks the bound against histories recorded on a real
// server.
type recorder struct {
	interceptor.WorkerInterceptorBase

	mu sync.Mutex
	runCounts
	// memo is the last memo the run published.
	memo contract.ProxyMemo
	// onWatch, if set, is told each MonitorMemo the run publishes (nil: it removed it).
	onWatch func(*activities.MonitorMemo)
	// verdicts is every Verdict the run published, in order (nil: it removed it).
	verdicts []*activities.Verdict
}

// runCounts is what one run did.
type runCounts struct {
	signals, activities, localActivities, timers, upserts, markers int
	// payload is the bytes of signal, activity-input and memo payloads.
	payload int
}

// Per-event costs of the bound. Each signal, activity completion and timer may need its own
// workflow task (scheduled, started, completed); an activity has scheduled, started, closed
// and possibly cancel-requested events; a timer started and fired or cancelled. Every event
// carries up to eventBytes of framing besides its payloads, and an activity's result up to
// resultBytes.
const (
	eventBytes  = 256
	resultBytes = 1024
)

// events is the upper bound on the run's history events.
// It charges what the workflow charges itself (the cost constants in budget.go), plus the
// closing event and the version marker, so the test checks the workflow's own accounting.
func (c runCounts) events() int {
	const closing = 1
	return costStart + closing + costSignal*c.signals + costActivity*c.activities + costTimer*c.timers +
		costLocal*c.localActivities + costUpsert*c.upserts + c.markers
}

// bytes is the upper bound on the run's history size.
func (c runCounts) bytes() int {
	return c.events()*eventBytes + c.payload + (c.activities+c.localActivities)*resultBytes
}

// take returns the counts so far and starts counting a new run.
//
//workflowcheck:ignore
func (r *recorder) take() runCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.runCounts
	r.runCounts = runCounts{}
	return c
}

// lastMemo is the memo the run published last.
//
//workflowcheck:ignore
func (r *recorder) lastMemo() contract.ProxyMemo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.memo
}

// add counts what f counts and the JSON bytes of payload.
//
//workflowcheck:ignore
func (r *recorder) add(f func(c *runCounts), payload ...any) {
	n := 0
	for _, p := range payload {
		b, _ := json.Marshal(p)
		n += len(b)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.runCounts)
	r.payload += n
}

func (r *recorder) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &recorderInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}, r: r}
}

type recorderInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	r *recorder
}

func (i *recorderInbound) Init(outbound interceptor.WorkflowOutboundInterceptor) error {
	return i.Next.Init(&recorderOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: outbound}, r: i.r})
}

//workflowcheck:ignore
func (i *recorderInbound) HandleSignal(ctx workflow.Context, in *interceptor.HandleSignalInput) error {
	i.r.mu.Lock()
	i.r.signals++
	i.r.payload += proto.Size(in.Arg)
	i.r.mu.Unlock()
	return i.Next.HandleSignal(ctx, in)
}

type recorderOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	r *recorder
}

func (o *recorderOutbound) ExecuteActivity(ctx workflow.Context, typ string, args ...any) workflow.Future {
	o.r.add(func(c *runCounts) { c.activities++ }, args...)
	return o.Next.ExecuteActivity(ctx, typ, args...)
}

func (o *recorderOutbound) ExecuteLocalActivity(ctx workflow.Context, typ string, args ...any) workflow.Future {
	o.r.add(func(c *runCounts) { c.localActivities++ }, args...)
	return o.Next.ExecuteLocalActivity(ctx, typ, args...)
}

func (o *recorderOutbound) NewTimer(ctx workflow.Context, d time.Duration) workflow.Future {
	o.r.add(func(c *runCounts) { c.timers++ })
	return o.Next.NewTimer(ctx, d)
}

func (o *recorderOutbound) NewTimerWithOptions(ctx workflow.Context, d time.Duration, opts workflow.TimerOptions) workflow.Future {
	o.r.add(func(c *runCounts) { c.timers++ })
	return o.Next.NewTimerWithOptions(ctx, d, opts)
}

func (o *recorderOutbound) UpsertTypedSearchAttributes(ctx workflow.Context, attrs ...temporal.SearchAttributeUpdate) error {
	o.r.add(func(c *runCounts) { c.upserts++; c.payload += 64 * len(attrs) })
	return o.Next.UpsertTypedSearchAttributes(ctx, attrs...)
}

//workflowcheck:ignore
func (o *recorderOutbound) UpsertMemo(ctx workflow.Context, memo map[string]any) error {
	o.r.add(func(c *runCounts) { c.upserts++ }, memo)
	if m, ok := memo[contract.MemoKey].(contract.ProxyMemo); ok {
		o.r.mu.Lock()
		o.r.memo = m
		o.r.mu.Unlock()
	}
	if v, ok := memo[activities.VerdictMemoKey]; ok {
		verdict, _ := v.(*activities.Verdict)
		o.r.mu.Lock()
		o.r.verdicts = append(o.r.verdicts, verdict)
		o.r.mu.Unlock()
	}
	if v, ok := memo[activities.MonitorMemoKey]; ok && o.r.onWatch != nil {
		watch, _ := v.(*activities.MonitorMemo)
		o.r.onWatch(watch)
	}
	return o.Next.UpsertMemo(ctx, memo)
}

func (o *recorderOutbound) GetVersion(ctx workflow.Context, changeID string, minSupported, maxSupported workflow.Version) workflow.Version {
	o.r.add(func(c *runCounts) { c.markers++ })
	return o.Next.GetVersion(ctx, changeID, minSupported, maxSupported)
}

// TestRecorderBoundsRealHistories: the recorder's bound holds for every history recorded
// from real runs on the Temporal dev server, so a test that keeps the bound under a limit
// keeps the real history under it too.
func TestRecorderBoundsRealHistories(t *testing.T) {
	for _, f := range recordedHistories(t) {
		t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
			fh, err := os.Open(f)
			require.NoError(t, err)
			defer fh.Close()
			hist, err := client.HistoryFromJSON(fh, client.HistoryJSONOptions{})
			require.NoError(t, err)

			rec := &recorder{}
			r, err := worker.NewWorkflowReplayerWithOptions(worker.WorkflowReplayerOptions{Interceptors: []interceptor.WorkerInterceptor{rec}})
			require.NoError(t, err)
			r.RegisterWorkflowWithOptions(ProxyWorkflow, workflow.RegisterOptions{Name: contract.ProxyWorkflowType})
			r.RegisterWorkflowWithOptions(GCWorkflow, workflow.RegisterOptions{Name: contract.GCWorkflowType})
			r.RegisterWorkflowWithOptions(MonitorShardWorkflow, workflow.RegisterOptions{Name: contract.MonitorShardWorkflowType})
			require.NoError(t, r.ReplayWorkflowHistory(nil, hist))

			c := rec.take()
			events, size := len(hist.Events), proto.Size(hist)
			t.Logf("real: %d events, %d bytes; bound: %d events, %d bytes", events, size, c.events(), c.bytes())
			assert.GreaterOrEqual(t, c.events(), events)
			assert.GreaterOrEqual(t, c.bytes(), size)
		})
	}
}
