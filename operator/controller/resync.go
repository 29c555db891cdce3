package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// DefaultResyncInterval is how often the resync looks for Proxies whose workflow stopped,
// when Options.ResyncInterval is 0. A stopped workflow leaves its Proxy out of discovery
// for up to this long; each pass costs one visibility list per 1,000 running workflows.
const DefaultResyncInterval = 2 * time.Minute

// Resync runs one pass of the periodic resync: every live Proxy (not being deleted, holding
// the finalizer) whose workflow is not running gets a new run, started as a reconcile
// starts one, with a Warning event EventWorkflowRestarted. Reconciles follow the Proxy's
// spec, its cloud-init Secret and its deletion, never the workflow, so a run that stops while
// its Proxy lives (terminated by hand or by a server limit, failed) would otherwise not come
// back until the spec changed, and the Proxy would drop out of discovery while Kubernetes
// kept showing its last status.
//
// Running workflows are read from Temporal's visibility, which lags: a Proxy missing from it
// is confirmed with DescribeWorkflow before anything is started. It returns how many
// workflows it started. An error means the pass was skipped (a list failed); errors about
// one Proxy are logged and the pass goes on. The manager runs it every ResyncInterval;
// tests call it directly.
func (r *ProxyReconciler) Resync(ctx context.Context) (int, error) {
	logger := log.FromContext(ctx)
	running, err := r.runningWorkflows(ctx)
	if err != nil {
		return 0, fmt.Errorf("list running workflows: %w", err)
	}
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("list proxies: %w", err)
	}
	restarted := 0
	for i := range list.Items {
		if ctx.Err() != nil {
			return restarted, ctx.Err()
		}
		p := &list.Items[i]
		id := contract.ProxyWorkflowID(p.Namespace, p.Name)
		// A Proxy without the finalizer has not been reconciled yet (its reconcile starts the
		// workflow); a deleting one is the delete path's to finish.
		if p.DeletionTimestamp != nil || !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) || running[id] {
			continue
		}
		ok, err := r.restartIfStopped(ctx, p, id)
		if err != nil {
			logger.Error(err, "cannot restart a workflow; trying again next pass", "workflow", id)
			continue
		}
		if ok {
			restarted++
		}
	}
	return restarted, nil
}

// runningWorkflows is the set of running ProxyWorkflow IDs, by the query discovery and the
// orphan sweep use, so that all three agree on what is live.
func (r *ProxyReconciler) runningWorkflows(ctx context.Context) (map[string]bool, error) {
	running := map[string]bool{}
	var token []byte
	for {
		resp, err := r.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: contract.RunningProxiesQuery, PageSize: 1000, NextPageToken: token,
		})
		if err != nil {
			return nil, err
		}
		for _, ex := range resp.GetExecutions() {
			running[ex.GetExecution().GetWorkflowId()] = true
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return running, nil
		}
	}
}

// restartIfStopped starts p's workflow again if DescribeWorkflow confirms that its latest run
// is not running, and reports whether it did.
func (r *ProxyReconciler) restartIfStopped(ctx context.Context, p *v1alpha1.Proxy, id string) (restarted bool, err error) {
	var status string
	desc, err := r.Temporal.DescribeWorkflow(ctx, id, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		// Never started, or its history is past retention: either way nothing runs it.
		status = "not found"
	case err != nil:
		return false, fmt.Errorf("describe: %w", err)
	case desc.Status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING:
		return false, nil // visibility had not caught up
	default:
		status = desc.Status.String()
	}
	// The list came from the cache, which may predate a deletion: a run started for a Proxy
	// that is gone would provision an instance no finalizer guards. Read it afresh, which
	// also hands the new run the newest spec.
	fresh, err := r.liveProxy(ctx, p)
	if fresh == nil || err != nil {
		return false, err
	}
	ctx, span := otel.Tracer("github.com/proxyfleet/proxyfleet/operator/controller").Start(ctx, "Restart Proxy workflow",
		trace.WithAttributes(attribute.String("proxyfleet.namespace", p.Namespace), attribute.String("proxyfleet.name", p.Name),
			attribute.String("proxyfleet.workflow_status", status)))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	if err := r.signalSpec(ctx, fresh); err != nil {
		return false, fmt.Errorf("start: %w", err)
	}
	workflowRestarts.Inc()
	if r.Events != nil {
		r.Events.Eventf(fresh, nil, corev1.EventTypeWarning, EventWorkflowRestarted, "Resync",
			"workflow %s was %s; started it again", id, status)
	}
	log.FromContext(ctx).Info("started a stopped workflow again", "workflow", id, "status", status, "uid", fresh.UID)
	return true, nil
}

// liveProxy re-reads p bypassing the cache: nil (and no error) if it is gone, is another
// object now, is being deleted or has lost the finalizer.
func (r *ProxyReconciler) liveProxy(ctx context.Context, p *v1alpha1.Proxy) (*v1alpha1.Proxy, error) {
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	var fresh v1alpha1.Proxy
	err := reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, &fresh)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get proxy: %w", err)
	}
	if fresh.UID != p.UID || fresh.DeletionTimestamp != nil || !controllerutil.ContainsFinalizer(&fresh, v1alpha1.Finalizer) {
		return nil, nil
	}
	return &fresh, nil
}

// resyncRunnable runs Resync every interval in the elected leader: two replicas resyncing
// would race to start the same runs (harmless, but twice the Temporal traffic and events).
type resyncRunnable struct {
	r        *ProxyReconciler
	interval time.Duration
	log      logr.Logger
}

var (
	_ manager.Runnable               = (*resyncRunnable)(nil)
	_ manager.LeaderElectionRunnable = (*resyncRunnable)(nil)
)

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (s *resyncRunnable) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable. The first pass waits one interval: when the manager
// starts, every Proxy is reconciled anyway, and each reconcile starts its workflow again.
func (s *resyncRunnable) Start(ctx context.Context) error {
	ctx = log.IntoContext(ctx, s.log)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := s.r.Resync(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.log.Error(err, "resync skipped; trying again next interval")
		case n > 0:
			s.log.Info("resync started stopped workflows again", "count", n)
		}
	}
}
