package deployed_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// awsStandIns are EC2 (whose instances boot their user data into real Squid on loopback)
// and STS (which exchanges the worker's web identity token for its role's credentials).
type awsStandIns struct {
	ec2 *ec2test.Server
	sts *ec2test.STS
}

// TestShippedAWSOverlayRunsAProxyOnEC2 applies deploy/overlays/aws as a user does on EKS
// and walks an aws Proxy on what it runs: the worker, started with the overlay's flags
// and environment, gets its credentials the IRSA way (the role its ServiceAccount names,
// a web identity token exchanged at STS) and its region from the overlay; the Proxy's
// instance is made once, boots, is leased and carries a crawler's request; deleting the
// Proxy terminates it, and the sweep lists the overlay's regions without an error.
func TestShippedAWSOverlayRunsAProxyOnEC2(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := &cluster{ctx: ctx, k: testenv.Kube(t), temporal: testenv.Temporal(t), binaries: buildBinaries(t)}
	ec2 := ec2test.NewServer(t)
	ec2.BootSquid(t, nil)
	c.aws = &awsStandIns{ec2: ec2, sts: ec2test.NewSTS(t, "arn:aws:iam::123456789012:role/proxyfleet-worker", "eks-projected-token")}
	// The overlay's regions but the default: the fake's.
	discovery, token := c.deploy(t, "deploy/overlays/aws", map[string]string{"AWS_REGION": ec2test.Region})

	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello from the site\n")
	}))
	t.Cleanup(site.Close)
	siteURL, _ := url.Parse(site.URL)
	kubectl(t, c, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", crawlNS), "apply", "--server-side", "-f", "-")

	// A Proxy as the aws sample is, with what reaching a site on loopback takes.
	kubectl(t, c, fmt.Sprintf(`apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: on-ec2, namespace: %s}
spec:
  provider: aws
  port: %d
  attributes: {pool: on-ec2}
  aws:
    region: %s
    allowedSourceRanges: ["127.0.0.1/32"]
    spot: true
  egress:
    allowedDestinations: ["127.0.0.1/32"]
    ports: [%s]
  healthCheck: {url: "%s/", interval: 2s, timeout: 1s}
`, crawlNS, freePort(t), ec2test.Region, siteURL.Port(), site.URL), "apply", "--server-side", "-f", "-")
	key := types.NamespacedName{Namespace: crawlNS, Name: "on-ec2"}
	px := c.waitProxy(t, key, "Ready", func(px *v1alpha1.Proxy) bool {
		return px.Status.Phase == v1alpha1.PhaseReady && px.Status.InstanceName != ""
	})
	assert.True(t, strings.HasPrefix(px.Status.ProviderID, ec2test.Region+"/"+px.Status.InstanceName+"/i-"), px.Status.ProviderID)
	assert.Positive(t, c.aws.sts.Exchanges(), "the worker's credentials came from its role")
	assert.Contains(t, ec2.Authorizations(ec2test.ActionRunInstances), "Credential="+c.aws.sts.AccessKeyID+"/", "signed with the role's credentials")
	assert.Equal(t, 1, ec2.Requests(ec2test.ActionRunInstances))

	api := dclient.New(fmt.Sprintf("http://127.0.0.1:%d", discovery[0].ports[8090]), token)
	lease := c.acquire(t, api, map[string]string{"pool": "on-ec2"})
	assert.Equal(t, "hello from the site\n", fetchThrough(t, lease.Proxy.URL, site.URL))
	require.NoError(t, api.Release(ctx, lease.ID))

	require.NoError(t, c.k.Client.Delete(ctx, px))
	c.eventually(t, "the Proxy is gone (its finalizer released)", func() bool {
		return !c.exists(t, &v1alpha1.Proxy{}, key)
	})
	for _, in := range ec2.Instances() {
		assert.Contains(t, []string{"shutting-down", "terminated"}, in.State, "instance %s left behind", in.ID)
		assert.Equal(t, string(px.UID), in.Tags[provider.LabelProxyUID])
	}

	result := c.sweep(t)
	assert.Empty(t, result.Errors, "every region listed: %+v", result)
	assert.False(t, result.Skipped, result.SkipReason)
	c.refused(t)
}
