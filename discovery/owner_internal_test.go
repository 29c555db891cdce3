package discovery

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestLeaseOpsActAsTheCrawler: the lease operations the gateway calls with a crawler's
// credentials (renewing, releasing and reporting on the leases it holds for it) act as
// that crawler's client: on another client's lease they answer as on an unknown one and
// change nothing, and a token no client has any more is refused.
func TestLeaseOpsActAsTheCrawler(t *testing.T) {
	const shopTok, newsTok = "shop-token-0123456789abcdef", "news-token-0123456789abcdef"
	store := NewStore(30 * time.Minute)
	store.ReplaceAll([]Proxy{{Name: "p", Namespace: "crawl", IP: "10.0.0.1", Port: 3128, Healthy: true, Phase: "Ready", MaxLeases: 2}})
	s := NewServer(Config{Clients: NewClients([]ClientConfig{{Name: "shop", Token: shopTok}, {Name: "news", Token: newsTok}})},
		store, nil, nil, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	l, err := s.Grant(ctx, Want{Client: "shop", Target: "shop.example", TTL: time.Minute}, nil)
	require.NoError(t, err)
	const unknown = "00aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	shop, news := "Bearer "+shopTok, "Bearer "+newsTok

	code := func(err error) string {
		if err == nil {
			return ""
		}
		ae, _ := ErrorOf(err)
		return ae.Code
	}
	_, err = s.RenewLease(ctx, news, l.LeaseID, time.Minute)
	assert.Equal(t, codes.UnknownLease, code(err), "news renews shop's lease: %v", err)
	_, uerr := s.RenewLease(ctx, news, unknown, time.Minute)
	assert.Equal(t, code(uerr), code(err))
	err = s.ReportLease(ctx, news, l.LeaseID, contract.ReportBanned, "")
	assert.Equal(t, codes.UnknownLease, code(err), "news reports on shop's lease: %v", err)
	assert.NoError(t, s.ReleaseLease(ctx, news, l.LeaseID), "a release answers as for an unknown lease")
	assert.Equal(t, 1, store.Stats().Leases, "and ends nothing")

	_, err = s.RenewLease(ctx, "Bearer gone-token-0123456789abcdef", l.LeaseID, time.Minute)
	assert.Equal(t, codes.Unauthorized, code(err), "a token no client has: %v", err)

	r, err := s.RenewLease(ctx, shop, l.LeaseID, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, l.Proxy.IP, r.Proxy.IP)
	require.NoError(t, s.ReportLease(ctx, shop, l.LeaseID, contract.ReportOK, ""))
	require.NoError(t, s.ReleaseLease(ctx, shop, l.LeaseID))
	assert.Equal(t, 0, store.Stats().Leases)
}
