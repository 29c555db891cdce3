package controller

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// A pool's reconcile is a plan and its execution: planPool decides from the pool's members
// alone what to create, delete and update, so each rule (how many, which first, how many at
// once) is a table test away from being checked without an API server.

// member is what the pool's plan needs to know of one of its Proxies.
type member struct {
	name    string
	index   int // the n of <pool>-<n>; -1 for a name the pool would not give
	created time.Time
	// current: built from the pool's template as it is now.
	current bool
	// settled: the Proxy's workflow has applied its latest spec (observedGeneration).
	settled bool
	// ready: condition Ready is True (provisioned, healthy, leasable).
	ready bool
	// unhealthy: condition Healthy is False.
	unhealthy bool
	// replacing: phase Replacing, its replacement instance under way, or an instance it
	// gave up still being deleted (a surge instance whatever started it).
	replacing bool
	// deleting: it has a deletion time; it still exists until its instances are gone.
	deleting bool
	// pending: its workflow wants to replace its instance on its own account (maxAge,
	// the unhealthy grace, bans, a cloud-init rotation) and waits for the pool's grant (ReplacementPending).
	pending bool
	// askedAt is when it began to ask (the condition's transition time).
	askedAt time.Time
	// provisioned: it has an instance (condition Provisioned is True).
	provisioned bool
	// granted: the pool granted it (annotation AnnotationReplaceGranted) and has not yet
	// seen the replacement start; grantedAt is when.
	granted   bool
	grantedAt time.Time
	// leases and resting are discovery's: the crawler leases it holds, and the sites it
	// rests for after bans or rate limits (every site counting as one more than any).
	// Zero when discovery was not asked (the pool does not shrink) or did not answer.
	leases, resting int
}

// poolInput is what the plan is made from.
type poolInput struct {
	desired int
	// surge and unavailable are the rolling budget, resolved against desired.
	surge, unavailable int
	members            []member
	// now is when the plan is made: grants older than regrantAfter are sent again.
	now time.Time
}

// poolPlan is what one reconcile does. A scale-down is planned alone; creating missing
// Proxies and rolling outdated ones go on together, each within its own rule.
type poolPlan struct {
	// create are the indexes of Proxies to create from the current template.
	create []int
	// remove are Proxies to delete to scale down.
	remove []string
	// update are outdated Proxies to give the current template in place: each is replaced
	// make-before-break by its own workflow, one surge instance while it lasts.
	update []string
	// replace are outdated Proxies, or ones that want a replacement, to delete so that new
	// ones take their place (maxSurge 0: delete-first, within maxUnavailable).
	replace []string
	// grant are Proxies whose own replacement may start now, within maxSurge.
	grant []string
	// regrant are granted Proxies whose replacement has not started regrantAfter after the
	// grant (the signal was lost with an operator that stopped): granted again.
	regrant []string
	// ungrant are granted Proxies whose replacement started (or is no longer wanted):
	// their grant annotation goes.
	ungrant []string
}

// regrantAfter is how long a grant may go unanswered before it is sent again. A grant its
// workflow has already taken is ignored there, so sending one twice costs no instance.
const regrantAfter = 30 * time.Second

// planPool decides one reconcile of a pool.
func planPool(in poolInput) poolPlan {
	var p poolPlan
	var active []member
	taken := map[int]bool{}
	for _, m := range in.members {
		if m.index >= 0 {
			// A deleting Proxy keeps its name until its instances are gone.
			taken[m.index] = true
		}
		if !m.deleting {
			active = append(active, m)
		}
	}
	if extra := len(active) - in.desired; extra > 0 {
		// Scale down first, the least useful first; rolling waits until the count is right.
		byUse := slices.Clone(active)
		slices.SortStableFunc(byUse, lessUseful)
		for _, m := range byUse[:extra] {
			p.remove = append(p.remove, m.name)
		}
		return p
	}
	for i := 0; len(p.create) < in.desired-len(active); i++ {
		if !taken[i] {
			p.create = append(p.create, i)
		}
	}

	// Due are the members to replace: outdated ones (a new template), and those whose
	// workflow asks to replace its instance (maxAge, ill health, bans, a cloud-init
	// rotation). Both count against one budget, so nothing that asks can rebuild the
	// pool at once. Extras are the members with a second instance, or about to have one:
	// what maxSurge bounds. Members not Ready on the current template (new, or updated
	// and not back) have none, but hold back further updates, as a Deployment's rollout
	// waits for its new pods; they do not hold back what members ask for.
	var due []member
	extras, unreadyCurrent, ready := 0, 0, 0
	for _, m := range active {
		granted := m.granted
		switch {
		case granted && (!m.pending || in.surge == 0):
			// Its replacement started (and counts as replacing below), is no longer
			// wanted, or the budget is now delete-first: the grant has done its work.
			p.ungrant = append(p.ungrant, m.name)
			granted = false
		case granted && (in.now.Sub(m.grantedAt) >= regrantAfter || m.grantedAt.After(in.now.Add(regrantAfter))):
			// Unanswered for regrantAfter, or dated ahead of this clock by more than
			// that (written by hand, or by a leader whose clock ran ahead).
			p.regrant = append(p.regrant, m.name)
		}
		switch {
		case m.replacing || granted:
			extras++
		case m.current && !m.settled && (m.ready || m.provisioned):
			// Given a new template its run has not taken yet: its replacement is about
			// to start (its status may still show an old ask).
			extras++
		case !m.current || m.pending:
			due = append(due, m)
		case !m.settled || !m.ready:
			unreadyCurrent++
		}
		if m.ready {
			ready++
		}
	}
	slices.SortStableFunc(due, lessUseful)
	switch {
	case len(due) == 0:
	case in.surge > 0:
		free := in.surge - extras
		pace := free - unreadyCurrent
		for _, m := range due {
			if free <= 0 {
				break
			}
			if m.current {
				p.grant = append(p.grant, m.name)
			} else if pace > 0 {
				// The new template replaces it, which serves what it asked for too.
				p.update = append(p.update, m.name)
			} else {
				continue
			}
			free--
			pace--
		}
	default:
		// Delete-first: one that is not Ready serves nobody and may always go; of the
		// others, as many as leaves at least desired − maxUnavailable Ready (those being
		// deleted or not yet back are not Ready, so they count as gone already).
		free := in.unavailable - (in.desired - ready)
		for _, m := range due {
			switch {
			case !m.ready:
			case free > 0:
				free--
			default:
				continue
			}
			p.replace = append(p.replace, m.name)
		}
	}
	return p
}

// lessUseful orders members from the one to give up first: not ready, then unhealthy,
// then resting for the most sites (banned where crawlers go), then holding the fewest
// leases (the fewest crawlers cut off), then the one that has asked to be replaced
// longest (so a member banned again and again cannot keep the budget from one whose
// maxAge came due long ago), then the oldest.
func lessUseful(a, b member) int {
	return cmp.Or(
		cmpBool(!a.ready, !b.ready),
		cmpBool(a.unhealthy, b.unhealthy),
		cmp.Compare(b.resting, a.resting),
		cmp.Compare(a.leases, b.leases),
		cmpBool(a.pending, b.pending),
		a.askedAt.Compare(b.askedAt),
		a.created.Compare(b.created),
		strings.Compare(a.name, b.name),
	)
}

// cmpBool sorts true first.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// memberName is the name of a pool's n-th Proxy.
func memberName(pool string, n int) string { return pool + "-" + strconv.Itoa(n) }

// memberIndex is the n of a name memberName gave, or -1.
func memberIndex(pool, name string) int {
	rest, ok := strings.CutPrefix(name, pool+"-")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return -1
	}
	return n
}

// budget resolves a maxSurge or maxUnavailable against desired replicas, as a Deployment
// does (apimachinery's own rounding): percentages round up for surge and down for
// unavailable; unset is 25%.
func budget(v *intstr.IntOrString, desired int, roundUp bool) (int, error) {
	if v == nil {
		v = ptr.To(intstr.FromString("25%"))
	}
	return intstr.GetScaledValueFromIntOrPercent(v, desired, roundUp)
}

// maxAgeSpread is the share of maxAge by which a pool's Proxies differ: a pool's instances
// are created together, and with one maxAge they would all come due together, and be
// replaced at once.
const maxAgeSpread = 0.2

// minMaxAge is the shortest maxAge the API admits.
const minMaxAge = 10 * time.Minute

// staggeredMaxAge is the maxAge the pool's n-th Proxy gets for the template's age: between
// (1 − maxAgeSpread) × age and age, the n-th point of the golden-ratio sequence, which
// spreads any number of consecutive indexes evenly over the range (a pool that grows
// needs no other member changed), in whole seconds and never under the API's minimum.
// Instances made at the same moment so come due apart; a Proxy's first replacement takes
// its own period from then on.
func staggeredMaxAge(age time.Duration, n int) time.Duration {
	if n < 0 {
		return age
	}
	const invPhi = 0.6180339887498949
	frac := math.Mod(float64(n)*invPhi, 1)
	d := time.Duration(float64(age) * (1 - maxAgeSpread*frac)).Truncate(time.Second)
	return max(d, min(age, minMaxAge))
}
