package aws

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	awsprov "github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// cloud is the fake EC2 API with instances that boot: each runs its user data as the VM
// would and then real Squid on what it wrote, on 127.0.0.1 at the Proxy's port, until EC2
// terminates or interrupts it.
type cloud struct {
	*ec2test.Server
	mu     sync.Mutex
	booted map[string]string // instance ID → the directory its boot script ran in
}

func newCloud(t *testing.T) *cloud {
	c := &cloud{Server: ec2test.NewServer(t), booted: map[string]string{}}
	c.BootSquid(t, func(id, root string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.booted[id] = root
	})
	return c
}

// root is the directory instance id's boot script ran in ("" if it never booted).
func (c *cloud) root(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.booted[id]
}

// startAWS is a stack whose worker runs the aws provider (and the local one) against c,
// as --providers aws,local with the SDK's configuration pointed at the fake. Groups the
// provider makes are tagged an hour old, so the sweep's minimum age does not spare them.
func startAWS(t *testing.T, c *cloud, opts ...stack.Options) *stack.Stack {
	o := stack.Options{}
	if len(opts) > 0 {
		o = opts[0]
	}
	o.NoWorker = true
	s := stack.Start(t, o)
	w := s.NewWorker(t, s.TaskQueue, func(cfg *worker.Config) {
		cfg.Providers.Enabled = []v1alpha1.Provider{v1alpha1.ProviderAWS, v1alpha1.ProviderLocal}
		sdk := c.Config()
		// The SDK's own retryer, as in production, with its backoff shortened for a test.
		sdk.Retryer = func() awssdk.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 100 * time.Millisecond })
		}
		cfg.Providers.AWS = awsprov.Config{AWS: sdk, Now: func() time.Time { return time.Now().Add(-time.Hour) }}
	})
	t.Cleanup(w.Stop)
	require.NoError(t, w.Start(context.Background()))
	return s
}

// awsProxy is a Spot Proxy in the fake's region on port, probing the stack's target, which
// its egress rules let it reach (Squid refuses loopback otherwise).
func awsProxy(s *stack.Stack, ns, name string, port int32) *v1alpha1.Proxy {
	p := s.LocalProxy(ns, name)
	target, _ := url.Parse(s.Target.URL)
	tport, _ := strconv.Atoi(target.Port())
	p.Spec.Provider, p.Spec.Local, p.Spec.Port = v1alpha1.ProviderAWS, nil, port
	p.Spec.AWS = &v1alpha1.AWSSpec{Region: ec2test.Region, AssociatePublicIP: ptr.To(true),
		AllowedSourceRanges: []v1alpha1.CIDR{"127.0.0.1/32"}, Spot: true, Tags: map[string]string{"team": "crawl"}}
	p.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{"127.0.0.1/32"}, Ports: []v1alpha1.PortNumber{v1alpha1.PortNumber(tport)}}
	return p
}

// TestAWSProxyLifecycle: an aws Proxy is made exactly one hardened EC2 instance that boots
// its user data into a Squid crawlers get through with the credentials derived for it;
// when EC2 takes the Spot instance back the Proxy says Preempted and a new instance
// replaces it at once; deleting the Proxy terminates its instances; and the sweep deletes
// an orphan of the installation and the security group no instance uses any more.
func TestAWSProxyLifecycle(t *testing.T) {
	port := squidtest.FreePort(t)
	c := newCloud(t)
	s := startAWS(t, c)
	ctx := context.Background()
	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, awsProxy(s, ns, "spot-1", port)))

	p := s.WaitFor(t, ns, "spot-1", 2*time.Minute, "Ready", stack.Ready)
	assert.Equal(t, "127.0.0.1", p.Status.IP)
	assert.True(t, strings.HasPrefix(p.Status.ProviderID, ec2test.Region+"/"+p.Status.InstanceName+"/i-"), p.Status.ProviderID)
	body, err := s.Fetch(p, "/through-ec2")
	require.NoError(t, err)
	assert.Equal(t, "hello from the target: /through-ec2", body)

	live := c.Live()
	require.Len(t, live, 1, "one instance")
	in := live[0]
	assert.Equal(t, 1, c.Requests(ec2test.ActionRunInstances), "created once")
	assert.Equal(t, "required", in.HTTPTokens, "IMDSv2 only")
	assert.Equal(t, 1, in.HopLimit)
	assert.Empty(t, in.InstanceProfile)
	assert.True(t, in.Spot)
	assert.Equal(t, "crawl", in.Tags["team"])
	assert.Equal(t, string(p.UID), in.Tags[provider.LabelProxyUID])
	assert.Equal(t, s.Installation, in.Tags[provider.LabelInstallation])
	groups := c.SecurityGroups()
	require.Len(t, groups, 1)
	assert.Equal(t, []string{fmt.Sprintf("tcp:%d:127.0.0.1/32", port)}, groups[0].Ingress, "the proxy port from the allowed ranges alone")
	assert.Contains(t, in.SecurityGroupIDs, groups[0].ID)

	// EC2 takes the Spot instance back.
	first := p.Status.InstanceName
	c.Interrupt(in.ID)
	var sawPreempted bool
	p = s.WaitFor(t, ns, "spot-1", 2*time.Minute, "a new instance after the interruption", func(p *v1alpha1.Proxy) bool {
		if h := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy); h != nil && h.Reason == v1alpha1.ReasonPreempted {
			sawPreempted = true
		}
		return stack.Ready(p) && p.Status.InstanceName != first
	})
	assert.True(t, sawPreempted, "the Proxy said Preempted while it was replaced")
	require.Len(t, c.Live(), 1)
	body, err = s.Fetch(p, "/after-the-interruption")
	require.NoError(t, err)
	assert.Equal(t, "hello from the target: /after-the-interruption", body)

	// Delete: every instance terminated, the object released.
	uid := p.UID
	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "spot-1", 2*time.Minute)
	assert.Empty(t, c.Live(), "an instance was left behind")
	assert.Equal(t, 2, c.Requests(ec2test.ActionRunInstances), "one create per instance, none repeated")
	require.Eventually(t, func() bool {
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, contract.ProxyWorkflowID(ns, "spot-1"), "")
		return err == nil && desc.Status == enums.WORKFLOW_EXECUTION_STATUS_COMPLETED
	}, 30*time.Second, 50*time.Millisecond, "the workflow did not complete after deleting")
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, "spot-1"), "aws-spot-interrupted.json")

	// An orphan of this installation (its Proxy long gone) and one of another; the sweep
	// deletes the first and the group nothing uses, and leaves the rest.
	orphanTags := func(installation string) map[string]string {
		return map[string]string{provider.LabelInstallation: installation, provider.LabelProxyUID: "gone-" + string(uid),
			provider.LabelManagedBy: provider.ManagedByValue, "proxyfleet-instance": "px-orphan-" + installation, "Name": "px-orphan"}
	}
	old := time.Now().Add(-2 * time.Hour)
	orphan := c.AddInstance(ec2test.Instance{Tags: orphanTags(s.Installation), LaunchTime: old, ClientToken: "px-orphan-" + s.Installation})
	other := c.AddInstance(ec2test.Instance{Tags: orphanTags("someone-else"), LaunchTime: old, ClientToken: "px-orphan-someone-else"})
	run, err := s.Temporal.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: s.TaskQueue, ID: "gc-" + s.TaskQueue},
		contract.GCWorkflowType, workflows.GCInput{Installation: s.Installation, Providers: []v1alpha1.Provider{v1alpha1.ProviderAWS}})
	require.NoError(t, err)
	var res workflows.GCResult
	require.NoError(t, run.Get(ctx, &res))
	assert.Empty(t, res.Errors)
	assert.Equal(t, 2, res.DeletedCount, "the orphan and the unused group: %+v", res)
	states := map[string]string{}
	for _, in := range c.Instances() {
		states[in.ID] = in.State
	}
	assert.Contains(t, []string{"shutting-down", "terminated"}, states[orphan])
	assert.Equal(t, "running", states[other], "another installation's instance")
	assert.Empty(t, c.SecurityGroups(), "the group no instance uses")
}
