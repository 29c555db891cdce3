package kubernetes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
// Three objects make an instance: the pod, the NetworkPolicy admitting only the Proxy's
// clients, and the Secret holding its rendered configuration. The workflow and the sweeper
// find instances by listing pods and nothing else, so whatever cuts a create short (the
// worker killed, the activity timed out, an API error), no Secret or policy may exist
// without a pod that takes it along. The pod is therefore created first, and the policy
// and the Secret are created already owned by it (its UID is known once it exists): the
// cluster's garbage collector deletes them with the pod, whether or not a worker ever gets
// to.
//
// That order is safe because the kubelet starts no container of a pod before the Secret
// of a Secret volume exists: the pod waits, and Squid never runs without its
// configuration. The policy is created before the Secret, so Squid never serves before
// its policy exists. Delete removes all three too, for clusters where the garbage
// collector is slow or absent, and for what older versions left: they made the Secret and
// the policy before the pod.
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
	secret := buildConfigSecret(req, files)
	policy := buildNetworkPolicy(req, p.ProbeFrom)

	// The Secret and the policy are read before the pod (from the API server, so in that
	// order). A dependent is only ever made once its pod exists, so if no pod exists after
	// them, what they found is left over (by an older version, which made them before the
	// pod, or by a deleted pod the garbage collector has not got to) and no live pod's.
	var foreign error
	var haveSecret, havePolicy client.Object
	for _, dep := range []struct {
		want client.Object
		have *client.Object
	}{{secret, &haveSecret}, {policy, &havePolicy}} {
		switch have, err := p.read(ctx, dep.want, req.ProxyUID); {
		case errors.Is(err, errNotOurs):
			foreign = cmp.Or(foreign, err)
		case err != nil:
			return provider.Instance{}, err
		default:
			*dep.have = have
		}
	}
	// A pod an earlier attempt created runs with the Secret that attempt wrote, and its key
	// label tells the workflow which credentials Squid requires. Rewriting that Secret (with
	// a fleet key made primary since, say) would change them behind the label, at Squid's
	// next restart; so an existing pod is adopted with its Secret as it is.
	existing, err := p.adopt(ctx, key, req.ProxyUID)
	if err != nil && !apierrors.IsNotFound(err) {
		return provider.Instance{}, err
	}
	if foreign != nil {
		// A Secret or policy of the instance's name that is not this Proxy's is never taken
		// over; and a pod of ours would mount that Secret, or run without its own policy.
		return provider.Instance{}, p.discard(ctx, existing, foreign)
	}

	if existing == nil {
		// What was left over is removed rather than brought up to date: a Secret there
		// before the pod would let Squid start before its policy is made, and a policy
		// owned by a deleted pod could still be removed by the garbage collector after the
		// new pod started.
		for _, dep := range []*client.Object{&haveSecret, &havePolicy} {
			if *dep == nil {
				continue
			}
			if err := p.remove(ctx, *dep); err != nil {
				return provider.Instance{}, err
			}
			*dep = nil
		}
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
		if haveSecret == nil && !fits(pod, req) {
			// A pod without its Secret (an attempt was cut short between the two) waits for
			// it, but the Secret this request renders is not what the pod was made for: the
			// pod's key label would name other credentials than Squid requires, or Squid's
			// port or include would not match the pod. Having no configuration, it never
			// ran; it is deleted, and the next attempt makes the instance anew.
			return provider.Instance{}, p.discard(ctx, pod, fmt.Errorf(
				"pod %s has no configuration yet and was made for another fleet key or spec than this attempt's: deleting it, so that the next attempt makes it anew", key))
		}
	}

	if err := ensure(ctx, p, pod, policy, havePolicy, req.ProxyUID, func(have *networkingv1.NetworkPolicy) bool {
		return equality.Semantic.DeepEqual(have.Spec, policy.Spec)
	}, func(have *networkingv1.NetworkPolicy) { have.Spec = policy.Spec }); err != nil {
		return provider.Instance{}, p.discardIfNotOurs(ctx, pod, err)
	}
	// An existing Secret is kept as it is: it is the one the pod reads (see above).
	if err := ensure[*corev1.Secret](ctx, p, pod, secret, haveSecret, req.ProxyUID, nil, nil); err != nil {
		return provider.Instance{}, p.discardIfNotOurs(ctx, pod, err)
	}
	return toInstance(pod), nil
}

// errNotOurs marks an object of an instance's name that is not the instance's Proxy's.
var errNotOurs = errors.New("already exists and is not this Proxy's")

// describe names obj in errors.
func describe(obj client.Object) string {
	return fmt.Sprintf("%T %s/%s", obj, obj.GetNamespace(), obj.GetName())
}

// read returns the object of want's name as the cluster has it, nil if there is none, and
// a permanent error wrapping errNotOurs if it is not the Proxy uid's.
func (p *Provider) read(ctx context.Context, want client.Object, uid string) (client.Object, error) {
	have := want.DeepCopyObject().(client.Object)
	what := describe(want)
	switch err := p.Client.Get(ctx, client.ObjectKeyFromObject(want), have); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, classify("get "+what, err)
	}
	if got := have.GetLabels()[provider.LabelProxyUID]; got != uid {
		return nil, provider.Permanent(fmt.Errorf("%s %w (label %s=%q, want %q)", what, errNotOurs, provider.LabelProxyUID, got, uid))
	}
	return have, nil
}

// ensure makes want exist as a dependent of pod; have is the object of its name read
// before (nil: there was none). A missing one is created already owned by pod, so it never
// exists without a pod to go with. An existing one is brought to what want says where same
// says it differs (with same nil it is kept as it is), and made pod's dependent if it is
// not yet: an older version's, or one an earlier attempt cut short left unowned.
func ensure[T client.Object](ctx context.Context, p *Provider, pod *corev1.Pod, want T, have client.Object, uid string, same func(T) bool, update func(T)) error {
	what := describe(want)
	if have == nil {
		want.SetOwnerReferences([]metav1.OwnerReference{ownerRef(pod)})
		err := p.Client.Create(ctx, want)
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return classify("create "+what, err)
		}
		// Created since it was read, by an attempt running alongside this one.
		if have, err = p.read(ctx, want, uid); err != nil {
			return err
		}
		if have == nil {
			return fmt.Errorf("create %s: refused as existing, yet gone when read; the next attempt creates it", what)
		}
	}
	got := have.(T)
	if same == nil || same(got) {
		return p.ownBy(ctx, got, pod)
	}
	// An earlier attempt's object, from other worker settings, say: the pod is about to
	// rely on it, so it must say what this attempt wants. One write brings it up to date
	// and owns it.
	update(got)
	if !owns(got, pod) {
		got.SetOwnerReferences(append(got.GetOwnerReferences(), ownerRef(pod)))
	}
	if err := p.Client.Update(ctx, got); err != nil {
		return classify("update "+what, err)
	}
	return nil
}

// ownerRef names pod as the owner of a dependent, which the garbage collector deletes once
// the pod is gone.
func ownerRef(pod *corev1.Pod) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}
}

// owns reports whether dep is already pod's dependent.
func owns(dep client.Object, pod *corev1.Pod) bool {
	for _, ref := range dep.GetOwnerReferences() {
		if ref.UID == pod.UID {
			return true
		}
	}
	return false
}

// ownBy makes dep a dependent of pod, so the cluster's garbage collector deletes it with
// the pod even if the worker never gets to.
func (p *Provider) ownBy(ctx context.Context, dep client.Object, pod *corev1.Pod) error {
	if owns(dep, pod) {
		return nil
	}
	patch := client.MergeFrom(dep.DeepCopyObject().(client.Object))
	dep.SetOwnerReferences(append(dep.GetOwnerReferences(), ownerRef(pod)))
	if err := p.Client.Patch(ctx, dep, patch); err != nil {
		return classify(fmt.Sprintf("own %T %s by its pod", dep, dep.GetName()), err)
	}
	return nil
}

// remove deletes obj, read a moment ago, by its UID: an object made since under its name
// is not the one judged left over.
func (p *Provider) remove(ctx context.Context, obj client.Object) error {
	uid := obj.GetUID()
	if err := p.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return classify("delete left-over "+describe(obj), err)
	}
	return nil
}

// discard deletes pod (nil: none) because it must not run, for the reason cause, which it
// returns. Should the delete fail, its error is returned instead, carrying cause's text: a
// retry must come and delete the pod, even when cause itself is permanent.
func (p *Provider) discard(ctx context.Context, pod *corev1.Pod, cause error) error {
	if pod == nil {
		return cause
	}
	uid := pod.UID
	// By UID, so that a pod made since under the name is not taken for this one; by force
	// if its node is lost, as Delete does, since no kubelet would confirm.
	opts := []client.DeleteOption{client.Preconditions{UID: &uid}}
	if p.lost(pod) {
		opts = append(opts, client.GracePeriodSeconds(0))
	}
	if err := p.Client.Delete(ctx, pod, opts...); err != nil && !apierrors.IsNotFound(err) {
		return classify(fmt.Sprintf("%v; delete pod %s/%s, which must not run", cause, pod.Namespace, pod.Name), err)
	}
	return cause
}

// discardIfNotOurs discards pod when err says one of its dependents is not this Proxy's:
// the pod would mount someone else's configuration, or run without its own policy.
func (p *Provider) discardIfNotOurs(ctx context.Context, pod *corev1.Pod, err error) error {
	if errors.Is(err, errNotOurs) {
		return p.discard(ctx, pod, err)
	}
	return err
}

// fits reports whether the Secret req renders is the configuration pod was made for: the
// credentials of the key its label names, Squid's port, the user's file included or not,
// and the spec its hash label names. A pod that does not fit was made by an attempt with
// another fleet key or spec (the key rotated, or the spec changed, before the retry).
func fits(pod *corev1.Pod, req provider.CreateRequest) bool {
	want := buildPod(req)
	hasUser := func(pod *corev1.Pod) bool {
		return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == userVolume })
	}
	return pod.Labels[provider.LabelKeyID] == want.Labels[provider.LabelKeyID] &&
		pod.Labels[provider.LabelSpecHash] == want.Labels[provider.LabelSpecHash] &&
		proxyPort(pod) == proxyPort(want) &&
		hasUser(pod) == hasUser(want)
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
	// The pod's configuration and policy go with it. They are the pod's dependents, but not
	// every cluster runs the garbage collector promptly, and an older version's create cut
	// short may have left them without a pod (it made them first). The policy goes after
	// the pod is asked to stop, not after it has: a scheduled pod's Squid runs on until its
	// kubelet stops it (within the grace period), for that moment with only its own
	// authentication in front of it.
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
