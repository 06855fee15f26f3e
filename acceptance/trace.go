package acceptance

import (
	"strconv"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// storeOp names a store call that the probe store traces.
type storeOp string

const (
	opClaim    storeOp = "claim"    // Store.Claim
	opBegin    storeOp = "begin"    // Inbox.Begin
	opExtend   storeOp = "extend"   // Store.Extend
	opComplete storeOp = "complete" // Store.Complete
	opCommit   storeOp = "commit"   // InboxTx.Commit
)

// storeCall is one store call of a delivery, as the probe store saw it.
// The store acted at some instant between sent and returned: the two
// bound the store's own time of the call from both sides.
type storeCall struct {
	op       storeOp
	delivery string // the delivery's key (consumer/id)
	event    string
	// err: the call failed. Otherwise, for a claim or a begin, result is
	// what the store answered and takeover its Claim.Takeover.
	err      bool
	result   stores.Result
	takeover bool
	// again: a claim by a delivery that had claimed the keys already (the
	// middleware's reconcile after a refused Complete), not a claim that
	// starts a delivery.
	again bool
	// cancelled: the call failed because the delivery's context ended
	// while the store had it (a router closing): the store may have acted
	// on it all the same.
	cancelled      bool
	sent, returned time.Time
}

// claimed reports whether c is a claim or begin that started its delivery
// and won the keys.
func (c storeCall) claimed() bool {
	return (c.op == opClaim || c.op == opBegin) && !c.err && !c.again && c.result == stores.Claimed
}

// clockSlack bounds how much shorter or longer than the probe's bounds
// an interval may be as a store measured it: a store's clock ticks within
// a call (redisstore keeps the millisecond, sqlstore the microsecond), and
// a store reading the wall clock may see it slewed against the monotonic
// clock of the probe (NTP slews by up to 0.05%, 5ms over 10s).
const clockSlack = 10 * time.Millisecond

// surelyWithin reports whether the store saw later no more than d after
// earlier (both calls traced, earlier returned before later was sent):
// the interval the store measured between them is at most
// later.returned - earlier.sent, give or take clockSlack.
func surelyWithin(earlier, later storeCall, d time.Duration) bool {
	return later.returned.Sub(earlier.sent) <= d-clockSlack
}

// surelyAfter reports whether the store saw later more than d after
// earlier: the interval the store measured between them is at least
// later.sent - earlier.returned, give or take clockSlack.
func surelyAfter(earlier, later storeCall, d time.Duration) bool {
	return later.sent.Sub(earlier.returned) > d+clockSlack
}

// calls returns the store calls traced so far, in the order they returned
// (for a child process, the order its reports were read).
func (r *run) calls() []storeCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]storeCall(nil), r.callLog...)
}

// traced records c.
func (r *run) traced(c storeCall) {
	r.mu.Lock()
	r.callLog = append(r.callLog, c)
	r.mu.Unlock()
}

// callOf returns the winning claim or begin of delivery, if any.
func callOf(calls []storeCall, delivery string) (storeCall, int, bool) {
	for i, c := range calls {
		if c.delivery == delivery && c.claimed() {
			return c, i, true
		}
	}
	return storeCall{}, -1, false
}

// lastLease returns the call that gave the claim of calls[i] its last
// lease: the claim itself or the latest Extend of its delivery that
// succeeded.
func lastLease(calls []storeCall, i int) storeCall {
	last := calls[i]
	for _, c := range calls {
		if c.delivery == last.delivery && c.op == opExtend && !c.err && c.sent.After(last.sent) {
			last = c
		}
	}
	return last
}

// replacement returns the first winning claim of event, after calls[i],
// by another delivery than calls[i]'s: the claim that replaced the record
// of calls[i].
func replacement(calls []storeCall, i int) (storeCall, bool) {
	for _, c := range calls[i+1:] {
		if c.event == calls[i].event && c.delivery != calls[i].delivery && c.claimed() {
			return c, true
		}
	}
	return storeCall{}, false
}

// traceLine is the report line of c for a child's pipe ("T ...").
func traceLine(id string, c storeCall) []string {
	return []string{"T", id, c.event, string(c.op), strconv.FormatBool(c.err), strconv.Itoa(int(c.result)),
		strconv.FormatBool(c.takeover), strconv.FormatBool(c.again),
		strconv.FormatInt(c.sent.UnixNano(), 10), strconv.FormatInt(c.returned.UnixNano(), 10),
		strconv.FormatBool(c.cancelled)}
}

// traceFields is the number of fields of a "T" line.
const traceFields = 11

// parseTrace reads a "T" line written by traceLine; f[1] is the delivery
// id, which the caller turns into the delivery key.
func parseTrace(delivery string, f []string) storeCall {
	at := func(s string) time.Time {
		n, _ := strconv.ParseInt(s, 10, 64)
		return time.Unix(0, n)
	}
	res, _ := strconv.Atoi(f[5])
	return storeCall{
		op:        storeOp(f[3]),
		delivery:  delivery,
		event:     f[2],
		err:       f[4] == "true",
		result:    stores.Result(res),
		takeover:  f[6] == "true",
		again:     f[7] == "true",
		sent:      at(f[8]),
		returned:  at(f[9]),
		cancelled: f[10] == "true",
	}
}
