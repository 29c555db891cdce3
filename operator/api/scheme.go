// Package api is the Proxy API: its versions live in subpackages (v1alpha1), and NewScheme
// gives every Kubernetes client of the project the same view of them and of the built-in
// kinds. It is kept apart from v1alpha1 so that importing the types alone does not pull in
// client-go's scheme of every built-in API group.
package api

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// NewScheme knows the built-in kinds (Secrets, Pods, Events) and Proxy: every Kubernetes
// client of the project (operator, worker, dev stack, tests) uses it.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	// Registering static Go types only fails on a programming error (a kind registered twice).
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}
