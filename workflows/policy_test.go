package workflows

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/workflow"
)

// TestPolicyFor: each version turns on what it added and keeps what came before.
func TestPolicyFor(t *testing.T) {
	assert.Equal(t, runPolicy{legacy: true}, policyFor(workflow.DefaultVersion))
	assert.Equal(t, runPolicy{}, policyFor(versionLongLived))
	assert.Equal(t, runPolicy{requireAuth: true}, policyFor(versionCredentials))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true}, policyFor(versionLostFirst))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true, shardWatched: true}, policyFor(versionShardMonitor))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true, shardWatched: true, serveWhileReplacing: true}, policyFor(versionServeWhileReplacing))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true, shardWatched: true, serveWhileReplacing: true, poolGrants: true}, policyFor(versionPoolGrants))
	assert.Equal(t, policyFor(versionPoolGrants), policyFor(versionLatest))
}

// TestOnlyThePolicyReadsTheVersion: the version a run started with is read once, by
// ProxyWorkflow, and turned into its runPolicy; no other code names a version, so each
// decision says which behaviour it follows, not which number.
func TestOnlyThePolicyReadsTheVersion(t *testing.T) {
	versions := map[string]bool{"versionLongLived": true, "versionCredentials": true, "versionLostFirst": true,
		"versionShardMonitor": true, "versionServeWhileReplacing": true, "versionPoolGrants": true, "versionLatest": true, "versionChangeID": true}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "policy.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				// The one read: workflow.GetVersion(ctx, versionChangeID, …, versionLatest).
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "GetVersion" && name == "proxy.go" {
					return false
				}
			case *ast.Ident:
				assert.False(t, versions[n.Name], "%s names %s: decide by a runPolicy field instead", fset.Position(n.Pos()), n.Name)
			}
			return true
		})
	}
}
