package registry

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// isolateAWS points the SDK's shared files at nothing, so the machine's own AWS settings
// (if any) take no part, and clears the environment the chain reads.
func isolateAWS(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_PROFILE": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
		"AWS_SESSION_TOKEN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_ROLE_ARN": "", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
	} {
		t.Setenv(k, v)
	}
}

// TestAWSNeedsARegion: enabled without a region (no --aws-region, no AWS_REGION) the aws
// provider is refused before the worker starts, naming both ways to give one.
func TestAWSNeedsARegion(t *testing.T) {
	isolateAWS(t)
	_, _, err := Build(context.Background(), Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderAWS}})
	assert.ErrorContains(t, err, "--aws-region or AWS_REGION")

	// A worker that does not enable it never reads AWS's configuration at all.
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "missing", "config"))
	_, release, err := Build(context.Background(), Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderLocal}, LocalDaemonURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	release()
}

// TestAWSCredentialsFromTheEnvironment: the default chain's environment credentials and
// region, with the endpoint override the SDK reads (AWS_ENDPOINT_URL_EC2), reach EC2: the
// fake answers the provider's list only for a request it could check was signed.
func TestAWSCredentialsFromTheEnvironment(t *testing.T) {
	isolateAWS(t)
	srv := ec2test.NewServer(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT00001")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
	t.Setenv("AWS_REGION", ec2test.Region)
	t.Setenv("AWS_ENDPOINT_URL_EC2", srv.URL)
	reg, release, err := Build(context.Background(), Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderAWS}})
	require.NoError(t, err)
	defer release()
	p, err := reg.Get(v1alpha1.ProviderAWS)
	require.NoError(t, err)
	_, err = p.ListOwned(context.Background(), provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	assert.Contains(t, srv.Authorizations(ec2test.ActionDescribeInstances), "Credential=AKIAENVIRONMENT00001/")
}

// TestAWSWebIdentity is IRSA as EKS sets it up: a projected token file and a role ARN in
// the environment. The chain exchanges the token at STS (a stand-in on loopback, through
// the SDK's AWS_ENDPOINT_URL_STS) for the role's credentials, which sign the EC2 calls.
func TestAWSWebIdentity(t *testing.T) {
	isolateAWS(t)
	srv := ec2test.NewServer(t)
	sts := ec2test.NewSTS(t, "arn:aws:iam::123456789012:role/proxyfleet-worker", "projected-token")
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("projected-token"), 0o600))
	t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", token)
	t.Setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/proxyfleet-worker")
	t.Setenv("AWS_ENDPOINT_URL_STS", sts.URL)
	t.Setenv("AWS_ENDPOINT_URL_EC2", srv.URL)

	reg, release, err := Build(context.Background(), Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderAWS}, AWSRegion: ec2test.Region})
	require.NoError(t, err)
	defer release()
	assert.Zero(t, sts.Exchanges(), "nothing is asked of AWS until the first call")
	p, err := reg.Get(v1alpha1.ProviderAWS)
	require.NoError(t, err)
	_, err = p.ListOwned(context.Background(), provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	assert.Equal(t, 1, sts.Exchanges())
	assert.Contains(t, srv.Authorizations(ec2test.ActionDescribeInstances), "Credential=ASIAWEBIDENTITY00001/")
}
