package v1alpha1_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// createPool creates a ProxyPool whose spec is given as YAML and returns the API server's
// error.
func createPool(t *testing.T, ns, name, specYAML string) error {
	t.Helper()
	var spec map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(specYAML), &spec))
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ProxyPool",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	return testenv.Kube(t).Client.Create(context.Background(), u)
}

const poolTemplate = `template:
  spec:
    provider: local
    local: {}
    attributes: {region: eu}
    healthCheck: {url: "http://127.0.0.1:1/"}
`

// TestPoolDefaults: a pool of one, Deployment's 25%/25% budget left to the readers (unset
// here, as a Deployment's strategy defaults are), autoscale at 80% with a 5m delay.
func TestPoolDefaults(t *testing.T) {
	k := testenv.Kube(t)
	ns := newNamespace(t)
	require.NoError(t, createPool(t, ns, "eu", poolTemplate+"autoscale: {maxReplicas: 5}\n"))
	var p v1alpha1.ProxyPool
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "eu"}, &p))
	require.NotNil(t, p.Spec.Replicas)
	assert.EqualValues(t, 1, *p.Spec.Replicas)
	assert.Equal(t, v1alpha1.ModeManaged, p.Spec.Template.Spec.Mode)
	assert.EqualValues(t, v1alpha1.DefaultMaxLeases, p.Spec.Template.Spec.MaxLeases)
	require.NotNil(t, p.Spec.Autoscale.MinReplicas)
	assert.EqualValues(t, 1, *p.Spec.Autoscale.MinReplicas)
	assert.EqualValues(t, 80, p.Spec.Autoscale.TargetUtilization)
	assert.Equal(t, v1alpha1.Duration("5m"), p.Spec.Autoscale.ScaleDownDelay)
}

// TestInvalidPoolsAreRejected: a pool that could never work is refused, naming the field.
func TestInvalidPoolsAreRejected(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name, spec, want string
	}{
		{"external template", `template:
  spec: {mode: External, endpoint: {host: a.example, port: 8080}, healthCheck: {url: "http://127.0.0.1:1/"}}
`, "spec.template.spec.mode must be Managed"},
		{"template that is not a valid Proxy", "template:\n  spec: {provider: gcp, healthCheck: {url: \"http://127.0.0.1:1/\"}}\n",
			"provider gcp needs the spec.gcp block"},
		{"negative replicas", poolTemplate + "replicas: -1\n", "spec.replicas"},
		{"too many replicas", poolTemplate + "replicas: 20001\n", "spec.replicas"},
		{"min above max", poolTemplate + "autoscale: {minReplicas: 6, maxReplicas: 5}\n",
			"spec.autoscale.minReplicas must not exceed spec.autoscale.maxReplicas"},
		{"autoscale without max", poolTemplate + "autoscale: {minReplicas: 0}\n", "spec.autoscale.maxReplicas"},
		{"utilization above 100", poolTemplate + "autoscale: {maxReplicas: 5, targetUtilization: 101}\n", "spec.autoscale.targetUtilization"},
		{"scale-down delay not a duration", poolTemplate + "autoscale: {maxReplicas: 5, scaleDownDelay: soon}\n", "spec.autoscale.scaleDownDelay"},
		{"both budgets zero", poolTemplate + "strategy: {maxSurge: 0, maxUnavailable: 0}\n",
			"spec.strategy.maxSurge and spec.strategy.maxUnavailable cannot both be zero"},
		{"both budgets zero percent", poolTemplate + "strategy: {maxSurge: '0%', maxUnavailable: 0}\n",
			"cannot both be zero"},
		{"negative surge", poolTemplate + "strategy: {maxSurge: -1}\n", "spec.strategy.maxSurge must be a non-negative count or a percentage"},
		{"surge not a percentage", poolTemplate + "strategy: {maxSurge: 'lots'}\n", "spec.strategy.maxSurge must be a non-negative count or a percentage"},
		{"unavailable not a percentage", poolTemplate + "strategy: {maxUnavailable: '5'}\n", "spec.strategy.maxUnavailable must be a non-negative count or a percentage"},
		{"the operator's annotation", "template:\n  metadata: {annotations: {crawl.example.com/replace-granted: '2030-01-01T00:00:00Z'}}\n" + poolTemplate[len("template:\n"):],
			"spec.template.metadata.annotations: keys under crawl.example.com/ are the operator's"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := createPool(t, ns, "p"+string(rune('a'+i)), tc.spec)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// And what is valid is accepted.
	for i, spec := range []string{
		poolTemplate + "replicas: 0\n",
		poolTemplate + "strategy: {maxSurge: 0, maxUnavailable: 1}\n",
		poolTemplate + "strategy: {maxSurge: '50%', maxUnavailable: 0}\n",
		poolTemplate + "autoscale: {minReplicas: 0, maxReplicas: 12, targetUtilization: 60, scaleDownDelay: 30s}\n",
	} {
		assert.NoError(t, createPool(t, ns, "ok"+string(rune('a'+i)), spec), spec)
	}
}

// TestPoolScaleSubresource: what `kubectl scale`, an HPA and KEDA use: the scale
// subresource reads and writes spec.replicas and reports status.replicas and the selector.
func TestPoolScaleSubresource(t *testing.T) {
	k := testenv.Kube(t)
	ns := newNamespace(t)
	require.NoError(t, createPool(t, ns, "eu", poolTemplate+"replicas: 3\n"))
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eu"}}
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), pool))
	pool.Status.Replicas = 2
	pool.Status.Selector = v1alpha1.LabelPool + "=eu"
	require.NoError(t, k.Client.Status().Update(context.Background(), pool))

	scale := &autoscalingv1.Scale{}
	require.NoError(t, k.Client.SubResource("scale").Get(context.Background(), pool, scale))
	assert.EqualValues(t, 3, scale.Spec.Replicas)
	assert.EqualValues(t, 2, scale.Status.Replicas)
	assert.Equal(t, v1alpha1.LabelPool+"=eu", scale.Status.Selector)

	scale.Spec.Replicas = 20
	require.NoError(t, k.Client.SubResource("scale").Update(context.Background(), pool, client.WithSubResourceBody(scale)))
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), pool))
	assert.EqualValues(t, 20, *pool.Spec.Replicas)

	// The schema's bound holds through the subresource too.
	scale.Spec.Replicas = v1alpha1.MaxPoolReplicas + 1
	err := k.Client.SubResource("scale").Update(context.Background(), pool, client.WithSubResourceBody(scale))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.replicas")
}

func TestPoolCRDPrinterColumns(t *testing.T) {
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "crd", "crawl.example.com_proxypools.yaml"))
	require.NoError(t, err)
	for _, col := range []string{"name: Desired", "name: Ready", "name: Leased", "name: Age", "- pxp", "specReplicasPath: .spec.replicas", "labelSelectorPath: .status.selector"} {
		assert.True(t, bytes.Contains(raw, []byte(col)), "CRD lacks %q", col)
	}
}
