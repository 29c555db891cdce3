package aws_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/smithy-go/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

const password = "fleet-password-canary-7Qx"

func machine() aws.Machine {
	return aws.Machine{Region: ec2test.Region, InstanceType: "t3.micro", AMI: "ami-0123456789abcdef0", PublicIP: true,
		AllowedSourceRanges: []string{"203.0.113.0/24"},
		Tags:                map[string]string{"team": "crawl", "proxyfleet-uid": "forged"}}
}

func newProvider(t *testing.T, s *ec2test.Server, m aws.Machine) *aws.Provider {
	t.Helper()
	return providerAt(t, s, s.URL, m, nil)
}

// providerAt is a provider of machine m whose calls go to endpoint (the fake, or a
// stand-in in front of it), on the clock now (nil: the machine's), with no retries.
func providerAt(t *testing.T, s *ec2test.Server, endpoint string, m aws.Machine, now func() time.Time) *aws.Provider {
	t.Helper()
	cfg := s.Config()
	cfg.BaseEndpoint = awssdk.String(endpoint)
	cfg.Retryer = func() awssdk.Retryer { return awssdk.NopRetryer{} }
	p, err := aws.New(aws.Config{AWS: cfg, Now: now, MachineOf: func(v1alpha1.ProxySpec) (aws.Machine, error) { return m, nil }})
	require.NoError(t, err)
	return p
}

// terminatedAfterCreate creates req's instance with p, deletes it, and moves it on to
// terminated, as EC2 would.
func terminatedAfterCreate(t *testing.T, s *ec2test.Server, p *aws.Provider, req provider.CreateRequest) ec2test.Instance {
	t.Helper()
	ctx := context.Background()
	in, err := p.Create(ctx, req)
	require.NoError(t, err)
	require.NoError(t, p.Delete(ctx, in.ProviderID))
	for _, i := range s.Instances() {
		if i.Tags["proxyfleet-instance"] == req.Name && i.State != "terminated" {
			s.SetState(i.ID, "terminated")
			i.State = "terminated"
			return i
		}
	}
	t.Fatalf("no instance of %s to terminate", req.Name)
	return ec2test.Instance{}
}

func request(name, uid string) provider.CreateRequest {
	return provider.CreateRequest{Name: name, ProxyUID: uid, Installation: "inst-a", Namespace: "crawl", Port: 3128,
		Spec: v1alpha1.ProxySpec{Provider: "aws"}, CloudInit: []byte("#!/bin/sh\necho user\n"),
		Credentials: proxyauth.Credentials{Username: "proxyfleet", Password: password}, KeyID: "k1", SpecHash: "0123456789abcdef"}
}

// TestCreateIsExactlyOnce: creating the same instance again (a retried activity, a
// replayed workflow) returns the instance the first call made; the request asks for
// IMDSv2 with a hop limit of 1, no instance profile, the ownership tags (which the
// machine's own tags cannot override), and user data that boots the hardened Squid
// without the password in the clear.
func TestCreateIsExactlyOnce(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	req := request("px-abc-1", "uid-1")

	first, err := p.Create(ctx, req)
	require.NoError(t, err)
	again, err := p.Create(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, first.ProviderID, again.ProviderID)
	ec2ID := s.Live()[0].ID
	assert.Regexp(t, `^`+p.ProviderID(req)+`/`+ec2ID+`/[0-9]+$`, first.ProviderID,
		"the provider ID known before the create, with EC2's ID and the launch time")
	require.Len(t, s.Live(), 1, "one instance whatever the retries")
	runs := s.Forms(ec2test.ActionRunInstances)
	require.Len(t, runs, 1, "a create that finds its instance asks for none")
	assert.Regexp(t, `^px-abc-1-[0-9a-f]{16}$`, runs[0].Get("ClientToken"), "two creates racing past the lookup are one instance by the token: the name and a hash of the request")

	in := s.Live()[0]
	assert.Equal(t, "required", in.HTTPTokens)
	assert.Equal(t, 1, in.HopLimit)
	assert.Empty(t, in.InstanceProfile)
	assert.Equal(t, "uid-1", in.Tags[provider.LabelProxyUID], "ownership tags win over the machine's")
	assert.Equal(t, "inst-a", in.Tags[provider.LabelInstallation])
	assert.Equal(t, "crawl", in.Tags["team"])
	assert.Equal(t, "px-abc-1", in.Tags["Name"])
	script, err := base64.StdEncoding.DecodeString(in.UserData)
	require.NoError(t, err)
	assert.Contains(t, string(script), "squid")
	assert.NotContains(t, string(script), password, "the password is in the boot script in the clear")
	for _, form := range s.Forms(ec2test.ActionRunInstances) {
		assert.NotContains(t, form.Encode(), password)
	}
}

// TestGetFollowsTheInstance: pending is Provisioning, running is Running on its public
// address (the private one without), a Spot interruption is Stopped and Preempted, and a
// terminated or missing instance is not found.
func TestGetFollowsTheInstance(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	m := machine()
	m.Spot = true
	p := newProvider(t, s, m)
	inst, err := p.Create(ctx, request("px-abc-1", "uid-1"))
	require.NoError(t, err)
	assert.Equal(t, provider.StateProvisioning, inst.State)
	got, err := p.Get(ctx, inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateProvisioning, got.State)
	got, err = p.Get(ctx, inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.True(t, strings.HasPrefix(got.IP, "198.51.100."), got.IP)
	assert.Equal(t, "uid-1", got.ProxyUID())
	assert.Equal(t, "px-abc-1", got.Name)

	s.Interrupt(s.Live()[0].ID)
	_, err = p.Get(ctx, inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound, "a terminated instance is gone")
	assert.ErrorIs(t, err, provider.ErrPreempted, "taken back by EC2, and said so")
	require.NoError(t, p.Delete(ctx, inst.ProviderID), "deleting what EC2 took back is done")

	private := machine()
	private.PublicIP = false
	pp := newProvider(t, s, private)
	inst, err = pp.Create(ctx, request("px-def-1", "uid-2"))
	require.NoError(t, err)
	for range 2 {
		got, err = pp.Get(ctx, inst.ProviderID)
		require.NoError(t, err)
	}
	assert.True(t, strings.HasPrefix(got.IP, "10.0."), "without a public address the Proxy serves on the private one: %s", got.IP)

	_, err = p.Get(ctx, ec2test.Region+"/px-nothing-1")
	assert.ErrorIs(t, err, provider.ErrNotFound)
	assert.NotErrorIs(t, err, provider.ErrPreempted)

	// Terminated by the provider (not EC2): gone, not preempted.
	require.NoError(t, pp.Delete(ctx, inst.ProviderID))
	for range 2 { // shutting-down, then terminated
		_, err = pp.Get(ctx, inst.ProviderID)
	}
	assert.ErrorIs(t, err, provider.ErrNotFound)
	assert.NotErrorIs(t, err, provider.ErrPreempted)
	_, err = p.Get(ctx, "no-slash")
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// TestDeleteIsIdempotent: delete terminates the instance; deleting it again, or one never
// made, succeeds.
func TestDeleteIsIdempotent(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	inst, err := p.Create(ctx, request("px-abc-1", "uid-1"))
	require.NoError(t, err)
	require.NoError(t, p.Delete(ctx, inst.ProviderID))
	assert.Empty(t, s.Live())
	require.NoError(t, p.Delete(ctx, inst.ProviderID))
	require.NoError(t, p.Delete(ctx, ec2test.Region+"/px-never-1"))
	assert.Equal(t, 1, s.Requests(ec2test.ActionTerminateInstances), "nothing left to terminate the second time")
}

// TestListOwnedPagesAndChecksOwnership: the installation's instances are listed a page of
// 1,000 at a time; another installation's and terminated ones are not.
func TestListOwnedPagesAndChecksOwnership(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	for i := range 1005 {
		s.AddInstance(ec2test.Instance{Tags: map[string]string{provider.LabelInstallation: "inst-a",
			provider.LabelProxyUID: fmt.Sprintf("uid-%d", i), "proxyfleet-instance": fmt.Sprintf("px-%d-1", i)}})
	}
	s.AddInstance(ec2test.Instance{Tags: map[string]string{provider.LabelInstallation: "inst-b", "proxyfleet-instance": "px-b-1"}})
	s.AddInstance(ec2test.Instance{State: "terminated", Tags: map[string]string{provider.LabelInstallation: "inst-a", "proxyfleet-instance": "px-t-1"}})

	all, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	assert.Len(t, all, 1005)
	assert.GreaterOrEqual(t, s.Requests(ec2test.ActionDescribeInstances), 2, "listed a page at a time")
	one, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a", ProxyUID: "uid-7"})
	require.NoError(t, err)
	require.Len(t, one, 1)
	assert.Equal(t, ec2test.Region+"/px-7-1", one[0].ProviderID)
	_, err = p.ListOwned(ctx, provider.Owner{})
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// TestErrorsAreClassified: capacity and limits are quota waits, refusals of the request
// are permanent with EC2's message; throttling, the unexpected and the worker's own
// credentials are transient (a Proxy is not parked as Failed for the worker's fault).
func TestErrorsAreClassified(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	cases := []struct {
		status        int
		code, message string
		kind          provider.Kind
	}{
		{http.StatusInternalServerError, "InsufficientInstanceCapacity", "no capacity", provider.KindQuota},
		{http.StatusBadRequest, "InstanceLimitExceeded", "limit", provider.KindQuota},
		{http.StatusBadRequest, "VcpuLimitExceeded", "vcpus", provider.KindQuota},
		{http.StatusBadRequest, "UnauthorizedOperation", "You are not authorized to perform this operation.", provider.KindPermanent},
		{http.StatusBadRequest, "InvalidAMIID.NotFound", "The image id '[ami-0]' does not exist", provider.KindPermanent},
		{http.StatusBadRequest, "InvalidParameterValue", "bad", provider.KindPermanent},
		{http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.", provider.KindTransient},
		{http.StatusInternalServerError, "InternalError", "oops", provider.KindTransient},
		{http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials", provider.KindTransient},
		{http.StatusBadRequest, "RequestExpired", "Request has expired.", provider.KindTransient},
		{http.StatusBadRequest, "IdempotentParameterMismatch", "differ from this request", provider.KindTransient},
	}
	for i, tc := range cases {
		s.FailNext(ec2test.ActionRunInstances, tc.status, tc.code, tc.message)
		_, err := p.Create(ctx, request(fmt.Sprintf("px-e%d-1", i), "uid"))
		require.Error(t, err)
		assert.Equal(t, tc.kind, provider.Class(err), tc.code)
		assert.Contains(t, err.Error(), tc.message, "EC2's message reaches the condition")
		var canary = errors.New(password)
		assert.NotErrorIs(t, err, canary)
	}
	assert.Empty(t, s.Live())
}

// TestTheSDKNeverLogsTheUserData: a configuration that asks the SDK to log request bodies
// does not get the user data (or the cloud-init canary) into the log.
func TestTheSDKNeverLogsTheUserData(t *testing.T) {
	s := ec2test.NewServer(t)
	cfg := s.Config()
	var buf strings.Builder
	cfg.Logger = logging.LoggerFunc(func(_ logging.Classification, format string, v ...any) {
		fmt.Fprintf(&buf, format+"\n", v...)
	})
	cfg.ClientLogMode = awssdk.LogRequestWithBody | awssdk.LogResponseWithBody | awssdk.LogRequest
	p, err := aws.New(aws.Config{AWS: cfg, MachineOf: func(v1alpha1.ProxySpec) (aws.Machine, error) { return machine(), nil }})
	require.NoError(t, err)
	req := request("px-abc-1", "uid-1")
	req.CloudInit = []byte("#!/bin/sh\necho cloud-init-canary-Zr4\n")
	_, err = p.Create(context.Background(), req)
	require.NoError(t, err)
	require.NotEmpty(t, buf.String(), "the SDK logged the request")
	assert.NotContains(t, buf.String(), "UserData")
	assert.NotContains(t, buf.String(), base64.StdEncoding.EncodeToString([]byte("#!/bin/sh")))
}

// TestTheImageCanBeAnSSMParameter: an AMI given as an SSM parameter (Debian's public one)
// is resolved by EC2 at launch; a parameter that does not exist is the request's fault.
func TestTheImageCanBeAnSSMParameter(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	m := machine()
	m.AMI = ec2test.DebianParameter
	_, err := newProvider(t, s, m).Create(ctx, request("px-abc-1", "uid-1"))
	require.NoError(t, err)
	assert.Equal(t, ec2test.DebianAMI, s.Instances()[0].ImageID)
	assert.Equal(t, "resolve:ssm:"+ec2test.DebianParameter, s.Forms(ec2test.ActionRunInstances)[0].Get("ImageId"))

	m.AMI = "/aws/service/debian/release/99/latest/amd64"
	_, err = newProvider(t, s, m).Create(ctx, request("px-def-1", "uid-2"))
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// TestRegionsAreKeptApart: a Proxy's spec.aws.region is where its instance runs and where
// Get and Delete look; a list for that region (Owner.Project) finds it, and the sweep's list
// (no project) finds it only in a region it is told to sweep.
func TestRegionsAreKeptApart(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	newIn := func(regions ...string) *aws.Provider {
		cfg := s.Config()
		cfg.Retryer = func() awssdk.Retryer { return awssdk.NopRetryer{} }
		p, err := aws.New(aws.Config{AWS: cfg, Regions: regions})
		require.NoError(t, err)
		return p
	}
	p := newIn()
	req := request("px-far-1", "uid-far")
	req.Spec.AWS = &v1alpha1.AWSSpec{Region: "ap-southeast-2", AssociatePublicIP: ptr.To(false)}
	in, err := p.Create(ctx, req)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(in.ProviderID, "ap-southeast-2/px-far-1/i-"), in.ProviderID)
	assert.Empty(t, s.Instances(), "nothing in the default region")
	require.Len(t, s.InRegion("ap-southeast-2").Instances(), 1)
	assert.Equal(t, "t3.micro", s.InRegion("ap-southeast-2").Instances()[0].InstanceType, "the API's default type")
	assert.Equal(t, ec2test.DebianAMI, s.InRegion("ap-southeast-2").Instances()[0].ImageID, "the API's default image, resolved by EC2")

	got, err := p.Get(ctx, in.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, "px-far-1", got.Name)

	owner := provider.Owner{Installation: "inst-a"}
	list, err := p.ListOwned(ctx, owner)
	require.NoError(t, err)
	assert.Empty(t, list, "the default region alone is swept unless told otherwise")
	list, err = newIn("ap-southeast-2").ListOwned(ctx, owner)
	require.NoError(t, err)
	assert.Len(t, list, 1)
	owner.Project = "ap-southeast-2"
	list, err = p.ListOwned(ctx, owner)
	require.NoError(t, err)
	assert.Len(t, list, 1)

	require.NoError(t, p.Delete(ctx, in.ProviderID))
	assert.Equal(t, "shutting-down", s.InRegion("ap-southeast-2").Instances()[0].State)
}
