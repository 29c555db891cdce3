// Package httpserve serves an HTTP server until a context ends and then drains it, the
// one way discovery's API and its gateway stop: both must let requests in flight finish
// (a renewal, a lease release) within a bound rather than cut them off or hang a rollout.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Drain is how long requests in flight get once the context ends.
const Drain = 10 * time.Second

// Until serves hs on ln until ctx ends, then stops accepting and gives the requests in
// flight up to Drain. It returns the error of serving (nil for that stop) and the
// shutdown's, which says requests were cut off.
func Until(ctx context.Context, hs *http.Server, ln net.Listener) (err, shutdownErr error) {
	shutdown := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, stop := context.WithTimeout(context.Background(), Drain)
		defer stop()
		shutdown <- hs.Shutdown(sctx)
	}()
	err = hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil, <-shutdown
	}
	return err, nil
}
