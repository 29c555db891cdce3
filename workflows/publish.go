package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"strconv"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// What the run publishes (the Proxy's status, search attributes, the memo discovery and the
// monitor shards read) and what it is derived from.

func (w *proxyWorkflow) instanceInput(ref *InstanceRef) activities.InstanceInput {
	return activities.InstanceInput{
		Provider: ref.Provider, Name: ref.Name, ProxyUID: w.state.UID, Namespace: w.in.Namespace,
		Spec: ref.Spec, ProviderID: ref.ProviderID, SpecHash: ref.Hash,
		PollInterval: w.tuning.PollInterval, MaxWait: w.tuning.WaitRunningMax,
	}
}

// watch is what a monitor shard is to watch for this proxy now, or nil for nothing.
func (w *proxyWorkflow) watch() *activities.MonitorMemo {
	in, ok := w.monitorInput()
	if !ok {
		return nil
	}
	if in.Instance != nil {
		// The shard needs only where the instance is. Kept out: what it would repeat
		// (the health check) or never use (attributes, lifecycle), which would make every
		// memo write larger for discovery to read, and restart the watch on an edit that
		// changes nothing it does.
		ii := *in.Instance
		spec := ii.Spec
		ii.Spec = v1alpha1.ProxySpec{Mode: spec.Mode, Provider: spec.Provider, Port: spec.Port,
			GCP: spec.GCP, Kubernetes: spec.Kubernetes, Local: spec.Local}
		ii.PollInterval, ii.MaxWait, ii.SpecHash = 0, 0, ""
		in.Instance = &ii
	}
	return &activities.MonitorMemo{Epoch: watchEpoch(in), Input: in}
}

// verdictOf is the verdict to publish beside watch: the run's, for watch's epoch; nil if
// there is no watch or no verdict yet.
func (w *proxyWorkflow) verdictOf(watch *activities.MonitorMemo) *activities.Verdict {
	h := w.state.Health
	if watch == nil || !h.Known {
		return nil
	}
	v := &activities.Verdict{Epoch: watch.Epoch, Healthy: h.Healthy, Since: h.Since, LatencyMillis: h.LatencyMillis}
	if w.policy.serveWhileReplacing {
		// A member that starts later (its shard moved) must know the reason the run holds,
		// or it could never report it gone (a health-check target judged down).
		v.FailureReason = h.FailureReason
	}
	return v
}

// watchEpoch names a watch by everything in it but the last verdict (which the shard
// carries on by itself): the same watch published again, by this run or the next, is the
// same epoch, and the shard keeps watching without a pause. Whether a verdict is known at
// all is part of it: a run that starts knowing nothing (after a terminate, adopting the
// instance) must be told the verdict that the shard already gave the run before it. JSON of plain data is the same
// bytes on every replay (struct fields in order, map keys sorted); workflowcheck flags the
// encoder only for its type cache.
//
//workflowcheck:ignore
func watchEpoch(in activities.MonitorInput) string {
	in.Last = activities.Health{Known: in.Last.Known}
	b, err := json.Marshal(in)
	if err != nil {
		// Plain data always encodes; if it did not, every report would look stale.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func (w *proxyWorkflow) monitorInput() (activities.MonitorInput, bool) {
	s := w.state
	if s.Spec == nil || s.Deleting {
		return activities.MonitorInput{}, false
	}
	in := activities.MonitorInput{HealthCheck: s.Spec.HealthCheck, Last: s.Health, DriftInterval: w.tuning.DriftInterval}
	switch {
	case s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		in.Target = net.JoinHostPort(s.Spec.Endpoint.Host, strconv.Itoa(int(s.Spec.Endpoint.Port)))
		if ref := s.Spec.Endpoint.CredentialsSecretRef; ref != nil {
			in.Auth = &activities.ProbeAuth{Namespace: w.in.Namespace, Secret: ref.Name, UID: s.UID, Sealed: s.Sealed}
		}
	case s.Instance.Running():
		in.Target = net.JoinHostPort(s.Instance.IP, strconv.Itoa(int(s.Instance.Port)))
		ii := w.instanceInput(s.Instance)
		in.Instance = &ii
		in.Auth = managedAuth(s.Instance)
	default:
		return in, false
	}
	return in, true
}

// managedAuth is how a Managed instance's credentials are found: derived from its key and
// name. An instance built before instances had credentials has no key and takes none.
func managedAuth(ref *InstanceRef) *activities.ProbeAuth {
	if ref == nil || ref.KeyID == "" {
		return nil
	}
	return &activities.ProbeAuth{KeyID: ref.KeyID, Instance: ref.Name}
}

// publishState writes what changed since the last write: the CR status (through a local
// activity), the search attributes and the memo.
func (w *proxyWorkflow) publishState(ctx workflow.Context) error {
	s := w.state
	if s.UID == "" {
		return nil
	}
	st := status(s, w.wfID)
	s.Phase = st.Phase
	if w.published == nil || !equalData(*w.published, st) {
		lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: 30 * time.Second,
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, MaximumAttempts: 10},
		})
		in := activities.PublishInput{Namespace: w.in.Namespace, Name: w.in.Name, UID: s.UID, Status: st}
		if err := w.local(lctx, a.PublishStatus, in).Get(ctx, nil); err != nil {
			// Status is a view; the workflow's state is the truth. A run of an older version
			// tries again at its next change; this one also on a timer of its own, so the
			// status is right again soon after the API server is back.
			w.log.Warn("publishing status failed; will try again", "error", err)
			if w.policy.bounded() {
				w.publishFailures++
				w.republishAt = workflow.Now(ctx).Add(min(republishBase<<min(w.publishFailures-1, 6), republishMax))
			}
		} else {
			w.published = &st
			w.publishFailures, w.republishAt = 0, time.Time{}
		}
	}
	healthy := w.leasable(st)
	memo := w.memoOf(st)
	fields := map[string]any{contract.MemoKey: memo}
	var watch *activities.MonitorMemo
	var verdict *activities.Verdict
	sameVerdict := true
	if w.policy.shardWatched {
		watch = w.watch()
		// Written only when it changes (memo fields not written keep their value), so the
		// many writes of a flapping proxy carry only what discovery reads; the verdict in
		// it is the one of its epoch's start (or of the run's), which is all a shard that
		// takes over needs. A nil value removes the field: nothing to watch.
		switch {
		case w.sameWatch(watch):
		case watch != nil:
			fields[activities.MonitorMemoKey] = watch
		default:
			fields[activities.MonitorMemoKey] = nil
		}
		// The verdict it holds now, which a shard's member started later (its shard moved,
		// its worker restarted) starts from. It changes with what discovery's memo carries
		// too (health, latency), so it adds bytes to writes made anyway.
		verdict = w.verdictOf(watch)
		sameVerdict = equalData(verdict, w.verdictPub)
		switch {
		case sameVerdict:
		case verdict != nil:
			fields[activities.VerdictMemoKey] = verdict
		default:
			fields[activities.VerdictMemoKey] = nil // removed, as the watch is
		}
	}
	unchanged := w.memo != nil && equalData(*w.memo, memo) && !w.memoDirty && w.sameWatch(watch) && sameVerdict
	if unchanged && w.saPhase == st.Phase && w.saHealthy != nil && *w.saHealthy == healthy {
		return nil
	}
	w.cost += 2 * costUpsert
	err := workflow.UpsertTypedSearchAttributes(ctx,
		contract.SearchAttrPhase.ValueSet(string(st.Phase)),
		contract.SearchAttrProvider.ValueSet(w.providerName()),
		contract.SearchAttrHealthy.ValueSet(healthy),
		contract.SearchAttrUpdatedAt.ValueSet(workflow.Now(ctx).UTC()),
	)
	if err != nil {
		return err
	}
	// The update time is what monitor shards and discovery read changes by, so the memo is
	// never written without it.
	if err := workflow.UpsertMemo(ctx, fields); err != nil {
		return err
	}
	w.memo, w.saPhase, w.saHealthy, w.memoDirty = &memo, st.Phase, &healthy, false
	w.publishedAt, w.urgent = workflow.Now(ctx), false
	if w.policy.shardWatched {
		w.verdictPub = verdict
		w.watchSet, w.watchEpoch, w.watchLeft = true, "", false
		if watch != nil {
			w.watchEpoch = watch.Epoch
		}
	}
	return nil
}

// sameWatch reports whether watch is what this run last published (always true for a run
// of a version that is not watched by shards).
func (w *proxyWorkflow) sameWatch(watch *activities.MonitorMemo) bool {
	if !w.policy.shardWatched {
		return true
	}
	epoch := ""
	if watch != nil {
		epoch = watch.Epoch
	}
	return w.watchSet && epoch == w.watchEpoch
}

func (w *proxyWorkflow) providerName() string {
	s := w.state
	if s.Spec == nil {
		return ""
	}
	return s.Spec.ProviderLabel()
}

// leasable is whether discovery may lease the proxy: it is Ready, or (from version 5) it is
// being replaced and the instance that serves until the replacement is verified is
// healthy. Make-before-break is for crawlers too: the old instance leaves the pool when
// the new one takes its place, not when the new one is started.
func (w *proxyWorkflow) leasable(st v1alpha1.ProxyStatus) bool {
	s := w.state
	if st.Phase == v1alpha1.PhaseReady {
		return true
	}
	return w.policy.serveWhileReplacing && st.Phase == v1alpha1.PhaseReplacing &&
		s.Instance.Running() && s.Health.Known && s.Health.Healthy
}

func (w *proxyWorkflow) memoOf(st v1alpha1.ProxyStatus) contract.ProxyMemo {
	s := w.state
	m := contract.ProxyMemo{
		Name: w.in.Name, Namespace: w.in.Namespace, UID: s.UID, Phase: string(st.Phase),
		Healthy: w.leasable(st), IP: st.IP, Port: st.Port,
		LatencyMillis: st.LatencyMillis, Provider: w.providerName(),
	}
	if s.Spec != nil {
		m.MaxLeases = s.Spec.MaxLeases
		for _, k := range sortedKeys(s.Spec.Attributes) {
			if m.Attributes == nil {
				m.Attributes = make(map[string]string, len(s.Spec.Attributes))
			}
			m.Attributes[k] = string(s.Spec.Attributes[k])
		}
	}
	switch {
	case s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		if s.Spec.Endpoint != nil && s.Spec.Endpoint.CredentialsSecretRef != nil {
			if s.Sealed != "" {
				m.Auth = &contract.ProxyAuth{Sealed: s.Sealed}
			} else {
				// The Secret has not been read yet (it was just named, or cannot be found):
				// leased now, the proxy would be handed out without the credentials it needs.
				m.Healthy = false
			}
		}
	case s.Instance != nil && s.Instance.KeyID != "":
		m.Auth = &contract.ProxyAuth{KeyID: s.Instance.KeyID, Instance: s.Instance.Name}
	}
	now := w.now()
	for _, target := range sortedKeys(s.Cooldowns) {
		if until := s.Cooldowns[target]; until.After(now) {
			if m.Cooldowns == nil {
				m.Cooldowns = map[string]time.Time{}
			}
			m.Cooldowns[target] = until
		}
	}
	return m
}

// How soon a status the API server refused is written again: 30s, doubling to 5 minutes.
// The local activity itself already retried for about a minute.
const (
	republishBase = 30 * time.Second
	republishMax  = 5 * time.Minute
)
