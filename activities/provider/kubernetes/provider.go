package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := checkRequest(req); err != nil {
		return provider.Instance{}, err
	}
	pod := buildPod(req)
	key := client.ObjectKeyFromObject(pod)
	err := p.Client.Create(ctx, pod)
	switch {
	case apierrors.IsAlreadyExists(err):
		return p.adopt(ctx, key, req.ProxyUID)
	case err != nil:
		return provider.Instance{}, classify("create pod "+key.String(), err)
	}
	return toInstance(pod), nil
}

// adopt returns the pod an earlier attempt created, after proving it is that attempt's: the
// name is derived from the Proxy's UID, so another UID on it means a collision with a pod
// we must never take over (or later delete).
func (p *Provider) adopt(ctx context.Context, key types.NamespacedName, uid string) (provider.Instance, error) {
	var pod corev1.Pod
	if err := p.Client.Get(ctx, key, &pod); err != nil {
		// NotFound: deleted since Create said it exists; the retry will create it again.
		return provider.Instance{}, classify("get existing pod "+key.String(), err)
	}
	if got := pod.Labels[provider.LabelProxyUID]; got != uid {
		return provider.Instance{}, provider.Permanent(fmt.Errorf(
			"pod %s already exists and is not this Proxy's (label %s=%q, want %q)",
			key, provider.LabelProxyUID, got, uid))
	}
	return toInstance(&pod), nil
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
	if err := p.Client.Get(ctx, key, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return classify("get pod "+key.String(), err)
	}
	var opts []client.DeleteOption
	if p.lost(&pod) {
		// Grace period 0 removes the object without the kubelet's confirmation. Should the
		// node come back, its kubelet stops the orphaned Squid itself. The UID
		// precondition keeps the force for this pod alone, not a new one of the same name.
		opts = append(opts, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	}
	if err := p.Client.Delete(ctx, &pod, opts...); err != nil && !apierrors.IsNotFound(err) {
		return classify("delete pod "+key.String(), err)
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
