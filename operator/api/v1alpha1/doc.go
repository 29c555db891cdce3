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
