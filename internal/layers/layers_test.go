package layers

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/proxyfleet/proxyfleet/"

// TestNoArrowUp: each package links none of the packages its rule forbids, directly or
// through anything it imports.
func TestNoArrowUp(t *testing.T) {
	workflowCode := []string{module + "workflows", module + "activities"}
	kubernetes := []string{module + "operator/api", "k8s.io/client-go", "sigs.k8s.io/controller-runtime"}
	// Discovery reads the workflows' memos and signals them through workflows/contract and
	// workflows/proxyruns, and nothing else of theirs; it never talks to Kubernetes.
	discoveryForbid := append(append([]string{module + "workflows/proxyinput"}, workflowCode...), kubernetes...)
	rules := []struct {
		pkg    string
		why    string
		forbid []string
	}{
		{"operator/controller", "the controller starts and signals workflows with workflows/proxyinput and workflows/contract", workflowCode},
		{"discovery", "the lease domain reads workflows through workflows/contract only", discoveryForbid},
		{"discovery/gateway", "the gateway leases through the domain and links workflows/contract only", discoveryForbid},
		{"discovery/temporal", "the index reader links workflows/contract and workflows/proxyruns, the workflows' own readers", discoveryForbid},
		{"discovery/httpapi", "the HTTP API serves the domain's lease operations and links workflows/contract only", discoveryForbid},
		{"discovery/peer", "the replica set carries the domain's lease records and links workflows/contract only", discoveryForbid},
		{"discovery/service", "discovery's process reads workflows through workflows/contract and proxyruns only", discoveryForbid},
		{"workflows/contract", "every process links contract: it is a leaf", append(append(workflowCode, kubernetes...), module+"discovery", module+"operator")},
		{"workflows/proxyinput", "the controller links proxyinput", workflowCode},
		{"workflows/proxyruns", "discovery links proxyruns", append(workflowCode, kubernetes...)},
		{"discovery/codes", "the Go client links the codes table, and crawlers link the client", []string{strings.TrimSuffix(module, "/")}},
		{"discovery/client", "crawlers link the Go client", []string{module + "discovery", module + "workflows", module + "activities", module + "operator", module + "internal"}},
		{"cmd/operator", "the operator starts workflows and never runs them", workflowCode},
		{"cmd/discovery", "discovery's process is discovery and its flags", discoveryForbid},
	}
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+r.pkg).Output()
			require.NoError(t, err, "go list %s", r.pkg)
			for _, dep := range strings.Fields(string(out)) {
				if dep == module+r.pkg {
					continue
				}
				for _, f := range r.forbid {
					// A forbidden package and those below it, but not its siblings that
					// share a prefix (workflows/contract is not workflows).
					if dep == f || strings.HasPrefix(dep, f+"/") && !allowedBelow(dep) {
						assert.Failf(t, "arrow up", "%s links %s: %s", r.pkg, dep, r.why)
					}
				}
			}
		})
	}
}

// allowedBelow are the packages under a forbidden one that anything may link: the
// workflows' contract, start input and visibility reader are what the workflows' callers
// are meant to use, and discovery's codes table is what its clients share with it.
func allowedBelow(dep string) bool {
	switch strings.TrimPrefix(dep, module) {
	case "workflows/contract", "workflows/proxyinput", "workflows/proxyruns", "discovery/codes":
		return true
	}
	return false
}
