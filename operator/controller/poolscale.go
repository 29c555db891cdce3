package controller

import (
	"slices"
	"time"
)

// A pool's autoscaling decision is a pure function of the demand discovery reports, the
// pool's bounds and what it recommended lately, so that each rule (how many for a demand,
// when to shrink, which bound holds) is a table test away from being checked.

// recommendation is what the autoscaler wanted at one look.
type recommendation struct {
	at       time.Time
	replicas int
}

// scaleInput is what one decision is made from.
type scaleInput struct {
	now time.Time
	// current is spec.replicas now.
	current int
	// min and max bound the pool; perProxy is a proxy's maxLeases; target is the share of
	// the pool's capacity demand should fill, in percent.
	min, max, perProxy, target int
	// delay is how long demand must stay lower before the pool shrinks to it.
	delay time.Duration
	// demand is the leases crawlers want of the pool (held + waiting + refused).
	demand int
	// history are the recommendations of earlier looks, oldest first; empty after the
	// operator started.
	history []recommendation
}

// scaleDecision is one look's outcome.
type scaleDecision struct {
	// desired is what spec.replicas should be.
	desired int
	// wanted is what the demand alone asks for, before the bounds.
	wanted int
	// limit names the bound that held wanted back: "max", "min" or "".
	limit string
	// stabilized says a lower recommendation waits out the delay: desired is the
	// highest of the window.
	stabilized bool
	history    []recommendation
}

// decideScale sizes a pool for its demand as a HorizontalPodAutoscaler sizes a Deployment
// for its metric: enough proxies that demand fills target percent of their leases,
// within the bounds; up at once, in one step to what demand asks (waiting and refused
// requests are demand too, so a pool grows in steps that follow it); down only to the
// highest recommendation of the last delay, so a lull shorter than the delay shrinks
// nothing. After a restart, when no history is left, the pool's size counts as
// recommended now: a shrink waits a whole delay rather than acting on one look.
func decideScale(in scaleInput) scaleDecision {
	perProxy := max(in.perProxy, 1)
	target := min(max(in.target, 1), 100)
	// Clamped before the arithmetic: a demand read from discovery is a sum of replicas'
	// numbers, and one past any pool (MaxPoolReplicas of the most leases a proxy takes)
	// must hold the pool at its maximum, not overflow into no demand at all.
	demand := min(max(in.demand, 0), 1<<30)
	d := scaleDecision{wanted: ceilDiv(demand*100, perProxy*target)}
	rec := d.wanted
	switch {
	case rec > in.max:
		rec, d.limit = in.max, "max"
	case rec < in.min:
		rec, d.limit = in.min, "min"
	}
	if len(in.history) == 0 {
		d.history = remember(nil, in.now, in.delay, min(max(in.current, in.min), in.max))
	} else {
		d.history = slices.Clone(in.history)
	}
	d.history = remember(d.history, in.now, in.delay, rec)
	d.desired = rec
	if rec < in.current {
		highest := d.history[0].replicas
		if highest > rec {
			d.stabilized = true
		}
		// Never above the bound (a kubectl scale past max comes back down at once), and
		// never up because of an old recommendation.
		d.desired = min(max(highest, rec), in.current, in.max)
	}
	return d
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// remember adds a recommendation of replicas at now to history, dropping those older than
// delay. Only the highest of the window matters: an earlier recommendation no higher than
// this one never will again, so the history is a falling staircase, as long as the
// distinct sizes recommended in one delay, however long the delay.
func remember(history []recommendation, now time.Time, delay time.Duration, replicas int) []recommendation {
	cutoff := now.Add(-delay)
	kept := history[:0]
	for _, r := range history {
		if r.at.After(cutoff) {
			kept = append(kept, r)
		}
	}
	for len(kept) > 0 && kept[len(kept)-1].replicas <= replicas {
		kept = kept[:len(kept)-1]
	}
	return append(kept, recommendation{at: now, replicas: replicas})
}
