package discovery

import (
	"context"
	"time"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Signaler forwards reports to the proxies' workflows, which keep cooldowns durably.
type Signaler interface {
	Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error
}

// TemporalSignaler signals ProxyWorkflows.
type TemporalSignaler struct {
	Client interface {
		SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
	}
}

// Report implements Signaler.
func (t TemporalSignaler) Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error {
	return t.Client.SignalWorkflow(ctx, contract.ProxyWorkflowID(namespace, name), "", contract.SignalReport, sig)
}

type pendingReport struct {
	namespace, name string
	sig             contract.ReportSignal
}

// forward queues sig for the workflow of l's proxy without waiting: a crawler's report
// must not wait for Temporal. When the queue is full the report is dropped (and counted);
// the local cooldown the caller set still applies.
func (s *Server) forward(l *Lease, sig contract.ReportSignal) {
	select {
	case s.reports <- pendingReport{namespace: l.Proxy.Namespace, name: l.Proxy.Name, sig: sig}:
	default:
		s.metrics.reportSignalFailures.Inc()
		s.log.Warn("report queue full; the local cooldown applies but is not made durable", "proxy", l.ProxyID)
	}
}

// RunReports forwards queued reports to Temporal until ctx ends, retrying each a few times.
func (s *Server) RunReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-s.reports:
			var err error
			for attempt := range 5 {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err = s.signal.Report(sctx, r.namespace, r.name, r.sig)
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(1<<attempt) * 200 * time.Millisecond):
				}
			}
			if err != nil {
				s.metrics.reportSignalFailures.Inc()
				s.log.Warn("report not forwarded to the proxy's workflow; the local cooldown still applies",
					"proxy", r.namespace+"/"+r.name, "target", r.sig.Target, "error", err)
			}
		}
	}
}
