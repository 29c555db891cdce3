// Package deploy_test checks the deployment files against what they deploy: every
// kustomization renders and passes a real kube-apiserver's server-side dry run, the
// manifests and docker-compose.yaml call the binaries with flags and variables the binaries
// have, the Dockerfile builds every binary, and each place that registers the search
// attributes registers exactly those of package workflows.
package deploy_test

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

const (
	namespace   = "proxyfleet-system"
	image       = "ghcr.io/proxyfleet/proxyfleet:v0.1.0"
	adminTools  = "temporalio/admin-tools:1.28.1"
	tokenSecret = "proxyfleet-discovery-token"
	binPrefix   = "/usr/local/bin/" // where the Dockerfile puts the binaries
)

// imageBinaries are the commands the image holds. cmd/ folders not listed in devOnly must
// be among them (TestDockerfileBuildsEveryBinary).
var imageBinaries = []string{"operator", "worker", "discovery", "localproxyd"}

// devOnly lists the cmd/ folders that are deliberately not in the image, with the reason.
var devOnly = map[string]string{
	"devstack": "`make dev`: starts the dev servers from bin/ on the developer's machine",
}

var binDir string // the binaries built once for the tests that ask them for their flags

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "proxyfleet-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := testenv.Run(m, testenv.Options{Kube: true})
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	return root
}

// binary is what a test knows of one of the project's binaries from running it with -h.
type binary struct {
	path  string
	flags map[string]bool
	help  string
}

var (
	buildOnce sync.Once
	buildErr  error
	binMu     sync.Mutex
	binCache  = map[string]*binary{}
)

// binaryInfo builds the image's binaries (once per test run) and returns name's flags and
// help text, as the flag package prints them for -h.
func binaryInfo(t *testing.T, name string) *binary {
	t.Helper()
	require.Contains(t, imageBinaries, name, "not a binary of the image")
	buildOnce.Do(func() {
		root, err := testenv.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		args := []string{"build", "-o", binDir + string(filepath.Separator)}
		for _, b := range imageBinaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	require.NoError(t, buildErr)

	binMu.Lock()
	defer binMu.Unlock()
	if b, ok := binCache[name]; ok {
		return b
	}
	p := filepath.Join(binDir, name)
	// -h prints the usage and exits before the binary touches anything; the exit code of
	// -h differs between flag package versions, so only the output counts.
	out, _ := exec.Command(p, "-h").CombinedOutput()
	b := &binary{path: p, flags: map[string]bool{}, help: string(out)}
	for _, m := range usageFlag.FindAllStringSubmatch(b.help, -1) {
		b.flags[m[1]] = true
	}
	require.NotEmpty(t, b.flags, "%s -h printed no flags:\n%s", name, out)
	binCache[name] = b
	return b
}

// usageFlag matches the lines flag.PrintDefaults starts each flag with: "  -name type".
var usageFlag = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9._-]*)`)

// checkFlags asserts that every flag in args is one that bin defines.
func checkFlags(t *testing.T, where string, bin *binary, args []string) {
	t.Helper()
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		assert.True(t, bin.flags[name], "%s: %s has no flag -%s (it has %v)", where, filepath.Base(bin.path), name, slices.Sorted(maps.Keys(bin.flags)))
	}
}

// flagValue returns the value of --name in args, given as "--name=v" or "--name v".
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		n, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if n != name {
			continue
		}
		if hasValue {
			return v, true
		}
		if i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// wantSearchAttributes is name → CLI type ("Keyword", "Bool", …) of every search attribute
// the workflows upsert.
func wantSearchAttributes(t *testing.T) map[string]string {
	t.Helper()
	want := map[string]string{}
	for key := range contract.SearchAttributes().GetUntypedValues() {
		want[key.GetName()] = key.GetValueType().String()
	}
	require.Len(t, want, 4)
	return want
}

var searchAttrPair = regexp.MustCompile(`\b([A-Za-z]\w*)=(Text|Keyword|Int|Double|Bool|Datetime|KeywordList)\b`)

// registeredSearchAttributes reads the name=Type pairs a setup script loops over.
func registeredSearchAttributes(t *testing.T, script string) map[string]string {
	t.Helper()
	require.Contains(t, script, "temporal operator search-attribute create")
	got := map[string]string{}
	for _, m := range searchAttrPair.FindAllStringSubmatch(script, -1) {
		got[m[1]] = m[2]
	}
	return got
}

// ---- Kubernetes manifests ----

type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	raw []byte // the document as JSON
}

func decodeObjects(t *testing.T, rendered []byte) []object {
	t.Helper()
	var objs []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(rendered)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		raw, err := yaml.YAMLToJSON(doc)
		require.NoError(t, err)
		if string(raw) == "null" {
			continue
		}
		var o object
		require.NoError(t, json.Unmarshal(raw, &o))
		o.raw = raw
		objs = append(objs, o)
	}
	return objs
}

func find(t *testing.T, objs []object, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			require.NoError(t, json.Unmarshal(o.raw, into))
			return
		}
	}
	t.Fatalf("no %s %s in the rendered manifests", kind, name)
}

func TestManifestsServerSideDryRun(t *testing.T) {
	k := testenv.Kube(t)
	root := repoRoot(t)

	// What a user creates before the first apply: the namespace and the discovery token. The
	// namespace is created from the base's own file, so that its Pod Security level applies
	// to the dry runs below.
	ns, err := os.ReadFile(filepath.Join(root, "deploy", "base", "namespace.yaml"))
	require.NoError(t, err)
	token := make([]byte, 16)
	_, _ = rand.Read(token)
	secret := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: %s
  namespace: %s
stringData:
  token: %s
`, tokenSecret, namespace, hex.EncodeToString(token))
	fleetKey := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: proxyfleet-fleet-key
  namespace: %s
stringData:
  key: %s
`, namespace, base64.StdEncoding.EncodeToString(append(token, token...)))
	out, err := k.RunKubectl(t, strings.NewReader(string(ns)+"\n---\n"+secret+"\n---\n"+fleetKey), "apply", "--server-side", "-f", "-")
	require.NoError(t, err, out)

	tests := []struct {
		dir      string
		replicas map[string]int32
		config   map[string]string // keys of proxyfleet-config that must have these values
		check    func(t *testing.T, objs []object)
	}{
		{
			dir:      "deploy/base",
			replicas: map[string]int32{"proxyfleet-operator": 2, "proxyfleet-worker": 2, "proxyfleet-discovery": 3},
			config:   map[string]string{"PROXYFLEET_PROVIDERS": "kubernetes"},
		},
		{
			dir:      "deploy/overlays/gcp",
			replicas: map[string]int32{"proxyfleet-operator": 2, "proxyfleet-worker": 2, "proxyfleet-discovery": 3},
			config:   map[string]string{"PROXYFLEET_PROVIDERS": "gcp,kubernetes"},
			check: func(t *testing.T, objs []object) {
				var cm corev1.ConfigMap
				find(t, objs, "ConfigMap", "proxyfleet-config", &cm)
				assert.NotEmpty(t, cm.Data["GOOGLE_CLOUD_PROJECT"], "the gcp provider needs a default project")
				assert.NotEqual(t, "default", cm.Data["PROXYFLEET_INSTALLATION"])
				var sa corev1.ServiceAccount
				find(t, objs, "ServiceAccount", "proxyfleet-worker", &sa)
				assert.Contains(t, sa.Annotations["iam.gke.io/gcp-service-account"], ".iam.gserviceaccount.com")
			},
		},
		{
			dir:      "deploy/overlays/aws",
			replicas: map[string]int32{"proxyfleet-operator": 2, "proxyfleet-worker": 2, "proxyfleet-discovery": 3},
			config:   map[string]string{"PROXYFLEET_PROVIDERS": "aws,kubernetes"},
			check: func(t *testing.T, objs []object) {
				var cm corev1.ConfigMap
				find(t, objs, "ConfigMap", "proxyfleet-config", &cm)
				assert.NotEmpty(t, cm.Data["AWS_REGION"], "the aws provider needs a default region")
				assert.NotEqual(t, "default", cm.Data["PROXYFLEET_INSTALLATION"])
				var sa corev1.ServiceAccount
				find(t, objs, "ServiceAccount", "proxyfleet-worker", &sa)
				assert.Regexp(t, `^arn:aws:iam::[0-9]{12}:role/`, sa.Annotations["eks.amazonaws.com/role-arn"], "IRSA: the worker's role")
			},
		},
		{
			dir:      "deploy/overlays/kind",
			replicas: map[string]int32{"proxyfleet-operator": 1, "proxyfleet-worker": 1, "proxyfleet-discovery": 1},
			config: map[string]string{"PROXYFLEET_PROVIDERS": "kubernetes", "PROXYFLEET_INSTALLATION": "kind",
				"TEMPORAL_ADDRESS": "temporal-frontend.temporal:7233"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.dir, func(t *testing.T) {
			cmd := exec.Command(k.Kubectl, "kustomize", filepath.Join(root, tc.dir))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			rendered, err := cmd.Output()
			require.NoError(t, err, "kubectl kustomize %s: %s", tc.dir, stderr.String())

			out, err := k.RunKubectl(t, bytes.NewReader(rendered), "apply", "--server-side", "--dry-run=server", "-f", "-")
			require.NoError(t, err, "server-side dry run of %s:\n%s", tc.dir, out)
			assert.NotContains(t, out, "Warning", "no warnings: deprecated APIs, the restricted Pod Security level of the namespace, …")

			objs := decodeObjects(t, rendered)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.Kind]++
				assert.NotEqual(t, "Secret", o.Kind, "%s: Secret %s is in the manifests; secrets are created by the user, never committed", tc.dir, o.Metadata.Name)
			}
			for kind, n := range map[string]int{"Deployment": 2, "StatefulSet": 1, "PodDisruptionBudget": 1, "Job": 1,
				"ServiceAccount": 3, "ClusterRoleBinding": 2, "ClusterRole": 2, "CustomResourceDefinition": 2, "ConfigMap": 1,
				"Namespace": 1} {
				assert.Equal(t, n, kinds[kind], "%s: number of %s objects", tc.dir, kind)
			}
			assert.GreaterOrEqual(t, kinds["Service"], 1)

			var cm corev1.ConfigMap
			find(t, objs, "ConfigMap", "proxyfleet-config", &cm)
			for key, want := range tc.config {
				assert.Equal(t, want, cm.Data[key], "proxyfleet-config %s", key)
			}
			assert.NotEmpty(t, cm.Data["TEMPORAL_ADDRESS"])

			for name, want := range tc.replicas {
				replicas, pod := findWorkload(t, objs, name)
				require.NotNil(t, replicas, name)
				assert.Equal(t, want, *replicas, "%s replicas", name)
				checkWorkload(t, name, pod.Spec, cm)
			}

			var svc corev1.Service
			find(t, objs, "Service", "proxyfleet-discovery", &svc)
			// The API and the gateway.
			require.Len(t, svc.Spec.Ports, 2)
			assert.Equal(t, int32(8090), svc.Spec.Ports[0].Port)
			assert.Equal(t, int32(8091), svc.Spec.Ports[1].Port)
			assertSelectsOnly(t, objs, "Service proxyfleet-discovery", labels.SelectorFromValidatedSet(svc.Spec.Selector), "proxyfleet-discovery")
			checkDiscoveryReplicas(t, objs)

			var job batchv1.Job
			find(t, objs, "Job", "proxyfleet-register-search-attributes", &job)
			checkSearchAttributeJob(t, job, cm)

			for _, name := range []string{"proxyfleet-operator", "proxyfleet-worker"} {
				var crb rbacv1.ClusterRoleBinding
				find(t, objs, "ClusterRoleBinding", name, &crb)
				assert.Equal(t, name, crb.RoleRef.Name)
				assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}}, crb.Subjects)
			}
			if tc.check != nil {
				tc.check(t, objs)
			}
		})
	}
}

// addressFlag is, per binary, the flag whose port the probes must use.
var addressFlag = map[string]string{
	"operator":  "health-probe-bind-address",
	"worker":    "http-address",
	"discovery": "listen",
}

// workloadKinds is the kind of each workload. Discovery's is a StatefulSet: a replica's
// number, which its peers address it by and its lease IDs carry, is its pod's ordinal.
var workloadKinds = map[string]string{
	"proxyfleet-operator":  "Deployment",
	"proxyfleet-worker":    "Deployment",
	"proxyfleet-discovery": "StatefulSet",
}

// findWorkload returns the replica count and pod template of the workload name, of its
// kind in workloadKinds.
func findWorkload(t *testing.T, objs []object, name string) (*int32, corev1.PodTemplateSpec) {
	t.Helper()
	switch kind := workloadKinds[name]; kind {
	case "Deployment":
		var d appsv1.Deployment
		find(t, objs, kind, name, &d)
		return d.Spec.Replicas, d.Spec.Template
	case "StatefulSet":
		var s appsv1.StatefulSet
		find(t, objs, kind, name, &s)
		return s.Spec.Replicas, s.Spec.Template
	}
	t.Fatalf("workloadKinds has no kind for %s", name)
	return nil, corev1.PodTemplateSpec{}
}

// checkWorkload checks the pod of the Deployment or StatefulSet name.
func checkWorkload(t *testing.T, name string, pod corev1.PodSpec, cm corev1.ConfigMap) {
	t.Helper()
	require.Len(t, pod.Containers, 1, name)
	c := pod.Containers[0]
	assert.Equal(t, image, c.Image, name)
	checkContainerBasics(t, name, c)

	bin := binaryName(t, name, c)
	args, port := listenArgs(t, name, c)
	checkFlags(t, name, binaryInfo(t, bin), args)
	checkVariableRefs(t, name, c, cm)

	// Probes hit the port the binary listens on.
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, p, "%s: %s probe", name, what)
		require.NotNil(t, p.HTTPGet, "%s: %s probe", name, what)
		assert.Equal(t, port, containerPort(t, c, p.HTTPGet.Port.String()), "%s: %s probe port", name, what)
	}

	mounts := pod.AutomountServiceAccountToken != nil && *pod.AutomountServiceAccountToken
	switch bin {
	case "operator":
		assert.True(t, mounts, "the operator calls the Kubernetes API")
		assert.Contains(t, args, "--leader-elect")
		assert.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
		assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	case "worker":
		assert.True(t, mounts, "the worker calls the Kubernetes API")
		assert.Contains(t, args, "--providers=$(PROXYFLEET_PROVIDERS)")
	case "discovery":
		assert.False(t, mounts, "discovery never calls the Kubernetes API; it gets no token")
		// /readyz fails until the index is loaded from Temporal; /healthz only says the
		// process serves, so a replica waiting for Temporal is not restarted in a loop.
		assert.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
		assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
		var ref *corev1.SecretKeySelector
		for _, e := range c.Env {
			if e.Name == "DISCOVERY_TOKEN" && e.ValueFrom != nil {
				ref = e.ValueFrom.SecretKeyRef
			}
		}
		require.NotNil(t, ref, "discovery reads DISCOVERY_TOKEN from a Secret")
		assert.Equal(t, tokenSecret, ref.Name, "the Secret the user creates (docs/operations.md)")
	}
	assert.Equal(t, "proxyfleet-"+bin, pod.ServiceAccountName)
}

// binaryName is the image's binary that container c of workload name runs.
func binaryName(t *testing.T, name string, c corev1.Container) string {
	t.Helper()
	require.NotEmpty(t, c.Command, "%s: the image has no entrypoint; command names the binary", name)
	bin, ok := strings.CutPrefix(c.Command[0], binPrefix)
	require.True(t, ok, "%s: command %q is not a binary in %s", name, c.Command[0], binPrefix)
	return bin
}

// listenArgs returns the arguments container c of workload name passes its binary and the
// port the binary listens on (for its probes, metrics and, for discovery, its API).
func listenArgs(t *testing.T, name string, c corev1.Container) (args []string, port string) {
	t.Helper()
	bin := binaryName(t, name, c)
	args = append(slices.Clone(c.Command[1:]), c.Args...)
	addr, ok := flagValue(args, addressFlag[bin])
	require.True(t, ok, "%s: --%s is not set; its default listens on 127.0.0.1 only", name, addressFlag[bin])
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return args, port
}

// checkDiscoveryReplicas checks what discovery's replicas need to share one lease table:
// numbers that survive restarts, a list of peers that matches the replica count, addresses
// that resolve before a replica is ready, at most one replica down at a time, and a network
// path between them.
func checkDiscoveryReplicas(t *testing.T, objs []object) {
	t.Helper()
	const name = "proxyfleet-discovery"
	var ss appsv1.StatefulSet
	find(t, objs, "StatefulSet", name, &ss)
	require.NotNil(t, ss.Spec.Replicas)
	replicas := int(*ss.Spec.Replicas)
	pod := ss.Spec.Template
	require.Len(t, pod.Spec.Containers, 1)
	c := pod.Spec.Containers[0]
	_, port := listenArgs(t, name, c)

	// Each replica waits for its peers itself: started one after the other, replica 0
	// would wait for peers the StatefulSet creates only once it is ready.
	assert.Equal(t, appsv1.ParallelPodManagement, ss.Spec.PodManagementPolicy, "podManagementPolicy")
	// A rollout replaces one replica at a time, each once the one before is ready, that is
	// has restored its leases: two down at once can lose a lease.
	assert.Equal(t, appsv1.RollingUpdateStatefulSetStrategyType,
		cmp.Or(ss.Spec.UpdateStrategy.Type, appsv1.RollingUpdateStatefulSetStrategyType), "updateStrategy")
	if ru := ss.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		assert.Equal(t, intstr.FromInt32(1), *ru.MaxUnavailable, "updateStrategy.rollingUpdate.maxUnavailable")
	}
	// Replicas on one node go down together with it.
	assert.True(t, spreadsOverNodes(pod), "%s: no pod anti-affinity on kubernetes.io/hostname for its own pods", name)
	// On SIGTERM discovery gives requests in flight up to 10s, then queued reports up to
	// 10s more; a shorter grace period kills it before it has copied or forwarded them.
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	assert.Greater(t, grace, int64(20), "terminationGracePeriodSeconds")

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	// Both variables are the binary's: one it does not read would leave every replica alone.
	help := binaryInfo(t, "discovery").help
	for _, v := range []string{"DISCOVERY_PEERS", "DISCOVERY_REPLICA"} {
		assert.Contains(t, help, "env "+v, "discovery does not read %s", v)
	}

	// The replica's number is its pod's ordinal, which ends the pod's name.
	replica := env["DISCOVERY_REPLICA"].ValueFrom
	require.NotNil(t, replica, "%s: DISCOVERY_REPLICA is not set from the pod", name)
	require.NotNil(t, replica.FieldRef, "%s: DISCOVERY_REPLICA", name)
	assert.Equal(t, "metadata.name", replica.FieldRef.FieldPath, "%s: DISCOVERY_REPLICA", name)

	// Every replica's address, by replica number, split as the binary splits it.
	require.NotEmpty(t, ss.Spec.ServiceName, "%s: serviceName names the Service that gives its pods DNS names", name)
	require.Nil(t, env["DISCOVERY_PEERS"].ValueFrom, "%s: DISCOVERY_PEERS is the same list for every replica", name)
	var peers []string
	for _, p := range strings.Split(env["DISCOVERY_PEERS"].Value, ",") {
		if p = strings.TrimSpace(p); p != "" {
			peers = append(peers, p)
		}
	}
	if len(peers) == 0 {
		assert.Equal(t, 1, replicas, "%s: DISCOVERY_PEERS is empty, so each replica would grant leases alone and a Proxy could hold replicas x maxLeases", name)
	} else {
		// Fewer, and the replicas past the list's end refuse to start; more, and every
		// replica waits for peers that never start (a count changed without the list).
		require.Len(t, peers, replicas, "%s: DISCOVERY_PEERS lists %d replicas, the StatefulSet runs %d", name, len(peers), replicas)
	}
	for i, p := range peers {
		u, err := url.Parse(p)
		require.NoError(t, err, "%s: DISCOVERY_PEERS", name)
		assert.Equal(t, "http", u.Scheme, "%s: replica %d's address %s", name, i, p)
		// Pod <name>-<i> of the StatefulSet's governing Service: replica i is the pod of
		// ordinal i, whichever node it runs on.
		assert.Equal(t, fmt.Sprintf("%s-%d.%s.%s.svc", ss.Name, i, ss.Spec.ServiceName, ss.Namespace), u.Hostname(),
			"%s: replica %d's address %s", name, i, p)
		assert.Equal(t, port, u.Port(), "%s: replica %d's address %s: replicas call each other on the API port", name, i, p)
		assert.Contains(t, []string{"", "/"}, u.Path, "%s: replica %d's address %s: a base URL", name, i, p)
	}

	// The governing Service gives each pod its DNS name: headless, and publishing pods that
	// are not ready, since a starting replica restores its leases from peers that may be
	// restoring too.
	var peerSvc corev1.Service
	find(t, objs, "Service", ss.Spec.ServiceName, &peerSvc)
	assert.Equal(t, corev1.ClusterIPNone, peerSvc.Spec.ClusterIP, "Service %s: clusterIP", peerSvc.Name)
	assert.True(t, peerSvc.Spec.PublishNotReadyAddresses, "Service %s: publishNotReadyAddresses", peerSvc.Name)
	assertSelectsOnly(t, objs, "Service "+peerSvc.Name, labels.SelectorFromValidatedSet(peerSvc.Spec.Selector), name)

	// Drains evict one replica at a time, for the same reason as the rollout.
	var pdb policyv1.PodDisruptionBudget
	find(t, objs, "PodDisruptionBudget", name, &pdb)
	require.NotNil(t, pdb.Spec.MaxUnavailable, "PodDisruptionBudget %s: maxUnavailable", name)
	assert.Equal(t, intstr.FromInt32(1), *pdb.Spec.MaxUnavailable, "PodDisruptionBudget %s: maxUnavailable", name)
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	require.NoError(t, err)
	assertSelectsOnly(t, objs, "PodDisruptionBudget "+name, sel, name)

	// A lease change is answered only once a peer holds its copy: replicas that cannot
	// reach each other grant nothing.
	portNum, err := strconv.Atoi(port)
	require.NoError(t, err)
	assert.True(t, ingressAdmitted(t, objs, ss.Namespace, pod.Labels, pod.Labels, c, int32(portNum)),
		"the NetworkPolicies do not admit %s's pods to each other on port %s", name, port)
}

// spreadsOverNodes reports whether pod asks, required or preferred, not to share a node
// with the pods of its own labels.
func spreadsOverNodes(pod corev1.PodTemplateSpec) bool {
	aa := pod.Spec.Affinity
	if aa == nil || aa.PodAntiAffinity == nil {
		return false
	}
	terms := slices.Clone(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
	for _, w := range aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		terms = append(terms, w.PodAffinityTerm)
	}
	return slices.ContainsFunc(terms, func(term corev1.PodAffinityTerm) bool {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		return err == nil && term.TopologyKey == corev1.LabelHostname && len(term.Namespaces) == 0 &&
			term.NamespaceSelector == nil && sel.Matches(labels.Set(pod.Labels))
	})
}

// assertSelectsOnly asserts that sel, the selector of what, matches the pods of workload
// name and of no other workload.
func assertSelectsOnly(t *testing.T, objs []object, what string, sel labels.Selector, name string) {
	t.Helper()
	require.False(t, sel.Empty(), "%s selects every pod", what)
	for w := range workloadKinds {
		_, pod := findWorkload(t, objs, w)
		assert.Equal(t, w == name, sel.Matches(labels.Set(pod.Labels)), "%s: selects the pods of %s", what, w)
	}
}

// ingressAdmitted reports whether the NetworkPolicies of namespace ns admit TCP traffic
// from a pod labelled from to port of container c, in a pod labelled to, in the same
// namespace. Only policies are read, as the network plugin applies them; a pod no policy
// selects counts as not admitted, since discovery's own policy must select its pods.
func ingressAdmitted(t *testing.T, objs []object, ns string, from, to map[string]string, c corev1.Container, port int32) bool {
	t.Helper()
	var nsObj corev1.Namespace
	find(t, objs, "Namespace", ns, &nsObj)
	nsLabels := labels.Set(maps.Clone(nsObj.Labels))
	if nsLabels == nil {
		nsLabels = labels.Set{}
	}
	nsLabels[corev1.LabelMetadataName] = ns // set by the API server on every namespace

	matches := func(s *metav1.LabelSelector, l map[string]string) bool {
		sel, err := metav1.LabelSelectorAsSelector(s)
		require.NoError(t, err)
		return sel.Matches(labels.Set(l))
	}
	portMatches := func(p networkingv1.NetworkPolicyPort) bool {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			return false
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
				return cp.Name == p.Port.StrVal && cp.ContainerPort == port
			})
		case p.EndPort != nil:
			return p.Port.IntVal <= port && port <= *p.EndPort
		}
		return p.Port.IntVal == port
	}
	peerMatches := func(p networkingv1.NetworkPolicyPeer) bool {
		if p.IPBlock != nil {
			return false // pod addresses are not known in advance
		}
		if p.NamespaceSelector != nil && !matches(p.NamespaceSelector, nsLabels) {
			return false
		}
		return p.PodSelector == nil || matches(p.PodSelector, from)
	}
	for _, o := range objs {
		if o.Kind != "NetworkPolicy" || o.Metadata.Namespace != ns {
			continue
		}
		var np networkingv1.NetworkPolicy
		require.NoError(t, json.Unmarshal(o.raw, &np))
		if !matches(&np.Spec.PodSelector, to) {
			continue
		}
		if len(np.Spec.PolicyTypes) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			if (len(rule.Ports) == 0 || slices.ContainsFunc(rule.Ports, portMatches)) &&
				(len(rule.From) == 0 || slices.ContainsFunc(rule.From, peerMatches)) {
				return true
			}
		}
	}
	return false
}

// containerPort resolves a probe's port (a number or a port name) to a number.
func containerPort(t *testing.T, c corev1.Container, port string) string {
	t.Helper()
	if _, err := strconv.Atoi(port); err == nil {
		return port
	}
	for _, p := range c.Ports {
		if p.Name == port {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, port)
	return ""
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkVariableRefs asserts that every $(VAR) Kubernetes expands in command and args is
// defined; an undefined one would reach the binary literally.
func checkVariableRefs(t *testing.T, where string, c corev1.Container, cm corev1.ConfigMap) {
	t.Helper()
	defined := map[string]bool{}
	for _, e := range c.Env {
		defined[e.Name] = true
	}
	for _, ef := range c.EnvFrom {
		require.NotNil(t, ef.ConfigMapRef, "%s: envFrom other than the config", where)
		require.Equal(t, cm.Name, ef.ConfigMapRef.Name, where)
		for k := range cm.Data {
			defined[ef.Prefix+k] = true
		}
	}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		a = strings.ReplaceAll(a, "$$", "")
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			assert.True(t, defined[m[1]], "%s: $(%s) is not defined in the container's environment", where, m[1])
		}
	}
}

func checkContainerBasics(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		assert.Contains(t, c.Resources.Requests, res, "%s: requests", where)
		assert.Contains(t, c.Resources.Limits, res, "%s: limits", where)
	}
	sc := c.SecurityContext
	require.NotNil(t, sc, "%s: securityContext", where)
	assert.Equal(t, ptrTo(true), sc.RunAsNonRoot, where)
	assert.Equal(t, ptrTo(int64(65532)), sc.RunAsUser, where)
	assert.Equal(t, ptrTo(true), sc.ReadOnlyRootFilesystem, where)
	assert.Equal(t, ptrTo(false), sc.AllowPrivilegeEscalation, where)
	require.NotNil(t, sc.Capabilities, where)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, where)
	require.NotNil(t, sc.SeccompProfile, where)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type, where)
}

func ptrTo[T any](v T) *T { return &v }

func checkSearchAttributeJob(t *testing.T, job batchv1.Job, cm corev1.ConfigMap) {
	t.Helper()
	pod := job.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	assert.Equal(t, adminTools, c.Image)
	assert.Equal(t, ptrTo(false), pod.AutomountServiceAccountToken, "the Job talks to Temporal only")
	checkContainerBasics(t, job.Name, c)
	script := strings.Join(append(slices.Clone(c.Command), c.Args...), "\n")
	assert.Equal(t, wantSearchAttributes(t), registeredSearchAttributes(t, script),
		"the Job registers other search attributes than contract.SearchAttributes()")
	assert.Contains(t, script, `--address "$TEMPORAL_ADDRESS"`)
	assert.Contains(t, script, "already exists", "a second run must not fail")
	checkVariableRefs(t, job.Name, c, cm)
}

// ---- docker-compose.yaml ----

type composeService struct {
	Build       any    `json:"build"`
	Command     any    `json:"command"`
	Entrypoint  any    `json:"entrypoint"`
	Environment any    `json:"environment"`
	Ports       []any  `json:"ports"`
	NetworkMode string `json:"network_mode"`
	DependsOn   any    `json:"depends_on"`
}

// words returns a compose command or entrypoint as a list: compose takes a list or a string
// it splits on spaces.
func words(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		var out []string
		for _, w := range v {
			out = append(out, fmt.Sprint(w))
		}
		return out
	}
	return nil
}

// environment returns a compose environment (a map, or a list of KEY=VALUE) as a map.
func environment(v any) map[string]string {
	env := map[string]string{}
	switch v := v.(type) {
	case map[string]any:
		for k, val := range v {
			env[k] = fmt.Sprint(val)
		}
	case []any:
		for _, kv := range v {
			k, val, _ := strings.Cut(fmt.Sprint(kv), "=")
			env[k] = val
		}
	}
	return env
}

// standardEnv are variables the binaries read through libraries rather than their own
// code: client-go's kubeconfig loading, the OpenTelemetry SDK, Google's default credentials.
var standardEnv = regexp.MustCompile(`^(KUBECONFIG|HOME|TZ|GODEBUG|GOMAXPROCS|GOOGLE_APPLICATION_CREDENTIALS|OTEL_[A-Z0-9_]+)$`)

var helpEnv = regexp.MustCompile(`\benv ([A-Z][A-Z0-9_]+)`)

// envRead returns the variables cmd/<name> reads: those its -h text names ("(env X)") and
// the literals its main package passes to os.Getenv, os.LookupEnv or its env helper.
func envRead(t *testing.T, root, name string) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	for _, m := range helpEnv.FindAllStringSubmatch(binaryInfo(t, name).help, -1) {
		vars[m[1]] = true
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(root, "cmd", name, "*.go"))
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			var fn string
			switch f := call.Fun.(type) {
			case *ast.Ident:
				fn = f.Name
			case *ast.SelectorExpr:
				if pkg, ok := f.X.(*ast.Ident); ok {
					fn = pkg.Name + "." + f.Sel.Name
				}
			}
			if fn != "env" && fn != "os.Getenv" && fn != "os.LookupEnv" {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					vars[s] = true
				}
			}
			return true
		})
	}
	return vars
}

func TestComposeMatchesBinaries(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yaml"))
	require.NoError(t, err)
	var compose struct {
		Services map[string]composeService `json:"services"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &compose))

	for _, name := range []string{"postgresql", "temporal", "temporal-setup", "temporal-ui", "worker", "discovery", "localproxyd"} {
		require.Contains(t, compose.Services, name)
	}

	t.Run("ports bind 127.0.0.1", func(t *testing.T) {
		for name, svc := range compose.Services {
			for _, p := range svc.Ports {
				switch p := p.(type) {
				case string:
					parts := strings.Split(p, ":")
					assert.True(t, len(parts) == 3 && parts[0] == "127.0.0.1", "service %s publishes %q: give the host address 127.0.0.1", name, p)
				case map[string]any:
					assert.Equal(t, "127.0.0.1", p["host_ip"], "service %s publishes %v", name, p)
				default:
					t.Errorf("service %s: port %v", name, p)
				}
			}
		}
	})

	t.Run("search attributes", func(t *testing.T) {
		setup := compose.Services["temporal-setup"]
		script := strings.Join(append(words(setup.Entrypoint), words(setup.Command)...), " ")
		assert.Equal(t, wantSearchAttributes(t), registeredSearchAttributes(t, script),
			"temporal-setup registers other search attributes than contract.SearchAttributes()")
	})

	// commands holds each project service's command, checked against its binary.
	commands := map[string][]string{}
	for _, name := range []string{"worker", "discovery", "localproxyd"} {
		t.Run(name, func(t *testing.T) {
			svc := compose.Services[name]
			assert.Equal(t, ".", buildContext(svc.Build), "%s is built from the Dockerfile", name)
			assert.Nil(t, svc.Entrypoint, "the image has no entrypoint to override")
			cmd := words(svc.Command)
			require.NotEmpty(t, cmd)
			bin, ok := strings.CutPrefix(cmd[0], binPrefix)
			require.True(t, ok, "%s: command %q is not a binary in %s", name, cmd[0], binPrefix)
			require.Equal(t, name, bin)
			info := binaryInfo(t, bin)
			checkFlags(t, "docker-compose.yaml service "+name, info, cmd[1:])
			commands[name] = cmd[1:]

			read := envRead(t, root, bin)
			for k := range environment(svc.Environment) {
				assert.True(t, read[k] || standardEnv.MatchString(k), "service %s sets %s, which %s does not read", name, k, bin)
			}
			if name != "localproxyd" {
				addr, ok := flagValue(cmd, "temporal-address")
				require.True(t, ok, "%s: --temporal-address", name)
				host, _, err := net.SplitHostPort(addr)
				require.NoError(t, err)
				assert.Contains(t, compose.Services, host, "%s: --temporal-address names no service", name)
				deps, _ := svc.DependsOn.(map[string]any)
				require.Contains(t, deps, "temporal-setup", "%s starts after the search attributes exist", name)
				assert.Equal(t, map[string]any{"condition": "service_completed_successfully"}, deps["temporal-setup"])
			}
		})
	}

	t.Run("localproxyd shares the worker's loopback", func(t *testing.T) {
		listen, ok := flagValue(commands["localproxyd"], "listen")
		require.True(t, ok, "localproxyd --listen")
		host, port, err := net.SplitHostPort(listen)
		require.NoError(t, err)
		ip := net.ParseIP(host)
		require.True(t, ip != nil && ip.IsLoopback(), "localproxyd refuses a non-loopback --listen, got %q", listen)

		assert.Equal(t, "service:localproxyd", compose.Services["worker"].NetworkMode,
			"the worker must share localproxyd's network namespace to reach its loopback")
		daemon, ok := flagValue(commands["worker"], "local-daemon")
		require.True(t, ok, "worker --local-daemon")
		u, err := url.Parse(daemon)
		require.NoError(t, err)
		dip := net.ParseIP(u.Hostname())
		assert.True(t, dip != nil && dip.IsLoopback(), "worker --local-daemon %s", daemon)
		assert.Equal(t, port, u.Port())
		assert.Empty(t, compose.Services["worker"].Ports, "a service in another's network namespace cannot publish ports")
	})
}

func buildContext(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case map[string]any:
		return fmt.Sprint(v["context"])
	}
	return ""
}

// ---- Dockerfile ----

type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, …
	args string
}

// parseDockerfile returns the instructions with continuation lines joined and comments
// dropped, grouped by stage.
func parseDockerfile(t *testing.T, text string) [][]instruction {
	t.Helper()
	var stages [][]instruction
	var line strings.Builder
	flush := func() {
		s := strings.TrimSpace(line.String())
		line.Reset()
		if s == "" {
			return
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		require.NotEmpty(t, stages, "%s before the first FROM", in.cmd)
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	for _, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if rest, ok := strings.CutSuffix(trimmed, `\`); ok {
			line.WriteString(rest + " ")
			continue
		}
		line.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

var secretish = regexp.MustCompile(`(?i)(secret|token|passw|credential|api_?key|private_?key)`)

func TestDockerfileBuildsEveryBinary(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	stages := parseDockerfile(t, string(raw))
	require.GreaterOrEqual(t, len(stages), 2, "a build stage and a runtime stage")

	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	require.NoError(t, err)
	var cmds []string
	for _, e := range entries {
		if e.IsDir() {
			if _, dev := devOnly[e.Name()]; !dev {
				cmds = append(cmds, e.Name())
			}
		}
	}
	assert.ElementsMatch(t, imageBinaries, cmds, "cmd/ folders and the image's binaries differ: add the new one to the Dockerfile and imageBinaries, or to devOnly with a reason")

	// The build stage: modules in their own layer, then one static build of every binary.
	build := stages[0]
	var buildRun string
	order := map[string]int{}
	for i, in := range build {
		switch {
		case in.cmd == "COPY" && strings.Contains(in.args, "go.mod") && strings.Contains(in.args, "go.sum"):
			order["copy go.mod"] = i + 1
		case in.cmd == "RUN" && strings.Contains(in.args, "go mod download"):
			order["go mod download"] = i + 1
		case in.cmd == "COPY" && strings.Fields(in.args)[0] == ".":
			order["copy sources"] = i + 1
		case in.cmd == "RUN" && strings.Contains(in.args, "go build"):
			buildRun = in.args
		}
	}
	require.NotZero(t, order["copy go.mod"], "COPY go.mod go.sum")
	require.NotZero(t, order["go mod download"], "RUN go mod download")
	require.NotZero(t, order["copy sources"], "COPY . .")
	assert.Less(t, order["copy go.mod"], order["go mod download"])
	assert.Less(t, order["go mod download"], order["copy sources"], "go mod download runs before the sources are copied, so its layer survives source changes")
	require.NotEmpty(t, buildRun, "RUN go build")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags="-s -w"`, "-o /out/"} {
		assert.Contains(t, buildRun, want)
	}
	built := strings.Fields(buildRun)
	for _, name := range cmds {
		assert.Contains(t, built, "./cmd/"+name, "the Dockerfile does not build cmd/%s", name)
	}

	// The runtime stage: distroless nonroot, the binaries in /usr/local/bin, no entrypoint.
	final := stages[len(stages)-1]
	assert.Contains(t, final[0].args, "gcr.io/distroless/static-debian12:nonroot")
	var copied []string
	var user string
	for _, in := range final {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) >= 3 && strings.HasPrefix(f[0], "--from=") && f[len(f)-1] == binPrefix {
				copied = append(copied, f[1:len(f)-1]...)
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			t.Errorf("ENTRYPOINT %s: each Deployment and compose service names its binary", in.args)
		}
	}
	for _, name := range cmds {
		assert.True(t, slices.Contains(copied, "/out/"+name) || slices.Contains(copied, "/out/"),
			"cmd/%s is not copied to %s (copied: %v)", name, binPrefix, copied)
	}
	assert.Equal(t, "65532:65532", user, "the final stage runs as the nonroot user")

	for _, stage := range stages {
		for _, in := range stage {
			if in.cmd != "ENV" && in.cmd != "ARG" {
				continue
			}
			for _, kv := range strings.Fields(in.args) {
				key, _, _ := strings.Cut(kv, "=")
				assert.False(t, secretish.MatchString(key), "%s %s looks like a secret; images keep what ENV and ARG hold", in.cmd, kv)
			}
		}
	}

	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	for _, want := range []string{".git", "bin/"} {
		assert.Contains(t, strings.Fields(string(ignore)), want, ".dockerignore")
	}
}
