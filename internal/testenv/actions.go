package testenv

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Actions reads what the server has counted as billable actions in namespace so far, by
// action type: the server's own `action` counter, which counts what Temporal Cloud bills
// (activity heartbeats `grpc_RecordActivityTaskHeartbeat`, activities scheduled
// `command_ScheduleActivityTask`, timers `command_StartTimer`, signals, markers of local
// activities `command_BatchMarkers`, …). Workflow tasks are not actions; the server's
// count of them is returned under "workflow_tasks_completed" for reports. The server
// flushes its counters every second, so a reading can lag by that much.
func (e *TemporalEnv) Actions(ctx context.Context, namespace string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.MetricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", e.MetricsURL, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.MetricsURL, err)
	}
	// The server's metrics replace every character outside [A-Za-z0-9_] in label values.
	ns := strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, namespace)
	out := map[string]float64{}
	for name, key := range map[string]string{"action": "action_type", "workflow_tasks_completed": ""} {
		f := families[name]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			var kind, mns string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					mns = l.GetValue()
				case key:
					kind = l.GetValue()
				}
			}
			if mns != ns {
				continue
			}
			if key == "" {
				kind = name
			}
			out[kind] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}
