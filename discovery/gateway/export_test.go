package gateway

import (
	"context"
	"time"
)

// WaitChecks is how many grants were tried again while requests waited for a slot (the
// lease server's count, which g's waiting requests share): what waiting cost the store.
func (g *Gateway) WaitChecks() int64 { return g.ops.(interface{ WaitChecks() int64 }).WaitChecks() }

// SetWaitPoll sets how often a waiting request looks for a slot by itself, before Serve.
func (g *Gateway) SetWaitPoll(d time.Duration) { g.waitPoll = d }

// SetRenewHook stands fn in for renewing a held lease, before Serve.
func (g *Gateway) SetRenewHook(fn func(ctx context.Context, auth, id string) error) { g.renewHook = fn }

// Hold makes g hold lease id as a request or tunnel in progress would.
func (g *Gateway) Hold(id, auth string) { g.hold(id, auth) }

// RenewPass runs one pass of renewals of the leases g holds.
func (g *Gateway) RenewPass(ctx context.Context) { g.renewPass(ctx) }

// SetHeaderTimeout bounds a crawler's request head to d, before Serve.
func (g *Gateway) SetHeaderTimeout(d time.Duration) { g.headerTimeout = d }
