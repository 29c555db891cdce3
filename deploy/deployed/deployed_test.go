// Package deployed_test runs the system as deploy/ ships it. The manifests are built with
// kubectl's kustomize (through an overlay that only points the config at the test's
// Temporal, as a user's overlay does), applied to a real kube-apiserver, and every workload
// is run from what the API server then holds: the operator's and worker's replicas and
// discovery's three, each with the command, args and environment of its manifest and
// acting as its ServiceAccount, so a Role that lacks a verb a component uses, or a manifest
// that passes a flag its binary does not take, fails here. A test kubelet runs the Squid
// pods the worker creates with real Squid. The walk: create a Proxy, wait for Ready, lease
// it through discovery and fetch a site through it, replace it, delete it (the finalizer
// must be released), and sweep orphans.
package deployed_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	tclient "go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

const (
	systemNS     = "proxyfleet-system"
	crawlNS      = "crawl"
	installation = "deployed-test"
)

// imageBinaries are the commands the image holds (the Dockerfile's), built once for the
// package's tests.
var imageBinaries = []string{"operator", "worker", "discovery"}

func TestMain(m *testing.M) {
	code := testenv.Run(m, testenv.Options{Kube: true, Temporal: true})
	if binaries != nil {
		_ = os.RemoveAll(filepath.Dir(binaries[imageBinaries[0]]))
	}
	os.Exit(code)
}

// cluster is what the walk works with.
type cluster struct {
	ctx      context.Context
	k        *testenv.KubeEnv
	temporal *testenv.TemporalEnv
	binaries map[string]string
	kubelet  *kubelet
	pods     []*pod
	// aws are the stand-ins of AWS's EC2 and STS the pods reach, when the test runs them.
	aws *awsStandIns
}

func TestShippedManifestsRunTheSystem(t *testing.T) {
	for _, tc := range []struct {
		overlay   string
		discovery int // replicas the overlay runs
	}{
		{overlay: "deploy/base", discovery: 3},
		{overlay: "deploy/overlays/kind", discovery: 1},
	} {
		t.Run(tc.overlay, func(t *testing.T) { walk(t, tc.overlay, tc.discovery) })
	}
}

// walk applies overlay as a user does and walks a Proxy through its life on what it runs.
func walk(t *testing.T, overlay string, replicas int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := &cluster{ctx: ctx, k: testenv.Kube(t), temporal: testenv.Temporal(t), binaries: buildBinaries(t)}
	discovery, token := c.deploy(t, overlay, nil)
	require.Len(t, discovery, replicas, "discovery replicas")

	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello from the site\n")
	}))
	t.Cleanup(site.Close)
	siteURL, _ := url.Parse(site.URL)

	c.kubelet = newKubelet(t, c, crawlNS)
	kubectl(t, c, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", crawlNS), "apply", "--server-side", "-f", "-")

	// A Proxy as the kubernetes sample is, with what reaching a site on loopback takes.
	proxyPort := freePort(t)
	kubectl(t, c, fmt.Sprintf(`apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: walk, namespace: %s}
spec:
  provider: kubernetes
  kubernetes: {}
  port: %d
  attributes: {pool: walk}
  egress:
    allowedDestinations: ["127.0.0.1/32"]
    ports: [%s]
  healthCheck: {url: "%s/", interval: 2s, timeout: 1s}
`, crawlNS, proxyPort, siteURL.Port(), site.URL), "apply", "--server-side", "-f", "-")
	key := types.NamespacedName{Namespace: crawlNS, Name: "walk"}

	// Create → Ready.
	first := c.waitProxy(t, key, "Ready", func(px *v1alpha1.Proxy) bool {
		return px.Status.Phase == v1alpha1.PhaseReady && px.Status.InstanceName != ""
	})
	uid := string(first.UID)

	// Lease through one replica, fetch the site through the proxy, renew through another
	// (the owner answers wherever it is asked), release through the third.
	api := func(i int) *dclient.Client {
		return dclient.New(fmt.Sprintf("http://127.0.0.1:%d", discovery[i%len(discovery)].ports[8090]), token)
	}
	// Each replica reads the proxy from Temporal on its own; all three list it healthy
	// within a refresh.
	c.eventually(t, "every replica lists the proxy healthy", func() bool {
		for i := range discovery {
			healthy := true
			list, err := api(i).ListProxies(ctx, map[string]string{"pool": "walk"}, &healthy)
			if err != nil || list.Count != 1 {
				return false
			}
		}
		return true
	})
	lease := c.acquire(t, api(0), map[string]string{"pool": "walk"})
	assert.Equal(t, "walk", lease.Proxy.Name)
	assert.Equal(t, "hello from the site\n", fetchThrough(t, lease.Proxy.URL, site.URL))
	_, err := api(1).Renew(ctx, lease.ID, time.Minute)
	require.NoError(t, err, "renewal through another replica")
	require.NoError(t, api(2).Release(ctx, lease.ID), "release through the third replica")

	// The gateway of a replica, as a crawler that sets HTTP_PROXY uses it.
	gw := fmt.Sprintf("http://default:%s@127.0.0.1:%d", token, discovery[len(discovery)-1].ports[8091])
	assert.Equal(t, "hello from the site\n", fetchThrough(t, gw, site.URL))

	// Replace: a new instance, verified, then the old one goes.
	require.NoError(t, c.temporal.Client.SignalWorkflow(ctx, contract.ProxyWorkflowID(crawlNS, "walk"), "", contract.SignalReplace,
		contract.ReplaceSignal{Reason: "deployment test"}))
	second := c.waitProxy(t, key, "replaced and Ready", func(px *v1alpha1.Proxy) bool {
		return px.Status.Phase == v1alpha1.PhaseReady && px.Status.InstanceName != "" && px.Status.InstanceName != first.Status.InstanceName
	})
	c.eventually(t, "the old instance's pod is deleted", func() bool {
		return !c.exists(t, &corev1.Pod{}, types.NamespacedName{Namespace: crawlNS, Name: first.Status.InstanceName})
	})
	// Discovery leases the old instance until its index has the new one (the old one
	// serves until the replacement took over): a lease on the old address is refused at
	// renewal from then on, and a new lease is on the new instance.
	c.eventually(t, "a new lease is on the replacement", func() bool {
		lease = c.acquire(t, api(2), map[string]string{"pool": "walk"})
		defer func() { _ = api(0).Release(ctx, lease.ID) }()
		return strings.Contains(lease.Proxy.URL, "@"+second.Status.IP+":")
	})
	lease = c.acquire(t, api(2), map[string]string{"pool": "walk"})
	assert.Equal(t, "hello from the site\n", fetchThrough(t, lease.Proxy.URL, site.URL))
	require.NoError(t, api(0).Release(ctx, lease.ID))

	// Delete: the workflow deletes the instance and releases the finalizer.
	require.NoError(t, c.k.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: crawlNS, Name: "walk"}}))
	c.eventually(t, "the Proxy is gone (its finalizer released)", func() bool {
		return !c.exists(t, &v1alpha1.Proxy{}, key)
	})
	owned := client.MatchingLabels{provider.LabelProxyUID: uid}
	for _, list := range []client.ObjectList{&corev1.PodList{}, &corev1.SecretList{}, &networkingv1.NetworkPolicyList{}} {
		require.NoError(t, c.k.Client.List(ctx, list, client.InNamespace(crawlNS), owned))
		items, _ := json.Marshal(list)
		assert.NotContains(t, string(items), `"name"`, "%T left behind: %s", list, items)
	}

	// A pool autoscaled from zero, as a user applies it: idle, it has no Proxy; an acquire
	// that waits for its attributes waits while the operator's autoscaler (reading the
	// demand from discovery's Service with the token its manifest gives it) scales it to
	// one and the operator's role creates the Proxy; released, it shrinks back to zero;
	// deleting the pool then goes at once.
	poolPort := freePort(t)
	kubectl(t, c, fmt.Sprintf(`apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: walkers, namespace: %s}
spec:
  replicas: 0
  autoscale: {minReplicas: 0, maxReplicas: 2, scaleDownDelay: 2s}
  template:
    spec:
      provider: kubernetes
      kubernetes: {}
      port: %d
      attributes: {pool: walkers}
      egress:
        allowedDestinations: ["127.0.0.1/32"]
        ports: [%s]
      healthCheck: {url: "%s/", interval: 2s, timeout: 1s}
`, crawlNS, poolPort, siteURL.Port(), site.URL), "apply", "--server-side", "-f", "-")
	poolKey := types.NamespacedName{Namespace: crawlNS, Name: "walkers"}
	c.eventually(t, "the autoscaler reads the idle pool's demand", func() bool {
		var pl v1alpha1.ProxyPool
		return c.k.Client.Get(ctx, poolKey, &pl) == nil && pl.Status.Demand != nil &&
			meta.IsStatusConditionTrue(pl.Status.Conditions, v1alpha1.PoolConditionScalingActive)
	})
	assert.False(t, c.exists(t, &v1alpha1.Proxy{}, types.NamespacedName{Namespace: crawlNS, Name: "walkers-0"}), "an idle pool of 0..2 has no Proxy")
	asked := time.Now()
	// The acquire waits on a goroutine of its own: the test's plays the kubelet meanwhile.
	type answer struct {
		l   *dclient.Lease
		err error
	}
	got := make(chan answer, 1)
	go func() {
		l, err := api(1).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"pool": "walkers"}, Wait: time.Minute})
		got <- answer{l, err}
	}()
	var a answer
	c.eventually(t, "the waiting acquire is answered", func() bool {
		select {
		case a = <-got:
			return true
		default:
			return false
		}
	})
	lease, err = a.l, a.err
	require.NoError(t, err, "the acquire waited for the pool to grow")
	t.Logf("the first lease of the pool scaled from zero came after %s", time.Since(asked).Round(time.Millisecond))
	assert.Equal(t, "walkers-0", lease.Proxy.Name)
	member := c.waitProxy(t, types.NamespacedName{Namespace: crawlNS, Name: "walkers-0"}, "the pool's Proxy Ready", func(px *v1alpha1.Proxy) bool {
		return px.Status.Phase == v1alpha1.PhaseReady && px.Status.InstanceName != ""
	})
	assert.Equal(t, "hello from the site\n", fetchThrough(t, lease.Proxy.URL, site.URL))
	require.NoError(t, api(1).Release(ctx, lease.ID))
	c.eventually(t, "the idle pool shrinks back to no Proxy", func() bool {
		var pl v1alpha1.ProxyPool
		return c.k.Client.Get(ctx, poolKey, &pl) == nil && ptr.Deref(pl.Spec.Replicas, -1) == 0 &&
			!c.exists(t, &v1alpha1.Proxy{}, types.NamespacedName{Namespace: crawlNS, Name: "walkers-0"})
	})
	assert.False(t, c.exists(t, &corev1.Pod{}, types.NamespacedName{Namespace: crawlNS, Name: member.Status.InstanceName}), "the member's pod left behind")
	require.NoError(t, c.k.Client.Delete(ctx, &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: crawlNS, Name: "walkers"}}))
	c.eventually(t, "the pool is gone", func() bool { return !c.exists(t, &v1alpha1.ProxyPool{}, poolKey) })

	// Sweep: an instance of this installation whose Proxy never existed. Younger than the
	// minimum age the manifest leaves at its default, it is found and spared; what counts
	// here is that the worker's ServiceAccount lists what the sweep must list.
	orphan := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: crawlNS, Name: "px-orphan", Labels: map[string]string{
			provider.LabelInstallation: installation, provider.LabelProxyUID: "00000000-0000-0000-0000-000000000000",
			provider.LabelManagedBy: provider.ManagedByValue,
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: v1alpha1.DefaultSquidImage}}},
	}
	require.NoError(t, c.k.Client.Create(ctx, orphan))
	t.Cleanup(func() { _ = c.k.Client.Delete(context.Background(), orphan) })
	result := c.sweep(t)
	assert.Empty(t, result.Errors, "every provider listed")
	assert.False(t, result.Skipped, result.SkipReason)
	assert.Contains(t, fmt.Sprint(result.Spared), "px-orphan", "the sweep saw the orphan")

	// Nothing any component did was refused by the API server.
	c.refused(t)
}

// deploy applies overlay as a user does (the namespace, the discovery token and the fleet
// key first), its proxyfleet-config pointed at the test's Temporal and merged with config,
// and runs its pods; it returns discovery's pods and the token crawlers use.
func (c *cluster) deploy(t *testing.T, overlay string, config map[string]string) (discovery []*pod, token string) {
	root, err := testenv.RepoRoot()
	require.NoError(t, err)

	// What a user does before the first apply (deploy/base/kustomization.yaml): the
	// namespace, the discovery token and the fleet key.
	token = randomHex(16)
	prereqs := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: proxyfleet-discovery-token, namespace: %[1]s}
stringData: {token: %[2]s}
---
apiVersion: v1
kind: Secret
metadata: {name: proxyfleet-fleet-key, namespace: %[1]s}
stringData: {key: %[3]s}
`, systemNS, token, base64.StdEncoding.EncodeToString([]byte(randomHex(16))))
	ns, err := os.ReadFile(filepath.Join(root, "deploy", "base", "namespace.yaml"))
	require.NoError(t, err)
	kubectl(t, c, string(ns)+"\n---\n"+prereqs, "apply", "--server-side", "--force-conflicts", "-f", "-")

	// A user's overlay: the shipped one, pointed at the Temporal it runs against.
	merged := map[string]string{
		"TEMPORAL_ADDRESS":        c.temporal.HostPort,
		"TEMPORAL_NAMESPACE":      c.temporal.Namespace,
		"PROXYFLEET_INSTALLATION": installation,
	}
	maps.Copy(merged, config)
	rendered := kustomize(t, c, filepath.Join(root, overlay), merged)
	kubectl(t, c, string(rendered), "apply", "--server-side", "--force-conflicts", "-f", "-")

	// The pods, from what the API server holds. Discovery first: the operator and worker
	// need nothing of it, and its replicas wait for each other.
	pods := podsOf(t, c, []string{"proxyfleet-worker", "proxyfleet-operator"}, []string{"proxyfleet-discovery"})
	c.pods = pods
	for _, p := range pods {
		p.start(t, c, pods)
	}
	for _, p := range pods {
		p.waitReady(t)
	}
	for _, p := range pods {
		if p.labels["app.kubernetes.io/component"] == "discovery" {
			discovery = append(discovery, p)
		}
	}
	return discovery, token
}

// refused fails the test as soon as a component logs that the API server refused it
// something: a verb its ServiceAccount's role lacks.
func (c *cluster) refused(t *testing.T) {
	t.Helper()
	for _, p := range c.pods {
		if log := p.proc.log(); strings.Contains(log, "forbidden") {
			i := strings.Index(log, "forbidden")
			t.Fatalf("%s was refused something by the API server: ...%s...", p.name, log[max(0, i-400):min(len(log), i+200)])
		}
	}
}

var (
	binariesOnce sync.Once
	binaries     map[string]string
	binariesErr  error
)

// buildBinaries builds the image's binaries, once per test process.
func buildBinaries(t *testing.T) map[string]string {
	t.Helper()
	binariesOnce.Do(func() { binaries, binariesErr = build() })
	require.NoError(t, binariesErr)
	return binaries
}

func build() (map[string]string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "proxyfleet-deployed-")
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, b := range imageBinaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	bins := map[string]string{}
	for _, b := range imageBinaries {
		bins[b] = filepath.Join(dir, b)
	}
	return bins, nil
}

// kustomize builds base through an overlay that merges config into proxyfleet-config, as
// a user's overlay does.
func kustomize(t *testing.T, c *cluster, base string, config map[string]string) []byte {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, base) // kustomize takes no absolute resource paths
	require.NoError(t, err)
	var lits strings.Builder
	for _, k := range sortedKeys(config) {
		fmt.Fprintf(&lits, "      - %s=%s\n", k, config[k])
	}
	kust := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
configMapGenerator:
  - name: proxyfleet-config
    behavior: merge
    options:
      disableNameSuffixHash: true
    literals:
%s`, rel, lits.String())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o644))
	cmd := exec.Command(c.k.Kubectl, "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "kubectl kustomize: %s", stderr.String())
	return out
}

func kubectl(t *testing.T, c *cluster, stdin string, args ...string) {
	t.Helper()
	out, err := c.k.RunKubectl(t, strings.NewReader(stdin), args...)
	require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
}

// eventually waits for cond, playing the kubelet between tries.
func (c *cluster) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if c.kubelet != nil {
			c.kubelet.sync(t)
		}
		c.refused(t)
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 3m for: %s", what)
		}
		time.Sleep(100 * time.Millisecond) // the poll interval of a condition with a deadline
	}
}

func (c *cluster) exists(t *testing.T, obj client.Object, key types.NamespacedName) bool {
	t.Helper()
	err := c.k.Client.Get(c.ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

func (c *cluster) waitProxy(t *testing.T, key types.NamespacedName, what string, cond func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	t.Helper()
	var px v1alpha1.Proxy
	c.eventually(t, "Proxy "+key.String()+" "+what, func() bool {
		require.NoError(t, c.k.Client.Get(c.ctx, key, &px))
		return cond(&px)
	})
	return &px
}

// acquire leases a proxy, waiting while discovery has yet to see it.
func (c *cluster) acquire(t *testing.T, api *dclient.Client, selector map[string]string) *dclient.Lease {
	t.Helper()
	var lease *dclient.Lease
	var last error
	c.eventually(t, "a lease", func() bool {
		lease, last = api.Acquire(c.ctx, dclient.AcquireRequest{Selector: selector, TTL: time.Minute})
		if last != nil && !dclient.IsNoMatch(last) && !dclient.IsIndexLoading(last) {
			require.NoError(t, last)
		}
		return last == nil
	})
	return lease
}

// fetchThrough GETs target through the forward proxy at proxyURL (credentials as userinfo).
func fetchThrough(t *testing.T, proxyURL, target string) string {
	t.Helper()
	pu, err := url.Parse(proxyURL)
	require.NoError(t, err)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	resp, err := hc.Get(target)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "through %s: %s", pu.Redacted(), body)
	return string(body)
}

// sweep triggers the proxy-gc schedule the worker created and returns the run's result.
func (c *cluster) sweep(t *testing.T) workflows.GCResult {
	t.Helper()
	tc := c.temporal.Client
	h := tc.ScheduleClient().GetHandle(c.ctx, contract.GCScheduleID)
	before := time.Now()
	var desc error
	c.eventually(t, "the worker's proxy-gc schedule", func() bool {
		_, desc = h.Describe(c.ctx)
		return desc == nil
	})
	require.NoError(t, h.Trigger(c.ctx, tclient.ScheduleTriggerOptions{}))
	var runID, wfID string
	c.eventually(t, "a GC run started by the trigger", func() bool {
		resp, err := tc.ListWorkflow(c.ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: c.temporal.Namespace,
			Query:     fmt.Sprintf("WorkflowType = '%s' AND StartTime > '%s'", contract.GCWorkflowType, before.UTC().Format(time.RFC3339)),
		})
		require.NoError(t, err)
		for _, e := range resp.Executions {
			if e.Status == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
				wfID, runID = e.Execution.WorkflowId, e.Execution.RunId
				return true
			}
		}
		return false
	})
	var res workflows.GCResult
	require.NoError(t, tc.GetWorkflow(c.ctx, wfID, runID).Get(c.ctx, &res))
	return res
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := testenv.FreePorts(1)
	require.NoError(t, err)
	return p[0]
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
