package workflows

import (
	"fmt"
	"maps"
	"time"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// ProxyWorkflow's pure core: every change to ProxyState is a method that takes the time it
// happens at and returns what the loop must do about it — here for signals, instance steps
// and failures, in health.go for the monitor's verdicts and the times to wake, in adopt.go
// for a run that starts without state. Nothing here touches Temporal, so each transition is
// a table test away from being checked (transitions_test.go), and the loop (proxy.go, the
// steps in execute.go) is left with signals, waiting and activities.

// failKind is what an activity failure means to the state machine. The loop maps Temporal's
// errors to it (failureOf), so the core never sees an SDK type.
type failKind int

const (
	// failTransient backs off exponentially and tries again.
	failTransient failKind = iota
	// failQuota waits QuotaRetry: the provider has no capacity for us yet.
	failQuota
	// failPermanent latches Failed until a newer generation arrives.
	failPermanent
	// failCloudInit waits for the cloud-init Secret to be fixed.
	failCloudInit
)

// effect is what a transition asks of the loop.
type effect struct {
	// replan ends an interruptible wait: what plan() chooses may have changed.
	replan bool
	// publish asks for the memo to be written now: cooldowns changed, discovery must see them.
	publish bool
	// note is said in the workflow's log; warn says it as a warning.
	note string
	warn bool
	// lost is set when an instance vanished or stopped before it ever served.
	lost bool
}

// Limits on what a state carries across continue-as-new, whatever arrives: a proxy reported
// on 100,000 targets carries at most this many of each, with targets of bounded length.
const (
	// maxCooldowns bounds the cooldowns a workflow keeps (and puts in its memo).
	maxCooldowns = 256
	// maxBans bounds the targets remembered as having banned the proxy. A ban-driven
	// replacement needs spec.lifecycle.banReplaceTargets of them, which the schema caps at
	// this value.
	maxBans = 256
	// maxTargetLen is the longest target kept: a DNS name has at most 253 characters.
	maxTargetLen = 253
)

// --- signals -------------------------------------------------------------------------

// applySpec takes the Proxy's spec. Older or duplicate specs change nothing; a spec for a
// different object while deleting is kept as the successor; a spec for a different object
// otherwise (its finalizer was removed by hand) retires the old object's instances.
func (s *ProxyState) applySpec(sig SpecSignal) effect {
	var e effect
	if s.Deleting {
		if sig.UID != s.UID && sig.UID != s.DeletedSuccessor {
			// A new object with the same name: it gets this workflow ID once we are done.
			s.Successor = &sig
			return effect{note: "spec for a new object arrived during deletion; kept for after"}
		}
		return e
	}
	if s.UID != "" && sig.UID != s.UID {
		s.retireAll()
		*s = ProxyState{Retiring: s.Retiring, policy: s.policy}
		e = effect{note: "spec for a different object UID; retiring the old object's instances", warn: true}
	}
	if (s.UID == "" || sig.UID == s.UID) && sig.Pool != s.Pool {
		// Membership is not part of the spec's generation: the controller sends a
		// duplicate spec when it changes. Runs of every version keep it (only version 6
		// acts on it), so a member's run that started before version 6 carries it into the
		// run it continues as.
		s.Pool = sig.Pool
		if s.Pool == "" && s.Asked != nil {
			// No pool to grant it any more: what waited starts now.
			s.ReplaceReason, s.Asked = s.Asked.Reason, nil
			e.replan = true
		}
	}
	if sig.Generation < s.Generation || sig.Generation == s.Generation && sig.SecretVersion == s.SecretVersion {
		return e // stale or duplicate: retries and restarts of the controller are harmless
	}
	s.UID, s.Generation, s.SecretVersion = sig.UID, sig.Generation, sig.SecretVersion
	spec := sig.Spec
	s.Spec = &spec
	s.NeedHash = spec.CloudInit != nil
	if !s.NeedHash {
		s.SecretHash = ""
	}
	s.CloudInitError = ""
	if s.Asked != nil && !s.stillAsks() {
		// The lifecycle that asked changed: a timer asks again if it is still due.
		s.Asked = nil
	}
	// A newer spec deserves a fresh attempt now, not after the last failure's backoff.
	s.Failure, s.RetryAt, s.Attempt, s.LastError, s.Quota = nil, time.Time{}, 0, "", ""
	e.replan = true
	return e
}

// requestDelete starts deleting, unless the delete is for another object with this name:
// an older one's is ignored; a newer one's, arriving while this one deletes, means that
// object must never be provisioned.
func (s *ProxyState) requestDelete(sig contract.DeleteSignal) effect {
	if s.UID != "" && sig.UID != "" && sig.UID != s.UID {
		if s.Deleting && !s.policy.legacy {
			s.DeletedSuccessor = sig.UID
			if s.Successor != nil && s.Successor.UID == sig.UID {
				s.Successor = nil
				return effect{note: "the object that took this name was deleted too; it will not be provisioned"}
			}
		}
		return effect{}
	}
	if s.Deleting {
		return effect{}
	}
	if s.UID == "" && s.Unlisted {
		// A run started for the delete alone: the UID is what it must look for.
		s.UID = sig.UID
	}
	s.Deleting = true
	s.retireAll()
	return effect{replan: true}
}

// requestReplace asks for a make-before-break replacement of a Managed proxy.
func (s *ProxyState) requestReplace(sig contract.ReplaceSignal) effect {
	if s.Deleting || s.Spec == nil || s.Spec.EffectiveMode() == v1alpha1.ModeExternal {
		return effect{note: "replace signal ignored: nothing to replace (" + sig.Reason + ")"}
	}
	if sig.Grant {
		// A pool's grant: the replacement its member waits for, if one still does.
		if s.Asked == nil || s.ReplaceReason != "" {
			return effect{note: "grant ignored: no replacement waits for one"}
		}
		sig.Reason = s.Asked.Reason + " (granted by pool " + s.Pool + ")"
	}
	if sig.Reason == "" {
		sig.Reason = "manual"
	}
	// Whatever waited for the pool is served by this replacement.
	s.Asked = nil
	s.ReplaceReason = sig.Reason
	// An explicit request deserves an attempt now.
	s.RetryAt, s.Attempt = time.Time{}, 0
	return effect{replan: true}
}

// report records a crawler's report: a cooldown for the target (durable here, so it
// survives discovery restarts and reaches every replica through the memo), and for bans the
// distinct targets banned within lifecycle.banWindow, which may call for a replacement.
func (s *ProxyState) report(sig contract.ReportSignal, now time.Time) effect {
	if s.Spec == nil || s.Deleting || (sig.Result != contract.ReportBanned && sig.Result != contract.ReportRateLimited) {
		return effect{}
	}
	if len(sig.Target) > maxTargetLen && !s.policy.legacy {
		// Discovery refuses such targets; a signal sent by hand must not bloat the state.
		return effect{note: fmt.Sprintf("report ignored: target longer than %d characters", maxTargetLen), warn: true}
	}
	until := sig.Until
	if !until.After(now) {
		until = now.Add(DefaultCooldown)
	}
	if s.Cooldowns == nil {
		s.Cooldowns = map[string]time.Time{}
	}
	if until.After(s.Cooldowns[sig.Target]) {
		s.Cooldowns[sig.Target] = until
	}
	if sig.Result == contract.ReportBanned {
		if s.Bans == nil {
			s.Bans = map[string]time.Time{}
		}
		s.Bans[sig.Target] = now
	}
	s.pruneReports(now, s.banWindow())
	e := effect{publish: true}
	if n, limit := len(s.Bans), s.banLimit(); limit > 0 && n >= limit && s.ReplaceReason == "" && s.Asked == nil &&
		s.Spec.EffectiveMode() == v1alpha1.ModeManaged {
		e.replan = s.askReplace(v1alpha1.ReasonBanned, fmt.Sprintf("banned on %d targets within %s", n, s.banWindow()), now)
	}
	return e
}

// pruneReports forgets ended cooldowns and bans older than the window, and keeps at most
// maxCooldowns cooldowns (those ending last) and maxBans bans (the latest). It runs on
// every report, so it is linear in what is kept.
func (s *ProxyState) pruneReports(now time.Time, window time.Duration) {
	deleteWhere(s.Cooldowns, func(until time.Time) bool { return !until.After(now) })
	deleteWhere(s.Bans, func(at time.Time) bool { return now.Sub(at) > window })
	keepLatest(s.Cooldowns, maxCooldowns)
	keepLatest(s.Bans, maxBans)
}

// deleteWhere deletes the entries whose time matches. Which entries go depends only on
// their values, never on map order, so workflowcheck's map-iteration warning does not apply.
//
//workflowcheck:ignore
func deleteWhere(m map[string]time.Time, drop func(time.Time) bool) {
	maps.DeleteFunc(m, func(_ string, t time.Time) bool { return drop(t) })
}

// keepLatest deletes the entries with the earliest times (ties: the greatest target, as before) until
// at most n are left. The entry found is the minimum of a total order, so map order does
// not matter.
//
//workflowcheck:ignore
func keepLatest(m map[string]time.Time, n int) {
	for len(m) > n {
		var oldest string
		var at time.Time
		first := true
		for k, t := range m {
			if first || t.Before(at) || t.Equal(at) && k > oldest {
				oldest, at, first = k, t, false
			}
		}
		delete(m, oldest)
	}
}

func (s *ProxyState) banWindow() time.Duration {
	if l := s.Spec.Lifecycle; l != nil && l.BanWindow != nil {
		if d, err := l.BanWindow.ParseDuration(v1alpha1.DefaultBanWindow); err == nil {
			return d
		}
	}
	return v1alpha1.DefaultBanWindow
}

// banLimit is lifecycle.banReplaceTargets (0: bans never replace), at most maxBans: no more
// bans than that are kept.
func (s *ProxyState) banLimit() int {
	if l := s.Spec.Lifecycle; l != nil && l.BanReplaceTargets != nil {
		if s.policy.legacy {
			return int(*l.BanReplaceTargets)
		}
		return min(int(*l.BanReplaceTargets), maxBans)
	}
	return 0
}

// unhealthyGrace is spec.lifecycle.unhealthyReplaceAfter, or 0 when health-driven
// replacement is off.
func (s *ProxyState) unhealthyGrace() time.Duration {
	l := s.Spec.Lifecycle
	if l == nil || l.UnhealthyReplaceAfter == nil {
		return 0
	}
	d, err := l.UnhealthyReplaceAfter.ParseDuration(0)
	if err != nil {
		return 0
	}
	return d
}

// maxAge is spec.lifecycle.maxAge, or 0 when instances live as long as they serve.
func (s *ProxyState) maxAge() time.Duration {
	l := s.Spec.Lifecycle
	if l == nil || l.MaxAge == nil {
		return 0
	}
	d, err := l.MaxAge.ParseDuration(0)
	if err != nil || d <= 0 {
		return 0
	}
	return d
}

// retireAll moves every live instance to Retiring.
func (s *ProxyState) retireAll() {
	for _, r := range []*InstanceRef{s.Next, s.Instance} {
		if r != nil {
			s.Retiring = append(s.Retiring, *r)
		}
	}
	s.Instance, s.Next = nil, nil
	s.DeleteRetryAt = time.Time{}
}

// --- instances -----------------------------------------------------------------------

// allocate records the next instance. It is recorded before Create runs, so an instance
// whose creation is cut short is still known and later deleted.
func (s *ProxyState) allocate(now time.Time) *InstanceRef {
	s.Counter++
	return &InstanceRef{
		Provider:  s.Spec.Provider,
		Name:      InstanceName(s.UID, s.Counter),
		Hash:      DesiredHash(s.Spec, s.SecretHash),
		Spec:      *s.Spec,
		CreatedAt: now,
	}
}

// ensureInstance returns the current instance's name, allocating it first if needed.
func (s *ProxyState) ensureInstance(now time.Time) string {
	if s.Instance == nil {
		s.Instance = s.allocate(now)
	}
	return s.Instance.Name
}

// ensureNext returns the replacement's name, allocating it first if needed.
func (s *ProxyState) ensureNext(now time.Time) string {
	if s.Next == nil {
		s.Next = s.allocate(now)
	}
	return s.Next.Name
}

// find returns the instance record with this name wherever it is kept.
func (s *ProxyState) find(name string) *InstanceRef {
	if s.Instance != nil && s.Instance.Name == name {
		return s.Instance
	}
	if s.Next != nil && s.Next.Name == name {
		return s.Next
	}
	for i := range s.Retiring {
		if s.Retiring[i].Name == name {
			return &s.Retiring[i]
		}
	}
	return nil
}

// retire moves a live instance to Retiring.
func (s *ProxyState) retire(name string) {
	ref := s.find(name)
	if ref == nil || ref != s.Instance && ref != s.Next {
		return
	}
	s.Retiring = append(s.Retiring, *ref)
	s.dropLive(name)
}

// dropLive removes the instance from the live slots after it was copied to Retiring.
func (s *ProxyState) dropLive(name string) {
	if s.Instance != nil && s.Instance.Name == name {
		s.Instance = nil
	}
	if s.Next != nil && s.Next.Name == name {
		s.Next = nil
	}
}

// retireCurrent drops a current instance that does not serve and no longer matches the spec.
func (s *ProxyState) retireCurrent() { s.retire(s.Instance.Name) }

// retireNext drops a replacement that no longer matches the spec or is no longer needed.
func (s *ProxyState) retireNext() { s.retire(s.Next.Name) }

// created records a Create that returned: the provider accepted the instance.
func (s *ProxyState) created(name string, res activities.CreateResult) {
	// The attempt count stays until the instance runs: one lost before it ever ran backs
	// off longer each time (lostWhileProvisioning).
	s.LastError, s.Quota, s.RetryAt = "", "", time.Time{}
	ref := s.find(name) // signals may have moved it to Retiring meanwhile
	if ref == nil {
		return
	}
	ref.Created = true
	ref.ProviderID = res.Instance.ProviderID
	ref.KeyID = res.KeyID
	ref.State, ref.IP, ref.Port = res.Instance.State, res.Instance.IP, portOr(res.Instance.Port, &ref.Spec)
	if ref.Spec.CloudInit != nil && res.SecretHash != "" && res.SecretHash != s.SecretHash && !s.Deleting {
		// The Secret changed between hashing and creating: the instance was built from the
		// newer data, which is now what we want.
		s.SecretHash = res.SecretHash
		ref.Hash = DesiredHash(&ref.Spec, res.SecretHash)
	}
}

// createFailed records a Create that failed for good (its own retries are spent).
func (s *ProxyState) createFailed(name string, kind failKind, msg string, now time.Time, t Tuning) effect {
	if kind == failPermanent {
		// Nothing was created; the record is retired anyway so a delete makes sure.
		s.retire(name)
	}
	return s.failed(kind, msg, now, t)
}

// waited records what WaitRunning saw: an instance gone or stopped before it ever ran is
// retired (and a new one created under a new name); a running one records its address.
func (s *ProxyState) waited(name string, res activities.WaitResult) effect {
	ref := s.find(name)
	if ref == nil {
		return effect{}
	}
	switch {
	case res.Gone:
		s.retire(name)
		return effect{note: "instance disappeared while provisioning: " + name, warn: true, lost: true}
	case res.Instance.State == provider.StateStopped:
		s.retire(name)
		return effect{note: "instance stopped while provisioning: " + name, warn: true, lost: true}
	}
	ref.State, ref.IP, ref.Port = res.Instance.State, res.Instance.IP, portOr(res.Instance.Port, &ref.Spec)
	if ref.ProviderID == "" {
		ref.ProviderID = res.Instance.ProviderID
	}
	if ref.Running() {
		s.Attempt = 0
	}
	return effect{}
}

// lostWhileProvisioning holds off the next create after an instance vanished or stopped
// before it ever served: a provider that accepts instances and then drops them (a stockout
// reported late, a quota enforced after the fact) must not be asked again in a tight loop.
func (s *ProxyState) lostWhileProvisioning(name string, now time.Time, t Tuning) {
	s.Attempt++
	s.LastError = "instance " + name + " vanished or stopped before it ever ran"
	s.RetryAt = now.Add(t.Backoff(s.Attempt))
}

// verified records the replacement's own health verdict. A healthy replacement is promoted
// next; an unhealthy one is retired and tried again later, unless the current instance is
// no better, in which case swapping costs nothing.
func (s *ProxyState) verified(name string, h activities.Health, now time.Time, t Tuning) effect {
	next := s.Next
	if next == nil || next.Name != name {
		if s.policy.serveWhileReplacing && s.Instance != nil && s.Instance.Name == name && h.Healthy && !(s.Health.Known && s.Health.Healthy) {
			// It took over from a lost instance while it was being checked: its verdict
			// is the proxy's.
			s.Health = h
			s.Health.Since = now
			return effect{publish: true}
		}
		return effect{}
	}
	next.Health = &h
	if h.Healthy || !s.Health.Known || !s.Health.Healthy {
		return effect{}
	}
	s.retire(name)
	s.LastError = "replacement " + name + " failed its health check: " + h.LastFailure
	s.Attempt++
	s.RetryAt = now.Add(t.Backoff(s.Attempt))
	return effect{note: "replacement failed its health check; keeping the current instance: " + name, warn: true}
}

// promote makes the verified replacement current and retires the old instance.
func (s *ProxyState) promote(now time.Time) effect {
	old := *s.Instance
	s.Instance, s.Next = s.Next, nil
	// The replacement passed its own health check; that verdict is now the proxy's.
	if s.Instance.Health != nil {
		s.Health = *s.Instance.Health
		s.Health.Since = now
		s.Instance.Health = nil
	}
	s.Instance.CreatedAt = now
	s.Retiring = append(s.Retiring, old)
	s.Replacements++
	// Bans and cooldowns were earned by the old address.
	s.Cooldowns, s.Bans, s.Asked = nil, nil, nil
	reason := s.ReplaceReason
	if reason == "" {
		reason = "spec changed"
	}
	s.ReplaceReason = ""
	return effect{publish: true, note: fmt.Sprintf("replacement %s promoted over %s (%s)", s.Instance.Name, old.Name, reason)}
}

// deleted records that a retiring instance is gone.
func (s *ProxyState) deleted(name string) {
	for i := range s.Retiring {
		if s.Retiring[i].Name == name {
			s.Retiring = append(s.Retiring[:i], s.Retiring[i+1:]...)
			break
		}
	}
	s.DeleteRetryAt, s.DeleteAttempts = time.Time{}, 0
}

// deleteFailed holds off deletes after a failed one, separately from creates.
func (s *ProxyState) deleteFailed(msg string, now time.Time, t Tuning) {
	s.DeleteAttempts++
	s.DeleteRetryAt = now.Add(t.Backoff(s.DeleteAttempts))
	s.LastError = msg
}

// hashed records the cloud-init Secret's hash.
func (s *ProxyState) hashed(h string) {
	s.SecretHash, s.NeedHash, s.CloudInitError = h, false, ""
	if s.Instance != nil && s.Instance.Hash == "" && s.Spec != nil {
		// An adopted instance of unknown spec (see adopt) is taken as built from this one.
		s.Instance.Hash = DesiredHash(s.Spec, h)
	}
}

// --- failures ------------------------------------------------------------------------

// failed records an activity failure by its kind: quota is a slow retry, permanent latches
// Failed for this generation, a cloud-init problem waits for the Secret, anything else
// backs off exponentially.
func (s *ProxyState) failed(kind failKind, msg string, now time.Time, t Tuning) effect {
	s.Attempt++
	switch kind {
	case failQuota:
		s.Quota = msg
		s.RetryAt = now.Add(t.QuotaRetry)
	case failPermanent:
		s.Failure = &Failure{Generation: s.Generation, Message: msg}
	case failCloudInit:
		s.CloudInitError = msg
		s.NeedHash = true
		s.RetryAt = now.Add(t.Backoff(s.Attempt))
	default:
		s.LastError = msg
		s.RetryAt = now.Add(t.Backoff(s.Attempt))
	}
	return effect{note: fmt.Sprintf("provisioning step failed (attempt %d): %s", s.Attempt, msg), warn: true}
}

// succeeded clears the failure record after a provider call went through.
func (s *ProxyState) succeeded() {
	s.Attempt, s.LastError, s.Quota, s.RetryAt = 0, "", "", time.Time{}
}

// successor is the state a new run starts from for the object that took this name while
// this one was being deleted.
func (s *ProxyState) successor() *ProxyState {
	next := &ProxyState{}
	next.applySpec(*s.Successor)
	return next
}

// portOr is the instance's port as its provider reports it, or the spec's when the
// provider does not know it (a VM's listening port is whatever its image configures).
func portOr(p int32, spec *v1alpha1.ProxySpec) int32 {
	if p != 0 {
		return p
	}
	return spec.EffectivePort()
}

// stillAsks says whether the replacement a member asked for is still wanted under the
// spec it has now: bans still at the limit; a rotation until the Secret is hashed again.
// An ask of maxAge or of the unhealthy grace is dropped, and asked again at once by the
// steady step's timer when still due under the new lifecycle.
func (s *ProxyState) stillAsks() bool {
	if s.Asked.Cause == v1alpha1.ReasonCloudInit {
		return true // askRotation decides, once the Secret is hashed again
	}
	if s.Asked.Cause != v1alpha1.ReasonBanned || s.Spec == nil || s.Spec.EffectiveMode() != v1alpha1.ModeManaged {
		return false
	}
	limit := s.banLimit()
	return limit > 0 && len(s.Bans) >= limit
}
