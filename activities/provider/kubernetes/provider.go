package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// defaultPageSize bounds one List response, so a cluster with many pods of ours is listed in
// pieces instead of one response the API server must build in memory.
const defaultPageSize = 500

// lostMargin is how long past its deletion timestamp a terminating pod is still waited for.
// The API server sets that timestamp to the deletion time plus the grace period, by which
// the kubelet has stopped Squid; a kubelet that is up confirms within seconds after. The
// margin also absorbs clock skew between the API server and this worker.
const lostMargin = 30 * time.Second

// Provider runs one Squid pod per instance. Provider IDs are "<namespace>/<name>".
//
// Client should read from the API server, not a cache: Get must see a pod created a moment
// ago, and a cache of Pods would watch every pod in the cluster. It needs get, list, create
// and delete on pods (list cluster-wide, for ListOwned).
type Provider struct {
	Client client.Client
	// Allow limits the namespaces and images a Proxy may ask for.
	Allow Allow
	// ProbeFrom are the worker's pods, as NetworkPolicy peers: every Squid pod's policy
	// admits them so that probes get through.
	ProbeFrom []networkingv1.NetworkPolicyPeer

	// pageSize overrides defaultPageSize (tests).
	pageSize int64
	// now is the clock that judges how long a pod has been terminating; nil is time.Now.
	// Tests move it forward instead of waiting out a grace period.
	now func() time.Time
}

func (p *Provider) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

// lost reports a pod stuck terminating: past its grace period by more than lostMargin, and
// still there. Only the kubelet removes a terminating pod, so this is one whose node is
// gone or cut off; it will not finish on its own, and nothing in the cluster removes it
// until someone deletes the Node. A Proxy deletion must not hang on such a pod, and the
// Proxy must get a replacement, so the provider counts the pod as gone (Get) and removes
// the API object by force (Delete).
func (p *Provider) lost(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp != nil && p.clock().Sub(pod.DeletionTimestamp.Time) > lostMargin
}

var _ provider.Provider = (*Provider)(nil)

// ProviderID implements provider.Provider.
func (p *Provider) ProviderID(req provider.CreateRequest) string {
	return podNamespace(req) + "/" + req.Name
}

// Create implements provider.Provider. An existing pod of the same name is returned when it
// belongs to the same Proxy (a retry after a crash), and refused otherwise.
//
// Three objects make an instance: the Secret holding its rendered configuration, the
// NetworkPolicy admitting only the Proxy's clients, and the pod. The Secret and the policy
// come first, so the pod never runs without its configuration or unprotected; once the pod
// exists they are made its dependents, so the cluster removes them with it. Delete removes
// all three too, for clusters or moments where that has not happened.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := checkRequest(req); err != nil {
		return provider.Instance{}, err
	}
	if err := p.Allow.check(req); err != nil {
		return provider.Instance{}, err
	}
	if req.Credentials.Empty() {
		return provider.Instance{}, provider.Permanent(errors.New("no credentials for the instance: a Squid pod without them would be an open proxy"))
	}
	files, err := renderConfig(req)
	if err != nil {
		return provider.Instance{}, provider.Permanent(fmt.Errorf("render the Squid configuration: %w", err))
	}

	pod := buildPod(req)
	key := client.ObjectKeyFromObject(pod)
	// A pod an earlier attempt created runs with the Secret that attempt wrote, and its key
	// label tells the workflow which credentials Squid requires. Rewriting that Secret (with
	// a fleet key made primary since, say) would change them behind the label, at Squid's
	// next restart; so an existing pod is adopted with its Secret as it is, and the Secret
	// is brought to this request only while no pod reads it.
	existing, err := p.adopt(ctx, key, req.ProxyUID)
	if err != nil && !apierrors.IsNotFound(err) {
		return provider.Instance{}, err
	}
	secret := buildConfigSecret(req, files)
	if err := ensure(ctx, p.Client, secret, req.ProxyUID, func(have *corev1.Secret) bool {
		return existing != nil || have.Labels[provider.LabelKeyID] == req.KeyID && maps.EqualFunc(have.Data, secret.Data, bytes.Equal)
	}, func(have *corev1.Secret) { have.Data, have.Labels = secret.Data, secret.Labels }); err != nil {
		return provider.Instance{}, err
	}
	policy := buildNetworkPolicy(req, p.ProbeFrom)
	if err := ensure(ctx, p.Client, policy, req.ProxyUID, func(have *networkingv1.NetworkPolicy) bool {
		return equality.Semantic.DeepEqual(have.Spec, policy.Spec)
	}, func(have *networkingv1.NetworkPolicy) { have.Spec = policy.Spec }); err != nil {
		return provider.Instance{}, err
	}

	if existing == nil {
		switch err := p.Client.Create(ctx, pod); {
		case apierrors.IsAlreadyExists(err):
			// Created since the look above, by an attempt running alongside this one.
			if existing, err = p.adopt(ctx, key, req.ProxyUID); err != nil {
				return provider.Instance{}, err
			}
		case err != nil:
			return provider.Instance{}, classify("create pod "+key.String(), err)
		}
	}
	if existing != nil {
		pod = existing
	}
	inst := toInstance(pod)
	for _, dep := range []client.Object{secret, policy} {
		if err := p.ownBy(ctx, dep, pod); err != nil {
			return provider.Instance{}, err
		}
	}
	return inst, nil
}

// ensure creates obj, or checks that the existing object of its name is this Proxy's and
// brings it to what obj says (same reports whether it already is; update copies obj in).
func ensure[T client.Object](ctx context.Context, c client.Client, obj T, uid string, same func(T) bool, update func(T)) error {
	what := fmt.Sprintf("%T %s/%s", obj, obj.GetNamespace(), obj.GetName())
	err := c.Create(ctx, obj)
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return classify("create "+what, err)
	}
	have := obj.DeepCopyObject().(T)
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), have); err != nil {
		return classify("get "+what, err)
	}
	if got := have.GetLabels()[provider.LabelProxyUID]; got != uid {
		return provider.Permanent(fmt.Errorf("%s already exists and is not this Proxy's (label %s=%q, want %q)", what, provider.LabelProxyUID, got, uid))
	}
	if !same(have) {
		// An earlier attempt's object, from another spec or fleet key: the pod is about to
		// read it, so it must say what this attempt wants.
		update(have)
		if err := c.Update(ctx, have); err != nil {
			return classify("update "+what, err)
		}
	}
	// obj stands for the object in the cluster from here on (ownBy patches it).
	obj.SetUID(have.GetUID())
	obj.SetResourceVersion(have.GetResourceVersion())
	obj.SetOwnerReferences(have.GetOwnerReferences())
	return nil
}

// ownBy makes dep a dependent of pod, so the cluster's garbage collector deletes it with
// the pod even if the worker never gets to.
func (p *Provider) ownBy(ctx context.Context, dep client.Object, pod *corev1.Pod) error {
	for _, ref := range dep.GetOwnerReferences() {
		if ref.UID == pod.UID {
			return nil
		}
	}
	patch := client.MergeFrom(dep.DeepCopyObject().(client.Object))
	dep.SetOwnerReferences(append(dep.GetOwnerReferences(), metav1.OwnerReference{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
	}))
	if err := p.Client.Patch(ctx, dep, patch); err != nil {
		return classify(fmt.Sprintf("own %T %s by its pod", dep, dep.GetName()), err)
	}
	return nil
}

// adopt returns the pod an earlier attempt created, after proving it is that attempt's: the
// name is derived from the Proxy's UID, so another UID on it means a collision with a pod
// we must never take over (or later delete).
func (p *Provider) adopt(ctx context.Context, key types.NamespacedName, uid string) (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := p.Client.Get(ctx, key, &pod); err != nil {
		// NotFound: no pod yet, which Create then makes; or one deleted since Create was
		// told it exists, which the retry creates again.
		return nil, classify("get existing pod "+key.String(), err)
	}
	if got := pod.Labels[provider.LabelProxyUID]; got != uid {
		return nil, provider.Permanent(fmt.Errorf(
			"pod %s already exists and is not this Proxy's (label %s=%q, want %q)",
			key, provider.LabelProxyUID, got, uid))
	}
	return &pod, nil
}

// checkRequest refuses requests no pod can satisfy, before anything reaches the cluster.
func checkRequest(req provider.CreateRequest) error {
	if errs := validation.IsDNS1123Subdomain(req.Name); len(errs) > 0 {
		return provider.Permanent(fmt.Errorf("pod name %q: %s", req.Name, strings.Join(errs, "; ")))
	}
	ns := podNamespace(req)
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return provider.Permanent(fmt.Errorf("pod namespace %q: %s", ns, strings.Join(errs, "; ")))
	}
	// The API server rejects only leading and trailing whitespace in an image; a space
	// inside passes admission and leaves the pod Pending with InvalidImageName forever.
	if image := podImage(req); strings.ContainsFunc(image, unicode.IsSpace) {
		return provider.Permanent(fmt.Errorf("spec.kubernetes.image %q: an image reference has no whitespace", image))
	}
	// A secret volume can only name a Secret in the pod's own namespace. The cloud-init
	// Secret the worker checked lives in the Proxy's namespace; mounting a same-named Secret
	// from another namespace would run the pod with configuration nobody vetted.
	if ci := req.Spec.CloudInit; ci != nil && ns != req.Namespace {
		return provider.Permanent(fmt.Errorf(
			"spec.cloudInit needs the pod in the Proxy's namespace %q, but spec.kubernetes.namespace is %q: a pod can only mount Secrets of its own namespace",
			req.Namespace, ns))
	}
	return nil
}

// Get implements provider.Provider.
func (p *Provider) Get(ctx context.Context, providerID string) (provider.Instance, error) {
	key, err := parseID(providerID)
	if err != nil {
		return provider.Instance{}, err
	}
	var pod corev1.Pod
	if err := p.Client.Get(ctx, key, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return provider.Instance{}, fmt.Errorf("pod %s: %w (%v)", key, provider.ErrNotFound, err)
		}
		return provider.Instance{}, classify("get pod "+key.String(), err)
	}
	if p.lost(&pod) {
		// Gone as far as the Proxy is concerned: its Squid no longer serves, and waiting
		// for the object would wait for a node that is not coming back. Delete removes the
		// object.
		return provider.Instance{}, fmt.Errorf("pod %s: %w (still terminating; its grace period ended at %s: its node is lost)",
			key, provider.ErrNotFound, pod.DeletionTimestamp.UTC().Format(time.RFC3339))
	}
	return toInstance(&pod), nil
}

// Delete implements provider.Provider. It only asks: the kubelet stops Squid within the grace
// period, and the workflow polls Get until the pod is gone. A pod stuck terminating past
// its grace period (see lost) is deleted by force instead, since its kubelet will never
// confirm and the object would otherwise stay.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	key, err := parseID(providerID)
	if err != nil {
		return err
	}
	var pod corev1.Pod
	switch err := p.Client.Get(ctx, key, &pod); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return classify("get pod "+key.String(), err)
	default:
		var opts []client.DeleteOption
		if p.lost(&pod) {
			// Grace period 0 removes the object without the kubelet's confirmation. Should
			// the node come back, its kubelet stops the orphaned Squid itself. The UID
			// precondition keeps the force for this pod alone, not a new one of the same name.
			opts = append(opts, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
		}
		if err := p.Client.Delete(ctx, &pod, opts...); err != nil && !apierrors.IsNotFound(err) {
			return classify("delete pod "+key.String(), err)
		}
	}
	// The pod's configuration and policy go with it. They are the pod's dependents, but a
	// create cut short may have left them without a pod, and not every cluster runs the
	// garbage collector promptly. The policy goes after the pod is asked to stop, not after
	// it has: a scheduled pod's Squid runs on until its kubelet stops it (within the grace
	// period), for that moment with only its own authentication in front of it.
	deps := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: configSecretName(key.Name)}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
	}
	for _, dep := range deps {
		what := fmt.Sprintf("%T %s/%s", dep, key.Namespace, dep.GetName())
		switch err := p.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return classify("get "+what, err)
		}
		// Only this instance's: Create refuses an object of the name that is not ours, and
		// the retired instance's delete must not then remove it.
		if dep.GetLabels()[labelInstance] != key.Name {
			continue
		}
		uid := dep.GetUID()
		if err := p.Client.Delete(ctx, dep, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return classify("delete "+what, err)
		}
	}
	return nil
}

// ListOwned implements provider.Provider, across all namespaces: spec.kubernetes.namespace
// lets a Proxy put its pod anywhere.
func (p *Provider) ListOwned(ctx context.Context, owner provider.Owner) ([]provider.Instance, error) {
	// An empty selector value matches pods labelled with an empty installation, which are
	// nobody's: the sweeper must never be handed those.
	if err := owner.Check(); err != nil {
		return nil, err
	}
	selector := owner.Selector()
	// The selector is sent as text; a value that is not a label value (a comma, say) could
	// add requirements of its own, and could never match a pod of ours anyway.
	for k, v := range selector {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, provider.Permanent(fmt.Errorf("list pods: label %s=%q: %s", k, v, strings.Join(errs, "; ")))
		}
	}
	size := p.pageSize
	if size <= 0 {
		size = defaultPageSize
	}
	var out []provider.Instance
	opts := []client.ListOption{
		client.MatchingLabels(selector),
		client.Limit(size),
	}
	what := "list pods of installation " + owner.Installation
	if owner.ProxyUID != "" {
		what += ", proxy " + owner.ProxyUID
	}
	for cont := ""; ; {
		var list corev1.PodList
		if err := p.Client.List(ctx, &list, append(opts, client.Continue(cont))...); err != nil {
			return nil, classify(what, err)
		}
		for i := range list.Items {
			// The sweeper deletes what this returns, so the labels are checked here too
			// rather than trusted to the server's selector.
			if owner.Owns(list.Items[i].Labels) {
				out = append(out, toInstance(&list.Items[i]))
			}
		}
		if cont = list.Continue; cont == "" {
			return out, nil
		}
	}
}

// parseID splits "<namespace>/<name>". A malformed ID cannot name any pod, so retrying with
// it is pointless.
func parseID(id string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(id, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return types.NamespacedName{}, provider.Permanent(
			fmt.Errorf("malformed kubernetes provider ID %q: want <namespace>/<pod name>", id))
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
