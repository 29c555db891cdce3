package aws_test

import (
	"fmt"
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
	_, errs := getAll(p, "px-reclaimed-%d", n)
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
// value). A full batch sent 200 client tokens AND the 5 live states: 205 values, so EC2
// refused it, and every Get in it failed. A batch is full from 196 Gets in a window (784
// Gets a second), i.e. exactly at the load the batching exists for ("up to 800 Gets a
// second"): above it, no Get of the region succeeded. The fake enforces EC2's limit.
func TestReview33bFullBatchExceedsEC2FilterLimit(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	const n = 1000 // however the goroutines fall into 250 ms windows, one window holds 200
	for i := range n {
		name := fmt.Sprintf("px-full-%d", i)
		s.AddInstance(ec2test.Instance{ClientToken: name, PublicIP: "198.51.100.7",
			Tags: map[string]string{"proxyfleet-instance": name, provider.LabelInstallation: "inst-a"}})
	}
	_, errs := getAll(p, "px-full-%d", n)
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
