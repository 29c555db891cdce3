package controller

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
