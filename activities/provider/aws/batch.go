package aws

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// A fleet's Gets are many and alike: the monitor checks every instance for drift every
// two minutes and every new one is polled while it boots, so 10,000 proxies would ask EC2
// about 80 times a second, four times the rate at which EC2 refills a caller's budget for
// describe calls. Gets in one region are therefore coalesced: the names asked for within
// findWindow go to EC2 as one DescribeInstances, filtered by up to maxNames instance
// names, and each caller gets its own instance from the answer, live or terminated. A
// region then costs at most 1/findWindow describe calls a second, 4, up to
// maxNames/findWindow Gets a second (800: 100,000 proxies' drift checks), for a quarter
// of a second more per Get.

const (
	// findWindow is how long the first Get of a batch waits for others to join it.
	findWindow = 250 * time.Millisecond
	// maxNames is EC2's limit on the filter values of one call (all filters together).
	maxNames = 200
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
	l   listed
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

// findBatched is lookup, in a batch with the other lookups of region asked meanwhile.
func (p *Provider) findBatched(ctx context.Context, region, name string) (listed, error) {
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
		return r.l, r.err
	case <-ctx.Done():
		return listed{}, ctx.Err()
	}
}

// flush asks EC2 for up to maxNames of the names waiting, and schedules itself again
// while more wait.
func (f *finds) flush() {
	f.mu.Lock()
	names := slices.Sorted(maps.Keys(f.waiting))
	if len(names) > maxNames {
		names = names[:maxNames]
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
			r.l = got[n]
		}
		for _, c := range chans {
			c <- r
		}
	}
}

// describeNames is what EC2 lists of the instances called names in region, by name:
// one DescribeInstances by the proxyfleet-instance tag, its pages followed, every state
// included (live and terminated are told apart here, which keeps the call to one filter
// and maxNames values).
func (p *Provider) describeNames(ctx context.Context, region string, names []string) (map[string]listed, error) {
	pages := ec2.NewDescribeInstancesPaginator(p.client(region), &ec2.DescribeInstancesInput{
		MaxResults: aws.Int32(1000),
		Filters:    []types.Filter{{Name: aws.String("tag:" + tagInstance), Values: names}},
	})
	out := make(map[string]listed, len(names))
	var at time.Time
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify("describe instances", err)
		}
		if t, ok := awsmiddleware.GetServerTime(page.ResultMetadata); ok {
			at = t
		}
		for _, r := range page.Reservations {
			for i := range r.Instances {
				in := &r.Instances[i]
				name := tagOf(in.Tags, tagInstance)
				if !slices.Contains(names, name) {
					continue
				}
				l := out[name]
				if in.State != nil && in.State.Name == types.InstanceStateNameTerminated {
					if l.gone == nil || aws.ToTime(in.LaunchTime).After(aws.ToTime(l.gone.LaunchTime)) {
						l.gone = in
					}
				} else if l.live == nil || aws.ToTime(in.LaunchTime).After(aws.ToTime(l.live.LaunchTime)) {
					l.live = in
				}
				out[name] = l
			}
		}
	}
	for _, n := range names {
		l := out[n]
		l.at = at
		out[n] = l
	}
	return out, nil
}
