package workflows

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

// ProxyWorkflowInput starts (or continues) the workflow of one Proxy. The spec arrives by
// signal, so that starting and editing are one code path (SignalWithStart). A start
// sends proxyinput.Start, which is this without State: the two must stay one JSON
// schema (TestStartInputIsTheWorkflowInput).
type ProxyWorkflowInput struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Installation is this deployment's id, put on every instance as an ownership label.
	Installation string `json:"installation"`
	// State is carried across continue-as-new; nil on a first start.
	State *ProxyState `json:"state,omitempty"`
	// Tuning overrides timings; zero fields take defaults. Tests shorten them.
	Tuning Tuning `json:"tuning"`
}

// SpecSignal carries the Proxy's full current spec (see proxyinput.SpecSignal).
type SpecSignal = proxyinput.SpecSignal

// DefaultCooldown applies when a report carries no end time, or one already past.
const DefaultCooldown = 10 * time.Minute

// Tuning holds the workflow's timings (see proxyinput.Tuning).
type Tuning = proxyinput.Tuning

// Run budget defaults (see proxyinput).
const (
	DefaultHistoryLimit  = proxyinput.DefaultHistoryLimit
	DefaultMaxRunBytes   = proxyinput.DefaultMaxRunBytes
	DefaultMaxRunSignals = proxyinput.DefaultMaxRunSignals
	DefaultMaxRunAge     = proxyinput.DefaultMaxRunAge
)

// InstanceRef is the workflow's record of one instance. It is written before the Create
// activity runs, so an instance whose creation was cut short is still known and deleted.
type InstanceRef struct {
	Provider   v1alpha1.Provider `json:"provider"`
	Name       string            `json:"name"`
	ProviderID string            `json:"providerID,omitempty"`
	// Created is true once Create has returned: the provider has accepted the instance.
	Created bool           `json:"created,omitempty"`
	State   provider.State `json:"state,omitempty"`
	IP      string         `json:"ip,omitempty"`
	Port    int32          `json:"port,omitempty"`
	// Lost is set when the instance was lost behind the workflow's back (gone, stopped or
	// preempted): it serves nobody, so its replacement need not wait for its deletion.
	// LostReason says how. Lost keeps the type it was first carried with; see
	// UnmarshalJSON for the runs that carried the reason under its key.
	Lost       bool   `json:"lost,omitempty"`
	LostReason string `json:"lostReason,omitempty"`
	// Hash is the spec hash the instance was built from; a different desired hash means
	// it must be replaced.
	Hash string `json:"hash"`
	// Spec is the spec it was created with: deleting it after a provider or zone change
	// must address it where it is, not where the new spec says.
	Spec v1alpha1.ProxySpec `json:"spec"`
	// CreatedAt is workflow time at creation, reset when the instance is promoted: the start
	// of lifecycle.maxAge.
	CreatedAt time.Time `json:"createdAt"`
	// Health is a replacement's own verdict, taken before traffic moves to it.
	Health *activities.Health `json:"health,omitempty"`
	// KeyID is the fleet key the instance's credentials are derived from (with Name); empty
	// for an instance built before instances had credentials.
	KeyID string `json:"keyID,omitempty"`
}

// UnmarshalJSON reads an InstanceRef as every version carried it. What a run carries
// across continue-as-new is a versioned schema whose fields never change type (see
// carried_test.go); one did: for a day, runs carried the reason an instance was lost
// as a string under "lost", where runs before and since carry a bool and the reason
// under "lostReason". Both decode.
func (r *InstanceRef) UnmarshalJSON(b []byte) error {
	type plain InstanceRef // without this method
	v := struct {
		*plain
		Lost json.RawMessage `json:"lost,omitempty"` // shadows plain's Lost
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	r.Lost = false
	switch raw := strings.TrimSpace(string(v.Lost)); {
	case raw == "" || raw == "null":
	case raw[0] == '"':
		var why string
		if err := json.Unmarshal(v.Lost, &why); err != nil {
			return fmt.Errorf("instance %s: lost: %w", r.Name, err)
		}
		r.Lost = why != ""
		if r.LostReason == "" {
			r.LostReason = why
		}
	default:
		if err := json.Unmarshal(v.Lost, &r.Lost); err != nil {
			return fmt.Errorf("instance %s: lost: %w", r.Name, err)
		}
	}
	return nil
}

// Running reports whether the instance can carry traffic.
func (r *InstanceRef) Running() bool {
	return r != nil && r.State == provider.StateRunning && r.IP != ""
}

// Failure latches a permanent error for one generation: the workflow stays Failed until a
// newer generation arrives.
type Failure struct {
	Generation int64  `json:"generation"`
	Message    string `json:"message"`
}

// AskedReplace is a replacement a pool member's run wants and its pool has not granted
// yet: why (Cause is a ReplacementPending reason), and since when.
type AskedReplace struct {
	Cause  string    `json:"cause"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// ProxyState is everything the workflow knows. It is the query "state" result and what
// continue-as-new carries.
type ProxyState struct {
	UID           string              `json:"uid"`
	Generation    int64               `json:"generation"`
	SecretVersion string              `json:"secretVersion,omitempty"`
	Spec          *v1alpha1.ProxySpec `json:"spec,omitempty"`
	// SecretHash is the hash of the cloud-init Secret's data; empty with NeedHash set means
	// it must be (re)computed before the desired hash is known.
	SecretHash string `json:"secretHash,omitempty"`
	NeedHash   bool   `json:"needHash,omitempty"`

	Phase v1alpha1.Phase `json:"phase"`
	// Instance serves traffic; Next is its replacement being built; Retiring are
	// instances to delete.
	Instance *InstanceRef  `json:"instance,omitempty"`
	Next     *InstanceRef  `json:"next,omitempty"`
	Retiring []InstanceRef `json:"retiring,omitempty"`
	// Counter numbers instances, so every instance of a Proxy has a distinct name.
	Counter      int   `json:"counter"`
	Replacements int32 `json:"replacements"`
	// ReplaceReason is set while a replacement not caused by a spec change is pending.
	ReplaceReason string `json:"replaceReason,omitempty"`
	// Pool is the ProxyPool that controls the Proxy (from the spec signal), if any.
	Pool string `json:"pool,omitempty"`
	// Asked is a replacement the run wants on its own account and waits to be granted by
	// its pool (see askReplace); nil when none waits.
	Asked *AskedReplace `json:"asked,omitempty"`

	Deleting bool     `json:"deleting,omitempty"`
	Failure  *Failure `json:"failure,omitempty"`
	// Quota is the provider's quota message while creation waits on quota.
	Quota string `json:"quota,omitempty"`
	// CloudInitError is set while the cloud-init Secret cannot be read.
	CloudInitError string `json:"cloudInitError,omitempty"`
	// RetryAt holds off provider calls after a failure; Attempt counts consecutive ones.
	RetryAt time.Time `json:"retryAt,omitempty"`
	// DeleteRetryAt holds off deletes after a failed one, separately from creates: a quota
	// wait for a replacement must not delay deleting an instance nobody wants.
	DeleteRetryAt time.Time `json:"deleteRetryAt,omitempty"`
	// DeleteAttempts counts consecutive failed deletes, so their backoff grows as creates'
	// does (Attempt counts creates, and a delete that fails does not touch it).
	DeleteAttempts int    `json:"deleteAttempts,omitempty"`
	Attempt        int    `json:"attempt,omitempty"`
	LastError      string `json:"lastError,omitempty"`

	Health activities.Health `json:"health"`

	// Sealed is an External proxy's credentials as its Secret last gave them, sealed with
	// the fleet key for this Proxy's UID (never in the clear): the memo hands it to
	// discovery, which alone can open it.
	Sealed string `json:"sealed,omitempty"`

	// Cooldowns maps a target ("" for all) to the end of its cooldown; Bans maps a target to
	// when it last banned the proxy. Both are cleared when a replacement is promoted.
	Cooldowns map[string]time.Time `json:"cooldowns,omitempty"`
	Bans      map[string]time.Time `json:"bans,omitempty"`

	// Successor is a spec for a new object with the same name that arrived while this one
	// was being deleted; the workflow continues as new for it once deletion is done.
	Successor *SpecSignal `json:"successor,omitempty"`
	// DeletedSuccessor is the UID of such a newer object whose delete arrived while this one
	// was still deleting: it is not provisioned, whichever of its spec and delete came first.
	DeletedSuccessor string `json:"deletedSuccessor,omitempty"`

	// Unlisted is set on a run that started without state (after a terminate, a server
	// limit or a reset): before anything else it asks the providers for the instances that
	// carry the Proxy's UID label, which earlier runs may have left, and adopts or retires
	// them.
	Unlisted bool `json:"unlisted,omitempty"`

	// policy is what this run's version decides (set by the loop from runPolicy, never
	// carried): decisions added since an older version keep their old outcome there, so
	// its histories replay.
	policy runPolicy
}

// lacksCredentials reports a Managed instance built before instances had credentials: it
// has no fleet key, so it takes anyone, and discovery would hand it out bare.
func (s *ProxyState) lacksCredentials(ref *InstanceRef) bool {
	return s.policy.requireAuth && ref != nil && ref.Created && ref.KeyID == ""
}

// sortedKeys returns the keys in order, so workflow code never depends on map order.
//
//workflowcheck:ignore
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// DesiredHash is the hash of everything that shapes an instance: provider, port, provider
// block, cloud-init reference, the Secret data's hash and the egress rules. Fields added
// later are omitted while unset, so an older spec keeps its hash. Attributes, health checks and
// lease limits are left out: changing them never needs a new instance.
//
// encoding/json is deterministic here (struct fields in order, map keys sorted); workflowcheck
// flags it only because reflection can allocate.
//
//workflowcheck:ignore
func DesiredHash(spec *v1alpha1.ProxySpec, secretHash string) string {
	shape := struct {
		Provider   v1alpha1.Provider        `json:"provider"`
		Port       int32                    `json:"port"`
		GCP        *v1alpha1.GCPSpec        `json:"gcp,omitempty"`
		Kubernetes *v1alpha1.KubernetesSpec `json:"kubernetes,omitempty"`
		Local      *v1alpha1.LocalSpec      `json:"local,omitempty"`
		CloudInit  *v1alpha1.CloudInit      `json:"cloudInit,omitempty"`
		SecretHash string                   `json:"secretHash,omitempty"`
		Egress     *v1alpha1.Egress         `json:"egress,omitempty"`
		AWS        *v1alpha1.AWSSpec        `json:"aws,omitempty"`
	}{spec.Provider, spec.EffectivePort(), hashedGCP(spec.GCP), spec.Kubernetes, spec.Local, spec.CloudInit, secretHash, spec.Egress, spec.AWS}
	b, err := json.Marshal(shape)
	if err != nil {
		// The struct has only marshalable fields; this cannot happen.
		panic(fmt.Sprintf("hash spec: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// hashedGCP is the GCP block as the hash sees it: externalIP true is its default, which the
// API server fills in on objects stored before the field existed, so it hashes like unset.
// Otherwise the first edit of such a Proxy, whatever it changed, would replace its VM.
func hashedGCP(g *v1alpha1.GCPSpec) *v1alpha1.GCPSpec {
	if g == nil || g.ExternalIP == nil || !*g.ExternalIP {
		return g
	}
	c := g.DeepCopy()
	c.ExternalIP = nil
	return c
}

// InstanceName is the deterministic name of a Proxy's n-th instance: valid as a GCP
// instance name and a Pod name ([a-z]([-a-z0-9]*[a-z0-9])?, at most 63 characters). 80 bits
// of the UID's hash keep names of different Proxies apart; the counter keeps a Proxy's
// replacement apart from the instance it replaces, so both can exist at once.
func InstanceName(uid string, n int) string {
	sum := sha256.Sum256([]byte(uid))
	enc := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:10]))
	return fmt.Sprintf("px-%s-%d", enc, n)
}
