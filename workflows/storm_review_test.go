package workflows

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReviewReportStormDuringALongDeleteStaysInBudget: version 5's await publishes the memo
// on every dirty change while a step's activity runs, and a non-interruptible step (create,
// delete, list) never checks overBudget. The old instance's delete hangs for an hour (one
// DeleteInstance may take 15 minutes a try, five tries); meanwhile crawlers report the
// proxy rate-limited on 700 distinct sites (discovery coalesces per target, not per
// proxy; 700 signals is under MaxRunSignals). Each report rewrites the whole memo, whose
// cooldowns grow to 256 entries: tens of kilobytes per upsert, hundreds of upserts, all in
// one run that cannot continue as new until the delete returns. Version 4 wrote one memo
// after the delete. The run's history passes DefaultMaxRunBytes (8 MiB, the budget meant to
// keep it "well before" the server's 10 MB warning and 50 MB termination).
func TestReviewReportStormDuringALongDeleteStaysInBudget(t *testing.T) {
	reviewVersions(t, reviewReportStorm)
}

func reviewReportStorm(t *testing.T, v workflow.Version) {
	h := newHarness(t, reviewVersion(v), func(h *harness) {
		acts := &activities.Activities{}
		h.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.MatchedBy(func(in activities.InstanceInput) bool {
			return in.Name == InstanceName(h.uid, 1)
		})).After(time.Hour).Return(func(ctx context.Context, in activities.InstanceInput) error {
			return h.prov.Delete(ctx, in.ProviderID)
		})
		h.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.InstanceInput) error {
			return h.prov.Delete(ctx, in.ProviderID)
		})
	})
	h.specAt(0, 1, h.spec())
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	const reports = 700
	for i := range reports {
		at := 21*time.Minute + time.Duration(i)*5*time.Second
		h.env.RegisterDelayedCallback(func() {
			target := fmt.Sprintf("shop-%04d.%s.example", i, strings.Repeat("x", 40))
			h.env.SignalWorkflow(contract.SignalReport, contract.ReportSignal{
				Target: target, Result: contract.ReportRateLimited, Until: h.env.Now().Add(time.Hour)})
		}, at)
	}
	var during runCounts
	h.checkAt(79*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 1), InstanceName(h.uid, 2)}, h.prov.names(), "the old instance is still being deleted")
		during = h.rec.take()
	})
	tuning := fastTuning()
	tuning.MaxRunAge = 3 * time.Hour
	h.run(tuning)
	// The run ends by continue-as-new once the delete returns (over its event budget).
	assert.True(t, h.env.IsWorkflowCompleted())
	assert.Equal(t, h.checks, h.ran, "some checks never ran")
	t.Logf("while the delete ran: %d signals, %d upserts, %d local activities, bound %d events / %d bytes",
		during.signals, during.upserts, during.localActivities, during.events(), during.bytes())
	assert.Less(t, during.bytes(), DefaultMaxRunBytes,
		"one run's history grew past its byte budget while a single delete ran (%d memo/search-attribute upserts)", during.upserts)
}
