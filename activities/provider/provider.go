package provider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// State is where an instance is in its provider's lifecycle.
type State string

const (
	// StateProvisioning: exists but cannot carry traffic yet (includes GCP RUNNING without an
	// external IP, and a Pod without an IP).
	StateProvisioning State = "Provisioning"
	// StateRunning: has an address and should accept connections.
	StateRunning State = "Running"
	// StateStopped: exists but will not come back by itself; the workflow replaces it.
	StateStopped State = "Stopped"
	// StateDeleting: being torn down.
	StateDeleting State = "Deleting"
)

// Ownership labels every instance carries. The sweeper deletes only instances that carry this
// installation's label and a UID label whose UID belongs to no live Proxy. Values are valid
// GCP label values and Kubernetes label values.
const (
	LabelProxyUID     = "proxyfleet-uid"
	LabelInstallation = "proxyfleet-installation"
	LabelManagedBy    = "proxyfleet-managed-by"
	ManagedByValue    = "proxyfleet"
	// LabelSpecHash is the workflow's spec hash (16 lowercase hex characters, so a valid
	// GCP and Kubernetes label value) the instance was built from. A workflow run that
	// starts with no state finds its Proxy's instances by UID (ListOwned) and keeps one
	// as-is only if it was built from the spec it now wants; the label is how it can tell
	// without remembering anything.
	LabelSpecHash = "proxyfleet-spec-hash"
	// LabelKeyID is the ID of the fleet key the instance's credentials are derived from
	// (8 lowercase hex characters). The instance's name is the other input; a workflow
	// that adopts an instance learns from the label how to derive its credentials.
	LabelKeyID = "proxyfleet-key-id"
)

// Owner selects instances by their ownership labels: an installation's, or, with
// ProxyUID, one Proxy's within it.
type Owner struct {
	// Installation is required: an empty one would select instances that belong to no
	// installation, and the sweeper must never be handed those.
	Installation string
	// ProxyUID narrows the selection to one Proxy's instances (optional).
	ProxyUID string
	// Project is where a provider with projects (gcp) looks; empty is its default.
	Project string
}

// Owns reports whether labels carry o's ownership labels. Providers check every listed
// instance with it rather than trust their server's filter, since the sweeper deletes what
// a list returns.
func (o Owner) Owns(labels map[string]string) bool {
	if o.Installation == "" || labels[LabelInstallation] != o.Installation {
		return false
	}
	return o.ProxyUID == "" || labels[LabelProxyUID] == o.ProxyUID
}

// Check refuses an Owner with no installation, as a permanent error: retrying cannot give
// it one.
func (o Owner) Check() error {
	if o.Installation == "" {
		return Permanent(errors.New("list instances: empty installation"))
	}
	return nil
}

// Selector is the label pairs an owner's instances carry: the server-side filter.
func (o Owner) Selector() map[string]string {
	m := map[string]string{LabelInstallation: o.Installation}
	if o.ProxyUID != "" {
		m[LabelProxyUID] = o.ProxyUID
	}
	return m
}

// Instance is what a provider reports about one instance.
type Instance struct {
	// Name is the provider-side name, chosen by the workflow (see InstanceName).
	Name string `json:"name"`
	// ProviderID locates the instance for Get and Delete (e.g. zones/<zone>/instances/<name>).
	ProviderID string `json:"providerID"`
	State      State  `json:"state"`
	// IP is the address crawlers connect to; empty until Running.
	IP   string `json:"ip,omitempty"`
	Port int32  `json:"port,omitempty"`
	// CreatedAt is the provider's creation time (the sweeper's minimum-age rule uses it).
	CreatedAt time.Time `json:"createdAt"`
	// Labels are the instance's ownership labels as the provider stores them.
	Labels map[string]string `json:"labels,omitempty"`
	// Preempted is set on a Stopped instance that the cloud took back (a GCP Spot VM).
	Preempted bool `json:"preempted,omitempty"`
}

// ProxyUID returns the owning Proxy's UID label, or "".
func (i Instance) ProxyUID() string { return i.Labels[LabelProxyUID] }

// CreateRequest describes an instance to create. CloudInit carries Secret data in memory
// only: it is read by the activity and must never be returned, logged or recorded.
type CreateRequest struct {
	Name         string
	ProxyUID     string
	Installation string
	Namespace    string // the Proxy's namespace
	Port         int32
	Spec         v1alpha1.ProxySpec
	CloudInit    []byte
	// Credentials are what the instance must require of every client (the worker's probes,
	// crawlers), derived from the fleet key KeyID. Like CloudInit, they live in memory
	// only; a provider stores at most a hash of the password on the instance.
	Credentials proxyauth.Credentials
	KeyID       string
	// SpecHash is the workflow's hash of the spec the instance is built from, stored as
	// LabelSpecHash so a workflow that lost its state can tell whether an instance it finds
	// still matches the spec. Empty omits the label.
	SpecHash string
}

// Labels are the ownership labels for the instance, plus LabelSpecHash when SpecHash is set.
func (r CreateRequest) Labels() map[string]string {
	labels := map[string]string{
		LabelProxyUID:     r.ProxyUID,
		LabelInstallation: r.Installation,
		LabelManagedBy:    ManagedByValue,
	}
	if r.SpecHash != "" {
		labels[LabelSpecHash] = r.SpecHash
	}
	if r.KeyID != "" {
		labels[LabelKeyID] = r.KeyID
	}
	return labels
}

// Provider runs instances. Every method is idempotent: Create of an existing name returns
// that instance, Delete of a missing one succeeds.
type Provider interface {
	Create(ctx context.Context, req CreateRequest) (Instance, error)
	// Get returns ErrNotFound (wrapped) when the instance does not exist.
	Get(ctx context.Context, providerID string) (Instance, error)
	Delete(ctx context.Context, providerID string) error
	// ListOwned lists the instances carrying owner's ownership labels: the installation's,
	// and the Proxy's too when owner.ProxyUID is set. It filters on the provider's side
	// and checks the labels again on its own (Owner.Owns), so a too-broad answer never
	// hands back another owner's instances. An empty owner.Installation is a permanent
	// error (Owner.Check).
	ListOwned(ctx context.Context, owner Owner) ([]Instance, error)
	// ProviderID is the ID Create returns for req, known without calling the provider, so
	// an instance whose creation was cut short can still be deleted.
	ProviderID(req CreateRequest) string
}

// Registry maps provider names (spec.provider) to implementations.
type Registry map[v1alpha1.Provider]Provider

// Get returns the named provider, or a transient error naming the ones configured. It is
// transient on purpose: during a rolling change of a worker's providers, the worker that
// picked up the task may be the one without it, and the retry may land on one that has
// it. A Proxy must not latch Failed because one worker was older.
func (r Registry) Get(name v1alpha1.Provider) (Provider, error) {
	p, ok := r[name]
	if !ok {
		return nil, fmt.Errorf("provider %q is not configured on this worker (configured: %v)", name, slices.Sorted(maps.Keys(r)))
	}
	return p, nil
}

// ErrNotFound reports an instance that does not exist.
var ErrNotFound = errors.New("instance not found")

// ErrPreempted is ErrNotFound for an instance the cloud took back and deleted itself (an
// EC2 Spot instance, which is terminated): gone, like any other, and the monitor says
// "preempted" rather than "deleted behind the workflow's back".
var ErrPreempted = fmt.Errorf("taken back by the cloud (preempted): %w", ErrNotFound)

// ErrInUse reports a delete the provider declined because something still uses the
// object: a shared firewall rule that an instance made since the sweep listed it uses.
// The sweep counts it as kept, not as deleted.
var ErrInUse = errors.New("still in use; kept")

// Kind classifies provider errors by what the workflow should do about them.
type Kind int

const (
	// KindTransient errors are retried with backoff.
	KindTransient Kind = iota
	// KindQuota errors are a wait: condition QuotaExceeded and a slow retry, never Failed.
	KindQuota
	// KindPermanent errors will not succeed on retry: phase Failed until the spec changes.
	KindPermanent
)

func (k Kind) String() string {
	switch k {
	case KindQuota:
		return "quota"
	case KindPermanent:
		return "permanent"
	default:
		return "transient"
	}
}

type classified struct {
	kind Kind
	err  error
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// QuotaError marks err as a quota refusal.
func QuotaError(err error) error { return &classified{kind: KindQuota, err: err} }

// Permanent marks err as one that retrying cannot fix.
func Permanent(err error) error { return &classified{kind: KindPermanent, err: err} }

// Class returns the kind of err; unmarked errors are transient.
func Class(err error) Kind {
	var c *classified
	if errors.As(err, &c) {
		return c.kind
	}
	return KindTransient
}
