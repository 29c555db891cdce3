package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/proxyfleet/proxyfleet/activities/monitor"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Application error types the workflow branches on. Errors of these types are never retried
// by Temporal: the workflow decides what happens next.
const (
	ErrTypeQuota     = "Quota"
	ErrTypePermanent = "Permanent"
	ErrTypeCloudInit = "CloudInit"
)

// Activities holds the dependencies of every activity. Workflows call its methods through a
// nil *Activities, so activity names are checked by the compiler.
type Activities struct {
	Providers provider.Registry
	// Kube reads Proxies and Secrets and writes Proxy status. It should not be a cached
	// client: Secrets are read once per use and never kept.
	Kube client.Client
	// Installation is this deployment's id; every instance is labelled with it.
	Installation string
	// Temporal lists running workflows for the orphan sweeper and monitor shards.
	Temporal WorkflowLister
	// Signaller is how monitor shards report to the proxies' workflows.
	Signaller WorkflowSignaller
	// Metrics may be nil (tests).
	Metrics *Metrics
	// Prober sends probes through proxies; nil uses probe.Probe with default settings.
	Prober Prober
	Log    *slog.Logger
	// CallTimeout bounds one provider call made by a long-running activity (default 20s,
	// and never more than half the activity's heartbeat timeout).
	CallTimeout time.Duration
	// Keyring holds the fleet key Managed instances' credentials are derived from and
	// External ones are sealed with. A worker without one creates nothing (the error says
	// so) and probes only proxies that take no credentials.
	Keyring *proxyauth.Keyring

	// monitorShards are this worker's monitor shards (see MonitorShard), made at its
	// first shard.
	shardsOnce    sync.Once
	monitorShards *monitor.Shards
}

func (a *Activities) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.Default()
}

// classify turns a provider error into what the workflow acts on: quota and permanent errors
// become non-retryable application errors of a known type; anything else stays retryable.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	msg := op + ": " + err.Error()
	switch provider.Class(err) {
	case provider.KindQuota:
		return temporal.NewNonRetryableApplicationError(msg, ErrTypeQuota, nil)
	case provider.KindPermanent:
		return temporal.NewNonRetryableApplicationError(msg, ErrTypePermanent, nil)
	default:
		return fmt.Errorf("%s: %w", op, err)
	}
}

// InstanceInput locates one instance of a Proxy (monitor.InstanceInput: a watch carries
// one).
type InstanceInput = monitor.InstanceInput

// createRequest is what the provider is asked to create for in.
func createRequest(in InstanceInput, installation string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: in.Name, ProxyUID: in.ProxyUID, Installation: installation,
		Namespace: in.Namespace, Port: in.Spec.EffectivePort(), Spec: in.Spec,
		SpecHash: in.SpecHash,
	}
}

func (a *Activities) locate(in InstanceInput) (provider.Provider, string, error) {
	p, err := a.Providers.Get(in.Provider)
	if err != nil {
		return nil, "", err
	}
	id := in.ProviderID
	if id == "" {
		id = p.ProviderID(createRequest(in, a.Installation))
	}
	return p, id, nil
}

// CreateResult is what CreateInstance reports.
type CreateResult struct {
	Instance provider.Instance `json:"instance"`
	// SecretHash is the hash of the cloud-init data the instance was actually built from.
	SecretHash string `json:"secretHash,omitempty"`
	// KeyID is the fleet key the instance's credentials are derived from (with its name).
	KeyID string `json:"keyID,omitempty"`
}

// CreateInstance asks the provider for an instance. It is idempotent: the name is
// deterministic, and "already exists" is success, so a retry after a crash adopts the
// instance an earlier attempt created.
func (a *Activities) CreateInstance(ctx context.Context, in InstanceInput) (CreateResult, error) {
	p, err := a.Providers.Get(in.Provider)
	if err != nil {
		return CreateResult{}, classify("create", err)
	}
	req := createRequest(in, a.Installation)
	var res CreateResult
	if ref := in.Spec.CloudInit; ref != nil {
		data, err := a.readCloudInit(ctx, in.Namespace, ref.SecretRef)
		if err != nil {
			return CreateResult{}, err
		}
		req.CloudInit = data
		res.SecretHash = hashData(data)
	}
	if a.Keyring == nil {
		// Not permanent: in a rolling change of the worker's settings, another worker may
		// hold the key. An instance without credentials would be an open proxy.
		return CreateResult{}, classify("create "+in.Name, errors.New("this worker has no fleet key (--fleet-key-path or PROXYFLEET_FLEET_KEY): it cannot give the instance credentials"))
	}
	req.KeyID = a.Keyring.PrimaryID()
	if req.Credentials, err = a.Keyring.Managed(req.KeyID, req.Name); err != nil {
		return CreateResult{}, classify("create "+in.Name, err)
	}
	inst, err := p.Create(ctx, req)
	if err != nil {
		return CreateResult{}, classify("create "+in.Name, err)
	}
	res.Instance = inst
	// An instance an earlier attempt created keeps the credentials it was made with: its
	// label says which key they come from, even if the primary key changed since.
	res.KeyID = req.KeyID
	if id, ok := inst.Labels[provider.LabelKeyID]; ok {
		res.KeyID = id
	}
	a.log().InfoContext(ctx, "instance created", "provider", in.Provider, "instance", inst.Name, "providerID", inst.ProviderID)
	return res, nil
}

// WaitResult is what WaitRunning reports.
type WaitResult struct {
	Instance provider.Instance `json:"instance"`
	// Gone is true when the instance does not exist (deleted behind our back).
	Gone bool `json:"gone,omitempty"`
}

// WaitRunning polls the provider until the instance runs with an address, is gone or
// stopped, or MaxWait passes (then it reports the instance still provisioning, so the
// workflow can say how long it has waited). It heartbeats, so a worker crash resumes the
// wait elsewhere and a cancelled wait stops promptly.
func (a *Activities) WaitRunning(ctx context.Context, in InstanceInput) (WaitResult, error) {
	p, id, err := a.locate(in)
	if err != nil {
		return WaitResult{}, classify("wait", err)
	}
	poll := orDefault(in.PollInterval, 5*time.Second)
	deadline := time.Now().Add(orDefault(in.MaxWait, 10*time.Minute))
	var last provider.Instance
	for {
		cctx, cancel := a.callContext(ctx)
		inst, err := p.Get(cctx, id)
		cancel()
		switch {
		case errors.Is(err, provider.ErrNotFound):
			return WaitResult{Gone: true}, nil
		case err == nil && inst.State == provider.StateDeleting:
			// Being torn down (a pod someone deleted; a VM gone whose firewall rule is
			// left): it will not run, and waiting would only wait for it to vanish.
			return WaitResult{Gone: true}, nil
		case err != nil && provider.Class(err) == provider.KindPermanent:
			return WaitResult{}, classify("get "+id, err)
		case err != nil:
			// A flaky Get is no reason to give up the wait; the heartbeat says we are alive.
			a.log().WarnContext(ctx, "get instance failed; will poll again", "providerID", id, "error", err)
		default:
			last = inst
			if inst.State == provider.StateRunning && inst.IP != "" || inst.State == provider.StateStopped {
				return WaitResult{Instance: inst}, nil
			}
		}
		if time.Now().After(deadline) {
			return WaitResult{Instance: last}, nil
		}
		activity.RecordHeartbeat(ctx, last.State)
		select {
		case <-ctx.Done():
			return WaitResult{}, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// DeleteInstance deletes the instance and waits until the provider no longer has it,
// issuing the delete again while it lingers: a Create that raced an earlier delete must not
// leave an instance behind. Missing instances are success.
func (a *Activities) DeleteInstance(ctx context.Context, in InstanceInput) error {
	p, id, err := a.locate(in)
	if err != nil {
		return classify("delete", err)
	}
	poll := orDefault(in.PollInterval, 5*time.Second)
	for i := 0; ; i++ {
		if i%6 == 0 {
			cctx, cancel := a.callContext(ctx)
			err := p.Delete(cctx, id)
			cancel()
			if err != nil && !errors.Is(err, provider.ErrNotFound) {
				// Permanent errors are retried too: giving up would leak the instance and wedge
				// the Proxy's finalizer. The workflow keeps retrying with backoff, visibly.
				return fmt.Errorf("delete %s: %w", id, err)
			}
			// Each call is bounded by half the heartbeat timeout; two in a row need a beat
			// between them.
			activity.RecordHeartbeat(ctx, i)
		}
		cctx, cancel := a.callContext(ctx)
		_, err := p.Get(cctx, id)
		cancel()
		if errors.Is(err, provider.ErrNotFound) {
			a.log().InfoContext(ctx, "instance deleted", "provider", in.Provider, "providerID", id)
			return nil
		}
		activity.RecordHeartbeat(ctx, i)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// HashInput names a cloud-init Secret key.
type HashInput struct {
	Namespace string                `json:"namespace"`
	Ref       v1alpha1.SecretKeyRef `json:"ref"`
}

// HashCloudInit returns a hash of the cloud-init data. The data itself never leaves this
// function: only the hash goes into workflow history, to detect rotation.
func (a *Activities) HashCloudInit(ctx context.Context, in HashInput) (string, error) {
	data, err := a.readCloudInit(ctx, in.Namespace, in.Ref)
	if err != nil {
		return "", err
	}
	return hashData(data), nil
}

func (a *Activities) readCloudInit(ctx context.Context, namespace string, ref v1alpha1.SecretKeyRef) ([]byte, error) {
	var s corev1.Secret
	err := a.Kube.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, &s)
	if apierrors.IsNotFound(err) {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("cloud-init Secret %s/%s not found", namespace, ref.Name), ErrTypeCloudInit, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("read cloud-init Secret %s/%s: %w", namespace, ref.Name, err)
	}
	if s.Labels[v1alpha1.LabelCloudInit] != "true" {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("Secret %s/%s lacks the label %s=true that marks it as cloud-init", namespace, ref.Name, v1alpha1.LabelCloudInit),
			ErrTypeCloudInit, nil)
	}
	data, ok := s.Data[ref.Key]
	if !ok {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("cloud-init Secret %s/%s has no key %q", namespace, ref.Name, ref.Key), ErrTypeCloudInit, nil)
	}
	return data, nil
}

func hashData(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// PublishInput is a status to write on one Proxy object.
type PublishInput struct {
	Namespace string               `json:"namespace"`
	Name      string               `json:"name"`
	UID       string               `json:"uid"`
	Status    v1alpha1.ProxyStatus `json:"status"`
}

// PublishStatus writes the status subresource. The workflow is its only writer. It skips
// objects with another UID (a Proxy recreated under the same name is not ours) and keeps a
// condition's transition time when its status has not changed.
func (a *Activities) PublishStatus(ctx context.Context, in PublishInput) error {
	p, err := a.ownProxy(ctx, ObjectRef{Namespace: in.Namespace, Name: in.Name, UID: in.UID})
	if p == nil || err != nil {
		return err
	}
	before := p.DeepCopy()
	conds := p.Status.Conditions
	p.Status = in.Status
	p.Status.Conditions = conds
	for _, c := range in.Status.Conditions {
		c.ObservedGeneration = in.Status.ObservedGeneration
		meta.SetStatusCondition(&p.Status.Conditions, c)
	}
	if equality.Semantic.DeepEqual(before.Status, p.Status) {
		return nil
	}
	if err := a.Kube.Status().Patch(ctx, p, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("patch proxy status: %w", err)
	}
	return nil
}

// ObjectRef names one Proxy object.
type ObjectRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// ReleaseFinalizer lets a deleted Proxy go once its instances are gone. It only touches the
// object with the workflow's UID, and only while that object is being deleted.
func (a *Activities) ReleaseFinalizer(ctx context.Context, in ObjectRef) error {
	p, err := a.ownProxy(ctx, in)
	if p == nil || err != nil || p.DeletionTimestamp == nil || !controllerutil.ContainsFinalizer(p, v1alpha1.Finalizer) {
		return err
	}
	before := p.DeepCopy()
	controllerutil.RemoveFinalizer(p, v1alpha1.Finalizer)
	if err := a.Kube.Patch(ctx, p, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// ownProxy reads the Proxy the workflow owns: nil (and no error) when it is gone or the
// name now belongs to another object (a Proxy recreated under the same name is not ours).
func (a *Activities) ownProxy(ctx context.Context, ref ObjectRef) (*v1alpha1.Proxy, error) {
	var p v1alpha1.Proxy
	err := a.Kube.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &p)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get proxy: %w", err)
	}
	if string(p.UID) != ref.UID {
		return nil, nil
	}
	return &p, nil
}

// callContext bounds one provider call to less than the activity's heartbeat timeout: a
// hung cloud API then fails the call, which the activity retries or reports, instead of
// holding the activity (and its worker slot) until Temporal gives up on it.
func (a *Activities) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := orDefault(a.CallTimeout, 20*time.Second)
	if activity.IsActivity(ctx) {
		if hb := activity.GetInfo(ctx).HeartbeatTimeout; hb > 0 {
			d = min(d, hb/2)
		}
	}
	return context.WithTimeout(ctx, d)
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
