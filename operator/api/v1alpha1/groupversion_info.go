// Package v1alpha1 holds the Proxy custom resource: the one object a platform team writes to
// ask for an egress proxy. Validation lives in the schema (CEL rules and OpenAPI markers), so
// the API server rejects a bad Proxy before any controller or workflow sees it.
//
// +kubebuilder:object:generate=true
// +groupName=crawl.example.com
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "crawl.example.com", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
