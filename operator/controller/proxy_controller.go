package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

// Temporal is the part of the Temporal client the controller uses.
type Temporal interface {
	SignalWithStartWorkflow(ctx context.Context, workflowID string, signalName string, signalArg any,
		options client.StartWorkflowOptions, workflow any, workflowArgs ...any) (client.WorkflowRun, error)
	SignalWorkflow(ctx context.Context, workflowID string, runID string, signalName string, arg any) error
	DescribeWorkflow(ctx context.Context, workflowID, runID string) (*client.WorkflowExecutionDescription, error)
	ListWorkflow(ctx context.Context, request *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error)
}

var _ Temporal = client.Client(nil)

// secretRefIndex indexes Proxies by the cloud-init Secret they reference, so a Secret event
// finds its Proxies without listing the namespace.
const secretRefIndex = ".spec.cloudInit.secretRef.name"

// CacheOptions restricts the manager's Secret cache to Secrets labelled as cloud-init: the
// operator may read Secrets cluster-wide, and an unrestricted cache would hold all of them.
func CacheOptions() cache.Options {
	sel := labels.SelectorFromSet(labels.Set{v1alpha1.LabelCloudInit: "true"})
	return cache.Options{ByObject: map[ctrlclient.Object]cache.ByObject{&corev1.Secret{}: {Label: sel}}}
}

// Reasons of the events the controller records.
const (
	// EventTemporalUnavailable: a call to Temporal failed; the controller retries it.
	EventTemporalUnavailable = "TemporalUnavailable"
	// EventWorkflowRestarted: the Proxy's workflow had stopped while the Proxy still needed
	// it (terminated by hand or by a server limit, failed) and the controller started a new
	// run. Nothing else would until the spec changed: reconciles follow spec, cloud-init
	// Secret and deletion changes, never the workflow. It is a Warning because a run should never stop on its own; its message names the
	// workflow and the status it was found in.
	EventWorkflowRestarted = "WorkflowRestarted"
)

// ProxyReconciler forwards Proxy changes to their workflows.
type ProxyReconciler struct {
	Client   ctrlclient.Client
	Temporal Temporal
	Events   events.EventRecorder
	// Installation is this deployment's id, handed to new workflows.
	Installation string
	// TaskQueue defaults to contract.TaskQueue.
	TaskQueue string
	// Tuning is passed to new workflows (tests shorten timings).
	Tuning proxyinput.Tuning
	// RecheckDeleting is how often a deleting Proxy is looked at again in case the workflow
	// could not release it (default 30s). The workflow normally releases it at once.
	RecheckDeleting time.Duration
	// APIReader reads a Proxy uncached where a stale cache could do harm: Resync confirms
	// that the Proxy still lives before it starts its workflow again, since a workflow
	// started for a Proxy that was just deleted would provision an instance no one owns.
	// nil reads through Client.
	APIReader ctrlclient.Reader
}

// SetupWithManager registers the controller. Only Secrets labelled as cloud-init are in the
// manager's cache (see CacheOptions); a change to one re-enqueues the Proxies using it.
func (r *ProxyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Proxy{}, secretRefIndex, func(o ctrlclient.Object) []string {
		p := o.(*v1alpha1.Proxy)
		if p.Spec.CloudInit == nil {
			return nil
		}
		return []string{p.Spec.CloudInit.SecretRef.Name}
	}); err != nil {
		return err
	}
	// Status patches (the workflow's) do not bump the generation; reacting to them would
	// echo a duplicate signal for every status change.
	// The pool that controls the Proxy is metadata, not spec: a change of it is news for
	// the workflow.
	onSpecOrDelete := predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectNew.GetDeletionTimestamp() != nil || poolOf(e.ObjectOld) != poolOf(e.ObjectNew)
		},
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxy").
		For(&v1alpha1.Proxy{}, builder.WithPredicates(onSpecOrDelete)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesForSecret)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: 8,
			// Temporal being down is retried quickly enough to notice its return, and never
			// backs off past half a minute.
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](500*time.Millisecond, 30*time.Second),
		}).
		Complete(r)
}

func (r *ProxyReconciler) proxiesForSecret(ctx context.Context, o ctrlclient.Object) []reconcile.Request {
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, ctrlclient.InNamespace(o.GetNamespace()), ctrlclient.MatchingFields{secretRefIndex: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list proxies for secret", "secret", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
	}
	return reqs
}

// Reconcile hands the Proxy's current spec, or its deletion, to its workflow. Its span is
// the root of the trace that continues into the workflow and its activities.
func (r *ProxyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (res reconcile.Result, err error) {
	ctx, span := otel.Tracer("github.com/proxyfleet/proxyfleet/operator/controller").Start(ctx, "Reconcile Proxy",
		trace.WithAttributes(attribute.String("proxyfleet.namespace", req.Namespace), attribute.String("proxyfleet.name", req.Name)))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	var p v1alpha1.Proxy
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return reconcile.Result{}, ctrlclient.IgnoreNotFound(err)
	}
	if p.DeletionTimestamp != nil {
		res, err := r.reconcileDelete(ctx, &p)
		return res, wrap("delete", err)
	}
	if err := r.ensureFinalizer(ctx, &p); err != nil {
		return reconcile.Result{}, wrap("finalizer", err)
	}
	return reconcile.Result{}, wrap("signal", r.signalSpec(ctx, &p))
}

func wrap(phase string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", phase, err)
}

// ensureFinalizer adds the finalizer before the workflow can create anything, so no instance
// exists whose Proxy could vanish without a delete reaching its workflow.
func (r *ProxyReconciler) ensureFinalizer(ctx context.Context, p *v1alpha1.Proxy) error {
	if controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		return nil
	}
	before := p.DeepCopy()
	controllerutil.AddFinalizer(p, v1alpha1.Finalizer)
	return r.Client.Patch(ctx, p, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{}))
}

func (r *ProxyReconciler) taskQueue() string {
	if r.TaskQueue != "" {
		return r.TaskQueue
	}
	return contract.TaskQueue
}

func (r *ProxyReconciler) signalSpec(ctx context.Context, p *v1alpha1.Proxy) error {
	sig := proxyinput.SpecSignal{
		UID:           string(p.UID),
		Generation:    p.Generation,
		SecretVersion: r.secretVersion(ctx, p),
		Spec:          p.Spec,
		Pool:          poolOf(p),
	}
	id, opts, in := r.startArgs(p)
	if _, err := r.Temporal.SignalWithStartWorkflow(ctx, id, contract.SignalSpec, sig, opts, contract.ProxyWorkflowType, in); err != nil {
		r.warn(p, "Signal", "cannot reach Temporal to hand over generation %d: %v (retrying)", p.Generation, err)
		return err
	}
	return nil
}

// startArgs are the workflow ID, options and input of every SignalWithStart for p: whichever
// signal starts a run, the run must be the same workflow on the same queue.
func (r *ProxyReconciler) startArgs(p *v1alpha1.Proxy) (string, client.StartWorkflowOptions, proxyinput.Start) {
	id := contract.ProxyWorkflowID(p.Namespace, p.Name)
	opts := client.StartWorkflowOptions{
		ID:                    id,
		TaskQueue:             r.taskQueue(),
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		StaticSummary:         fmt.Sprintf("Proxy %s/%s (%s)", p.Namespace, p.Name, p.Spec.ProviderLabel()),
		TypedSearchAttributes: contract.InitialSearchAttributes(p.Spec.ProviderLabel()),
	}
	in := proxyinput.Start{Namespace: p.Namespace, Name: p.Name, Installation: r.Installation, Tuning: r.Tuning}
	return id, opts, in
}

// startCleanup starts a run whose first signal is the delete: it finds the instances earlier
// runs left by the Proxy's UID label, deletes them and releases the finalizer itself.
// Releasing the finalizer here instead would leak whatever a stopped run had created.
func (r *ProxyReconciler) startCleanup(ctx context.Context, p *v1alpha1.Proxy, why string) error {
	id, opts, in := r.startArgs(p)
	if _, err := r.Temporal.SignalWithStartWorkflow(ctx, id, contract.SignalDelete, contract.DeleteSignal{UID: string(p.UID)},
		opts, contract.ProxyWorkflowType, in); err != nil {
		r.warn(p, "Delete", "cannot reach Temporal to start a run that deletes the instances: %v (retrying)", err)
		return err
	}
	if r.Events != nil {
		r.Events.Eventf(p, nil, corev1.EventTypeWarning, EventWorkflowRestarted, "Delete",
			"workflow %s %s; started a run to delete the Proxy's instances", id, why)
	}
	return nil
}

// secretVersion is the resourceVersion of the referenced cloud-init Secret (from the cache,
// which holds only labelled Secrets), or "" when there is none. It is a change detector:
// only the version enters the signal and the workflow's history; the data is read and used
// by the worker's activities alone (the operator's cache does hold labelled Secrets whole).
func (r *ProxyReconciler) secretVersion(ctx context.Context, p *v1alpha1.Proxy) string {
	if p.Spec.CloudInit == nil {
		return ""
	}
	var s corev1.Secret
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.CloudInit.SecretRef.Name}, &s); err != nil {
		return ""
	}
	return s.ResourceVersion
}

func (r *ProxyReconciler) reconcileDelete(ctx context.Context, p *v1alpha1.Proxy) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		return reconcile.Result{}, nil
	}
	recheck := r.RecheckDeleting
	if recheck <= 0 {
		recheck = 30 * time.Second
	}
	id := contract.ProxyWorkflowID(p.Namespace, p.Name)
	err := r.Temporal.SignalWorkflow(ctx, id, "", contract.SignalDelete, contract.DeleteSignal{UID: string(p.UID)})
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		// No running workflow. If none ever ran for this object (its status, written only by
		// the workflow, names none), nothing was created and the finalizer can go. If one
		// ran, it may have stopped (terminated by hand, by a server limit, failed) holding
		// an instance: only a run can find and delete that, so start one.
		if p.Status.WorkflowID == "" {
			return reconcile.Result{}, r.releaseFinalizer(ctx, p)
		}
		if err := r.startCleanup(ctx, p, "was not running"); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: recheck}, nil
	case err != nil:
		r.warn(p, "Delete", "cannot reach Temporal to delete the instance: %v (retrying)", err)
		return reconcile.Result{}, err
	}
	// The workflow removes the finalizer itself once its instances are gone; looking again
	// later covers a run that stops before it is done.
	desc, err := r.Temporal.DescribeWorkflow(ctx, id, "")
	if err == nil {
		switch desc.Status {
		case enums.WORKFLOW_EXECUTION_STATUS_RUNNING:
		case enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW:
			// A ProxyWorkflow completes only once it has deleted its instances and released
			// the finalizer (this p predates that), or continues as new with its state. The
			// next look finds no finalizer, or no running workflow and starts a cleanup run.
		default:
			// The run we just signalled stopped before deleting anything: it may hold an
			// instance, so the finalizer stays until a new run has deleted it.
			if err := r.startCleanup(ctx, p, "was "+desc.Status.String()); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	return reconcile.Result{RequeueAfter: recheck}, nil
}

func (r *ProxyReconciler) releaseFinalizer(ctx context.Context, p *v1alpha1.Proxy) error {
	before := p.DeepCopy()
	controllerutil.RemoveFinalizer(p, v1alpha1.Finalizer)
	err := r.Client.Patch(ctx, p, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (r *ProxyReconciler) warn(p *v1alpha1.Proxy, action, format string, args ...any) {
	if r.Events != nil {
		r.Events.Eventf(p, nil, corev1.EventTypeWarning, EventTemporalUnavailable, action, format, args...)
	}
}

// poolOf is the name of the ProxyPool that controls p, or "": its workflow then waits for
// the pool's grant before a replacement of its own (see PoolReconciler).
func poolOf(p metav1.Object) string {
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "ProxyPool" &&
		strings.HasPrefix(ref.APIVersion, v1alpha1.GroupVersion.Group+"/") {
		return ref.Name
	}
	return ""
}
