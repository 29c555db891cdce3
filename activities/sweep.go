package activities

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The orphan sweep decides and deletes inside one activity per provider, a page of the
// listing at a time, and returns counts and a bounded sample. An installation's listing and
// its live set grow with the fleet: as an activity result, a listing of 10,000 GCP
// instances was 4 MB, twice Temporal's 2 MiB payload limit, and a sweep that fails on its
// payload fails for good. Inside the activity they are memory, not history.

// GCItem is one instance the sweep looked at.
type GCItem struct {
	Provider   v1alpha1.Provider `json:"provider"`
	Name       string            `json:"name"`
	ProviderID string            `json:"providerID"`
	UID        string            `json:"uid,omitempty"`
	Age        time.Duration     `json:"age"`
	Reason     string            `json:"reason"`
}

// Reasons an instance is spared or deleted.
const (
	GCReasonNoOwner     = "no ownership label"
	GCReasonOther       = "another installation"
	GCReasonTooYoung    = "younger than the minimum age"
	GCReasonLiveProxy   = "its Proxy exists"
	GCReasonLiveRunning = "its workflow is running"
	GCReasonOrphan      = "orphan: no Proxy and no running workflow"
	// GCReasonInUse: judged an orphan, but the provider found it used again when asked to
	// delete it (a shared firewall rule an instance made since took up).
	GCReasonInUse = "in use again"
)

// DecideOrphans is the sweeper's whole judgement, as a pure function: delete only
// instances that prove they are ours and orphaned. Anything uncertain is spared.
func DecideOrphans(instances []provider.Instance, prov v1alpha1.Provider, live LiveUIDs,
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

// Sweep bounds: what a result may carry whatever the fleet size.
const (
	// SweepSampleSize is how many deleted and how many spared instances a result names.
	SweepSampleSize = 20
	// SweepMaxErrors is how many error messages a result keeps; ErrorCount counts all.
	SweepMaxErrors = 10
	// sweepPageSize is how many instances are decided (and their orphans deleted) between
	// heartbeats.
	sweepPageSize = 500
)

// Error types the sweep returns, which the workflow tells apart.
const (
	// ErrTypeLiveUnavailable: the live set could not be listed, so nothing was judged.
	ErrTypeLiveUnavailable = "LiveUnavailable"
	// ErrTypeListFailed: the provider's listing failed.
	ErrTypeListFailed = "ListFailed"
)

// SweepInput is one provider's sweep.
type SweepInput struct {
	Provider     v1alpha1.Provider `json:"provider"`
	Installation string            `json:"installation"`
	MinAge       time.Duration     `json:"minAge"`
	DryRun       bool              `json:"dryRun,omitempty"`
	Live         LiveInput         `json:"live"`
}

// SweepResult is what one provider's sweep did: counts, and a sample of names.
type SweepResult struct {
	// Listed counts the instances the listing returned.
	Listed int `json:"listed"`
	// DeletedCount counts the orphans deleted (or, in a dry run, that would be); Deleted
	// names the first SweepSampleSize of them.
	DeletedCount int      `json:"deletedCount"`
	Deleted      []GCItem `json:"deleted"`
	// SparedCount counts the instances kept, SparedBy by reason; Spared names a sample.
	SparedCount int            `json:"sparedCount"`
	SparedBy    map[string]int `json:"sparedBy,omitempty"`
	Spared      []GCItem       `json:"spared"`
	// ErrorCount counts failed deletes; Errors keeps the first SweepMaxErrors messages.
	ErrorCount int      `json:"errorCount,omitempty"`
	Errors     []string `json:"errors,omitempty"`
	// Done is how many listed instances were judged; a retried attempt carries on from a
	// heartbeat's copy of this result.
	Done int `json:"done"`
}

func (r *SweepResult) addDeleted(it GCItem) {
	r.DeletedCount++
	if len(r.Deleted) < SweepSampleSize {
		r.Deleted = append(r.Deleted, it)
	}
}

func (r *SweepResult) addSpared(it GCItem) {
	r.SparedCount++
	if r.SparedBy == nil {
		r.SparedBy = map[string]int{}
	}
	r.SparedBy[it.Reason]++
	if len(r.Spared) < SweepSampleSize {
		r.Spared = append(r.Spared, it)
	}
}

func (r *SweepResult) addError(msg string) {
	r.ErrorCount++
	if len(r.Errors) < SweepMaxErrors {
		r.Errors = append(r.Errors, TruncateMessage(msg))
	}
}

// SweepMaxMessage is how many bytes of an error message a result keeps: the message is
// whatever the provider's API answered.
const SweepMaxMessage = 1024

// TruncateMessage cuts msg to at most SweepMaxMessage bytes, at a rune boundary.
func TruncateMessage(msg string) string {
	if len(msg) <= SweepMaxMessage {
		return msg
	}
	const more = " … (cut short)"
	cut := SweepMaxMessage - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}

// SweepProvider lists the live Proxies and running workflows, then the provider's instances
// of the installation, and deletes the orphans among them a page at a time, heartbeating
// its progress. Nothing is deleted unless both live lists were read whole. A retried
// attempt lists again and carries on counting from the last heartbeat: what it deleted
// before is gone from the new listing, and a delete of something already gone succeeds.
//
// Ages are taken at the moment the live set was read, however long the listing and the
// deletes take after it: an instance made since then may belong to a Proxy made since
// then, which neither live list shows, so it is too young to judge. Each delete is bounded
// by the call timeout (see callContext), so one that hangs is an error and the sweep goes
// on; the listings, which take as long as the fleet is large, are kept alive by a
// heartbeat of their own.
func (a *Activities) SweepProvider(ctx context.Context, in SweepInput) (SweepResult, error) {
	var res SweepResult
	if activity.HasHeartbeatDetails(ctx) && !in.DryRun {
		// What a failed attempt deleted is gone from the new listing, so it is kept; what it
		// spared or failed to delete is listed and judged again, so that is counted anew. A
		// dry run deleted nothing: it lists and counts everything again.
		var prev SweepResult
		if activity.GetHeartbeatDetails(ctx, &prev) == nil {
			res.DeletedCount, res.Deleted = prev.DeletedCount, prev.Deleted
			if len(res.Deleted) > SweepSampleSize {
				res.Deleted = res.Deleted[:SweepSampleSize]
			}
		}
	}
	stop := a.keepAlive(ctx, res)
	liveAt := time.Now()
	live, err := a.ListLiveUIDs(ctx, in.Live)
	if err != nil {
		stop()
		return SweepResult{}, temporal.NewApplicationError(err.Error(), ErrTypeLiveUnavailable)
	}
	p, err := a.Providers.Get(in.Provider)
	if err != nil {
		stop()
		return SweepResult{}, temporal.NewApplicationError(fmt.Sprintf("%s: %v", in.Provider, err), ErrTypeListFailed)
	}
	instances, err := p.ListOwned(ctx, provider.Owner{Installation: in.Installation})
	stop()
	if err != nil {
		return SweepResult{}, temporal.NewApplicationError(fmt.Sprintf("list %s: %v", in.Provider, err), ErrTypeListFailed)
	}
	// One order for every attempt, so samples and progress mean the same thing each time.
	slices.SortFunc(instances, func(x, y provider.Instance) int { return cmp.Compare(x.ProviderID, y.ProviderID) })
	res.Listed = len(instances)
	minAge := in.MinAge
	for start := 0; start < len(instances); start += sweepPageSize {
		page := instances[start:min(start+sweepPageSize, len(instances))]
		del, spare := DecideOrphans(page, in.Provider, live, in.Installation, minAge, liveAt)
		for _, it := range spare {
			res.addSpared(it)
		}
		for _, it := range del {
			if !in.DryRun {
				cctx, cancel := a.callContext(ctx)
				err := a.deleteOrphan(cctx, OrphanInput{Provider: in.Provider, ProviderID: it.ProviderID, Name: it.Name, UID: it.UID})
				cancel()
				if errors.Is(err, provider.ErrInUse) {
					it.Reason = GCReasonInUse
					res.addSpared(it)
					activity.RecordHeartbeat(ctx, res)
					continue
				}
				if err != nil {
					if ctx.Err() != nil {
						return res, ctx.Err()
					}
					res.addError(fmt.Sprintf("%s: delete %s: %v", in.Provider, it.ProviderID, err))
					activity.RecordHeartbeat(ctx, res)
					continue
				}
			}
			res.addDeleted(it)
			activity.RecordHeartbeat(ctx, res)
		}
		res.Done += len(page)
		activity.RecordHeartbeat(ctx, res)
	}
	if res.Deleted == nil {
		res.Deleted = []GCItem{}
	}
	if res.Spared == nil {
		res.Spared = []GCItem{}
	}
	return res, nil
}

// keepAlive heartbeats progress (a copy of it, which does not change meanwhile) until stop
// is called: at once, then twice per call timeout (see callContext), well within the
// heartbeat timeout.
func (a *Activities) keepAlive(ctx context.Context, progress SweepResult) (stop func()) {
	every := orDefault(a.CallTimeout, 20*time.Second)
	if hb := activity.GetInfo(ctx).HeartbeatTimeout; hb > 0 {
		every = min(every, hb/2)
	}
	activity.RecordHeartbeat(ctx, progress)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(max(every/2, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				activity.RecordHeartbeat(ctx, progress)
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// IsSweepError reports whether err is a sweep error of type typ.
func IsSweepError(err error, typ string) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && app.Type() == typ
}
