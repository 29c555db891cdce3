package aws_test

import (
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/providertest"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestContract: the aws provider, built from spec.aws as the worker builds it, passes the
// contract every provider passes, against the fake EC2 API.
func TestContract(t *testing.T) {
	var srv *ec2test.Server
	providertest.Run(t, providertest.Harness{
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderAWS, AWS: &v1alpha1.AWSSpec{
			Region: ec2test.Region, InstanceType: "t3.micro", AMI: v1alpha1.DefaultAWSAMI,
			AssociatePublicIP: ptr.To(true), AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"}}},
		New: func(t *testing.T) provider.Provider {
			srv = ec2test.NewServer(t)
			cfg := srv.Config()
			cfg.Retryer = func() awssdk.Retryer { return awssdk.NopRetryer{} }
			p, err := aws.New(aws.Config{AWS: cfg})
			require.NoError(t, err)
			return p
		},
		Instances: func(*testing.T) int { return len(srv.Live()) },
	})
}
