//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	tclient "go.temporal.io/sdk/client"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{TemporalRestartable: true, Kube: true}))
}

// config sizes a run; CHAOS_PROXIES and CHAOS_OUTAGE override the full suite's defaults.
type config struct {
	proxies int           // fleet size
	churn   int           // per fault: Proxies created, replaced and deleted (each)
	outage  time.Duration // how long a killed server stays down
	settle  time.Duration // deadline for the desired state after a restart
}

func loadConfig(t *testing.T) config {
	c := config{proxies: 100, outage: 3 * time.Second, settle: 3 * time.Minute}
	if v := os.Getenv("CHAOS_PROXIES"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "CHAOS_PROXIES")
		c.proxies = n
	}
	if v := os.Getenv("CHAOS_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "CHAOS_OUTAGE")
		c.outage = d
	}
	require.GreaterOrEqual(t, c.proxies, 10, "CHAOS_PROXIES")
	c.churn = c.proxies / 10
	return c
}

// The cooled Proxy carries a ban for bannedTarget from before the first fault.
const (
	bannedTarget = "shop.example"
	otherTarget  = "news.example"
	token        = "chaos-token"
)

// system is the running system plus what the test has asked of it.
type system struct {
	s   *stack.Stack
	ns  string
	cfg config

	worker, operator, discovery *process
	crawler                     *dclient.Client

	want      map[string]*v1alpha1.Proxy // Proxies that must exist (by name, with their UID)
	gone      []string                   // Proxies deleted by the test
	replaced  map[string]string          // name → instance before a replace was asked
	instances map[string]string          // name → instance, at the last desired state
	next      int                        // next Proxy number

	// Provider calls the test's requests explain: every other create or delete is a
	// duplicate or a mistake.
	creates, deletes int
	gcRuns           int
}

// TestEveryServerKilledDuringChurn kills -9 and restarts, in turn, the worker, the
// operator, discovery, the Temporal dev server (its database file kept) and the
// kube-apiserver, each while a tenth of the fleet is being created, a tenth replaced and a
// tenth deleted; after each it checks the invariants in the package comment.
func TestEveryServerKilledDuringChurn(t *testing.T) {
	cfg := loadConfig(t)
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true, ProvisionDelay: 500 * time.Millisecond})
	sys := &system{s: s, ns: s.Namespace(t), cfg: cfg, want: map[string]*v1alpha1.Proxy{}, replaced: map[string]string{}}
	sys.startProcesses(t)

	t0 := time.Now()
	cooled := s.LocalProxy(sys.ns, "cooled")
	cooled.Spec.Attributes["role"] = "cooled"
	sys.create(t, cooled)
	for range cfg.proxies - 1 {
		sys.create(t, sys.newProxy())
	}
	sys.converge(t)
	t.Logf("%d Proxies Ready in %s", cfg.proxies, time.Since(t0).Round(100*time.Millisecond))
	sys.ban(t)
	sys.check(t)

	faults := []struct {
		name        string
		kill, start func(*testing.T)
		needed      string // what the churn cannot do while this server is down
	}{
		{"worker", sys.worker.kill, sys.worker.start, ""},
		{"operator", sys.operator.kill, sys.operator.start, ""},
		{"discovery", sys.discovery.kill, sys.startDiscovery, ""},
		{"temporal", func(t *testing.T) { s.Temporal.KillServer(t) }, func(t *testing.T) { s.Temporal.StartServer(t) }, needsTemporal},
		{"kube-apiserver", func(t *testing.T) { s.Kube.KillAPIServer(t) }, func(t *testing.T) { s.Kube.StartAPIServer(t) }, needsKube},
		// Not a server: workflows terminated by hand (or by a server limit). The operator's
		// resync starts them again and each fresh run adopts what the old one left.
		{"workflows-terminated", sys.terminateSome, func(*testing.T) {}, ""},
	}
	for _, f := range faults {
		ok := t.Run(f.name, func(t *testing.T) {
			before := len(s.Events())
			first, second := sys.pick()
			sys.apply(t, first, "")
			// Kill while the first half is in flight: once the provider has begun it.
			waitFor(t, time.Minute, "the churn to reach the provider", func() string {
				if n := len(s.Events()) - before; n < 1 {
					return "no provider call yet"
				}
				return ""
			})
			f.kill(t)
			done := len(s.Events()) - before
			up := time.Now().Add(cfg.outage)
			// The second half is asked for while the server is down, except what needs it.
			later := sys.apply(t, second, f.needed)
			// The outage is the fault's length, not a wait for anything.
			time.Sleep(time.Until(up))
			f.start(t)
			restarted := time.Now()
			sys.apply(t, later, "")
			sys.converge(t)
			t.Logf("killed %s after %d of %d provider calls of the churn; desired state %s after the restart",
				f.name, done, 4*cfg.churn, time.Since(restarted).Round(100*time.Millisecond))
			sys.check(t)
		})
		if !ok {
			return
		}
	}

	// A duplicate could still surface late: a create retried after its activity timeout.
	// Watch the settled system for longer than that, then check everything again.
	time.Sleep(2 * stack.FastTuning().ActivityTimeout)
	if why := sys.divergence(); why != "" {
		t.Fatalf("the system moved after it had settled: %s", why)
	}
	sys.check(t)
}

func (sys *system) startProcesses(t *testing.T) {
	sys.startControlPlane(t)
	// Discovery comes back on the same port after its restart.
	addr := freeAddrs(t, 1)[0]
	sys.discovery = sys.newDiscovery(t, "discovery", addr)
	sys.crawler = dclient.New("http://"+addr, token)
	sys.startDiscovery(t)
}

// startControlPlane starts the worker and the operator.
func (sys *system) startControlPlane(t *testing.T) {
	s := sys.s
	kubeconfig := "KUBECONFIG=" + s.Kube.Kubeconfig(t)
	sys.worker = sys.newWorker(t, "worker")
	ft := stack.FastTuning()
	sys.operator = newProcess(t, "operator", []string{kubeconfig}, append(sys.temporalArgs(),
		"--task-queue", s.TaskQueue, "--installation", s.Installation,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--tuning-poll-interval", ft.PollInterval.String(),
		"--tuning-retry-base", ft.RetryBase.String(), "--tuning-retry-max", ft.RetryMax.String(),
		"--tuning-quota-retry", ft.QuotaRetry.String(), "--tuning-drift-interval", ft.DriftInterval.String(),
		"--tuning-wait-running-max", ft.WaitRunningMax.String(),
		"--tuning-activity-timeout", ft.ActivityTimeout.String(), "--tuning-heartbeat-timeout", ft.HeartbeatTimeout.String(),
		"--resync-interval", "1s")...)
	sys.worker.start(t)
	sys.operator.start(t)
}

// newWorker is a worker process of the stack's task queue, not yet started.
func (sys *system) newWorker(t *testing.T, name string) *process {
	s := sys.s
	p := newProcess(t, "worker", []string{"KUBECONFIG=" + s.Kube.Kubeconfig(t), sys.fleetKeyEnv()}, append(sys.temporalArgs(),
		"--task-queue", s.TaskQueue, "--installation", s.Installation,
		"--providers", "local", "--local-daemon", s.DaemonURL,
		"--http-address", "127.0.0.1:0", "--gc-interval", "0")...)
	p.Name = name
	return p
}

func (sys *system) temporalArgs() []string {
	return []string{"--temporal-address", sys.s.Temporal.HostPort, "--temporal-namespace", sys.s.Temporal.Namespace}
}

func (sys *system) fleetKeyEnv() string { return "PROXYFLEET_FLEET_KEY=" + sys.s.FleetKey }

// newDiscovery makes (without starting) a discovery process listening on addr, logged
// under name; extra flags follow the common ones.
func (sys *system) newDiscovery(t *testing.T, name, addr string, extra ...string) *process {
	// The gateway is off: its fixed default port would clash between the suite's replicas.
	args := append(sys.temporalArgs(), "--listen", addr, "--gateway-listen", "", "--refresh-interval", "200ms")
	return &process{testenv.LoggedProcess(t, name, testenv.Command(t, "discovery"),
		[]string{"DISCOVERY_TOKEN=" + token, sys.fleetKeyEnv()}, append(args, extra...)...)}
}

// freeAddrs are n loopback addresses nothing listens on, for servers that must come back
// on the same address after a restart.
func freeAddrs(t *testing.T, n int) []string {
	ports, err := testenv.FreePorts(n)
	require.NoError(t, err)
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs
}

// startDiscovery starts discovery and waits until it answers.
func (sys *system) startDiscovery(t *testing.T) {
	sys.discovery.start(t)
	waitFor(t, 30*time.Second, "discovery to answer", func() string {
		if _, err := sys.crawler.ListProxies(context.Background(), map[string]string{"run": sys.ns}, nil); err != nil {
			return err.Error()
		}
		return ""
	})
}

func (sys *system) newProxy() *v1alpha1.Proxy {
	p := sys.s.LocalProxy(sys.ns, fmt.Sprintf("p-%04d", sys.next))
	sys.next++
	return p
}

func (sys *system) create(t *testing.T, p *v1alpha1.Proxy) {
	p.Spec.Attributes["run"] = v1alpha1.AttributeValue(sys.ns)
	require.NoError(t, sys.s.Kube.Client.Create(context.Background(), p))
	sys.want[p.Name] = p
	sys.creates++
}

// batch is part of a churn: Proxies to delete, to replace and to create.
type batch struct {
	del, repl []string
	create    []*v1alpha1.Proxy
}

// What a request needs up: deletes and creates go to the kube-apiserver, replace signals
// to Temporal.
const (
	needsKube     = "kube"
	needsTemporal = "temporal"
)

// pick chooses a churn — a tenth of the fleet deleted (the oldest), a tenth replaced, a
// tenth created — split in two halves.
func (sys *system) pick() (first, second batch) {
	var names []string
	for name := range sys.want {
		if name != "cooled" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	k := sys.cfg.churn
	h := (k + 1) / 2
	del, repl := names[:k], names[k:2*k]
	first = batch{del: del[:h], repl: repl[:h]}
	second = batch{del: del[h:], repl: repl[h:]}
	for i := range k {
		p := sys.newProxy()
		if i < h {
			first.create = append(first.create, p)
		} else {
			second.create = append(second.create, p)
		}
	}
	return first, second
}

// apply asks for the batch without waiting for any of it, except the requests that need
// the server that is down; those are returned.
func (sys *system) apply(t *testing.T, b batch, down string) (later batch) {
	ctx := context.Background()
	if down == needsKube {
		later.del, later.create = b.del, b.create
	} else {
		for _, name := range b.del {
			require.NoError(t, sys.s.Kube.Client.Delete(ctx, sys.want[name]))
			delete(sys.want, name)
			sys.gone = append(sys.gone, name)
			sys.deletes++
		}
		for _, p := range b.create {
			sys.create(t, p)
		}
	}
	if down == needsTemporal {
		later.repl = b.repl
	} else {
		for _, name := range b.repl {
			sys.replaced[name] = sys.instances[name]
			require.NoError(t, sys.s.Temporal.Client.SignalWorkflow(ctx, contract.ProxyWorkflowID(sys.ns, name), "",
				contract.SignalReplace, contract.ReplaceSignal{Reason: "chaos"}))
			sys.creates++
			sys.deletes++
		}
	}
	return later
}

// converge waits until every Proxy is what the test asked for and the provider holds
// exactly their instances.
func (sys *system) converge(t *testing.T) {
	waitFor(t, sys.cfg.settle, "the desired state", sys.divergence)
	sys.replaced = map[string]string{}
	var list v1alpha1.ProxyList
	require.NoError(t, sys.s.Kube.Client.List(context.Background(), &list, client.InNamespace(sys.ns)))
	sys.instances = map[string]string{}
	for _, p := range list.Items {
		sys.instances[p.Name] = p.Status.InstanceName
	}
}

// divergence says how the system differs from the desired state ("" when it does not).
func (sys *system) divergence() string {
	var list v1alpha1.ProxyList
	if err := sys.s.Kube.Client.List(context.Background(), &list, client.InNamespace(sys.ns)); err != nil {
		return "list Proxies: " + err.Error()
	}
	got := map[string]*v1alpha1.Proxy{}
	for i := range list.Items {
		got[list.Items[i].Name] = &list.Items[i]
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	uids := map[string]string{} // Ready wanted Proxies, by UID
	wanted := map[string]bool{} // every wanted Proxy that exists, by UID
	for _, name := range sortedNames(sys.want) {
		p, ok := got[name]
		if ok {
			wanted[string(p.UID)] = true
		}
		switch {
		case !ok:
			add("%s is missing", name)
		case !stack.Ready(p):
			add("%s is %s", name, p.Status.Phase)
		case sys.replaced[name] != "" && p.Status.InstanceName == sys.replaced[name]:
			add("%s still runs %s, which it was asked to replace", name, p.Status.InstanceName)
		default:
			uids[string(p.UID)] = name
		}
	}
	for _, name := range sys.gone {
		if p, ok := got[name]; ok {
			add("%s was deleted but still exists (finalizers %v)", name, p.Finalizers)
		}
	}
	// A Proxy whose workflow stopped still shows its last status: ask Temporal, in one list.
	running := map[string]bool{}
	var token []byte
	for {
		resp, err := sys.s.Temporal.Client.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{
			Query:    fmt.Sprintf("WorkflowId STARTS_WITH %q AND ExecutionStatus = 'Running'", contract.ProxyWorkflowID(sys.ns, "")),
			PageSize: 1000, NextPageToken: token,
		})
		if err != nil {
			add("list running workflows: %v", err)
			break
		}
		for _, ex := range resp.GetExecutions() {
			running[ex.GetExecution().GetWorkflowId()] = true
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			for _, name := range sortedNames(sys.want) {
				if !running[contract.ProxyWorkflowID(sys.ns, name)] {
					add("%s's workflow is not running", name)
				}
			}
			break
		}
	}
	byUID := map[string][]string{}
	for _, inst := range sys.s.Daemon.List(map[string]string{provider.LabelInstallation: sys.s.Installation}) {
		uid := inst.Labels[provider.LabelProxyUID]
		byUID[uid] = append(byUID[uid], inst.Name)
	}
	for uid, name := range uids {
		insts := byUID[uid]
		switch {
		case len(insts) != 1:
			add("%s has instances %v", name, insts)
		case insts[0] != got[name].Status.InstanceName:
			add("%s reports %s but the provider has %s", name, got[name].Status.InstanceName, insts[0])
		}
	}
	for uid, insts := range byUID {
		if !wanted[uid] {
			add("instances %v belong to no Proxy (uid %s)", insts, uid)
		}
	}
	if len(problems) == 0 {
		return ""
	}
	sort.Strings(problems)
	if len(problems) > 8 {
		problems = append(problems[:8], fmt.Sprintf("and %d more", len(problems)-8))
	}
	return strings.Join(problems, "; ")
}

// terminateSome terminates the workflows of a tenth of the fleet, as `temporal workflow
// terminate` would: half among the Proxies being created right now, half among settled
// ones. It spares the cooled Proxy (a terminated run forgets its cooldowns: discovery's
// own copy outlives it, but not a discovery restart) and the Proxies asked to be replaced
// (a terminated run forgets that request too; a new request would be needed).
func (sys *system) terminateSome(t *testing.T) {
	ctx := context.Background()
	var candidates []string
	for _, name := range sortedNames(sys.want) {
		if name != "cooled" && sys.replaced[name] == "" {
			candidates = append(candidates, name)
		}
	}
	k := min(sys.cfg.churn, len(candidates))
	picked := append(append([]string{}, candidates[len(candidates)-(k+1)/2:]...), candidates[:k/2]...)
	for _, name := range picked {
		err := sys.s.Temporal.Client.TerminateWorkflow(ctx, contract.ProxyWorkflowID(sys.ns, name), "", "chaos: terminated by hand")
		require.NoError(t, err, name)
	}
	t.Logf("terminated the workflows of %v", picked)
}

// ban leases the cooled Proxy for bannedTarget and reports it banned, then waits until its
// workflow holds the cooldown.
func (sys *system) ban(t *testing.T) {
	ctx := context.Background()
	var l *dclient.Lease
	waitFor(t, 30*time.Second, "a lease on the cooled proxy", func() string {
		var err error
		l, err = sys.crawler.Acquire(ctx, dclient.AcquireRequest{Selector: sys.cooledSelector(), TTL: time.Minute, Target: bannedTarget})
		if err != nil {
			return err.Error()
		}
		return ""
	})
	require.NoError(t, sys.crawler.Report(ctx, l.ID, dclient.ResultBanned, ""))
	require.NoError(t, sys.crawler.Release(ctx, l.ID))
	waitFor(t, 30*time.Second, "the cooldown in the workflow", func() string {
		v, err := sys.s.Temporal.Client.QueryWorkflow(ctx, contract.ProxyWorkflowID(sys.ns, "cooled"), "", contract.QueryState)
		if err != nil {
			return err.Error()
		}
		var st workflows.ProxyState
		if err := v.Get(&st); err != nil {
			return err.Error()
		}
		if _, ok := st.Cooldowns[bannedTarget]; !ok {
			return fmt.Sprintf("cooldowns %v", st.Cooldowns)
		}
		return ""
	})
}

func (sys *system) cooledSelector() map[string]string {
	return map[string]string{"run": sys.ns, "role": "cooled"}
}

// check asserts the invariants once the desired state is reached.
func (sys *system) check(t *testing.T) {
	ctx := context.Background()
	for _, p := range []*process{sys.worker, sys.operator, sys.discovery} {
		p.alive(t)
	}

	// Each provider call is explained by a request of the test: nothing created twice.
	creates, deletes := 0, 0
	for _, e := range sys.s.Events() {
		switch e.Op {
		case "create":
			creates++
		case "delete":
			deletes++
		}
	}
	assert.Equal(t, sys.creates, creates, "instances created")
	assert.Equal(t, sys.deletes, deletes, "instances deleted")

	// A GC sweep (dry run, no age grace) finds no orphan.
	sys.gcRuns++
	run, err := sys.s.Temporal.Client.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{
		ID: fmt.Sprintf("chaos-gc-%s-%d", sys.ns, sys.gcRuns), TaskQueue: sys.s.TaskQueue,
		WorkflowExecutionTimeout: 2 * time.Minute,
	}, workflows.GCWorkflow, workflows.GCInput{
		Installation: sys.s.Installation, Providers: []v1alpha1.Provider{v1alpha1.ProviderLocal},
		MinAge: time.Nanosecond, DryRun: true,
	})
	require.NoError(t, err)
	var gc workflows.GCResult
	require.NoError(t, run.Get(ctx, &gc))
	assert.False(t, gc.Skipped, "GC skipped: %s", gc.SkipReason)
	assert.Empty(t, gc.Errors, "GC errors")
	assert.Empty(t, gc.Deleted, "GC found orphans")
	assert.Len(t, gc.Spared, len(sys.want), "GC looked at one instance per Proxy")

	// Discovery offers the fleet, and the ban still rests the cooled proxy for its target
	// only.
	healthy := true
	want := strings.Join(sortedNames(sys.want), " ")
	waitFor(t, 30*time.Second, "discovery to list exactly the fleet, healthy", func() string {
		list, err := sys.crawler.ListProxies(ctx, map[string]string{"run": sys.ns}, &healthy)
		if err != nil {
			return err.Error()
		}
		var names []string
		for _, p := range list.Proxies {
			names = append(names, p.Name)
		}
		sort.Strings(names)
		if got := strings.Join(names, " "); got != want {
			return fmt.Sprintf("lists %d healthy proxies, not the %d Proxies (got %.200s…)", len(names), len(sys.want), got)
		}
		return ""
	})
	_, err = sys.crawler.Acquire(ctx, dclient.AcquireRequest{Selector: sys.cooledSelector(), TTL: time.Minute, Target: bannedTarget})
	var noMatch *dclient.Error
	if assert.ErrorAs(t, err, &noMatch, "the banned target was given the cooled proxy: the cooldown was lost") {
		assert.Equal(t, 1, noMatch.InCooldown, "%+v", noMatch)
	}
	l, err := sys.crawler.Acquire(ctx, dclient.AcquireRequest{Selector: sys.cooledSelector(), TTL: time.Minute, Target: otherTarget})
	if assert.NoError(t, err, "another target is refused the cooled proxy") {
		assert.NoError(t, sys.crawler.Release(ctx, l.ID))
	}
}

func sortedNames(m map[string]*v1alpha1.Proxy) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// waitFor polls cond until it returns "" or the deadline passes; the failure names what
// was still wrong.
func waitFor(t *testing.T, within time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s: %s", within, what, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
