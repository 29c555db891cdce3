package deployed_test

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
)

// kubelet plays the kubelet for the Squid pods the worker creates in one namespace: it
// runs each with real Squid on the configuration the worker rendered into the pod's Secret
// (its files where the container would see them, here in a directory of the pod's own),
// gives the pod an address of its own on loopback (127.0.0.10 and up, the way each pod has
// an IP, so that two instances of one Proxy on the same port can run at once during a
// replacement), and marks it Running and Ready. A pod that is gone has its Squid stopped.
// The test calls sync between the tries of every wait, so all of this happens on the
// test's goroutine.
type kubelet struct {
	c       *cluster
	ns      string
	running map[types.UID]*squidtest.Instance
	next    int
}

// configVolume and proxyPortName are the kubernetes provider's names for the pod's
// rendered configuration and its proxy port.
const (
	configVolume  = "squid-config"
	proxyPortName = "proxy"
)

func newKubelet(t *testing.T, c *cluster, ns string) *kubelet {
	t.Helper()
	return &kubelet{c: c, ns: ns, running: map[types.UID]*squidtest.Instance{}}
}

func (kl *kubelet) sync(t *testing.T) {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, kl.c.k.Client.List(kl.c.ctx, &pods, client.InNamespace(kl.ns),
		client.MatchingLabels{provider.LabelManagedBy: provider.ManagedByValue}))
	seen := map[types.UID]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		seen[pod.UID] = true
		if _, ok := kl.running[pod.UID]; ok || pod.DeletionTimestamp != nil {
			continue
		}
		if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == configVolume }) {
			continue // not a proxy pod the worker made (the sweep's orphan): it stays Pending
		}
		kl.run(t, pod)
	}
	for uid, inst := range kl.running {
		if !seen[uid] {
			inst.Stop()
			delete(kl.running, uid)
		}
	}
}

// run starts Squid for pod and writes its status.
func (kl *kubelet) run(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == configVolume })
	vol := pod.Spec.Volumes[i]
	require.NotNil(t, vol.Secret, "pod %s: its configuration comes from a Secret", pod.Name)
	var s corev1.Secret
	err := kl.c.k.Client.Get(kl.c.ctx, types.NamespacedName{Namespace: pod.Namespace, Name: vol.Secret.SecretName}, &s)
	if apierrors.IsNotFound(err) {
		// A kubelet starts no container before its Secret volume can be mounted: the worker
		// creates the pod first and its Secret after. The next sync tries again.
		return
	}
	require.NoError(t, err, "pod %s: configuration Secret", pod.Name)
	require.Len(t, pod.Spec.Containers, 1)
	var port int32
	for _, p := range pod.Spec.Containers[0].Ports {
		if p.Name == proxyPortName {
			port = p.ContainerPort
		}
	}
	require.NotZero(t, port, "pod %s declares its proxy port", pod.Name)

	kl.next++
	ip := fmt.Sprintf("127.0.0.%d", 9+kl.next)
	addr := net.JoinHostPort(ip, strconv.Itoa(int(port)))
	paths := squidtest.TempPaths(t)
	conf := relocate(t, string(s.Data["squid.conf"]), addr, paths)
	inst := squidtest.Run(t, squid.Files{Conf: []byte(conf), Passwd: s.Data["passwd"], Paths: paths}, addr)
	kl.running[pod.UID] = inst

	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: pod.Spec.Containers[0].Name, Image: pod.Spec.Containers[0].Image, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	err = kl.c.k.Client.Status().Update(kl.c.ctx, pod)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Deleted or changed since the list (the worker removes a pod it cannot complete):
		// as a kubelet would, stop what ran for it; the next sync sees the pod as it is now.
		inst.Stop()
		delete(kl.running, pod.UID)
		return
	}
	require.NoError(t, err, "pod %s status", pod.Name)
}

// relocate moves the files a rendered squid.conf names from the container's paths to the
// pod's directory, and its http_port from every address to the pod's: what mounting the
// Secret and giving the pod an IP do in a cluster. Every other line is Squid's as rendered.
func relocate(t *testing.T, conf, addr string, to squid.Paths) string {
	t.Helper()
	from := squid.DefaultPaths
	var out []string
	ports := 0
	for _, line := range strings.Split(conf, "\n") {
		if strings.HasPrefix(line, "http_port ") {
			line = "http_port " + addr
			ports++
		}
		for _, r := range [][2]string{{from.Passwd, to.Passwd}, {from.PidFile, to.PidFile}, {from.CacheLog, to.CacheLog}} {
			line = strings.ReplaceAll(line, r[0], r[1])
		}
		require.NotContains(t, line, "/etc/squid/", "a path the test kubelet does not mount: %q", line)
		out = append(out, line)
	}
	require.Equal(t, 1, ports, "one http_port")
	return strings.Join(out, "\n")
}
