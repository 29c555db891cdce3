package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// How the run takes signals: each is handed to the core (transitions.go), whose effect tells the
// loop whether to re-plan, publish or log.

func (w *proxyWorkflow) addSignals(sel workflow.Selector) {
	onSignal(w, sel, w.ch.spec, func(sig SpecSignal) effect { return w.state.applySpec(sig) })
	onSignal(w, sel, w.ch.del, func(sig contract.DeleteSignal) effect { return w.state.requestDelete(sig) })
	onSignal(w, sel, w.ch.report, func(sig contract.ReportSignal) effect { return w.state.report(sig, w.now()) })
	onSignal(w, sel, w.ch.repl, func(sig contract.ReplaceSignal) effect { return w.state.requestReplace(sig) })
	if w.policy.serveWhileReplacing {
		sel.AddReceive(w.ch.monitor, func(c workflow.ReceiveChannel, _ bool) {
			if r := w.receiveReport(c); r != nil {
				w.applyReport(r)
			}
		})
	}
}

// onSignal adds ch to sel: a signal received there is counted against the run's budget
// and handed to take, whose effect the loop carries out.
func onSignal[T any](w *proxyWorkflow, sel workflow.Selector, ch workflow.ReceiveChannel, take func(T) effect) {
	sel.AddReceive(ch, func(c workflow.ReceiveChannel, _ bool) {
		var sig T
		c.ReceiveAsync(&sig)
		w.budget.signals++
		w.budget.cost += costSignal
		w.apply(take(sig))
	})
}

// applyReport applies a shard's report in whatever step the run is. A changed verdict or
// address is published at the next chance (await and the waits publish a dirty memo); an
// instance lost behind the run's back changes the plan, so an interruptible step stops.
func (w *proxyWorkflow) applyReport(r *activities.MonitorReport) {
	s := w.state
	before := s.Health
	inst := s.Instance
	e := s.monitorReturned(r.Result, w.now())
	w.apply(e)
	w.flags.reported = true
	if s.Instance != inst {
		w.flags.interrupt, w.flags.watchLeft, w.flags.urgent = true, true, true
	}
	if before.Known != s.Health.Known || before.Healthy != s.Health.Healthy || before.FailureReason != s.Health.FailureReason {
		w.flags.urgent = true
	}
	if e.publish || w.flags.urgent || before.LatencyMillis != s.Health.LatencyMillis || before.LastFailure != s.Health.LastFailure {
		w.flags.memoDirty = true
	}
}

// drainSignals applies every signal already received, without blocking.
func (w *proxyWorkflow) drainSignals() {
	s := w.state
	for {
		var spec SpecSignal
		var del contract.DeleteSignal
		var repl contract.ReplaceSignal
		var rep contract.ReportSignal
		switch {
		case w.ch.spec.ReceiveAsync(&spec):
			w.apply(s.applySpec(spec))
		case w.ch.del.ReceiveAsync(&del):
			w.apply(s.requestDelete(del))
		case w.ch.repl.ReceiveAsync(&repl):
			w.apply(s.requestReplace(repl))
		case w.ch.report.ReceiveAsync(&rep):
			w.apply(s.report(rep, w.now()))
		case w.policy.serveWhileReplacing && w.ch.monitor.Len() > 0:
			// receiveReport counts the signal itself.
			if r := w.receiveReport(w.ch.monitor); r != nil {
				w.applyReport(r)
			}
			continue
		default:
			return
		}
		w.budget.signals++
		w.budget.cost += costSignal
	}
}

// apply carries out what a transition of the core asks of the loop.
func (w *proxyWorkflow) apply(e effect) {
	if e.replan {
		w.flags.interrupt = true
	}
	if e.publish {
		w.flags.memoDirty = true
	}
	switch {
	case e.note == "":
	case e.warn:
		w.log.Warn(e.note, "uid", w.state.UID)
	default:
		w.log.Info(e.note, "uid", w.state.UID)
	}
}

// receiveReport takes one shard report off c: it returns it if it is about what the run
// watches now, or nil if it is stale (about an instance since replaced, a health check
// since changed), which is dropped.
func (w *proxyWorkflow) receiveReport(c workflow.ReceiveChannel) *activities.MonitorReport {
	var r activities.MonitorReport
	c.ReceiveAsync(&r)
	w.budget.signals++
	w.budget.cost += costSignal
	if w.reportStale(r.Epoch) {
		w.log.Info("dropped a stale monitor report", "uid", w.state.UID, "epoch", r.Epoch, "reason", r.Result.Reason)
		return nil
	}
	return &r
}

// reportStale reports whether a shard's report for epoch is about something the run no
// longer watches. Runs of version 4 take only the epoch they last published. Later ones,
// which read reports in every step, also take the epoch of what they watch now: before
// their first publish, a continued run carries on its predecessor's watch, and a report
// for it may already be waiting. And they stop taking the published epoch once a report
// moved the run off it (the instance was lost): a second copy of that report (reports are
// delivered at least once) must not be applied to the instance that took over.
func (w *proxyWorkflow) reportStale(epoch string) bool {
	if epoch == "" {
		return true
	}
	if !w.policy.serveWhileReplacing {
		return !w.written.watchSet || epoch != w.written.watchEpoch
	}
	if w.written.watchSet && epoch == w.written.watchEpoch && !w.flags.watchLeft {
		return false
	}
	cur := w.view().watch()
	return cur == nil || cur.Epoch != epoch
}
