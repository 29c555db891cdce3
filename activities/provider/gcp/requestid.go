package gcp

import (
	"crypto/sha256"
	"fmt"
	"strconv"

	"cloud.google.com/go/compute/apiv1/computepb"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// maxRequestIDHops bounds how many finished operations one call steps past (see
// nextRequestID). Each step is one failed attempt GCE still remembers; a Proxy retrying a
// stockout every few minutes collects about a dozen an hour.
const maxRequestIDHops = 32

// requestID is the request ID of the c call on r for the Proxy proxyUID (empty for a
// delete, which is the same whoever asks). GCE answers a request whose ID it has seen (for
// at least an hour) with that request's operation instead of acting again, so a call
// retried after its answer was lost is recognised as the same call. It is derived from
// the call alone so that a retry in another activity attempt, or on another worker, sends
// the same ID without remembering anything. The Proxy is part of an insert's ID because
// another Proxy's insert of the same name (a collision) must not be taken for this one's
// retry: it must meet the 409 that Create answers by checking who owns the instance.
func requestID(c call, r ref, proxyUID string) string {
	return nameUUID(string(c) + " " + r.String() + " " + proxyUID)
}

// insertOwner is what an insert's request ID is for: the Proxy, and the fleet key the
// instance's credentials come from.
func insertOwner(req provider.CreateRequest) string {
	if req.KeyID == "" {
		return req.ProxyUID
	}
	return req.ProxyUID + " key " + req.KeyID
}

// nextRequestID is the ID to send after GCE answered id with an operation that cannot be
// the one wanted: one that failed, or one that finished long ago for an instance that has
// since been deleted or recreated. Retrying under id would only fetch that operation again
// until GCE forgets id, so a quota wait would be stuck on the old stockout for an hour.
// The next ID is derived from id and that operation, so every retry that meets the same
// operation moves to the same next ID, and a retry of that request is again recognised.
func nextRequestID(id string, op *computepb.Operation) string {
	return nameUUID(id + " " + op.GetName() + " " + strconv.FormatUint(op.GetId(), 10))
}

// nameUUID is a UUID derived from name by SHA-256. It is laid out as a version-4 UUID
// rather than RFC 9562's version 8 for custom hashes: GCE asks only for "a valid UUID",
// but some Google APIs accept only version 4, and a hash is as unpredictable as the random
// bits version 4 stands for. It is never the zero UUID, which GCE refuses.
func nameUUID(name string) string {
	sum := sha256.Sum256([]byte("proxyfleet gcp request " + name))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
