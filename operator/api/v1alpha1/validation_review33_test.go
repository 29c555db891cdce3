package v1alpha1_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// TestReview33AWSTagKeyReservedPrefixAnyCase
//
// Defect: spec.aws.tags refuses keys starting with "aws:" only in lower case. AWS reserves
// the prefix in any case ("Don't use aws:, AWS:, or any upper or lowercase combination of
// such as a prefix"), and EC2 refuses such a key at RunInstances (the project's own fake
// refuses it case-insensitively too). A Proxy with tags {AWS:team: x} is accepted by the
// API server and then fails only at create time, after a security group was made for it,
// instead of being refused up front with a message naming the field.
func TestReview33AWSTagKeyReservedPrefixAnyCase(t *testing.T) {
	ns := newNamespace(t)
	const hc = `healthCheck: {url: "http://127.0.0.1:1/"}`
	for i, key := range []string{"AWS:team", "Aws:team", "aWs:team"} {
		err := createProxy(t, ns, "aws-tag-case-"+string(rune('a'+i)),
			"provider: aws\naws: {region: eu-west-1, associatePublicIP: false, tags: {'"+key+"': x}}\n"+hc)
		require.Error(t, err, "the API server accepted tag key %q, which EC2 refuses", key)
		assert.True(t, apierrors.IsInvalid(err), "want 422 Invalid, got %v", err)
		assert.Contains(t, err.Error(), "aws:")
	}
}

// TestReview33AWSRealRegionsAccepted
//
// Defect: spec.aws.region's pattern ^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$ (and the same pattern
// in activities.awsRegion) requires a two-letter first part, so it refuses a real region:
// eusc-de-east-1, the AWS European Sovereign Cloud, which the SDK this module builds with
// already knows (its partition aws-eusc, region regex ^eusc\-(de)\-\w+\-\d+$). A worker
// deployed there can run no aws Proxy at all.
func TestReview33AWSRealRegionsAccepted(t *testing.T) {
	ns := newNamespace(t)
	const hc = `healthCheck: {url: "http://127.0.0.1:1/"}`
	for i, region := range []string{"us-gov-west-1", "ap-southeast-2", "il-central-1", "eusc-de-east-1"} {
		err := createProxy(t, ns, "aws-region-"+string(rune('a'+i)),
			"provider: aws\naws: {region: "+region+", associatePublicIP: false}\n"+hc)
		assert.NoError(t, err, "the API server refused the real region %s", region)
	}
}
