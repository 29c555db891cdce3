// Package provider is the contract every instance provider (gcp, kubernetes, local)
// implements, with the error taxonomy the workflow acts on and the ownership labels that let
// the orphan sweeper prove an instance is ours.
package provider
