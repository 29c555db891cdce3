//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestMonitorShardFailsOver: two workers share the task queue. The one running the monitor
// shard that watches a proxy is killed with SIGKILL at the moment that proxy's instance
// dies. The shard starts again on the other worker once its heartbeat times out, and its
// proxies are probed again: the dead one is seen Unhealthy and rebuilt, within a minute
// of the kill plus the health check's own detection time.
func TestMonitorShardFailsOver(t *testing.T) {
	cfg := loadConfig(t)
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true})
	sys := &system{s: s, ns: s.Namespace(t), cfg: cfg, want: map[string]*v1alpha1.Proxy{}, replaced: map[string]string{}}
	sys.startControlPlane(t)
	other := sys.newWorker(t, "worker-2")
	other.start(t)
	workers := []*process{sys.worker, other}

	for range cfg.proxies {
		sys.create(t, sys.newProxy())
	}
	sys.converge(t)

	victim := "p-0000"
	shard := contract.MonitorShardWorkflowID(s.TaskQueue, activities.ShardOf(contract.ProxyWorkflowID(sys.ns, victim), worker.DefaultMonitorShards), worker.DefaultMonitorShards)
	// holder is the worker process whose identity ("pid@host@") last started the shard's
	// activity, and since when; nil while none has.
	holder := func() (*process, time.Time) {
		desc, err := s.Temporal.Client.DescribeWorkflow(context.Background(), shard, "")
		if err != nil {
			return nil, time.Time{}
		}
		for _, pa := range desc.RawResponse.GetPendingActivities() {
			if pa.GetState() != enumspb.PENDING_ACTIVITY_STATE_STARTED {
				continue
			}
			for _, w := range workers {
				if strings.HasPrefix(pa.GetLastWorkerIdentity(), fmt.Sprintf("%d@", w.Pid())) {
					return w, pa.GetLastStartedTime().AsTime()
				}
			}
		}
		return nil, time.Time{}
	}
	var dead *process
	waitFor(t, time.Minute, "a worker to run "+shard, func() string {
		if dead, _ = holder(); dead == nil {
			return "not started"
		}
		return ""
	})
	instance := sys.instances[victim]

	dead.kill(t)
	_, _, err := s.Daemon.Kill(instance)
	require.NoError(t, err)
	killed := time.Now()

	// The promise: the shard's heartbeat timeout, a retry, one probe interval; then the
	// failure threshold (3 × 1s) and a probe timeout.
	within := time.Minute + 6*time.Second
	var resumed time.Duration
	waitFor(t, within, victim+" Unhealthy or rebuilt after the kill", func() string {
		if w, since := holder(); w != nil && w != dead && resumed == 0 {
			resumed = since.Sub(killed)
		}
		p := s.Get(t, sys.ns, victim)
		if p.Status.Phase == v1alpha1.PhaseUnhealthy || p.Status.InstanceName != instance {
			return ""
		}
		return fmt.Sprintf("%s on %s", p.Status.Phase, p.Status.InstanceName)
	})
	detected := time.Since(killed)
	t.Logf("shard %s started again on the other worker %s after the kill (heartbeat timeout %s); the dead proxy was seen %s after the kill",
		shard, resumed.Round(100*time.Millisecond), workflows.ShardHeartbeatTimeout, detected.Round(100*time.Millisecond))
	s.WaitFor(t, sys.ns, victim, time.Minute, "Ready on a new instance", func(p *v1alpha1.Proxy) bool {
		return stack.Ready(p) && p.Status.InstanceName != instance
	})
}
