package aws

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestAWSRefusals walks EC2's refusals as a user sees them on the Proxy, with the SDK's
// own retryer between the worker and the fake:
//   - throttling is retried with backoff by the SDK: the Proxy comes up, with one instance;
//   - no capacity for the type is a quota wait (QuotaExceeded=True, EC2's message), and
//     the Proxy comes up once there is capacity again;
//   - an image that does not exist fails the Proxy's generation with EC2's message, and
//     an edit that fixes it brings it up;
//   - a create whose answer was lost is asked again under the same client token and
//     makes no second instance.
func TestAWSRefusals(t *testing.T) {
	c := newCloud(t)
	s := startAWS(t, c)
	ctx := context.Background()
	ns := s.Namespace(t)

	t.Run("throttled", func(t *testing.T) {
		c.FailNext(ec2test.ActionRunInstances, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
		c.FailNext(ec2test.ActionRunInstances, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
		before := c.Requests(ec2test.ActionRunInstances)
		require.NoError(t, s.Kube.Client.Create(ctx, awsProxy(s, ns, "throttled", squidtest.FreePort(t))))
		p := s.WaitFor(t, ns, "throttled", 2*time.Minute, "Ready", stack.Ready)
		assert.Equal(t, before+3, c.Requests(ec2test.ActionRunInstances), "two throttled, then made")
		assert.Len(t, owned(c, p), 1)
	})

	t.Run("capacity", func(t *testing.T) {
		// More refusals than the SDK's attempts: the activity fails, as a quota wait.
		for range 4 {
			c.RefuseCapacity()
		}
		require.NoError(t, s.Kube.Client.Create(ctx, awsProxy(s, ns, "no-capacity", squidtest.FreePort(t))))
		s.WaitFor(t, ns, "no-capacity", 2*time.Minute, "QuotaExceeded", func(p *v1alpha1.Proxy) bool {
			q := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionQuotaExceeded)
			return q != nil && q.Status == metav1.ConditionTrue && assert.Contains(t, q.Message, "InsufficientInstanceCapacity")
		})
		p := s.WaitFor(t, ns, "no-capacity", 2*time.Minute, "Ready once there is capacity", stack.Ready)
		assert.False(t, meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionQuotaExceeded))
		assert.Len(t, owned(c, p), 1)
	})

	t.Run("no such image", func(t *testing.T) {
		const msg = "The image id '[ami-0aaaaaaaaaaaaaaa1]' does not exist"
		// EC2 answers the same for every attempt: the SDK does not retry a 400.
		c.FailNext(ec2test.ActionRunInstances, http.StatusBadRequest, "InvalidAMIID.NotFound", msg)
		proxy := awsProxy(s, ns, "no-image", squidtest.FreePort(t))
		proxy.Spec.AWS.AMI = "ami-0aaaaaaaaaaaaaaa1"
		require.NoError(t, s.Kube.Client.Create(ctx, proxy))
		p := s.WaitFor(t, ns, "no-image", 2*time.Minute, "Failed", func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhaseFailed
		})
		assert.Contains(t, conditionMessages(p), msg, "EC2's message in a condition")
		assert.Empty(t, owned(c, p))

		p.Spec.AWS.AMI = ec2test.DebianParameter
		require.NoError(t, s.Kube.Client.Update(ctx, p))
		p = s.WaitFor(t, ns, "no-image", 2*time.Minute, "Ready after the fix", stack.Ready)
		assert.Len(t, owned(c, p), 1)
	})

	t.Run("answer lost", func(t *testing.T) {
		c.LoseNextAnswer(ec2test.ActionRunInstances)
		before := c.Requests(ec2test.ActionRunInstances)
		require.NoError(t, s.Kube.Client.Create(ctx, awsProxy(s, ns, "lost-answer", squidtest.FreePort(t))))
		p := s.WaitFor(t, ns, "lost-answer", 2*time.Minute, "Ready", stack.Ready)
		assert.Greater(t, c.Requests(ec2test.ActionRunInstances), before+1, "asked again")
		assert.Len(t, owned(c, p), 1, "one instance for two asks")
	})
}

// owned is the live instances of the fake tagged with p's UID.
func owned(c *cloud, p *v1alpha1.Proxy) []ec2test.Instance {
	var out []ec2test.Instance
	for _, in := range c.Live() {
		if in.Tags["proxyfleet-uid"] == string(p.UID) {
			out = append(out, in)
		}
	}
	return out
}

// conditionMessages is every condition's message, joined, for a search.
func conditionMessages(p *v1alpha1.Proxy) string {
	var out string
	for _, c := range p.Status.Conditions {
		out += c.Type + ": " + c.Message + "\n"
	}
	return out
}
