package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
)

// Crawler is the project's Go client, scoped to this test's proxies: proxies of earlier
// tests still run on the shared Temporal server, so every selector includes run=<namespace>.
type Crawler struct {
	t      *testing.T
	Client *client.Client
	Run    string
}

// NewCrawler is a crawler of run (a namespace) on discovery d.
func NewCrawler(t *testing.T, d *stack.Discovery, run string) Crawler {
	return Crawler{t: t, Client: client.New(d.URL, d.Token), Run: run}
}

// Selector matches this run's proxies.
func (c Crawler) Selector() map[string]string {
	return map[string]string{"region": "local", "run": c.Run}
}

// Lease acquires for target; a 409 returns nil with the typed error.
func (c Crawler) Lease(target string) (*client.Lease, error) {
	c.t.Helper()
	l, err := c.Client.Acquire(context.Background(), client.AcquireRequest{Selector: c.Selector(), TTL: time.Minute, Target: target})
	if err != nil && !client.IsNoMatch(err) {
		require.NoError(c.t, err)
	}
	return l, err
}

// Release gives a lease back.
func (c Crawler) Release(l *client.Lease) {
	c.t.Helper()
	require.NoError(c.t, c.Client.Release(context.Background(), l.ID))
}
