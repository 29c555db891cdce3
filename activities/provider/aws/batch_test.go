package aws_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
)

// TestGetsAreCoalesced: 500 Gets at once, as a fleet's drift checks and boot polls make
// them, cost EC2 a few DescribeInstances (200 client tokens each at most), not 500, and
// each caller gets its own instance; one asking for a name EC2 does not have is told it
// is gone while the others in its batch are found.
func TestGetsAreCoalesced(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	const n = 500
	for i := range n {
		name := fmt.Sprintf("px-batch-%d", i)
		s.AddInstance(ec2test.Instance{ClientToken: name, PublicIP: fmt.Sprintf("198.51.100.%d", i%250+1),
			Tags: map[string]string{"proxyfleet-instance": name, provider.LabelInstallation: "inst-a"}})
	}
	before := s.Requests(ec2test.ActionDescribeInstances)
	var missing error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, missing = p.Get(context.Background(), ec2test.Region+"/px-batch-none")
	}()
	got, errs := getAll(p, "px-batch-%d", n)
	<-done
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, fmt.Sprintf("px-batch-%d", i), got[i].Name)
		assert.Equal(t, provider.StateRunning, got[i].State)
	}
	assert.True(t, errors.Is(missing, provider.ErrNotFound), "%v", missing)
	calls := s.Requests(ec2test.ActionDescribeInstances) - before
	assert.LessOrEqual(t, calls, 20, "Gets of one region are asked of EC2 together")
	t.Logf("%d Gets cost %d DescribeInstances", n+1, calls)
}

// TestACancelledGetLeavesTheBatch: a caller that gives up gets its context's error at
// once, and the batch it joined still answers the others.
func TestACancelledGetLeavesTheBatch(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	in, err := p.Create(context.Background(), request("px-keep-1", "uid-keep"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.Get(ctx, in.ProviderID)
	require.ErrorIs(t, err, context.Canceled)
	got, err := p.Get(context.Background(), in.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, "px-keep-1", got.Name)
}

// getAll Gets instances fmt.Sprintf(format, i) for i below n with p, all at once, as a
// fleet's drift checks come: what each got, and each error.
func getAll(p *aws.Provider, format string, n int) ([]provider.Instance, []error) {
	got, errs := make([]provider.Instance, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = p.Get(context.Background(), ec2test.Region+"/"+fmt.Sprintf(format, i))
		}()
	}
	wg.Wait()
	return got, errs
}
