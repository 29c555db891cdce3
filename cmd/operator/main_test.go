package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

// TestTuningFlags: each --tuning-* flag lands in its own field of the timings handed to new
// workflows, and the ones not given stay 0 so the workflow's defaults apply.
func TestTuningFlags(t *testing.T) {
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	tuning := tuningFlags(fs)
	require.NoError(t, fs.Parse([]string{
		"--tuning-poll-interval", "100ms", "--tuning-retry-base", "1s", "--tuning-retry-max", "2s",
		"--tuning-quota-retry", "3s", "--tuning-activity-timeout", "4s", "--tuning-heartbeat-timeout", "5s",
		"--tuning-wait-running-max", "6s",
	}))
	assert.Equal(t, proxyinput.Tuning{
		PollInterval: 100 * time.Millisecond, RetryBase: time.Second, RetryMax: 2 * time.Second,
		QuotaRetry: 3 * time.Second, ActivityTimeout: 4 * time.Second, HeartbeatTimeout: 5 * time.Second,
		WaitRunningMax: 6 * time.Second,
	}, *tuning)
	assert.Equal(t, 2*time.Minute, tuning.WithDefaults().DriftInterval, "an unset timing keeps its default")
	assert.Contains(t, fs.Lookup("tuning-drift-interval").Usage, "(0: 2m0s)", "the help names the default")
}

// TestDiscoveryURL: a --discovery-url the autoscaler cannot use is refused at start, and
// the refusal never shows a password put in it.
func TestDiscoveryURL(t *testing.T) {
	require.NoError(t, checkDiscoveryURL("http://proxyfleet-discovery.proxyfleet-system.svc:8090"))
	require.NoError(t, checkDiscoveryURL("https://discovery.example:443/"))
	for _, bad := range []string{
		"http://operator:hunter2-secret@discovery:8090",
		"http://operator:hunter2-secret@discovery:80g90",
		"discovery:8090",
		"ftp://discovery:8090",
		"http://",
	} {
		err := checkDiscoveryURL(bad)
		require.Error(t, err, bad)
		assert.NotContains(t, err.Error(), "hunter2", bad)
		assert.Contains(t, err.Error(), "--discovery-url", bad)
	}
}
