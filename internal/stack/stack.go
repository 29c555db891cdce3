package stack

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/kubernetes"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows"
)

// Options shape a Stack.
type Options struct {
	// Tuning is handed to workflows. A zero Tuning gets FastTuning(); in a partly set one,
	// the zero fields take the workflow's production defaults.
	Tuning workflows.Tuning
	// ProvisionDelay keeps local instances Provisioning this long.
	ProvisionDelay time.Duration
	// NoWorker leaves the worker out (a test runs it as a process it can kill).
	NoWorker bool
	// NoController leaves the controller out (a test runs the operator binary).
	NoController bool
	// Client replaces the shared Temporal client for the controller, worker and discovery
	// (e.g. one with the tracing interceptor).
	Client tclient.Client
	// Installation defaults to a name unique to the test.
	Installation string
	// KubernetesAllow is the worker's allowlist for the kubernetes provider (default: the
	// Proxy's own namespace and the pinned image only, as in production).
	KubernetesAllow kubernetes.Allow
	// Log, when set, receives every component's logs (the daemon, controller, worker and
	// discovery); tests that must prove something is never logged set a debug-level one.
	// Unset, warnings and errors go to stderr.
	Log *slog.Logger
	// ResyncInterval turns on the controller's resync of stopped workflows at this
	// interval. Off by default: the stacks of one test binary share a cluster, and a
	// resync would restart an earlier test's stopped workflows on this stack's queue.
	ResyncInterval time.Duration
}

// Stack is a running system.
type Stack struct {
	Kube     *testenv.KubeEnv
	Temporal *testenv.TemporalEnv

	// Daemon runs the local instances; DaemonURL is its control API.
	Daemon    *localproxy.Daemon
	DaemonURL string
	Local     *local.Provider
	// Target is a plain HTTP server on loopback to probe and fetch through proxies.
	Target *httptest.Server

	TaskQueue    string
	Installation string
	Tuning       workflows.Tuning
	// Keyring is the fleet key the stack's worker and discovery share; FleetKey is its
	// text, as --fleet-key-path would hold it (for processes a test starts itself).
	Keyring  *proxyauth.Keyring
	FleetKey string

	mu     sync.Mutex
	events []DaemonEvent
	log    *slog.Logger
	allow  kubernetes.Allow
}

// DaemonEvent is one create or delete seen by the daemon, with the instances left after it.
type DaemonEvent struct {
	Op   string
	Name string
	Live int
}

// FastTuning is short enough for tests, long enough not to thrash 2 cores.
func FastTuning() workflows.Tuning {
	return workflows.Tuning{
		PollInterval: 100 * time.Millisecond, RetryBase: 500 * time.Millisecond, RetryMax: 5 * time.Second,
		QuotaRetry: 2 * time.Second, DriftInterval: 2 * time.Second, WaitRunningMax: time.Minute,
		ActivityTimeout: 10 * time.Second, HeartbeatTimeout: 5 * time.Second,
	}
}

// Start builds a stack for the test and stops it when the test ends.
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	s := &Stack{
		Kube:     testenv.Kube(t),
		Temporal: testenv.Temporal(t),
		Tuning:   opts.Tuning,
		log:      opts.Log,
		allow:    opts.KubernetesAllow,
	}
	if opts.Client != nil {
		env := *s.Temporal
		env.Client = opts.Client
		s.Temporal = &env
	}
	if s.Tuning == (workflows.Tuning{}) {
		s.Tuning = FastTuning()
	}
	s.FleetKey = NewFleetKey(t)
	kr, err := proxyauth.Parse(s.FleetKey)
	require.NoError(t, err)
	s.Keyring = kr
	id := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(id) > 40 {
		id = id[:40]
	}
	s.TaskQueue = "tq-" + id + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
	s.Installation = opts.Installation
	if s.Installation == "" {
		s.Installation = strings.Trim(id, "-")
	}
	log := s.logger()

	// Local instances.
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{
		ProvisionDelay: opts.ProvisionDelay, Log: log,
		// Each proxy leaves from an address of its own, as in production: a test site
		// can ban one of them.
		DistinctEgress: runtime.GOOS == "linux",
		OnChange: func(op, name string, live int) {
			s.mu.Lock()
			s.events = append(s.events, DaemonEvent{Op: op, Name: name, Live: live})
			s.mu.Unlock()
		},
	})
	require.NoError(t, err)
	s.Daemon = d
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; _ = d.Close() })
	s.DaemonURL = "http://" + ln.Addr().String()
	s.Local = local.NewProvider(s.DaemonURL)

	s.Target = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from the target: "+r.URL.Path)
	}))
	t.Cleanup(s.Target.Close)

	if !opts.NoController {
		s.startManager(t, opts.ResyncInterval)
	}
	if !opts.NoWorker {
		s.StartWorker(t)
	}
	return s
}

// NewFleetKey returns a fresh random fleet key, as an operator would generate one.
func NewFleetKey(t testing.TB) string {
	b := make([]byte, proxyauth.MinKeyBytes)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(b)
}

// logger is the log every component of the stack writes to.
func (s *Stack) logger() *slog.Logger {
	if s.log != nil {
		return s.log
	}
	return quietLog()
}

func quietLog() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("STACK_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// setLogger gives controller-runtime's global logger (used by informers outside a
// manager) the stack's quiet one, once per process.
var setLogger sync.Once

func (s *Stack) startManager(t testing.TB, resync time.Duration) {
	t.Helper()
	setLogger.Do(func() { ctrl.SetLogger(logr.FromSlogHandler(quietLog().Handler())) })
	log := s.logger()
	mgr, err := ctrl.NewManager(s.Kube.Config, ctrl.Options{
		Scheme:                 s.Kube.Scheme,
		Cache:                  controller.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 logr.FromSlogHandler(log.Handler()),
		// Several stacks run in one test binary.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, controller.Setup(ctx, mgr, s.Temporal.Client, controller.Options{
		Installation: s.Installation, TaskQueue: s.TaskQueue, Tuning: s.Tuning, RecheckDeleting: 2 * time.Second,
		ResyncInterval: cmp.Or(resync, -1),
	}))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// NewWorker builds a worker on queue with internal/worker, as cmd/worker does, with the
// stack's local daemon and cluster as its providers, no metrics, the worker's default
// activity slots and no proxy-gc schedule; shape may change the config.
func (s *Stack) NewWorker(t testing.TB, queue string, shape ...func(*worker.Config)) *worker.Worker {
	t.Helper()
	return s.NewWorkerWithMetrics(t, queue, nil, shape...)
}

// NewWorkerWithMetrics is NewWorker registering the worker's metrics on reg, for a
// benchmark that reads them.
func (s *Stack) NewWorkerWithMetrics(t testing.TB, queue string, reg prometheus.Registerer, shape ...func(*worker.Config)) *worker.Worker {
	t.Helper()
	cfg := worker.Config{
		TaskQueue: queue, Installation: s.Installation, Keyring: s.Keyring,
		Providers: registry.Config{
			Enabled:         []v1alpha1.Provider{v1alpha1.ProviderLocal, v1alpha1.ProviderKubernetes},
			LocalDaemonURL:  s.DaemonURL,
			KubernetesAllow: s.allow,
		},
	}
	for _, f := range shape {
		f(&cfg)
	}
	w, err := worker.New(context.Background(), cfg, s.Temporal.Client, s.Kube.Client, s.logger(), reg)
	require.NoError(t, err)
	return w
}

// StartWorker runs an in-process worker on the stack's task queue.
func (s *Stack) StartWorker(t testing.TB) {
	t.Helper()
	w := s.NewWorker(t, s.TaskQueue)
	t.Cleanup(w.Stop)
	require.NoError(t, w.Start(context.Background()))
}

// Events returns what the daemon has seen so far.
func (s *Stack) Events() []DaemonEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]DaemonEvent(nil), s.events...)
}

// Namespace creates a namespace for one test.
func (s *Stack) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	require.NoError(t, s.Kube.Client.Create(context.Background(), ns))
	return ns.Name
}

// LocalProxy returns a Proxy of the local provider probing the stack's target.
func (s *Stack) LocalProxy(ns, name string) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxySpec{
			Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
			Attributes: map[string]v1alpha1.AttributeValue{"region": "local"},
			HealthCheck: v1alpha1.HealthCheck{
				URL: s.Target.URL + "/healthz", Interval: "1s", Timeout: "500ms",
				SuccessThreshold: 2, FailureThreshold: 3, ExpectedStatus: 200,
			},
			MaxLeases: v1alpha1.DefaultMaxLeases,
		},
	}
}

// Tagged gives p the attribute run=run and returns it. The tests and benchmarks of a
// binary share one Temporal server, and discovery lists every proxy workflow on it, those
// of earlier tests too; one that leases selects run=<its namespace> to get only its own.
func Tagged(p *v1alpha1.Proxy, run string) *v1alpha1.Proxy {
	p.Spec.Attributes["run"] = v1alpha1.AttributeValue(run)
	return p
}

// Get fetches a Proxy.
func (s *Stack) Get(t testing.TB, ns, name string) *v1alpha1.Proxy {
	t.Helper()
	var p v1alpha1.Proxy
	require.NoError(t, s.Kube.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p))
	return &p
}

// WaitFor polls the Proxy until ok holds or the deadline passes, and returns it.
func (s *Stack) WaitFor(t testing.TB, ns, name string, within time.Duration, what string, ok func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	t.Helper()
	var last v1alpha1.Proxy
	deadline := time.Now().Add(within)
	for {
		err := s.Kube.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &last)
		if err == nil && ok(&last) {
			return &last
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy %s/%s: %s not reached within %s; last status: %+v (get error: %v)", ns, name, what, within, last.Status, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitGone waits until the Proxy no longer exists.
func (s *Stack) WaitGone(t testing.TB, ns, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var p v1alpha1.Proxy
		err := s.Kube.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p)
		if client.IgnoreNotFound(err) == nil && err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy %s/%s still exists after %s: finalizers %v, status %+v", ns, name, within, p.Finalizers, p.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Ready reports whether a Proxy is Ready with an address.
func Ready(p *v1alpha1.Proxy) bool {
	return p.Status.Phase == v1alpha1.PhaseReady && p.Status.IP != "" && p.Status.ObservedGeneration == p.Generation
}

// Fetch gets the target's path through p's current instance (its status address).
func (s *Stack) Fetch(p *v1alpha1.Proxy, path string) (string, error) {
	proxyURL := &url.URL{Scheme: "http", Host: net.JoinHostPort(p.Status.IP, fmt.Sprint(p.Status.Port))}
	// A Managed instance requires the credentials derived for it, as a crawler's lease
	// would carry them.
	creds, err := s.Keyring.Managed(s.Keyring.PrimaryID(), p.Status.InstanceName)
	if err != nil {
		return "", err
	}
	proxyURL.User = url.UserPassword(creds.Username, creds.Password)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get(s.Target.URL + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), err
}

// InstancesOf lists the daemon's instances owned by the Proxy UID.
func (s *Stack) InstancesOf(uid types.UID) []local.InstanceInfo {
	return s.Daemon.List(map[string]string{provider.LabelProxyUID: string(uid)})
}
