package discovery

import "time"

// WaitChecks is how many grants g tried again while requests waited for a slot: what
// waiting cost the store.
func (g *Gateway) WaitChecks() int64 { return g.waitChecks.Load() }

// SetWaitPoll sets how often a waiting request looks for a slot by itself, before Serve.
func (g *Gateway) SetWaitPoll(d time.Duration) { g.waitPoll = d }
