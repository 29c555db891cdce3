package workflows

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// continuedAs returns the input the run continued as new with, failing if it did not.
func (h *harness) continuedAs() ProxyWorkflowInput {
	h.t.Helper()
	require.True(h.t, h.env.IsWorkflowCompleted(), "the run did not end")
	assert.Equal(h.t, h.checks, h.ran, "some checks never ran")
	var can *workflow.ContinueAsNewError
	require.ErrorAs(h.t, h.env.GetWorkflowError(), &can, "expected continue-as-new")
	var next ProxyWorkflowInput
	require.NoError(h.t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.NotNil(h.t, next.State)
	return next
}

// TestStableRunEndsAtMaxRunAge: a healthy proxy nobody touches still ends its run, so old
// code and tuning retire; nothing about the proxy changes across it.
func TestStableRunEndsAtMaxRunAge(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	tuning := fastTuning()
	tuning.MaxRunAge = 6 * time.Hour
	h.checkAt(5*time.Hour, func() {
		assert.False(t, h.env.IsWorkflowCompleted())
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase)
	})
	h.run(tuning)
	next := h.continuedAs()
	assert.Equal(t, InstanceName(h.uid, 1), next.State.Instance.Name)
	assert.True(t, next.State.Health.Healthy)
	assert.Equal(t, []string{"create " + InstanceName(h.uid, 1)}, h.prov.ops, "continuing as new touches no instance")
}

// TestReportsEndTheRunOnTheSignalBudget: a steady stream of reports never piles up in one
// run; the cooldowns they set are carried to the next.
func TestReportsEndTheRunOnTheSignalBudget(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	tuning := fastTuning()
	tuning.MaxRunSignals = 50
	for i := range 200 {
		h.signalAt(10*time.Minute+time.Duration(i)*time.Minute, contract.SignalReport,
			contract.ReportSignal{Target: fmt.Sprintf("t%d.example", i), Result: contract.ReportRateLimited})
	}
	h.run(tuning)
	next := h.continuedAs()
	assert.LessOrEqual(t, len(next.State.Cooldowns), 50)
	// The spec, the monitor shard's first verdict and 48 reports make 50 signals: the run
	// ends at the 48th report.
	assert.Equal(t, 1, h.shard.reports)
	assert.Contains(t, next.State.Cooldowns, "t47.example")
	assert.NotContains(t, next.State.Cooldowns, "t48.example")
	assert.Equal(t, 57*time.Minute, h.env.Now().Sub(h.start))
}

// TestRunEndsOnHistorySize: a run whose history grew large (bytes or events, as the server
// counts them) ends at the next thing that happens, even while steady.
func TestRunEndsOnHistorySize(t *testing.T) {
	for name, grow := range map[string]func(h *harness){
		"bytes":     func(h *harness) { h.env.SetCurrentHistorySize(DefaultMaxRunBytes) },
		"events":    func(h *harness) { h.env.SetCurrentHistoryLength(DefaultHistoryLimit) },
		"suggested": func(h *harness) { h.env.SetContinueAsNewSuggested(true) },
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.specAt(0, 1, h.spec())
			h.env.RegisterDelayedCallback(func() { grow(h) }, 30*time.Minute)
			h.signalAt(31*time.Minute, contract.SignalReport, contract.ReportSignal{Target: "a.example", Result: contract.ReportBanned})
			h.run(fastTuning())
			next := h.continuedAs()
			assert.Contains(t, next.State.Cooldowns, "a.example")
			assert.Equal(t, 31*time.Minute, h.env.Now().Sub(h.start), "ended at the report, not at the next timer")
		})
	}
}

// TestIdleRunPublishesReportsAndEnds: a Proxy latched Failed waits for a new generation;
// reports still reach discovery, and its run ends on the same budget.
func TestIdleRunPublishesReportsAndEnds(t *testing.T) {
	h := newHarness(t)
	h.prov.createErrs = []error{permanentErr("zone does not exist")}
	h.specAt(0, 1, h.spec())
	tuning := fastTuning()
	tuning.MaxRunAge = 24 * time.Hour
	h.signalAt(time.Hour, contract.SignalReport, contract.ReportSignal{Target: "a.example", Result: contract.ReportBanned})
	h.checkAt(2*time.Hour, func() {
		assert.Equal(t, v1alpha1.PhaseFailed, h.lastStatus().Phase)
		assert.Contains(t, h.memo().Cooldowns, "a.example", "the report was published while idle")
	})
	h.run(tuning)
	next := h.continuedAs()
	require.NotNil(t, next.State.Failure, "the latch is carried")
	assert.Equal(t, 24*time.Hour, h.env.Now().Sub(h.start))
}
