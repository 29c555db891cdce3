package workflows

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Limits every run of the soak must stay under, whatever arrives: well below the server's
// warning (10,240 events, 10 MB) and far below its hard limits (51,200 events, 50 MB).
const (
	soakMaxEvents = 10_000
	soakMaxBytes  = 8 << 20
	// soakMaxCarried bounds the state one run hands the next.
	soakMaxCarried = 160 << 10
)

// window is a span of simulated time, as offsets from the soak's start.
type window struct{ from, to time.Duration }

func (w window) has(d time.Duration) bool { return d >= w.from && d < w.to }

const day = 24 * time.Hour

// soakEvent is one thing that happens to the Proxy from outside, at an offset from the start.
type soakEvent struct {
	at     time.Duration
	signal string
	arg    any
}

// soakRun is what one run did.
type soakRun struct {
	start, end time.Duration
	ending     string // "continued", "terminated", "completed"
	counts     runCounts
	carried    int
}

// TestMonthsInMinutes drives one Proxy through 90 simulated days in Temporal's
// time-skipping test environment: a crawler report every minute across thousands of
// targets, bursts of bans that force replacements, replacements by hand, a week of quota
// refusals, Kubernetes API outages, and a termination by hand, then the deletion. Every
// run must end by continue-as-new (but for the terminated one and the last), stay under a
// fixed event count and byte size, and hand on a bounded state; no instance may leak or be
// created twice, and the final status must match.
//
// It takes about 15 seconds. SOAK_DAYS shortens or lengthens it; SOAK_REPORT=path writes the
// figures as JSON; SOAK_DEBUG=1 logs every run. SOAK_BASELINE_V0=1 runs the same reports and
// replacements (no outage, no termination) with the workflow pinned to version 0, before
// runs were bounded, and only reports what its one run grew to.
func TestMonthsInMinutes(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes the soak take minutes; make test runs it without (make soak)")
	}
	days := 90
	if v := os.Getenv("SOAK_DAYS"); v != "" {
		_, err := fmt.Sscan(v, &days)
		require.NoError(t, err)
	}
	total := time.Duration(days) * day
	uid := "uid-1"
	banTargets := int32(100)
	banWindow := v1alpha1.Duration("1h")
	spec := v1alpha1.ProxySpec{
		Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
		HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", Interval: "10s", Timeout: "5s", SuccessThreshold: 2, FailureThreshold: 3, ExpectedStatus: 200},
		MaxLeases:   4,
		Lifecycle:   &v1alpha1.Lifecycle{BanReplaceTargets: &banTargets, BanWindow: &banWindow},
	}
	specSignal := SpecSignal{UID: uid, Generation: 1, Spec: spec}

	// What happens from outside, in time order.
	events := []soakEvent{{at: 0, signal: contract.SignalSpec, arg: specSignal}}
	for m := time.Minute; m < total; m += time.Minute {
		i := int(m / time.Minute)
		result := contract.ReportRateLimited
		if i%5 == 0 {
			result = contract.ReportBanned
		}
		events = append(events, soakEvent{at: m, signal: contract.SignalReport,
			arg: contract.ReportSignal{Target: fmt.Sprintf("t%d.example", i%5000), Result: result}})
	}
	// Ban bursts: 150 distinct targets within a few minutes replace the instance.
	for _, d := range []time.Duration{9*day + 3*time.Hour, 41*day + 7*time.Hour, 77 * day} {
		for i := range 150 {
			events = append(events, soakEvent{at: d + time.Duration(i)*time.Second, signal: contract.SignalReport,
				arg: contract.ReportSignal{Target: fmt.Sprintf("burst-%d-%d.example", d/day, i), Result: contract.ReportBanned}})
		}
	}
	for _, d := range []time.Duration{5 * day, 20*day + 12*time.Hour, 62 * day, 85 * day} {
		events = append(events, soakEvent{at: d + 30*time.Second, signal: contract.SignalReplace, arg: contract.ReplaceSignal{Reason: "manual"}})
	}
	// A new generation (attributes only) every 10 days: no new instance, a new status.
	for g, d := 2, 10*day+time.Hour; d < total; g, d = g+1, d+10*day {
		s := spec
		s.Attributes = map[string]v1alpha1.AttributeValue{"gen": v1alpha1.AttributeValue(fmt.Sprint(g))}
		events = append(events, soakEvent{at: d, signal: contract.SignalSpec, arg: SpecSignal{UID: uid, Generation: int64(g), Spec: s}})
	}
	events = append(events, soakEvent{at: total, signal: contract.SignalDelete, arg: contract.DeleteSignal{UID: uid}})
	slices.SortStableFunc(events, func(a, b soakEvent) int { return cmp.Compare(a.at, b.at) })

	quota := window{20 * day, 27 * day}
	outages := []window{{33 * day, 33*day + 2*time.Hour}, {70 * day, 70*day + 30*time.Minute}, {total - 10*time.Minute, total + time.Hour}}
	baseline := os.Getenv("SOAK_BASELINE_V0") != ""
	if baseline {
		outages = nil // version 0 failed the workflow when the finalizer could not be released
	}
	terminateAt := 50*day + 6*time.Hour

	prov := newFakeProvider()
	var runs []soakRun
	var lastSpec SpecSignal = specSignal
	var statuses []v1alpha1.ProxyStatus
	released := 0
	next := 0 // index of the next event to deliver
	start := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	now := time.Duration(0)
	in := ProxyWorkflowInput{Namespace: "ns", Name: "p", Installation: "test"}
	terminated := baseline // the baseline is never terminated

	for len(runs) < 1000 {
		// The Proxy object keeps the last status any run published; a run that starts
		// without state reads its replacement count from there.
		var published int32
		for _, st := range statuses {
			published = st.Replacements
		}
		h := newHarness(t, func(h *harness) {
			if baseline {
				h.env.OnGetVersion(versionChangeID, workflow.DefaultVersion, versionLatest).Return(workflow.DefaultVersion)
			}
			acts := &activities.Activities{Providers: h.reg, Installation: "test", Keyring: testKeys}
			h.env.OnActivity(acts.FindInstances, mock.Anything, mock.Anything).Return(
				func(ctx context.Context, in activities.FindInput) (activities.FindResult, error) {
					res, err := acts.FindInstances(ctx, in)
					res.Replacements = published
					return res, err
				})
		})
		h.prov = prov
		h.reg[v1alpha1.ProviderLocal] = prov
		env := h.env
		env.SetTestTimeout(5 * time.Minute)
		env.SetStartTime(start.Add(now))
		runStart := now
		offset := func() time.Duration { return env.Now().Sub(start) }
		prov.createHook = func(string) error {
			if quota.has(offset()) {
				return provider.QuotaError(errors.New("ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources"))
			}
			return nil
		}
		down := func(d time.Duration) bool {
			for _, w := range outages {
				if w.has(d) {
					return true
				}
			}
			return false
		}
		h.setAPIDown(down(now))
		for _, w := range outages {
			for _, edge := range []time.Duration{w.from, w.to} {
				if edge > now {
					env.RegisterDelayedCallback(func() { h.setAPIDown(down(offset())) }, edge-now)
				}
			}
		}
		if !terminated {
			env.SetWorkflowRunTimeout(terminateAt - now)
		}
		if in.State == nil && runStart > 0 {
			// A run started by the controller's resync gets the spec first, as it would.
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(contract.SignalSpec, lastSpec) }, 0)
		}
		// Deliver events one after the other: each callback sends one and schedules the next.
		var deliver func()
		deliver = func() {
			if env.IsWorkflowCompleted() || next >= len(events) {
				return
			}
			e := events[next]
			next++
			if s, ok := e.arg.(SpecSignal); ok {
				lastSpec = s
			}
			env.SignalWorkflow(e.signal, e.arg)
			if next < len(events) {
				env.RegisterDelayedCallback(deliver, events[next].at-offset())
			}
		}
		if next < len(events) {
			env.RegisterDelayedCallback(deliver, max(events[next].at-now, 0))
		}

		h.runInput(in)

		require.True(t, env.IsWorkflowCompleted())
		now = offset()
		run := soakRun{start: runStart, end: now, counts: h.rec.take()}
		h.mu.Lock()
		statuses = append(statuses, h.statuses...)
		released += h.released
		h.mu.Unlock()
		err := env.GetWorkflowError()
		var can *workflow.ContinueAsNewError
		var timeout *temporal.TimeoutError
		switch {
		case errors.As(err, &can):
			run.ending = "continued"
			var nextIn ProxyWorkflowInput
			require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &nextIn))
			b, err := json.Marshal(nextIn)
			require.NoError(t, err)
			run.carried = len(b)
			in = nextIn
		case errors.As(err, &timeout):
			// Terminated by hand: its state is lost; the controller starts a fresh run.
			require.False(t, terminated)
			run.ending = "terminated"
			terminated = true
			in.State = nil
		default:
			var panicErr *temporal.PanicError
			if errors.As(err, &panicErr) {
				t.Fatalf("run %d panicked: %v\n%s", len(runs), panicErr, panicErr.StackTrace())
			}
			require.NoError(t, err, "run %d", len(runs))
			run.ending = "completed"
		}
		runs = append(runs, run)
		if os.Getenv("SOAK_DEBUG") != "" && len(statuses) > 0 {
			t.Logf("run %d %s..%s %s replacements=%d instance=%s ops=%d", len(runs), run.start, run.end, run.ending,
				statuses[len(statuses)-1].Replacements, statuses[len(statuses)-1].InstanceName, len(prov.ops))
		}
		if run.ending == "completed" {
			break
		}
	}

	if baseline {
		r := runs[0]
		t.Logf("version 0, %d days: %d run(s); the first: %d signals, %d events, %d bytes (bounds)", days, len(runs),
			r.counts.signals, r.counts.events(), r.counts.bytes())
		if path := os.Getenv("SOAK_REPORT"); path != "" {
			b, _ := json.MarshalIndent(map[string]any{"version": 0, "days": days, "runs": len(runs),
				"signals": r.counts.signals, "events": r.counts.events(), "bytes": r.counts.bytes()}, "", "  ")
			require.NoError(t, os.WriteFile(path, b, 0o644))
		}
		return
	}

	// Every run ended as it should and stayed bounded.
	require.NotEmpty(t, runs)
	assert.Equal(t, "completed", runs[len(runs)-1].ending)
	assert.True(t, terminated, "the termination by hand happened")
	assert.Equal(t, len(events), next, "every event was delivered")
	maxEvents, maxBytes, maxCarried, maxSignals := 0, 0, 0, 0
	var biggest soakRun
	for i, r := range runs {
		if i < len(runs)-1 && r.ending != "terminated" {
			assert.Equal(t, "continued", r.ending, "run %d", i)
		}
		assert.LessOrEqual(t, r.counts.events(), soakMaxEvents, "run %d: events", i)
		assert.LessOrEqual(t, r.counts.bytes(), soakMaxBytes, "run %d: bytes", i)
		assert.LessOrEqual(t, r.carried, soakMaxCarried, "run %d: carried state", i)
		if r.counts.events() > maxEvents {
			biggest = r
		}
		maxEvents = max(maxEvents, r.counts.events())
		maxBytes = max(maxBytes, r.counts.bytes())
		maxCarried = max(maxCarried, r.carried)
		maxSignals = max(maxSignals, r.counts.signals)
	}

	// No instance leaked or was created twice; never more than two at once.
	creates := map[string]int{}
	for _, op := range prov.ops {
		if name, ok := strings.CutPrefix(op, "create "); ok {
			creates[name]++
		}
	}
	for name, n := range creates {
		assert.Equal(t, 1, n, "%s created %d times", name, n)
	}
	assert.Empty(t, prov.names(), "every instance was deleted")
	assert.Len(t, creates, 1+int(lastReadyReplacements(statuses)), "one create per replacement, none after the termination")
	assert.LessOrEqual(t, slices.Max(prov.liveAfter), 2, "make-before-break never needs more than two")
	assert.Equal(t, 1, released, "the finalizer was released once, after the outage")

	// The status followed the state: replacements were counted, and the last status written
	// before the deletion described the instance that was serving.
	var lastReady v1alpha1.ProxyStatus
	for _, st := range statuses {
		if st.Phase == v1alpha1.PhaseReady {
			lastReady = st
		}
	}
	assert.GreaterOrEqual(t, lastReady.Replacements, int32(6), "bursts and manual replacements")
	assert.Equal(t, int64(lastSpec.Generation), lastReady.ObservedGeneration)
	assert.GreaterOrEqual(t, runs[len(runs)-1].end, total+time.Hour, "the finalizer waited out the last API outage")

	t.Logf("%d days: %d runs (%d continued as new), %d events delivered, %d instances created", days, len(runs),
		len(runs)-2, len(events), len(creates))
	t.Logf("biggest run: %s to %s, %+v", biggest.start, biggest.end, biggest.counts)
	t.Logf("per run at most: %d events, %d bytes (bounds), %d signals; carried state at most %d bytes", maxEvents, maxBytes, maxSignals, maxCarried)
	if path := os.Getenv("SOAK_REPORT"); path != "" {
		b, _ := json.MarshalIndent(map[string]any{
			"days": days, "runs": len(runs), "events": len(events), "instancesCreated": len(creates),
			"maxEventsPerRun": maxEvents, "maxBytesPerRun": maxBytes, "maxSignalsPerRun": maxSignals, "maxCarriedBytes": maxCarried,
		}, "", "  ")
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
}

func lastReadyReplacements(statuses []v1alpha1.ProxyStatus) int32 {
	var n int32
	for _, st := range statuses {
		n = max(n, st.Replacements)
	}
	return n
}
