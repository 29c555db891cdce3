package monitor

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// When a fleet's health-check target is down (it answers 503, refuses connections, its
// certificate expired), every proxy probed through to it fails at once, although the
// proxies are fine; with lifecycle.unhealthyReplaceAfter each would then be replaced, again
// and again (issue 29). So the monitor shards of a worker judge each target from all the
// proxies they probe it through: when enough of them fail against the target at once, it is
// the target that is down, and those failures say nothing about the proxies. A member then
// keeps its proxy's verdict and reports the situation instead (see thresholds.fold).

// Minimum evidence for judging a target down: at least targetDownMin proxies, and at least
// half of those whose latest probe says anything about the target, failed against it. Two
// proxies failing alike can be two bad proxies; three at once, and half of all, are far
// more likely one bad target. Below that (a fleet of one or two proxies per target) a
// failure counts as the proxy's, as it always did.
const targetDownMin = 3

// targetDownShare is the share, in tenths, of the members with evidence whose latest probe
// must have failed against the target: nearly all. Half would let one broken half of a
// fleet (a region, a vendor, whose proxies answer 502 for everything) excuse itself while
// the other half shows the target up.
const targetDownShare = 9

// targetFailureMin is the fewest failures in a row against the target that turn a healthy
// proxy unhealthy, whatever its failureThreshold: the members of a fleet probe at
// different moments of an interval, so at an outage's onset the first to fail are alone
// until the others have probed; with failureThreshold 1 they would be judged before the
// board could see it was the target.
const targetFailureMin = 3

// targetBoard holds, per health-check target, the latest probe of every member probing it.
// The shards of one worker share one (the feed's), so a fleet spread over shards is
// judged as one: with a board per shard, the default four shards would each need three
// proxies of a target, and a fleet of fewer than twelve would have no protection.
type targetBoard struct {
	metrics *Metrics

	mu    sync.Mutex
	byKey map[string]*targetState
}

// targetState is what a board knows of one target.
type targetState struct {
	name    string
	members map[string]memberProbe
	// ok and failed count the members' latest probes that said the target answered, or
	// that the proxy answered and the target failed; kept as members change, so a probe
	// costs O(1) however many proxies share the target.
	ok, failed int
	down       bool
	// pruned is when stale probes were last dropped.
	pruned time.Time
}

// memberProbe is a member's latest probe of its target.
type memberProbe struct {
	at      time.Time
	stale   time.Duration // after this long it no longer counts
	outcome probeOutcome
	// worked says the member was seen to work: it started healthy or passed a probe of
	// this target since. Only those are evidence: a proxy never seen working says nothing
	// about the target when it fails, and a few such (External proxies anyone may point
	// at an endpoint that answers 503) could otherwise excuse everyone's failures.
	worked bool
}

type probeOutcome int

const (
	// outcomeProxy: the probe says nothing about the target (the proxy refused, asked for
	// credentials, never answered).
	outcomeProxy probeOutcome = iota
	outcomeOK
	outcomeTargetFailed
)

func outcomeOf(res probe.Result) probeOutcome {
	switch {
	case res.OK:
		return outcomeOK
	case res.TargetFailed:
		return outcomeTargetFailed
	}
	return outcomeProxy
}

// targetJudgement is a board's view of one target after a member's probe.
type targetJudgement struct {
	Down bool
	// Failed of Of members failed against the target in their latest probe; Of counts
	// those whose latest probe said anything about it.
	Failed, Of int
	// Name is the target as a person may read it (scheme, host and port).
	Name string
}

func newTargetBoard(m *Metrics) *targetBoard {
	return &targetBoard{metrics: m, byKey: map[string]*targetState{}}
}

// targetKey is what a board groups members by: the health check's whole URL (without its
// fragment, which never reaches the target), not only its host. A status is one URL's
// answer: with /healthz broken and / fine on one host, the proxies probing / would
// outvote those probing /healthz, which would then be replaced for the URL's fault. name
// is the target for messages: scheme, host and port only, for a path or query may carry a
// token, and messages reach the Proxy's status and Temporal.
func targetKey(raw string) (key, name string) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw, "the health check's URL"
	}
	u.Fragment, u.RawFragment = "", ""
	u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	return u.String(), u.Scheme + "://" + u.Host
}

// staleAfter is how long a member's latest probe counts: twice the interval plus the
// timeout. A member probes every interval ±10% and a probe takes at most the timeout, so
// the latest probe of every member that is probing is younger than that, and each member
// counts once, with its latest probe: members probed at different moments of an interval
// are judged together, the same way whatever the moment. A member that stopped probing
// (its report retried through a Temporal outage) drops out after it; one that stopped for
// good is forgotten at once.
func staleAfter(interval, timeout time.Duration) time.Duration { return 2*interval + timeout }

// observe records member's latest probe of the target named by key and returns the
// target's judgement with it.
func (b *targetBoard) observe(key, name, member string, startedHealthy bool, res probe.Result, stale time.Duration, now time.Time) targetJudgement {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.byKey[key]
	if t == nil {
		t = &targetState{name: name, members: map[string]memberProbe{}, pruned: now}
		b.byKey[key] = t
	}
	worked := res.OK || t.members[member].worked || startedHealthy
	p := memberProbe{at: now, stale: stale, outcome: outcomeOf(res), worked: worked}
	if !worked {
		p.outcome = outcomeProxy
	}
	t.set(member, p)
	if now.Sub(t.pruned) >= time.Second {
		// At most once a second per target, so the sweep costs O(members) a second rather
		// than per probe.
		t.pruned = now
		for id, p := range t.members {
			if now.Sub(p.at) > p.stale {
				t.drop(id)
			}
		}
	}
	b.judge(t)
	return targetJudgement{Down: t.down, Failed: t.failed, Of: t.ok + t.failed, Name: t.name}
}

// forget removes a member that stopped watching; a target nobody probes is forgotten.
func (b *targetBoard) forget(key, member string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.byKey[key]
	if t == nil {
		return
	}
	t.drop(member)
	if len(t.members) == 0 {
		if t.down {
			b.metrics.targetDown(-1)
		}
		delete(b.byKey, key)
		return
	}
	b.judge(t)
}

// judge updates t's judgement from its counts, and the gauge of targets judged down with
// it. b.mu is held.
func (b *targetBoard) judge(t *targetState) {
	down := t.failed >= targetDownMin && 10*t.failed >= targetDownShare*(t.ok+t.failed)
	switch {
	case down && !t.down:
		b.metrics.targetDown(1)
	case !down && t.down:
		b.metrics.targetDown(-1)
	}
	t.down = down
}

func (t *targetState) set(member string, p memberProbe) {
	t.drop(member)
	t.members[member] = p
	t.count(p.outcome, 1)
}

func (t *targetState) drop(member string) {
	if p, ok := t.members[member]; ok {
		t.count(p.outcome, -1)
		delete(t.members, member)
	}
}

func (t *targetState) count(o probeOutcome, d int) {
	switch o {
	case outcomeOK:
		t.ok += d
	case outcomeTargetFailed:
		t.failed += d
	}
}

// message is the Health.LastFailure of a member whose failure the judgement excuses: it
// names the target and the evidence, so the Proxy's status says why nothing is replaced.
func (j targetJudgement) message(res probe.Result) string {
	return fmt.Sprintf("health-check target %s is down: %d of %d proxies failed against it in their latest probe (%s); "+
		"the proxy's verdict is kept until the target answers again", j.Name, j.Failed, j.Of, res.Message)
}

// targetJudge is how a member records a probe and learns its target's judgement; nil
// judges nothing (the Monitor activity of older workflows watches one proxy alone).
type targetJudge func(res probe.Result, now time.Time) targetJudgement

// judgeFor returns member's judge on b for the health check hc, and the function that
// forgets it when it stops.
func (b *targetBoard) judgeFor(member string, hc v1alpha1.HealthCheck, startedHealthy bool) (targetJudge, func()) {
	interval, err1 := hc.EffectiveInterval()
	timeout, err2 := hc.EffectiveTimeout()
	if b == nil || err1 != nil || err2 != nil {
		// A health check that does not parse fails its watch before any probe.
		return nil, func() {}
	}
	key, name := targetKey(hc.URL)
	// A status is one URL's answer to one expectation: members expecting another status
	// of the same URL are judged apart.
	key += "\x00" + strconv.Itoa(int(hc.ExpectedStatus))
	stale := staleAfter(interval, timeout)
	return func(res probe.Result, now time.Time) targetJudgement {
			return b.observe(key, name, member, startedHealthy, res, stale, now)
		}, func() {
			b.forget(key, member)
		}
}
