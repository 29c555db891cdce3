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

// What the run publishes — the Proxy's status, its search attributes, the memo discovery
// and the monitor shards read — is a pure function of the state and of what was last
// written (publication); publishState only carries it out. The rules that decide what a
// crawler or a shard sees (a replaced instance still leasable, a watch restarted or kept)
// are therefore table tests away, without Temporal.

// view derives what others read about the proxy from the run's state and what the run is.
// It reads and never changes anything.
type view struct {
	state  *ProxyState
	in     ProxyWorkflowInput
	policy runPolicy
	tuning Tuning
}

func (w *proxyWorkflow) view() view {
	return view{state: w.state, in: w.in, policy: w.policy, tuning: w.tuning}
}

// written is what the run last wrote where others read it, so nothing is written twice.
type written struct {
	// status is the status the API server last took (nil: none yet). retryAt is when to
	// write one it refused again (zero: no write pending); failures counts the refusals
	// in a row.
	status   *v1alpha1.ProxyStatus
	retryAt  time.Time
	failures int
	// memo, phase and healthy are the last memo and search attributes; at is when.
	memo    *contract.ProxyMemo
	phase   v1alpha1.Phase
	healthy *bool
	at      time.Time
	// watchEpoch is the epoch of the MonitorMemo last published ("" for none); watchSet
	// says one was published by this run. A shard's report for another epoch is stale.
	watchEpoch string
	watchSet   bool
	// verdict is the Verdict last published (nil: none).
	verdict *activities.Verdict
}

// sameWatch reports whether watch is what was last published.
func (wr written) sameWatch(watch *activities.MonitorMemo) bool {
	epoch := ""
	if watch != nil {
		epoch = watch.Epoch
	}
	return wr.watchSet && epoch == wr.watchEpoch
}

// publication is one write of the search attributes and the memo.
type publication struct {
	// The search attributes (ProxyUpdatedAt is the time of the write).
	phase    v1alpha1.Phase
	provider string
	healthy  bool
	// fields are the memo fields to write; a nil value removes its field.
	fields map[string]any
	// next is what will have been written once this is.
	next written
}

// publication is what must be written now for status st, given what was last written and
// whether something not in the memo's value asks for a write (dirty: reports, whose
// cooldowns may have expired by now); false when nothing need be.
func (v view) publication(st v1alpha1.ProxyStatus, last written, dirty bool, now time.Time) (publication, bool) {
	healthy := v.leasable(st)
	memo := v.memo(st, now)
	pub := publication{phase: st.Phase, provider: v.providerName(), healthy: healthy,
		fields: map[string]any{contract.MemoKey: memo}}
	pub.next = last
	pub.next.memo, pub.next.phase, pub.next.healthy = &memo, st.Phase, &healthy
	sameWatch, sameVerdict := true, true
	if v.policy.shardWatched {
		watch := v.watch()
		// Written only when it changes (memo fields not written keep their value), so the
		// many writes of a flapping proxy carry only what discovery reads; the verdict in
		// it is the one of its epoch's start (or of the run's), which is all a shard that
		// takes over needs. A nil value removes the field: nothing to watch.
		sameWatch = last.sameWatch(watch)
		switch {
		case sameWatch:
		case watch != nil:
			pub.fields[activities.MonitorMemoKey] = watch
		default:
			pub.fields[activities.MonitorMemoKey] = nil
		}
		// The verdict it holds now, which a shard's member started later (its shard moved,
		// its worker restarted) starts from. It changes with what discovery's memo carries
		// too (health, latency), so it adds bytes to writes made anyway.
		verdict := v.verdict(watch)
		sameVerdict = equalData(verdict, last.verdict)
		switch {
		case sameVerdict:
		case verdict != nil:
			pub.fields[activities.VerdictMemoKey] = verdict
		default:
			pub.fields[activities.VerdictMemoKey] = nil // removed, as the watch is
		}
		pub.next.verdict, pub.next.watchSet, pub.next.watchEpoch = verdict, true, ""
		if watch != nil {
			pub.next.watchEpoch = watch.Epoch
		}
	}
	unchanged := last.memo != nil && equalData(*last.memo, memo) && !dirty && sameWatch && sameVerdict
	if unchanged && last.phase == st.Phase && last.healthy != nil && *last.healthy == healthy {
		return publication{}, false
	}
	return pub, true
}

// publishState writes what changed since the last write: the CR status (through a local
// activity), then the search attributes and the memo as publication says.
func (w *proxyWorkflow) publishState(ctx workflow.Context) error {
	s := w.state
	if s.UID == "" {
		return nil
	}
	st := status(s, w.wfID)
	s.Phase = st.Phase
	if w.written.status == nil || !equalData(*w.written.status, st) {
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
				w.written.failures++
				w.written.retryAt = workflow.Now(ctx).Add(min(republishBase<<min(w.written.failures-1, 6), republishMax))
			}
		} else {
			w.written.status = &st
			w.written.failures, w.written.retryAt = 0, time.Time{}
		}
	}
	pub, write := w.view().publication(st, w.written, w.flags.memoDirty, w.now())
	if !write {
		return nil
	}
	w.budget.cost += 2 * costUpsert
	err := workflow.UpsertTypedSearchAttributes(ctx,
		contract.SearchAttrPhase.ValueSet(string(pub.phase)),
		contract.SearchAttrProvider.ValueSet(pub.provider),
		contract.SearchAttrHealthy.ValueSet(pub.healthy),
		contract.SearchAttrUpdatedAt.ValueSet(workflow.Now(ctx).UTC()),
	)
	if err != nil {
		return err
	}
	// The update time is what monitor shards and discovery read changes by, so the memo is
	// never written without it.
	if err := workflow.UpsertMemo(ctx, pub.fields); err != nil {
		return err
	}
	w.written = pub.next
	w.written.at = workflow.Now(ctx)
	w.flags.memoDirty, w.flags.urgent = false, false
	if w.policy.shardWatched {
		w.flags.watchLeft = false
	}
	return nil
}

func (v view) instanceInput(ref *InstanceRef) activities.InstanceInput {
	return activities.InstanceInput{
		Provider: ref.Provider, Name: ref.Name, ProxyUID: v.state.UID, Namespace: v.in.Namespace,
		Spec: ref.Spec, ProviderID: ref.ProviderID, SpecHash: ref.Hash,
		PollInterval: v.tuning.PollInterval, MaxWait: v.tuning.WaitRunningMax,
	}
}

// watch is what a monitor shard is to watch for this proxy now, or nil for nothing.
func (v view) watch() *activities.MonitorMemo {
	in, ok := v.monitorInput()
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
		if spec.AWS != nil {
			// Its region locates the instance; its tags (up to 12 KB) would only weigh.
			ii.Spec.AWS = &v1alpha1.AWSSpec{Region: spec.AWS.Region}
		}
		ii.PollInterval, ii.MaxWait, ii.SpecHash = 0, 0, ""
		in.Instance = &ii
	}
	return &activities.MonitorMemo{Epoch: watchEpoch(in), Input: in}
}

// verdict is the verdict to publish beside watch: the run's, for watch's epoch; nil if
// there is no watch or no verdict yet.
func (v view) verdict(watch *activities.MonitorMemo) *activities.Verdict {
	h := v.state.Health
	if watch == nil || !h.Known {
		return nil
	}
	verdict := &activities.Verdict{Epoch: watch.Epoch, Healthy: h.Healthy, Since: h.Since, LatencyMillis: h.LatencyMillis}
	if v.policy.serveWhileReplacing {
		// A member that starts later (its shard moved) must know the reason the run holds,
		// or it could never report it gone (a health-check target judged down).
		verdict.FailureReason = h.FailureReason
	}
	return verdict
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

func (v view) monitorInput() (activities.MonitorInput, bool) {
	s := v.state
	if s.Spec == nil || s.Deleting {
		return activities.MonitorInput{}, false
	}
	in := activities.MonitorInput{HealthCheck: s.Spec.HealthCheck, Last: s.Health, DriftInterval: v.tuning.DriftInterval}
	switch {
	case s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		in.Target = net.JoinHostPort(s.Spec.Endpoint.Host, strconv.Itoa(int(s.Spec.Endpoint.Port)))
		if ref := s.Spec.Endpoint.CredentialsSecretRef; ref != nil {
			in.Auth = &activities.ProbeAuth{Namespace: v.in.Namespace, Secret: ref.Name, UID: s.UID, Sealed: s.Sealed}
		}
	case s.Instance.Running():
		in.Target = net.JoinHostPort(s.Instance.IP, strconv.Itoa(int(s.Instance.Port)))
		ii := v.instanceInput(s.Instance)
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

func (v view) providerName() string {
	s := v.state
	if s.Spec == nil {
		return ""
	}
	return s.Spec.ProviderLabel()
}

// leasable is whether discovery may lease the proxy: it is Ready, or (from version 5) it is
// being replaced and the instance that serves until the replacement is verified is
// healthy. Make-before-break is for crawlers too: the old instance leaves the pool when
// the new one takes its place, not when the new one is started.
func (v view) leasable(st v1alpha1.ProxyStatus) bool {
	s := v.state
	if st.Phase == v1alpha1.PhaseReady {
		return true
	}
	return v.policy.serveWhileReplacing && st.Phase == v1alpha1.PhaseReplacing &&
		s.Instance.Running() && s.Health.Known && s.Health.Healthy
}

// memo is discovery's memo field for status st at now (cooldowns that ended by now are
// left out).
func (v view) memo(st v1alpha1.ProxyStatus, now time.Time) contract.ProxyMemo {
	s := v.state
	m := contract.ProxyMemo{
		Name: v.in.Name, Namespace: v.in.Namespace, UID: s.UID, Phase: string(st.Phase),
		Healthy: v.leasable(st), IP: st.IP, Port: st.Port,
		LatencyMillis: st.LatencyMillis, Provider: v.providerName(),
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
