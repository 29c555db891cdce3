package deployed_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestPodEmulationRefusesWhatAPodCannotDo: the walk runs the binaries as this test's user,
// which owns the files it writes, and passes arguments as Kubernetes does, a reference to a
// missing variable included. What a real pod could not do must fail here all the same: a
// fleet key the container's user cannot read (fsGroup removed, or a mode without group
// read), and an argument naming a variable the environment lacks.
func TestPodEmulationRefusesWhatAPodCannotDo(t *testing.T) {
	worker := shippedPodSpec(t, "worker.yaml")
	require.Len(t, worker.Containers, 1)
	ctr := worker.Containers[0]
	key := *worker.Volumes[0].Secret
	require.Equal(t, "proxyfleet-fleet-key", key.SecretName)

	assert.NoError(t, secretVolumeReadable(worker, ctr, key), "as shipped")
	noFSGroup := *worker.DeepCopy()
	noFSGroup.SecurityContext.FSGroup = nil
	assert.Error(t, secretVolumeReadable(noFSGroup, ctr, key), "without fsGroup the key is root's, mode 0440")
	ownerOnly := key
	ownerOnly.DefaultMode = ptr.To(int32(0o400))
	assert.NoError(t, secretVolumeReadable(worker, ctr, ownerOnly), "the kubelet adds group read for fsGroup")
	assert.Error(t, secretVolumeReadable(noFSGroup, ctr, ownerOnly))
	asRoot := ctr.DeepCopy()
	asRoot.SecurityContext.RunAsUser = ptr.To(int64(0))
	assert.NoError(t, secretVolumeReadable(noFSGroup, *asRoot, key))

	env := map[string]string{"POD_NAMESPACE": "proxyfleet-system"}
	assert.Equal(t, []string{"PROXYFLEET_PROVIDERS"}, unresolved("--providers=$(PROXYFLEET_PROVIDERS)", env))
	env["PROXYFLEET_PROVIDERS"] = ""
	assert.Empty(t, unresolved("--providers=$(PROXYFLEET_PROVIDERS)", env), "defined, if empty")
	assert.Empty(t, unresolved("--price=$$(NOT_A_VAR)", env), "escaped")
}

// shippedPodSpec reads the pod template of the one workload in deploy/base/file.
func shippedPodSpec(t *testing.T, file string) corev1.PodSpec {
	t.Helper()
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "base", file))
	require.NoError(t, err)
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var d appsv1.Deployment
		require.NoError(t, yaml.Unmarshal([]byte(doc), &d))
		if d.Kind == "Deployment" || d.Kind == "StatefulSet" {
			return d.Spec.Template.Spec
		}
	}
	t.Fatalf("no workload in %s", file)
	return corev1.PodSpec{}
}
