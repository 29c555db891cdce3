package monitor

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestWireJSON: the wire types encode as they did when they were package activities'
// (the golden lines were written by that code). They are in workflow histories, memos and
// heartbeats that outlive any worker: a renamed field or a new tag breaks replay and
// every watch a running workflow published.
func TestWireJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 2, 3, 4, 5, time.UTC)
	h := Health{Known: true, Healthy: true, LatencyMillis: 12, CheckedAt: at, Since: at.Add(-time.Hour), LastFailure: "x", FailureKind: "refused", FailureReason: "R"}
	in := Input{Target: "1.2.3.4:3128", HealthCheck: v1alpha1.HealthCheck{URL: "http://t/", Interval: "10s", Timeout: "2s", SuccessThreshold: 2, FailureThreshold: 3, ExpectedStatus: 200},
		Last: h, Instance: &InstanceInput{Provider: v1alpha1.ProviderLocal, Name: "n", ProxyUID: "u", Namespace: "ns", ProviderID: "p", PollInterval: time.Second, MaxWait: time.Minute, SpecHash: "h"},
		DriftInterval: time.Minute, LatencyEvery: time.Hour, Auth: &ProbeAuth{KeyID: "k", Instance: "i", Namespace: "ns", Secret: "s", UID: "u", Sealed: "v1.x"}}
	cases := []struct {
		v    any
		want string
	}{
		{Memo{Epoch: "e", Input: in}, `{"epoch":"e","input":{"target":"1.2.3.4:3128","healthCheck":{"url":"http://t/","interval":"10s","timeout":"2s","successThreshold":2,"failureThreshold":3,"expectedStatus":200},"last":{"known":true,"healthy":true,"latencyMillis":12,"checkedAt":"2026-12-01T02:03:04.000000005Z","since":"2026-12-01T01:03:04.000000005Z","lastFailure":"x","failureKind":"refused","failureReason":"R"},"instance":{"provider":"local","name":"n","proxyUID":"u","namespace":"ns","spec":{"healthCheck":{"url":""}},"providerID":"p","pollInterval":1000000000,"maxWait":60000000000,"specHash":"h"},"driftInterval":60000000000,"latencyEvery":3600000000000,"auth":{"keyID":"k","instance":"i","namespace":"ns","secret":"s","uid":"u","sealed":"v1.x"}}}`},
		{Report{Epoch: "e", Result: Result{Reason: ReasonTarget, Health: h, Instance: provider.Instance{Name: "n", IP: "1.2.3.4"}, Sealed: "s"}},
			`{"epoch":"e","result":{"reason":"target","health":{"known":true,"healthy":true,"latencyMillis":12,"checkedAt":"2026-12-01T02:03:04.000000005Z","since":"2026-12-01T01:03:04.000000005Z","lastFailure":"x","failureKind":"refused","failureReason":"R"},"instance":{"name":"n","providerID":"","state":"","ip":"1.2.3.4","createdAt":"0001-01-01T00:00:00Z"},"sealed":"s"}}`},
		{Verdict{Epoch: "e", Healthy: true, Since: at, LatencyMillis: 3, FailureReason: "R"}, `{"epoch":"e","healthy":true,"since":"2026-12-01T02:03:04.000000005Z","latencyMillis":3,"failureReason":"R"}`},
		{ShardInput{Index: 1, Count: 4, Refresh: 1, IdleRefresh: 2, Quiet: 3, Full: 4, Overlap: 5}, `{"index":1,"count":4,"refresh":1,"idleRefresh":2,"quiet":3,"full":4,"overlap":5}`},
		{Input{}, `{"target":"","healthCheck":{"url":""},"last":{"known":false,"healthy":false,"checkedAt":"0001-01-01T00:00:00Z","since":"0001-01-01T00:00:00Z"}}`},
		{Result{}, `{"reason":"","health":{"known":false,"healthy":false,"checkedAt":"0001-01-01T00:00:00Z","since":"0001-01-01T00:00:00Z"},"instance":{"name":"","providerID":"","state":"","createdAt":"0001-01-01T00:00:00Z"}}`},
		{[]string{MemoKey, VerdictMemoKey, ReasonVerdict, ReasonLatency, ReasonGone, ReasonStopped, ReasonCredentials, ReasonTarget},
			`["monitor","verdict","verdict","latency","gone","stopped","credentials","target"]`},
		// The Monitor activity's heartbeat: what an attempt on another worker resumes from.
		{Progress{Health: Health{Known: true}, Recent: []int64{1, 2}, ConsecOK: 1, ConsecFail: 2, LastReport: at, LastDrift: at, Reported: "not sent", ReasonAt: at},
			`{"health":{"known":true,"healthy":false,"checkedAt":"0001-01-01T00:00:00Z","since":"0001-01-01T00:00:00Z"},"recent":[1,2],"consecOK":1,"consecFail":2,"lastReport":"2026-12-01T02:03:04.000000005Z","lastDrift":"2026-12-01T02:03:04.000000005Z"}`},
	}
	for _, tc := range cases {
		b, err := json.Marshal(tc.v)
		require.NoError(t, err)
		assert.Equal(t, tc.want, string(b), "%T", tc.v)
	}
}
