// Package v1alpha1 holds the Proxy custom resource: the one object a platform team writes to
// ask for an egress proxy. Validation lives in the schema (CEL rules and OpenAPI markers), so
// the API server rejects a bad Proxy before any controller or workflow sees it.
//
// The package depends only on k8s.io/api and k8s.io/apimachinery so that crawler-side tools
// can import the types without pulling in controller-runtime.
//
// +kubebuilder:object:generate=true
// +groupName=crawl.example.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "crawl.example.com", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Proxy{}, &ProxyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
