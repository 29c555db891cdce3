package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Flag names the refusals point at, so a user whose Proxy went Failed knows which worker
// setting would allow it (and that it is the platform team's call, not theirs).
const (
	FlagAllowedNamespaces = "--kubernetes-allowed-namespaces"
	FlagAllowedImages     = "--kubernetes-allowed-images"
)

// Allow is what the worker lets a Proxy ask of the kubernetes provider. Anyone who can
// create a Proxy can name a namespace and an image; without these limits the worker, which
// holds the rights to create pods there, would run any image anywhere on their behalf.
type Allow struct {
	// Namespaces a pod may be put in besides the Proxy's own: exact names, or "*" for any.
	Namespaces []string
	// Images a pod may run: exact references, or a prefix ending in "*" (such as
	// "registry.example.com/squid:*"). Empty allows only v1alpha1.DefaultSquidImage.
	Images []string
}

// check refuses a pod outside the allowlists, permanently: the Proxy goes Failed with a
// message naming the flag, until its spec or the worker's settings change.
func (a Allow) check(req provider.CreateRequest) error {
	if ns := podNamespace(req); ns != req.Namespace && !slices.Contains(a.Namespaces, ns) && !slices.Contains(a.Namespaces, "*") {
		return provider.Permanent(fmt.Errorf(
			"spec.kubernetes.namespace %q is not allowed: the worker puts Squid pods in the Proxy's own namespace (%s) and in the namespaces its %s flag lists (%s)",
			ns, req.Namespace, FlagAllowedNamespaces, listOrNone(a.Namespaces)))
	}
	images := a.Images
	if len(images) == 0 {
		images = []string{v1alpha1.DefaultSquidImage}
	}
	image := podImage(req)
	for _, allowed := range images {
		if prefix, ok := strings.CutSuffix(allowed, "*"); ok && strings.HasPrefix(image, prefix) || image == allowed {
			return nil
		}
	}
	return provider.Permanent(fmt.Errorf(
		"spec.kubernetes.image %q is not allowed: the worker runs only the images its %s flag lists (%s)",
		image, FlagAllowedImages, strings.Join(images, ", ")))
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// WorkerPeer is the NetworkPolicy peer of the worker's pods: namespace and labels as the
// worker's Deployment sets them (--kubernetes-worker-namespace, --kubernetes-worker-labels).
// A namespace of "" gives no peer: a worker outside the cluster reaches pods only where
// nothing enforces NetworkPolicies.
func WorkerPeer(namespace string, labels map[string]string) []networkingv1.NetworkPolicyPeer {
	if namespace == "" {
		return nil
	}
	return []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: namespace}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: labels},
	}}
}
