package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// A ProxyPool is Kubernetes objects managing Kubernetes objects, as a ReplicaSet is: its
// Proxies are the durable part (each has its workflow, which owns its instances), so the
// pool itself is level-triggered from what the API server holds, and a restarted operator
// picks up where the last one stopped without state of its own. Each reconcile lists the
// pool's Proxies, plans (poolplan.go) and carries the plan out.

// Labels and the finalizer of pools.
const (
	// LabelPoolTemplate is the hash of the pool template a Proxy was last given.
	LabelPoolTemplate = "crawl.example.com/pool-template"
	// PoolFinalizer keeps a pool until its Proxies (and so their instances) are gone: the
	// pool deletes them itself rather than leave it to a garbage collector, so deleting a
	// pool ends the same way wherever it runs.
	PoolFinalizer = "crawl.example.com/pool-members"
	// AnnotationReplaceGranted is on a member the pool allowed to replace its instance
	// (RFC 3339 time of the grant) until its replacement has started: written before the
	// grant is sent, it keeps the grant counted against maxSurge across the moment
	// between the signal and the member's status saying Replacing, and across a restart
	// of the operator.
	AnnotationReplaceGranted = "crawl.example.com/replace-granted"
)

// Reasons of the pool's events and conditions.
const (
	EventPoolScaled      = "Scaled"
	EventPoolRolling     = "RollingUpdate"
	EventPoolDeleting    = "DeletingProxies"
	EventPoolGranted     = "ReplacementGranted"
	ReasonPoolSteady     = "Steady"
	ReasonPoolScaling    = "Scaling"
	ReasonPoolRolling    = "RollingUpdate"
	ReasonPoolAvailable  = "MinimumReplicasAvailable"
	ReasonPoolShortReady = "MinimumReplicasUnavailable"
)

// PoolReconciler keeps each ProxyPool's Proxies.
type PoolReconciler struct {
	Client ctrlclient.Client
	Events events.EventRecorder
	// Recheck is how soon a pool whose Proxies are still being deleted is looked at again
	// besides their own events (default 10s).
	Recheck time.Duration
	// Discovery, when set, is asked the leases and rests of a shrinking pool's proxies, so
	// that those crawlers use least go first.
	Discovery Discovery
	// Temporal carries the pool's grants to its members' workflows. Without it a member's
	// own replacement (maxAge, ill health, bans) waits for ever: the operator always has it.
	Temporal Signaler
	// Now is the clock (tests move it); nil is time.Now.
	Now func() time.Time

	mu sync.Mutex
	// expected is what this reconciler wrote on members and its cache may not show yet
	// (a ReplicaSet's expectations): a reconcile that follows at once, planning from a
	// cache without the write, would otherwise hand the same budget out again.
	expected map[types.UID]expectation
}

// expectation is a write on a member the cache has not shown yet.
type expectation struct {
	// grantedAt is a grant written; hash a template given. Zero when none.
	grantedAt time.Time
	hash      string
	// until is when it is forgotten: a cache a minute behind is a broken one, and the
	// objects as listed win.
	until time.Time
}

// expectationTTL bounds how long a write is expected: informers deliver in milliseconds.
const expectationTTL = time.Minute

// expect records writes on member uid.
func (r *PoolReconciler) expect(uid types.UID, now time.Time, change func(*expectation)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expected == nil {
		r.expected = map[types.UID]expectation{}
	}
	e := r.expected[uid]
	change(&e)
	e.until = now.Add(expectationTTL)
	r.expected[uid] = e
}

// applyExpected makes members as this reconciler last wrote them where the cache does not
// show it yet, and forgets what the cache shows or what is too old.
func (r *PoolReconciler) applyExpected(members []member, byName map[string]*v1alpha1.Proxy, hash string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range members {
		m := &members[i]
		p := byName[m.name]
		e, ok := r.expected[p.UID]
		if !ok {
			continue
		}
		if now.After(e.until) {
			delete(r.expected, p.UID)
			continue
		}
		if !e.grantedAt.IsZero() {
			if m.granted {
				e.grantedAt = time.Time{}
			} else {
				m.granted, m.grantedAt = true, e.grantedAt
			}
		}
		if e.hash != "" {
			if m.current || e.hash != hash {
				e.hash = ""
			} else {
				// Given the template: a step under way until its run takes it.
				m.current, m.settled = true, false
			}
		}
		if e.grantedAt.IsZero() && e.hash == "" {
			delete(r.expected, p.UID)
		} else {
			r.expected[p.UID] = e
		}
	}
}

// Signaler is the part of the Temporal client the pool uses.
type Signaler interface {
	SignalWorkflow(ctx context.Context, workflowID string, runID string, signalName string, arg any) error
}

// SetupWithManager registers the controller: it follows the pools and every change of
// their Proxies (status included: readiness is what a rollout waits on).
func (r *PoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxypool").
		For(&v1alpha1.ProxyPool{}).
		Owns(&v1alpha1.Proxy{}).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: 4,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](500*time.Millisecond, 30*time.Second),
		}).
		Complete(r)
}

// Reconcile brings one pool's Proxies to its spec by one step of its plan.
func (r *PoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pool v1alpha1.ProxyPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return reconcile.Result{}, ctrlclient.IgnoreNotFound(err)
	}
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, ctrlclient.InNamespace(pool.Namespace),
		ctrlclient.MatchingLabels{v1alpha1.LabelPool: pool.Name}); err != nil {
		return reconcile.Result{}, err
	}
	var owned []*v1alpha1.Proxy
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], &pool) {
			owned = append(owned, &list.Items[i])
		}
	}
	if pool.DeletionTimestamp != nil {
		return r.reconcileDelete(ctx, &pool, owned)
	}
	if !controllerutil.ContainsFinalizer(&pool, PoolFinalizer) {
		before := pool.DeepCopy()
		controllerutil.AddFinalizer(&pool, PoolFinalizer)
		if err := r.Client.Patch(ctx, &pool, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, err
		}
	}

	hash := templateHash(pool.Spec.Template)
	desired := int(ptr.Deref(pool.Spec.Replicas, 1))
	surge, err := budget(pool.Spec.Strategy.MaxSurge, desired, true)
	if err != nil {
		return reconcile.Result{}, reconcile.TerminalError(err)
	}
	unavailable, err := budget(pool.Spec.Strategy.MaxUnavailable, desired, false)
	if err != nil {
		return reconcile.Result{}, reconcile.TerminalError(err)
	}
	if surge == 0 && unavailable == 0 {
		// A percentage of a small pool can round both to zero; a Deployment then moves
		// one at a time rather than never.
		unavailable = 1
	}
	now := r.now()
	in := poolInput{desired: desired, surge: surge, unavailable: unavailable, now: now}
	byName := map[string]*v1alpha1.Proxy{}
	active := 0
	for _, p := range owned {
		byName[p.Name] = p
		in.members = append(in.members, memberOf(&pool, p, hash))
		if p.DeletionTimestamp == nil {
			active++
		}
	}
	if active > desired {
		r.addUse(ctx, &pool, in.members)
	}
	r.applyExpected(in.members, byName, hash, now)
	plan := planPool(in)

	for _, n := range plan.create {
		p, err := newMember(&pool, n, hash, r.Client.Scheme())
		if err != nil {
			return reconcile.Result{}, err
		}
		if err := r.Client.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, fmt.Errorf("create %s: %w", p.Name, err)
		}
	}
	for _, name := range append(plan.remove, plan.replace...) {
		if err := r.Client.Delete(ctx, byName[name]); ctrlclient.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, fmt.Errorf("delete %s: %w", name, err)
		}
	}
	for _, name := range plan.update {
		p := byName[name]
		before := p.DeepCopy()
		applyTemplate(&pool, p, hash)
		if err := r.Client.Patch(ctx, p, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, fmt.Errorf("update %s: %w", name, err)
		}
		r.expect(p.UID, now, func(e *expectation) { e.hash = hash })
	}
	var result reconcile.Result
	for _, name := range plan.ungrant {
		if err := r.setGrant(ctx, byName[name], time.Time{}); apierrors.IsConflict(err) {
			// The member moved since the cache saw it; its change brings the pool back.
			result.RequeueAfter = time.Second
		} else if err != nil {
			return reconcile.Result{}, err
		}
	}
	if r.Temporal != nil {
		for _, name := range append(plan.grant, plan.regrant...) {
			if err := r.grant(ctx, byName[name], now); apierrors.IsConflict(err) {
				// Not granted: the next reconcile plans from the member as it is now.
				result.RequeueAfter = time.Second
			} else if err != nil {
				return reconcile.Result{}, err
			}
		}
		if (len(plan.grant)+len(plan.regrant) > 0 || hasGrants(in.members, plan.ungrant)) && result.RequeueAfter == 0 {
			// A grant whose replacement does not start is sent again (regrant); nothing
			// else may wake the pool meanwhile.
			result.RequeueAfter = regrantAfter
		}
	}
	r.record(&pool, plan, desired, len(owned))
	if err := r.writeStatus(ctx, &pool, in, plan, hash); apierrors.IsConflict(err) {
		// The autoscaler wrote the pool since the cache saw it: not a failure, and the
		// change that moved it brings this pool back soon; look again in any case.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	} else if err != nil {
		return reconcile.Result{}, err
	}
	return result, nil
}

// grant lets member p start the replacement its workflow waits for: the annotation first,
// so the grant counts against maxSurge from now on whatever happens next, then the
// signal. A workflow that no longer waits ignores it.
func (r *PoolReconciler) grant(ctx context.Context, p *v1alpha1.Proxy, now time.Time) error {
	if err := r.setGrant(ctx, p, now); err != nil {
		return err
	}
	r.expect(p.UID, now, func(e *expectation) { e.grantedAt = now })
	sig := contract.ReplaceSignal{Reason: "granted by its pool", Grant: true}
	if err := r.Temporal.SignalWorkflow(ctx, contract.ProxyWorkflowID(p.Namespace, p.Name), "", contract.SignalReplace, sig); err != nil {
		var notFound *serviceerror.NotFound
		if errors.As(err, &notFound) {
			// No run: the Proxy's own controller starts one, which asks again if it must.
			return nil
		}
		return fmt.Errorf("grant %s its replacement: %w", p.Name, err)
	}
	return nil
}

// setGrant writes member p's grant time, or removes it for a zero time.
func (r *PoolReconciler) setGrant(ctx context.Context, p *v1alpha1.Proxy, at time.Time) error {
	before := p.DeepCopy()
	if at.IsZero() {
		delete(p.Annotations, AnnotationReplaceGranted)
	} else {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[AnnotationReplaceGranted] = at.UTC().Format(time.RFC3339)
	}
	if err := r.Client.Patch(ctx, p, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{})); ctrlclient.IgnoreNotFound(err) != nil {
		return fmt.Errorf("grant annotation of %s: %w", p.Name, err)
	}
	if at.IsZero() {
		r.expect(p.UID, r.now(), func(e *expectation) { e.grantedAt = time.Time{} })
	}
	return nil
}

func (r *PoolReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// hasGrants says whether a member holds a grant that stays after this step.
func hasGrants(members []member, ungranted []string) bool {
	gone := make(map[string]bool, len(ungranted))
	for _, name := range ungranted {
		gone[name] = true
	}
	for _, m := range members {
		if m.granted && !gone[m.name] {
			return true
		}
	}
	return false
}

// addUse gives members discovery's count of their leases and rests, for a scale-down to
// give up those crawlers use least. Without an answer within a few seconds the pool
// shrinks by what Kubernetes knows (ready, healthy, age): a scale-down is not held up by
// discovery.
func (r *PoolReconciler) addUse(ctx context.Context, pool *v1alpha1.ProxyPool, members []member) {
	if r.Discovery == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	list, err := r.Discovery.ListProxies(ctx, poolSelector(pool), nil)
	if err != nil {
		log.FromContext(ctx).Info("discovery did not list the pool's proxies: shrinking without their leases", "error", err)
		return
	}
	byName := map[string]dclient.ListedProxy{}
	for _, p := range list.Proxies {
		if p.Namespace == pool.Namespace {
			byName[p.Name] = p
		}
	}
	for i := range members {
		p, ok := byName[members[i].name]
		if !ok {
			continue
		}
		members[i].leases = p.ActiveLeases
		members[i].resting = len(p.Cooldowns)
		if _, all := p.Cooldowns["*"]; all {
			// Resting for every site: of no use to any crawler until it ends.
			members[i].resting = math.MaxInt32
		}
	}
}

// reconcileDelete deletes the pool's Proxies and lets the pool go once none is left. Each
// Proxy's own finalizer keeps it until its workflow has deleted its instances, so a pool
// that is gone has left no instance behind.
func (r *PoolReconciler) reconcileDelete(ctx context.Context, pool *v1alpha1.ProxyPool, owned []*v1alpha1.Proxy) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, PoolFinalizer) {
		return reconcile.Result{}, nil
	}
	if len(owned) > 0 {
		for _, p := range owned {
			if p.DeletionTimestamp != nil {
				continue
			}
			if err := r.Client.Delete(ctx, p); ctrlclient.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, err
			}
		}
		if r.Events != nil {
			r.Events.Eventf(pool, nil, corev1.EventTypeNormal, EventPoolDeleting, "Delete",
				"waiting for %d Proxies (and their instances) to be deleted", len(owned))
		}
		recheck := r.Recheck
		if recheck <= 0 {
			recheck = 10 * time.Second
		}
		return reconcile.Result{RequeueAfter: recheck}, nil
	}
	before := pool.DeepCopy()
	controllerutil.RemoveFinalizer(pool, PoolFinalizer)
	err := r.Client.Patch(ctx, pool, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{}))
	return reconcile.Result{}, ctrlclient.IgnoreNotFound(err)
}

// record says what this step did, in words, as events on the pool.
func (r *PoolReconciler) record(pool *v1alpha1.ProxyPool, plan poolPlan, desired, had int) {
	if r.Events == nil {
		return
	}
	switch {
	case len(plan.create) > 0:
		r.Events.Eventf(pool, nil, corev1.EventTypeNormal, EventPoolScaled, "Create",
			"creating %d Proxies (%d wanted, %d present)", len(plan.create), desired, had)
	case len(plan.remove) > 0:
		r.Events.Eventf(pool, nil, corev1.EventTypeNormal, EventPoolScaled, "Delete",
			"deleting %d Proxies, least useful first (%d wanted, %d present): %v", len(plan.remove), desired, had, plan.remove)
	}
	switch {
	case len(plan.update) > 0:
		r.Events.Eventf(pool, nil, corev1.EventTypeNormal, EventPoolRolling, "Update",
			"giving %v the new template; each is replaced make-before-break", plan.update)
	case len(plan.replace) > 0:
		r.Events.Eventf(pool, nil, corev1.EventTypeNormal, EventPoolRolling, "Replace",
			"deleting %v to make room for their replacements (maxSurge 0)", plan.replace)
	}
	if len(plan.grant) > 0 && r.Temporal != nil {
		r.Events.Eventf(pool, nil, corev1.EventTypeNormal, EventPoolGranted, "Grant",
			"allowing %v to replace their instances as they asked (within maxSurge)", plan.grant)
	}
}

// writeStatus writes the pool's counts, selector and conditions as they are after this step.
func (r *PoolReconciler) writeStatus(ctx context.Context, pool *v1alpha1.ProxyPool, in poolInput, plan poolPlan, hash string) error {
	before := pool.DeepCopy()
	st := &pool.Status
	st.Replicas, st.ReadyReplicas, st.UpdatedReplicas = 0, 0, 0
	for _, m := range in.members {
		if m.deleting {
			continue
		}
		st.Replicas++
		if m.ready {
			st.ReadyReplicas++
		}
		if m.current && m.settled {
			st.UpdatedReplicas++
		}
	}
	st.DesiredReplicas = int32(in.desired)
	st.Selector = v1alpha1.LabelPool + "=" + pool.Name
	st.ObservedGeneration = pool.Generation
	if len(plan.create) > 0 || len(plan.remove) > 0 {
		st.LastScaleTime = &metav1.Time{Time: time.Now()}
	}
	available := metav1.Condition{Type: v1alpha1.PoolConditionAvailable, Status: metav1.ConditionTrue, Reason: ReasonPoolAvailable,
		Message: fmt.Sprintf("%d of %d Proxies Ready (at least %d wanted)", st.ReadyReplicas, in.desired, max(in.desired-in.unavailable, 0))}
	if int(st.ReadyReplicas) < in.desired-in.unavailable {
		available.Status, available.Reason = metav1.ConditionFalse, ReasonPoolShortReady
	}
	progressing := metav1.Condition{Type: v1alpha1.PoolConditionProgressing, Status: metav1.ConditionFalse, Reason: ReasonPoolSteady,
		Message: fmt.Sprintf("%d Proxies, all on the current template", st.Replicas)}
	switch {
	case int(st.Replicas) != in.desired || len(plan.create) > 0 || len(plan.remove) > 0:
		progressing.Status, progressing.Reason = metav1.ConditionTrue, ReasonPoolScaling
		progressing.Message = fmt.Sprintf("scaling from %d to %d Proxies", st.Replicas, in.desired)
	case int(st.UpdatedReplicas) < in.desired || int(st.ReadyReplicas) < in.desired:
		progressing.Status, progressing.Reason = metav1.ConditionTrue, ReasonPoolRolling
		progressing.Message = fmt.Sprintf("%d of %d Proxies on template %s, %d Ready", st.UpdatedReplicas, in.desired, hash, st.ReadyReplicas)
	}
	meta.SetStatusCondition(&st.Conditions, available)
	meta.SetStatusCondition(&st.Conditions, progressing)
	if pool.Spec.Autoscale == nil {
		// The autoscaler's, from when the pool had spec.autoscale: stale now.
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.PoolConditionScalingActive)
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.PoolConditionScalingLimited)
		st.Demand, st.LeasedReplicas = nil, nil
	}
	if equality.Semantic.DeepEqual(before.Status, pool.Status) {
		return nil
	}
	// With the resource version: the autoscaler writes conditions of the same list, and a
	// patch from a stale copy would put back what it last wrote. A conflict requeues.
	return r.Client.Status().Patch(ctx, pool, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{}))
}

// memberOf is what the plan needs of Proxy p.
func memberOf(pool *v1alpha1.ProxyPool, p *v1alpha1.Proxy, hash string) member {
	m := member{
		name:     p.Name,
		index:    memberIndex(pool.Name, p.Name),
		created:  p.CreationTimestamp.Time,
		current:  p.Labels[LabelPoolTemplate] == hash,
		settled:  p.Status.ObservedGeneration == p.Generation,
		deleting: p.DeletionTimestamp != nil,
	}
	m.ready = meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady)
	m.unhealthy = meta.IsStatusConditionFalse(p.Status.Conditions, v1alpha1.ConditionHealthy)
	// An instance given up and still being deleted is an extra instance too.
	m.replacing = p.Status.Phase == v1alpha1.PhaseReplacing || p.Status.RetiringInstances > 0
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReplacementPending); c != nil && c.Status == metav1.ConditionTrue {
		m.pending, m.askedAt = true, c.LastTransitionTime.Time
	}
	m.provisioned = meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned)
	if at, ok := p.Annotations[AnnotationReplaceGranted]; ok {
		// An unreadable time (written by hand) is an old grant: sent again at once.
		m.granted = true
		m.grantedAt, _ = time.Parse(time.RFC3339, at)
	}
	return m
}

// newMember is the pool's n-th Proxy, built from its template.
func newMember(pool *v1alpha1.ProxyPool, n int, hash string, s *runtime.Scheme) (*v1alpha1.Proxy, error) {
	p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: memberName(pool.Name, n)}}
	applyTemplate(pool, p, hash)
	// The pool controls it: Owns() routes its changes here, and a cluster's garbage
	// collector deletes it with the pool even if the pool's finalizer were removed by hand.
	if err := controllerutil.SetControllerReference(pool, p, s); err != nil {
		return nil, err
	}
	return p, nil
}

// applyTemplate gives p the pool's template: its labels and annotations (beside what p has
// of its own), the pool's labels, and the spec.
func applyTemplate(pool *v1alpha1.ProxyPool, p *v1alpha1.Proxy, hash string) {
	t := pool.Spec.Template
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	maps.Copy(p.Labels, t.Metadata.Labels)
	p.Labels[v1alpha1.LabelPool] = pool.Name
	p.Labels[LabelPoolTemplate] = hash
	if len(t.Metadata.Annotations) > 0 {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		maps.Copy(p.Annotations, t.Metadata.Annotations)
	}
	p.Spec = *t.Spec.DeepCopy()
	if l := p.Spec.Lifecycle; l != nil && l.MaxAge != nil {
		if age, err := l.MaxAge.ParseDuration(0); err == nil && age > 0 {
			l.MaxAge = ptr.To(v1alpha1.Duration(staggeredMaxAge(age, memberIndex(pool.Name, p.Name)).String()))
		}
	}
}

// templateHash names a template: Proxies built from an older one are rolled. A rotation
// of the cloud-init Secret is not in it: each member's workflow notices the rotation and
// asks to be replaced, as for a ban (see askReplace), so the pool rolls it within maxSurge
// through its grants.
func templateHash(t v1alpha1.ProxyTemplate) string {
	b, err := json.Marshal(t)
	if err != nil {
		// Plain API data always encodes.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:5])
}
