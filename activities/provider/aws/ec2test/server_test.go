package ec2test_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
)

func client(s *ec2test.Server) *ec2.Client {
	return ec2.NewFromConfig(s.Config(), func(o *ec2.Options) { o.Retryer = aws.NopRetryer{} })
}

func run(token string, tags map[string]string) *ec2.RunInstancesInput {
	in := &ec2.RunInstancesInput{
		ImageId: aws.String("ami-0123456789abcdef0"), InstanceType: types.InstanceTypeT3Micro,
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ClientToken: aws.String(token),
		UserData:        aws.String(base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho hi\n"))),
		MetadataOptions: &types.InstanceMetadataOptionsRequest{HttpTokens: types.HttpTokensStateRequired, HttpPutResponseHopLimit: aws.Int32(1)},
	}
	spec := types.TagSpecification{ResourceType: types.ResourceTypeInstance}
	for k, v := range tags {
		spec.Tags = append(spec.Tags, types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	in.TagSpecifications = []types.TagSpecification{spec}
	return in
}

func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// TestTheSDKRunsAgainstTheFake: the real SDK's serializers and deserializers round-trip
// through the fake: a ClientToken makes RunInstances idempotent (and refuses other
// parameters under it), tags, user data and metadata options are kept, an instance is
// pending then running with an address, terminate is idempotent.
func TestTheSDKRunsAgainstTheFake(t *testing.T) {
	s := ec2test.NewServer(t)
	c := client(s)
	ctx := context.Background()

	out, err := c.RunInstances(ctx, run("px-abc-1", map[string]string{"proxyfleet-uid": "u1"}))
	require.NoError(t, err)
	require.Len(t, out.Instances, 1)
	id := aws.ToString(out.Instances[0].InstanceId)
	assert.Equal(t, types.InstanceStateNamePending, out.Instances[0].State.Name)

	again, err := c.RunInstances(ctx, run("px-abc-1", map[string]string{"proxyfleet-uid": "u1"}))
	require.NoError(t, err)
	assert.Equal(t, id, aws.ToString(again.Instances[0].InstanceId), "the same token is the same instance")
	_, err = c.RunInstances(ctx, run("px-abc-1", map[string]string{"proxyfleet-uid": "u2"}))
	assert.Equal(t, "IdempotentParameterMismatch", code(err))
	require.Len(t, s.Instances(), 1)

	got := s.Instances()[0]
	assert.Equal(t, "u1", got.Tags["proxyfleet-uid"])
	assert.Equal(t, "required", got.HTTPTokens)
	assert.Equal(t, 1, got.HopLimit)
	raw, err := base64.StdEncoding.DecodeString(got.UserData)
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\necho hi\n", string(raw))

	desc := func() types.Instance {
		d, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		require.NoError(t, err)
		require.Len(t, d.Reservations, 1)
		return d.Reservations[0].Instances[0]
	}
	assert.Equal(t, types.InstanceStateNamePending, desc().State.Name)
	running := desc()
	assert.Equal(t, types.InstanceStateNameRunning, running.State.Name)
	assert.NotEmpty(t, aws.ToString(running.PublicIpAddress))
	assert.Equal(t, "u1", aws.ToString(running.Tags[0].Value))

	for range 2 {
		_, err = c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
		require.NoError(t, err)
	}
	assert.Equal(t, types.InstanceStateNameTerminated, desc().State.Name)
	_, err = c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{"i-0000000000000dead"}})
	assert.Equal(t, "InvalidInstanceID.NotFound", code(err))
}

// TestTheFakePagesAndFilters: DescribeInstances pages with MaxResults/NextToken through
// the SDK's paginator and filters by tag and state.
func TestTheFakePagesAndFilters(t *testing.T) {
	s := ec2test.NewServer(t)
	c := client(s)
	ctx := context.Background()
	for i := range 12 {
		owner := "a"
		if i%3 == 0 {
			owner = "b"
		}
		_, err := c.RunInstances(ctx, run("tok-"+string(rune('a'+i)), map[string]string{"proxyfleet-installation": owner}))
		require.NoError(t, err)
	}
	p := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{
		MaxResults: aws.Int32(5),
		Filters:    []types.Filter{{Name: aws.String("tag:proxyfleet-installation"), Values: []string{"a"}}},
	})
	pages, n := 0, 0
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		require.NoError(t, err)
		pages++
		for _, r := range out.Reservations {
			n += len(r.Instances)
		}
	}
	assert.Equal(t, 8, n)
	assert.Equal(t, 2, pages)

	out, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: aws.String("instance-state-name"), Values: []string{"terminated"}}}})
	require.NoError(t, err)
	assert.Empty(t, out.Reservations)
}

// TestTheFakeFailsAndInterrupts: failures are EC2's error documents (code and message
// through the SDK), capacity refusals are InsufficientInstanceCapacity, and a Spot
// instance can be interrupted by its behaviour.
func TestTheFakeFailsAndInterrupts(t *testing.T) {
	s := ec2test.NewServer(t)
	c := client(s)
	ctx := context.Background()
	s.RefuseCapacity()
	_, err := c.RunInstances(ctx, run("t1", nil))
	assert.Equal(t, "InsufficientInstanceCapacity", code(err))
	s.FailNext(ec2test.ActionDescribeInstances, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
	_, err = c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	assert.Equal(t, "RequestLimitExceeded", code(err))

	in := run("spot-1", nil)
	in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
		SpotOptions: &types.SpotMarketOptions{InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate, SpotInstanceType: types.SpotInstanceTypeOneTime}}
	out, err := c.RunInstances(ctx, in)
	require.NoError(t, err)
	id := aws.ToString(out.Instances[0].InstanceId)
	assert.Equal(t, types.InstanceLifecycleTypeSpot, out.Instances[0].InstanceLifecycle)
	s.Interrupt(id)
	d, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	require.NoError(t, err)
	got := d.Reservations[0].Instances[0]
	assert.Equal(t, types.InstanceStateNameTerminated, got.State.Name)
	assert.Equal(t, "Server.SpotInstanceTermination", aws.ToString(got.StateReason.Code))

	// The SDK's standard retryer retries throttling by itself.
	rc := ec2.NewFromConfig(s.Config(), func(o *ec2.Options) {
		o.Retryer = retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 0 })
	})
	s.FailNext(ec2test.ActionDescribeInstances, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
	_, err = rc.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	assert.NoError(t, err)
}

// TestTheFakeKeepsSecurityGroups: groups are created with tags, take and lose ingress
// rules, cannot be deleted while an instance uses them, and names are unique per VPC.
func TestTheFakeKeepsSecurityGroups(t *testing.T) {
	s := ec2test.NewServer(t)
	c := client(s)
	ctx := context.Background()
	g, err := c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: aws.String("proxyfleet-3128-abc"),
		Description: aws.String("squid"), TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeSecurityGroup,
			Tags: []types.Tag{{Key: aws.String("proxyfleet-installation"), Value: aws.String("a")}}}}})
	require.NoError(t, err)
	gid := aws.ToString(g.GroupId)
	_, err = c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: aws.String("proxyfleet-3128-abc"), Description: aws.String("squid")})
	assert.Equal(t, "InvalidGroup.Duplicate", code(err))

	perm := []types.IpPermission{{IpProtocol: aws.String("tcp"), FromPort: aws.Int32(3128), ToPort: aws.Int32(3128),
		IpRanges: []types.IpRange{{CidrIp: aws.String("203.0.113.0/24")}}}}
	_, err = c.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: aws.String(gid), IpPermissions: perm})
	require.NoError(t, err)
	d, err := c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{
		{Name: aws.String("tag:proxyfleet-installation"), Values: []string{"a"}}}})
	require.NoError(t, err)
	require.Len(t, d.SecurityGroups, 1)
	require.Len(t, d.SecurityGroups[0].IpPermissions, 1)
	assert.Equal(t, "203.0.113.0/24", aws.ToString(d.SecurityGroups[0].IpPermissions[0].IpRanges[0].CidrIp))

	in := run("with-group", nil)
	in.SecurityGroupIds = []string{gid}
	out, err := c.RunInstances(ctx, in)
	require.NoError(t, err)
	_, err = c.DeleteSecurityGroup(ctx, &ec2.DeleteSecurityGroupInput{GroupId: aws.String(gid)})
	assert.Equal(t, "DependencyViolation", code(err))
	s.SetState(aws.ToString(out.Instances[0].InstanceId), "terminated")
	_, err = c.RevokeSecurityGroupIngress(ctx, &ec2.RevokeSecurityGroupIngressInput{GroupId: aws.String(gid), IpPermissions: perm})
	require.NoError(t, err)
	_, err = c.DeleteSecurityGroup(ctx, &ec2.DeleteSecurityGroupInput{GroupId: aws.String(gid)})
	require.NoError(t, err)
	assert.Empty(t, s.SecurityGroups())
}
