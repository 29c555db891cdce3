package workflows

import (
	"fmt"
	"sort"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// GC defaults: the worker's --gc-interval and --gc-min-age, and what a zero value means.
const (
	// DefaultGCInterval is how often the proxy-gc schedule sweeps.
	DefaultGCInterval = 10 * time.Minute
	// DefaultGCMinAge spares instances younger than this.
	DefaultGCMinAge = 10 * time.Minute
)

// GCInput configures one sweep.
type GCInput struct {
	Installation string              `json:"installation"`
	Providers    []v1alpha1.Provider `json:"providers"`
	// MinAge spares instances younger than this: they may be mid-create, before their
	// workflow has recorded them (0: DefaultGCMinAge).
	MinAge time.Duration `json:"minAge"`
	// DryRun reports what would be deleted without deleting.
	DryRun bool `json:"dryRun,omitempty"`
	// Namespaces, when set, are the only namespaces the worker can see Proxies in. A sweep
	// with a partial view would take other namespaces' instances for orphans, so it is
	// refused unless AllowPartialView is set (for installations that own those namespaces'
	// instances only).
	Namespaces       []string `json:"namespaces,omitempty"`
	AllowPartialView bool     `json:"allowPartialView,omitempty"`
}

// GCItem is one instance the sweep looked at.
type GCItem struct {
	Provider   v1alpha1.Provider `json:"provider"`
	Name       string            `json:"name"`
	ProviderID string            `json:"providerID"`
	UID        string            `json:"uid,omitempty"`
	Age        time.Duration     `json:"age"`
	Reason     string            `json:"reason"`
}

// GCResult says what the sweep did and why.
type GCResult struct {
	Skipped    bool     `json:"skipped,omitempty"`
	SkipReason string   `json:"skipReason,omitempty"`
	DryRun     bool     `json:"dryRun,omitempty"`
	Deleted    []GCItem `json:"deleted"`
	Spared     []GCItem `json:"spared"`
	// Errors are per-provider list or delete failures; the other providers went on.
	Errors []string `json:"errors,omitempty"`
}

// Reasons an instance is spared or deleted.
const (
	GCReasonNoOwner     = "no ownership label"
	GCReasonOther       = "another installation"
	GCReasonTooYoung    = "younger than the minimum age"
	GCReasonLiveProxy   = "its Proxy exists"
	GCReasonLiveRunning = "its workflow is running"
	GCReasonOrphan      = "orphan: no Proxy and no running workflow"
)

// decideGC is the sweeper's whole judgement, as a pure function: delete only instances that
// prove they are ours and orphaned. Anything uncertain is spared.
func decideGC(instances []provider.Instance, prov v1alpha1.Provider, live activities.LiveUIDs,
	installation string, minAge time.Duration, now time.Time) (del, spare []GCItem) {
	proxies := toSet(live.Proxies)
	running := toSet(live.Workflows)
	for _, inst := range instances {
		it := GCItem{Provider: prov, Name: inst.Name, ProviderID: inst.ProviderID, UID: inst.ProxyUID(), Age: now.Sub(inst.CreatedAt)}
		switch {
		case it.UID == "" || inst.Labels[provider.LabelInstallation] == "":
			it.Reason = GCReasonNoOwner
		case inst.Labels[provider.LabelInstallation] != installation:
			it.Reason = GCReasonOther
		case inst.CreatedAt.IsZero() || it.Age < minAge:
			it.Reason = GCReasonTooYoung
		case proxies[it.UID]:
			it.Reason = GCReasonLiveProxy
		case running[it.UID]:
			it.Reason = GCReasonLiveRunning
		default:
			it.Reason = GCReasonOrphan
			del = append(del, it)
			continue
		}
		spare = append(spare, it)
	}
	return del, spare
}

func toSet(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// GCWorkflow deletes instances that carry this installation's ownership labels but belong to
// no live Proxy. It runs from the Schedule "proxy-gc" (overlap: skip), so the schedule never
// runs two sweeps at a time.
func GCWorkflow(ctx workflow.Context, in GCInput) (GCResult, error) {
	res := GCResult{DryRun: in.DryRun, Deleted: []GCItem{}, Spared: []GCItem{}}
	defer recordGC(ctx, &res)
	minAge := in.MinAge
	if minAge <= 0 {
		minAge = DefaultGCMinAge
	}
	if len(in.Namespaces) > 0 && !in.AllowPartialView {
		res.Skipped = true
		res.SkipReason = fmt.Sprintf("the worker sees Proxies in %v only; sweeping would delete other namespaces' instances (set allowPartialView to sweep anyway)", in.Namespaces)
		workflow.GetLogger(ctx).Warn("GC skipped", "reason", res.SkipReason)
		return res, nil
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, MaximumAttempts: 3},
	})

	workflow.SetCurrentDetails(ctx, "listing live Proxies and running workflows")
	var live activities.LiveUIDs
	liveIn := activities.LiveInput{
		Namespaces:    in.Namespaces,
		WorkflowQuery: contract.RunningProxiesQuery,
		MemoKey:       contract.MemoKey,
	}
	if err := workflow.ExecuteActivity(actx, a.ListLiveUIDs, liveIn).Get(ctx, &live); err != nil {
		// Without a complete live set every instance looks orphaned: never guess.
		res.Skipped = true
		res.SkipReason = "could not list live proxies: " + errorMessage(err)
		workflow.GetLogger(ctx).Warn("GC skipped", "reason", res.SkipReason)
		return res, nil
	}
	now := workflow.Now(ctx)
	for _, prov := range in.Providers {
		workflow.SetCurrentDetails(ctx, fmt.Sprintf("listing %s instances of installation %s", prov, in.Installation))
		var instances []provider.Instance
		err := workflow.ExecuteActivity(actx, a.ListInstances, activities.ListInput{Provider: prov, Installation: in.Installation}).Get(ctx, &instances)
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: list: %s", prov, errorMessage(err)))
			continue
		}
		del, spare := decideGC(instances, prov, live, in.Installation, minAge, now)
		res.Spared = append(res.Spared, spare...)
		for _, it := range del {
			if in.DryRun {
				res.Deleted = append(res.Deleted, it)
				continue
			}
			oi := activities.OrphanInput{Provider: prov, ProviderID: it.ProviderID, Name: it.Name, UID: it.UID}
			if err := workflow.ExecuteActivity(actx, a.DeleteOrphan, oi).Get(ctx, nil); err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: delete %s: %s", prov, it.ProviderID, errorMessage(err)))
				continue
			}
			res.Deleted = append(res.Deleted, it)
		}
	}
	sort.Slice(res.Deleted, func(i, j int) bool { return res.Deleted[i].ProviderID < res.Deleted[j].ProviderID })
	sort.Slice(res.Spared, func(i, j int) bool { return res.Spared[i].ProviderID < res.Spared[j].ProviderID })
	verb := "deleted"
	if in.DryRun {
		verb = "would delete"
	}
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("%s %d orphans, spared %d, %d errors", verb, len(res.Deleted), len(res.Spared), len(res.Errors)))
	return res, nil
}

// recordGC counts the run in the worker's metrics through a local activity: it runs once,
// and a replay reads its marker instead of counting again.
func recordGC(ctx workflow.Context, res *GCResult) {
	sum := activities.GCSummary{Outcome: "swept", Spared: map[string]int{}}
	if res.Skipped {
		sum.Outcome = "skipped"
	}
	for _, it := range res.Spared {
		sum.Spared[it.Reason]++
	}
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
	_ = workflow.ExecuteLocalActivity(lctx, a.RecordGC, sum).Get(ctx, nil)
}
