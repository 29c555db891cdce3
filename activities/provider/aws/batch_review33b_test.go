package aws_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
)

// TestReview33bGetsOfGoneInstancesAreNotCoalesced
//
// Defect: only Get's lookup of LIVE instances is coalesced. Every Get that finds nothing
// live then calls terminated(), one DescribeInstances per Get, unbatched (and a fresh
// instance not listed yet costs the same on every 5-second boot poll). In a mass Spot
// reclaim — the moment many Gets at once are of gone instances: every monitor's drift
// check, every retired instance's DeleteInstance loop — describe calls go back to one
// per Get, bursting past EC2's describe bucket (100, refilled 20 a second) and
// throttling every describe of the account in that region, Creates included.
// docs/providers.md promises "a region costs at most 4 describe calls a second".
func TestReview33bGetsOfGoneInstancesAreNotCoalesced(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	const n = 300
	for i := range n {
		name := fmt.Sprintf("px-reclaimed-%d", i)
		s.AddInstance(ec2test.Instance{ClientToken: name, State: "terminated", StateReason: "Server.SpotInstanceTermination", Spot: true,
			Tags: map[string]string{"proxyfleet-instance": name, provider.LabelInstallation: "inst-a"}})
	}
	before := s.Requests(ec2test.ActionDescribeInstances)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.Get(context.Background(), fmt.Sprintf("%s/px-reclaimed-%d", ec2test.Region, i))
		}()
	}
	wg.Wait()
	for i := range n {
		assert.ErrorIs(t, errs[i], provider.ErrPreempted)
	}
	calls := s.Requests(ec2test.ActionDescribeInstances) - before
	assert.LessOrEqual(t, calls, 20, "%d Gets of reclaimed instances cost %d DescribeInstances: one each", n, calls)
}

// TestReview33bFullBatchExceedsEC2FilterLimit
//
// Defect: EC2 limits the filter values of ONE call, all filters together, to 200
// ("FilterLimitExceeded: The maximum number of filter values specified on a single call
// is 200", as DescribeInstances answers; callers elsewhere send 199 IDs beside one state
// value). A full batch sends 200 client tokens AND the 5 live states: 205 values, so
// EC2 refuses it, and every Get in it fails. A batch is full from 196 Gets in a window
// (784 Gets a second), i.e. exactly at the load the batching exists for ("up to 800
// Gets a second"): above it, no Get of the region succeeds. The fake has no such limit;
// here a proxy in front of it enforces EC2's.
func TestReview33bFullBatchExceedsEC2FilterLimit(t *testing.T) {
	s := ec2test.NewServer(t)
	srv := review33bProxy(t, s, func(form url.Values, w http.ResponseWriter) bool {
		if form.Get("Action") != ec2test.ActionDescribeInstances {
			return false
		}
		values := 0
		for k := range form {
			if strings.HasPrefix(k, "Filter.") && strings.Contains(k, ".Value.") {
				values++
			}
		}
		if values <= 200 {
			return false
		}
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>FilterLimitExceeded</Code><Message>The maximum number of filter values specified on a single call is 200</Message></Error></Errors><RequestID>r33b</RequestID></Response>`)
		return true
	})
	p := providerVia(t, s, srv, machine())
	const n = 1000 // however the goroutines fall into 250 ms windows, one window holds 200
	for i := range n {
		name := fmt.Sprintf("px-full-%d", i)
		s.AddInstance(ec2test.Instance{ClientToken: name, PublicIP: "198.51.100.7",
			Tags: map[string]string{"proxyfleet-instance": name, provider.LabelInstallation: "inst-a"}})
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.Get(context.Background(), fmt.Sprintf("%s/px-full-%d", ec2test.Region, i))
		}()
	}
	wg.Wait()
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	assert.Zero(t, failed, "%d of %d Gets failed; first: %v", failed, n, first)
}
