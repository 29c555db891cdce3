// Package kubernetes is the pod provider: each instance is one Squid pod in the cluster the
// worker talks to, created, read, deleted and listed through the Kubernetes API and nothing
// else. Like every provider it never waits: the caller (the WaitRunning and DeleteInstance
// activities) polls Get, so no Pod watch or informer is needed.
package kubernetes
