package aws_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestTheDocumentedPolicyCoversEveryCall: docs/aws-worker-policy.json, the IAM policy the
// docs tell users to give the worker, allows every EC2 action the provider calls through
// a whole life (create with a shared group, get, list, a drifted group put back, delete,
// the sweep of the unused group), and the SSM read EC2 makes for an image parameter. It
// cannot prove the conditions hold on real IAM (see docs/providers.md): the fake does not
// evaluate policies.
func TestTheDocumentedPolicyCoversEveryCall(t *testing.T) {
	var allowed []string
	for _, st := range workerPolicy(t) {
		require.Equal(t, "Allow", st.Effect)
		allowed = append(allowed, st.Actions...)
	}

	s := ec2test.NewServer(t)
	m := machine()
	m.AMI, m.SubnetID = ec2test.DebianParameter, ec2test.DefaultSubnet
	p := newProvider(t, s, m)
	ctx := context.Background()
	in, err := p.Create(ctx, request("px-pol-1", "uid-pol"))
	require.NoError(t, err)
	_, err = p.Get(ctx, in.ProviderID)
	require.NoError(t, err)
	s.SetIngress(s.SecurityGroups()[0].ID, "tcp:22:0.0.0.0/0")
	_, err = p.Create(ctx, request("px-pol-2", "uid-pol")) // puts the group back
	require.NoError(t, err)
	for _, id := range []string{in.ProviderID, ec2test.Region + "/px-pol-2"} {
		require.NoError(t, p.Delete(ctx, id))
	}
	for range 2 { // shutting-down, then terminated
		_, _ = p.Get(ctx, in.ProviderID)
		_, _ = p.Get(ctx, ec2test.Region+"/px-pol-2")
	}
	list, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	require.Len(t, list, 1, "the unused group")
	require.NoError(t, p.Delete(ctx, list[0].ProviderID))

	var called []string
	for _, action := range []string{ec2test.ActionRunInstances, ec2test.ActionDescribeInstances, ec2test.ActionTerminateInstances,
		ec2test.ActionCreateTags, ec2test.ActionCreateSecurityGroup, ec2test.ActionDescribeSecurityGroups,
		ec2test.ActionAuthorizeSecurityGroupIngress, ec2test.ActionRevokeSecurityGroupIngress, ec2test.ActionDeleteSecurityGroup,
		ec2test.ActionDescribeSubnets} {
		if s.Requests(action) > 0 {
			called = append(called, "ec2:"+action)
		}
	}
	require.Len(t, called, 9, "the walk calls every action the provider uses but CreateTags (tags go with the create): %v", called)
	for _, a := range append(called, "ec2:CreateTags", "ssm:GetParameters") {
		assert.True(t, slices.Contains(allowed, a), "the policy does not allow %s", a)
	}
}

// statement is one statement of docs/aws-worker-policy.json, its lists as lists.
type statement struct {
	Effect             string
	Actions, Resources []string
}

// workerPolicy reads docs/aws-worker-policy.json, the policy the docs give the worker.
func workerPolicy(t *testing.T) []statement {
	t.Helper()
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "aws-worker-policy.json"))
	require.NoError(t, err)
	var doc struct {
		Statement []struct {
			Effect           string
			Action, Resource any
		}
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	list := func(v any) []string {
		switch x := v.(type) {
		case string:
			return []string{x}
		case []any:
			var out []string
			for _, e := range x {
				out = append(out, e.(string))
			}
			return out
		}
		return nil
	}
	var out []statement
	for _, st := range doc.Statement {
		out = append(out, statement{Effect: st.Effect, Actions: list(st.Action), Resources: list(st.Resource)})
	}
	return out
}
