package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The autoscaler sizes the pools with spec.autoscale by their demand, which only
// discovery knows (the leases held on a pool's proxies, the requests waiting for one, the
// clients refused one), as a HorizontalPodAutoscaler sizes a Deployment: it writes
// spec.replicas and the pool controller does the rest. It is apart from the pool
// controller because it looks on a clock, not on changes, and because its one input is
// outside Kubernetes. What it remembers (recent recommendations, for the scale-down
// delay) is in memory, as an HPA's is: a restarted operator waits a whole delay before it
// shrinks anything, and never grows less for having restarted.

// DefaultAutoscaleInterval is how often the autoscaler looks at each pool's demand: the
// most a pool scaled to zero adds to its first request's wait, besides starting a proxy.
const DefaultAutoscaleInterval = 5 * time.Second

// demandTimeout bounds one pool's demand call: a discovery that does not answer is an
// unread demand (DemandUnreadable), not a pass that never ends. parallelLooks is how many
// pools are asked at once, so that one slow answer (a replica set waiting out a hung
// peer) delays no other pool's look.
const (
	demandTimeout = 4 * time.Second
	parallelLooks = 16
)

// Reasons of the autoscaler's events and conditions.
const (
	EventPoolAutoscaled    = "Autoscaled"
	ReasonDemandRead       = "DemandRead"
	ReasonNoDiscovery      = "NoDiscovery"
	ReasonDemandUnreadable = "DemandUnreadable"
	ReasonTooMany          = "TooManyReplicas"
	ReasonTooFew           = "TooFewReplicas"
	ReasonWithinRange      = "DesiredWithinRange"
)

// Discovery is what the operator reads of discovery: a pool's demand (the autoscaler), and
// the leases and rests of its proxies (the order a pool gives them up in). Discovery's Go
// client is one; tests stand in for it.
type Discovery interface {
	Demand(ctx context.Context, selector map[string]string) (*dclient.Demand, error)
	ListProxies(ctx context.Context, selector map[string]string, healthy *bool) (*dclient.ProxyList, error)
}

// Autoscaler sizes each pool with spec.autoscale by its demand, every Interval.
type Autoscaler struct {
	Client ctrlclient.Client
	Events events.EventRecorder
	// Demand reads discovery; nil marks every autoscaled pool ScalingActive=False.
	Demand   Discovery
	Interval time.Duration
	// Namespace, when set, limits it to that namespace's pools (an operator watching one
	// namespace; tests that share a cluster).
	Namespace string
	// Now is the clock (tests move it); nil is time.Now.
	Now func() time.Time

	mu      sync.Mutex
	history map[types.UID][]recommendation
	// written is when each pool's counts were last written.
	written map[types.UID]time.Time
}

// statusEvery is how often a pool's demand and leased counts are written while nothing
// else about its scaling changes: every look would be a status write (and a reconcile of
// the pool) every 5 s for every busy pool.
const statusEvery = 30 * time.Second

// statusDue says whether this look's status is worth a write: the pool was resized, its
// conditions (as the pool says them, not as this autoscaler last meant them: a write
// can fail, and another path may have set them) differ in status or reason, or its counts
// are statusEvery old.
func (a *Autoscaler) statusDue(p *v1alpha1.ProxyPool, resized bool, conds ...metav1.Condition) bool {
	if resized || p.Status.Demand == nil {
		return true
	}
	for _, c := range conds {
		have := meta.FindStatusCondition(p.Status.Conditions, c.Type)
		if have == nil || have.Status != c.Status || have.Reason != c.Reason {
			return true
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	last, ok := a.written[p.UID]
	return !ok || a.now().Sub(last) >= statusEvery
}

// countsWritten remembers when p's counts were last written, once the write succeeded.
func (a *Autoscaler) countsWritten(p *v1alpha1.ProxyPool, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.written == nil {
		a.written = map[types.UID]time.Time{}
	}
	a.written[p.UID] = at
}

// Start looks at every autoscaled pool each Interval until ctx ends. The manager runs it
// on the elected leader only: two autoscalers would each write their own decision.
func (a *Autoscaler) Start(ctx context.Context) error {
	interval := a.Interval
	if interval <= 0 {
		interval = DefaultAutoscaleInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := a.Scale(ctx); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "autoscaling pass")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Scale makes one decision for every pool with spec.autoscale. Errors about one pool are
// logged and the others go on.
func (a *Autoscaler) Scale(ctx context.Context) error {
	var pools v1alpha1.ProxyPoolList
	if err := a.Client.List(ctx, &pools, ctrlclient.InNamespace(a.Namespace)); err != nil {
		return fmt.Errorf("list pools: %w", err)
	}
	seen := map[types.UID]bool{}
	var g errgroup.Group
	g.SetLimit(parallelLooks)
	for i := range pools.Items {
		p := &pools.Items[i]
		if p.Spec.Autoscale == nil || p.DeletionTimestamp != nil {
			continue
		}
		seen[p.UID] = true
		g.Go(func() error {
			err := a.scaleOne(ctx, p)
			switch {
			case err == nil || ctx.Err() != nil:
			case errors.Is(err, errSpecMoved):
				// Someone changed the pool meanwhile: the next look decides from that.
				log.FromContext(ctx).V(1).Info("the pool changed during a decision; deciding again at the next look", "pool", p.Namespace+"/"+p.Name)
			default:
				log.FromContext(ctx).Error(err, "autoscaling a pool", "pool", p.Namespace+"/"+p.Name)
			}
			return nil
		})
	}
	_ = g.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid := range a.history {
		if !seen[uid] {
			delete(a.history, uid)
		}
	}
	for uid := range a.written {
		if !seen[uid] {
			delete(a.written, uid)
		}
	}
	return nil
}

// poolSelector is the attributes a pool's Proxies carry: what crawlers ask for to lease
// from it.
func poolSelector(p *v1alpha1.ProxyPool) map[string]string {
	sel := map[string]string{}
	for k, v := range p.Spec.Template.Spec.Attributes {
		sel[k] = string(v)
	}
	return sel
}

func (a *Autoscaler) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// scaleOne decides pool p's size from its demand, writes spec.replicas when it changes,
// and says what it saw in the pool's status and, for each change, an event.
func (a *Autoscaler) scaleOne(ctx context.Context, p *v1alpha1.ProxyPool) error {
	as := p.Spec.Autoscale
	active := metav1.Condition{Type: v1alpha1.PoolConditionScalingActive, Status: metav1.ConditionTrue, Reason: ReasonDemandRead}
	if a.Demand == nil {
		active.Status, active.Reason = metav1.ConditionFalse, ReasonNoDiscovery
		active.Message = "the operator has no --discovery-url: it cannot read the pool's demand, and keeps spec.replicas as it is"
		return a.writeStatus(ctx, p, active, nil, nil)
	}
	demandCtx, cancel := context.WithTimeout(ctx, demandTimeout)
	d, err := a.Demand.Demand(demandCtx, poolSelector(p))
	cancel()
	if err != nil {
		// Unread demand is no demand: the size stays, and counts as wanted now, so that
		// the first low reading after an outage longer than the delay shrinks nothing
		// before demand has stayed low for a whole delay.
		delay, _ := as.ScaleDownDelay.ParseDuration(5 * time.Minute)
		a.mu.Lock()
		if a.history == nil {
			a.history = map[types.UID][]recommendation{}
		}
		a.history[p.UID] = remember(a.history[p.UID], a.now(), delay, int(ptr.Deref(p.Spec.Replicas, 1)))
		a.mu.Unlock()
		active.Status, active.Reason = metav1.ConditionFalse, ReasonDemandUnreadable
		active.Message = fmt.Sprintf("discovery did not answer the pool's demand, so spec.replicas stays as it is: %v", err)
		return errors.Join(err, a.writeStatus(ctx, p, active, nil, nil))
	}
	delay, err := as.ScaleDownDelay.ParseDuration(5 * time.Minute)
	if err != nil {
		// The schema's pattern admits only what parses; kept for objects built in code.
		return err
	}
	in := scaleInput{
		now:      a.now(),
		current:  int(ptr.Deref(p.Spec.Replicas, 1)),
		min:      int(ptr.Deref(as.MinReplicas, 1)),
		max:      int(as.MaxReplicas),
		perProxy: int(p.Spec.Template.Spec.MaxLeases),
		target:   int(as.TargetUtilization),
		delay:    delay,
		demand:   d.Demand,
	}
	if in.perProxy <= 0 {
		in.perProxy = int(v1alpha1.DefaultMaxLeases)
	}
	if in.target <= 0 {
		in.target = 80
	}
	a.mu.Lock()
	if a.history == nil {
		a.history = map[types.UID][]recommendation{}
	}
	in.history = a.history[p.UID]
	a.mu.Unlock()
	dec := decideScale(in)
	a.mu.Lock()
	a.history[p.UID] = dec.history
	a.mu.Unlock()

	seen := fmt.Sprintf("demand %d leases (held %d, waiting %d, refused %d) at %d%% of %d leases a proxy wants %d",
		d.Demand, d.Held, d.Waiting, d.Refused, in.target, in.perProxy, dec.wanted)
	if d.Partial {
		seen += " (a discovery replica did not answer: waiting and refused may be short)"
	}
	active.Message = seen
	limited := metav1.Condition{Type: v1alpha1.PoolConditionScalingLimited, Status: metav1.ConditionFalse, Reason: ReasonWithinRange,
		Message: fmt.Sprintf("%d wanted, within %d..%d", dec.wanted, in.min, in.max)}
	switch dec.limit {
	case "max":
		limited.Status, limited.Reason = metav1.ConditionTrue, ReasonTooMany
		limited.Message = fmt.Sprintf("%d wanted, held at maxReplicas %d", dec.wanted, in.max)
	case "min":
		limited.Status, limited.Reason = metav1.ConditionTrue, ReasonTooFew
		limited.Message = fmt.Sprintf("%d wanted, held at minReplicas %d", dec.wanted, in.min)
	}
	if dec.desired != in.current {
		if err := a.resize(ctx, p, dec.desired); err != nil {
			return err
		}
		why := seen
		if dec.stabilized {
			why += fmt.Sprintf("; the highest wanted in the last %s", in.delay)
		}
		if a.Events != nil {
			a.Events.Eventf(p, nil, corev1.EventTypeNormal, EventPoolAutoscaled, "Scale",
				"scaled from %d to %d Proxies: %s", in.current, dec.desired, why)
		}
	}
	demand, leased := int32(min(d.Demand, 1<<30)), int32(min(d.LeasedProxies, 1<<30))
	if !a.statusDue(p, dec.desired != in.current, active, limited) {
		return nil
	}
	at := a.now()
	if err := a.writeStatus(ctx, p, active, &limited, &statusCounts{demand: demand, leased: leased}); err != nil {
		return err
	}
	a.countsWritten(p, at)
	return nil
}

// resize writes spec.replicas, read fresh and written with its resource version: the pool
// controller writes the pool's status all the time, which is no reason to drop the
// decision; a change of the spec since the decision (its generation moved) is, and the
// next look decides again from the pool as it is then.
func (a *Autoscaler) resize(ctx context.Context, p *v1alpha1.ProxyPool, replicas int) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.ProxyPool
		if err := a.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(p), &cur); err != nil {
			return err
		}
		if cur.Generation != p.Generation {
			return errSpecMoved
		}
		before := cur.DeepCopy()
		cur.Spec.Replicas = ptr.To(int32(replicas))
		return a.Client.Patch(ctx, &cur, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("scale to %d: %w", replicas, err)
	}
	return nil
}

var errSpecMoved = errors.New("the pool's spec changed since the decision")

type statusCounts struct{ demand, leased int32 }

// writeStatus sets the autoscaler's conditions and counts, leaving the pool controller's
// alone: read fresh and written with the resource version, retried on a conflict.
func (a *Autoscaler) writeStatus(ctx context.Context, p *v1alpha1.ProxyPool, active metav1.Condition, limited *metav1.Condition, counts *statusCounts) error {
	key := ctrlclient.ObjectKeyFromObject(p)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.ProxyPool
		if err := a.Client.Get(ctx, key, &cur); err != nil {
			return ctrlclient.IgnoreNotFound(err)
		}
		before := cur.DeepCopy()
		meta.SetStatusCondition(&cur.Status.Conditions, active)
		if limited != nil {
			meta.SetStatusCondition(&cur.Status.Conditions, *limited)
		}
		if counts != nil {
			cur.Status.Demand, cur.Status.LeasedReplicas = ptr.To(counts.demand), ptr.To(counts.leased)
		}
		if equality.Semantic.DeepEqual(before.Status, cur.Status) {
			return nil
		}
		return a.Client.Status().Patch(ctx, &cur, ctrlclient.MergeFromWithOptions(before, ctrlclient.MergeFromWithOptimisticLock{}))
	})
}
