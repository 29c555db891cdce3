package temporal

import (
	"context"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Signaler forwards reports to the proxies' workflows, which keep cooldowns durably: the
// discovery.Signaler of a process that runs against Temporal.
type Signaler struct {
	Client interface {
		SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
	}
}

var _ discovery.Signaler = Signaler{}

// Report signals the workflow of the proxy namespace/name.
func (t Signaler) Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error {
	return t.Client.SignalWorkflow(ctx, contract.ProxyWorkflowID(namespace, name), "", contract.SignalReport, sig)
}
