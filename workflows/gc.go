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
type GCItem = activities.GCItem

// GCResult says what the sweep did and why. Its lists are samples, so that it stays far
// below Temporal's payload limit whatever the fleet size: DeletedCount, SparedCount and
// SparedBy count everything, Deleted and Spared name at most activities.SweepSampleSize
// instances per provider, and Errors keeps the first few messages (ErrorCount counts all).
// Sweeps recorded before the counts existed listed every instance and leave them zero.
type GCResult struct {
	Skipped    bool     `json:"skipped,omitempty"`
	SkipReason string   `json:"skipReason,omitempty"`
	DryRun     bool     `json:"dryRun,omitempty"`
	Deleted    []GCItem `json:"deleted"`
	Spared     []GCItem `json:"spared"`
	// Errors are per-provider list or delete failures; the other providers went on.
	Errors       []string       `json:"errors,omitempty"`
	DeletedCount int            `json:"deletedCount,omitempty"`
	SparedCount  int            `json:"sparedCount,omitempty"`
	SparedBy     map[string]int `json:"sparedBy,omitempty"`
	ErrorCount   int            `json:"errorCount,omitempty"`
}

// Reasons an instance is spared or deleted.
const (
	GCReasonNoOwner     = activities.GCReasonNoOwner
	GCReasonOther       = activities.GCReasonOther
	GCReasonTooYoung    = activities.GCReasonTooYoung
	GCReasonLiveProxy   = activities.GCReasonLiveProxy
	GCReasonLiveRunning = activities.GCReasonLiveRunning
	GCReasonOrphan      = activities.GCReasonOrphan
)

// decideGC is activities.DecideOrphans, which sweeps of version gcVersionPaged run inside
// their activity; the sweeps recorded before it decide here.
func decideGC(instances []provider.Instance, prov v1alpha1.Provider, live activities.LiveUIDs,
	installation string, minAge time.Duration, now time.Time) (del, spare []GCItem) {
	return activities.DecideOrphans(instances, prov, live, installation, minAge, now)
}

// GC workflow versions (change ID gcVersionChange). Sweeps are short, so the code of an
// older version can go once no sweep started before the deploy is still open.
const (
	gcVersionChange = "gc-sweep"
	// gcVersionPaged: each provider is swept by one SweepProvider activity that decides and
	// deletes inside, a page at a time, and returns counts and a sample, rather than the
	// workflow taking the whole live set and listing as activity results (which outgrew
	// Temporal's 2 MiB payload limit at about 5,000 instances).
	gcVersionPaged workflow.Version = 1
)

// GCWorkflow deletes instances that carry this installation's ownership labels but belong to
// no live Proxy. It runs from the Schedule "proxy-gc" (overlap: skip), so the schedule never
// runs two sweeps at a time.
func GCWorkflow(ctx workflow.Context, in GCInput) (GCResult, error) {
	version := workflow.GetVersion(ctx, gcVersionChange, workflow.DefaultVersion, gcVersionPaged)
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
	liveIn := activities.LiveInput{
		Namespaces:    in.Namespaces,
		WorkflowQuery: contract.RunningProxiesQuery,
		MemoKey:       contract.MemoKey,
	}
	if version < gcVersionPaged {
		err := gcWholeListings(ctx, in, liveIn, minAge, &res) // before res is read: the order of a return's operands is unspecified
		return res, err
	}

	// A provider's sweep lists and deletes for as long as its fleet takes; the heartbeat
	// tells a dead worker from a long sweep, and a retry carries on from the last one.
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Hour,
		HeartbeatTimeout:    time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, MaximumAttempts: 3},
	})
	for i, prov := range in.Providers {
		workflow.SetCurrentDetails(ctx, fmt.Sprintf("sweeping %s instances of installation %s", prov, in.Installation))
		var pr activities.SweepResult
		err := workflow.ExecuteActivity(actx, a.SweepProvider, activities.SweepInput{
			Provider: prov, Installation: in.Installation, MinAge: minAge, DryRun: in.DryRun, Live: liveIn,
		}).Get(ctx, &pr)
		switch {
		case activities.IsSweepError(err, activities.ErrTypeLiveUnavailable) && i > 0:
			// Providers swept before did delete: the sweep is partial, not skipped. This
			// provider is left for the next one.
			res.ErrorCount++
			if len(res.Errors) < activities.SweepMaxErrors {
				res.Errors = append(res.Errors, activities.TruncateMessage(fmt.Sprintf("%s: not swept: could not list live proxies: %s", prov, errorMessage(err))))
			}
			continue
		case activities.IsSweepError(err, activities.ErrTypeLiveUnavailable):
			// Without a complete live set every instance looks orphaned: never guess.
			res.Skipped = true
			res.SkipReason = activities.TruncateMessage("could not list live proxies: " + errorMessage(err))
			workflow.GetLogger(ctx).Warn("GC skipped", "reason", res.SkipReason)
			return res, nil
		case err != nil:
			res.ErrorCount++
			if len(res.Errors) < activities.SweepMaxErrors {
				// The message is whatever the provider's API answered: keep a bounded part.
				res.Errors = append(res.Errors, activities.TruncateMessage(fmt.Sprintf("%s: %s", prov, errorMessage(err))))
			}
			continue
		}
		res.Deleted = append(res.Deleted, pr.Deleted...)
		res.Spared = append(res.Spared, pr.Spared...)
		res.DeletedCount += pr.DeletedCount
		res.SparedCount += pr.SparedCount
		for _, reason := range workflow.DeterministicKeys(pr.SparedBy) {
			if res.SparedBy == nil {
				res.SparedBy = map[string]int{}
			}
			res.SparedBy[reason] += pr.SparedBy[reason]
		}
		res.ErrorCount += pr.ErrorCount
		for _, e := range pr.Errors {
			if len(res.Errors) < activities.SweepMaxErrors {
				res.Errors = append(res.Errors, e)
			}
		}
	}
	verb := "deleted"
	if in.DryRun {
		verb = "would delete"
	}
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("%s %d orphans, spared %d, %d errors", verb, res.DeletedCount, res.SparedCount, res.ErrorCount))
	return res, nil
}

// gcWholeListings is the sweep of runs recorded before gcVersionPaged: the live set and
// each provider's listing come back as activity results, and the workflow decides.
func gcWholeListings(ctx workflow.Context, in GCInput, liveIn activities.LiveInput, minAge time.Duration, res *GCResult) error {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, MaximumAttempts: 3},
	})
	workflow.SetCurrentDetails(ctx, "listing live Proxies and running workflows")
	var live activities.LiveUIDs
	if err := workflow.ExecuteActivity(actx, a.ListLiveUIDs, liveIn).Get(ctx, &live); err != nil {
		res.Skipped = true
		res.SkipReason = "could not list live proxies: " + errorMessage(err)
		workflow.GetLogger(ctx).Warn("GC skipped", "reason", res.SkipReason)
		return nil
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
	return nil
}

// recordGC counts the run in the worker's metrics through a local activity: it runs once,
// and a replay reads its marker instead of counting again.
func recordGC(ctx workflow.Context, res *GCResult) {
	sum := activities.GCSummary{Outcome: "swept", Spared: map[string]int{}}
	if res.Skipped {
		sum.Outcome = "skipped"
	}
	if res.SparedBy != nil {
		for _, reason := range workflow.DeterministicKeys(res.SparedBy) {
			sum.Spared[reason] = res.SparedBy[reason]
		}
	} else {
		for _, it := range res.Spared { // a sweep of before gcVersionPaged lists everything
			sum.Spared[it.Reason]++
		}
	}
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
	_ = workflow.ExecuteLocalActivity(lctx, a.RecordGC, sum).Get(ctx, nil)
}
