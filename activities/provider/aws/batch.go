package aws

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// A fleet's Gets are many and alike: the monitor checks every instance for drift every
// two minutes and every new one is polled while it boots, so 10,000 proxies would ask EC2
// about 80 times a second, four times the rate at which EC2 refills a caller's budget for
// describe calls. Gets in one region are therefore coalesced: the names asked for within
// findWindow go to EC2 as one DescribeInstances, filtered by up to maxTokens client
// tokens, and each caller gets its own instance from the answer. A region then costs at
// most 1/findWindow describe calls a second, 4, up to maxTokens/findWindow Gets a second
// (800: 100,000 proxies' drift checks), for a quarter of a second more per Get.

const (
	// findWindow is how long the first Get of a batch waits for others to join it.
	findWindow = 250 * time.Millisecond
	// maxTokens is EC2's limit on the values of one filter.
	maxTokens = 200
	// batchTimeout bounds one batch's call, whoever is still waiting for it (each
	// caller also stops at its own deadline).
	batchTimeout = 20 * time.Second
)

// finds coalesces the lookups of one region.
type finds struct {
	p      *Provider
	region string

	mu      sync.Mutex
	waiting map[string][]chan found // by instance name
	armed   bool                    // a flush is scheduled
}

type found struct {
	in  *types.Instance
	err error
}

// finder is region's coalescer, made once.
func (p *Provider) finder(region string) *finds {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.finders[region]
	if f == nil {
		f = &finds{p: p, region: region, waiting: map[string][]chan found{}}
		p.finders[region] = f
	}
	return f
}

// findBatched is find, in a batch with the other lookups of region asked meanwhile.
func (p *Provider) findBatched(ctx context.Context, region, name string) (*types.Instance, error) {
	f := p.finder(region)
	ch := make(chan found, 1)
	f.mu.Lock()
	f.waiting[name] = append(f.waiting[name], ch)
	if !f.armed {
		f.armed = true
		time.AfterFunc(findWindow, f.flush)
	}
	f.mu.Unlock()
	select {
	case r := <-ch:
		return r.in, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// flush asks EC2 for up to maxTokens of the names waiting, and schedules itself again
// while more wait.
func (f *finds) flush() {
	f.mu.Lock()
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range f.waiting {
			if !yield(n) {
				return
			}
		}
	})
	if len(names) > maxTokens {
		names = names[:maxTokens]
	}
	batch := make(map[string][]chan found, len(names))
	for _, n := range names {
		batch[n] = f.waiting[n]
		delete(f.waiting, n)
	}
	if len(f.waiting) > 0 {
		go f.flush()
	} else {
		f.armed = false
	}
	f.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	got, err := f.p.describeNames(ctx, f.region, names)
	for n, chans := range batch {
		r := found{err: err}
		if err == nil {
			r.in = got[n]
		}
		for _, c := range chans {
			c <- r
		}
	}
}

// describeNames is the live instances called names in region, by name.
func (p *Provider) describeNames(ctx context.Context, region string, names []string) (map[string]*types.Instance, error) {
	tokens := make([]string, len(names))
	for i, n := range names {
		tokens[i] = clientToken(n)
	}
	pages := ec2.NewDescribeInstancesPaginator(p.client(region), &ec2.DescribeInstancesInput{
		MaxResults: aws.Int32(1000),
		Filters: []types.Filter{
			{Name: aws.String("client-token"), Values: tokens},
			{Name: aws.String("instance-state-name"), Values: liveStates},
		}})
	out := map[string]*types.Instance{}
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify("describe instances", err)
		}
		for _, r := range page.Reservations {
			for i := range r.Instances {
				in := &r.Instances[i]
				name := tagOf(in.Tags, tagInstance)
				if in.State != nil && in.State.Name == types.InstanceStateNameTerminated ||
					!slices.Contains(names, name) || aws.ToString(in.ClientToken) != clientToken(name) {
					continue // terminated since the filter was applied, or not one asked for
				}
				out[name] = in
			}
		}
	}
	return out, nil
}
