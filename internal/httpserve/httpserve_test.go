package httpserve_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/httpserve"
)

// TestUntilDrainsARequestInFlight: when the context ends, a request already being served
// still gets its answer, and Until returns without an error once it has.
func TestUntilDrainsARequestInFlight(t *testing.T) {
	started, finish := make(chan struct{}), make(chan struct{})
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-finish
		_, _ = io.WriteString(w, "done")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	type result struct{ err, shutdownErr error }
	served := make(chan result, 1)
	go func() { e, s := httpserve.Until(ctx, hs, ln); served <- result{e, s} }()

	body := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			body <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body <- string(b)
	}()
	<-started
	cancel()
	assert.Never(t, func() bool { return len(served) > 0 }, 200*time.Millisecond, 10*time.Millisecond,
		"Until returned while a request was in flight")
	close(finish)
	assert.Equal(t, "done", <-body)
	r := <-served
	assert.NoError(t, r.err)
	assert.NoError(t, r.shutdownErr)
}
