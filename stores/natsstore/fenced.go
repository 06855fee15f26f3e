package natsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The fenced calls: Complete, Release and Extend, which rewrite a claim's
// records only at the revisions at which they read them processing under
// the claim's token.

// Complete implements [stores.Store]. See fenced for how a claim of
// several keys is completed.
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckClaim(c), s.Capabilities().CheckRetention(retention),
		s.Capabilities().CheckData(data)); err != nil {
		return fmt.Errorf("natsstore: complete: %w", err)
	}
	by := completedBy(c.Token, subjects(s.records(c.Scope, c.Keys)))
	return s.fenced(ctx, "complete", c, retention, func(now int64, _ []byte) []byte { return doneValue(addNanos(now, retention), by, data) })
}

// Release implements [stores.Store]. The records become KV purge
// markers, which the bucket's MaxAge removes.
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckClaim(c)); err != nil {
		return fmt.Errorf("natsstore: release: %w", err)
	}
	return s.fenced(ctx, "release", c, 0, func(int64, []byte) []byte { return nil })
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckClaim(c), s.Capabilities().CheckLease(lease)); err != nil {
		return fmt.Errorf("natsstore: extend: %w", err)
	}
	return s.fenced(ctx, "extend", c, keepProcessing(lease), func(now int64, owner []byte) []byte {
		return processingValue(addNanos(now, lease), c.Token, owner)
	})
}

// fenced runs Complete, Release or Extend: it reads every key of c and
// fails with ErrLostClaim, writing nothing, unless each is processing
// under c's token (whether or not its lease ran out); then it writes the
// new value (nil: a purge marker) to each key in the fixed order, each
// write conditional on the revision read, to be kept for keep (see
// Store.write).
//
// While the claim's lease is live no other claim writes its keys, so
// the writes all succeed: the call is all-or-nothing. A connection lost
// between two writes leaves the call half done (the keys cannot be put
// back without it) and fails it as an outage; a Complete retried then
// finds the keys it completed (done by this claim's token, see
// completedBy) and completes the rest. If a write finds
// its key changed (the lease ran out and another claim took that key
// over between the read and the write, or an operator deleted it), the
// keys already written are put back to this claim's processing record
// and the call fails with ErrLostClaim; meanwhile a Claim of such a key
// may have seen it done (Complete: the handler did run) or free. A key
// changed by another call of the same claim (an Extend beside a
// Complete) is still the claim's: the call is tried again. Within the
// process, the fenced calls of one claim run one at a time (see
// claimLocks).
func (s *Store) fenced(ctx context.Context, op string, c *stores.Claim, keep time.Duration, value func(now int64, owner []byte) []byte) error {
	unlock, err := s.claimLocks.lock(ctx, c.Token)
	if err != nil {
		return fmt.Errorf("natsstore: %s: waiting for the claim's other call: %w", op, err)
	}
	defer unlock()
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return fmt.Errorf("natsstore: %s: %w", op, err)
	}
	defer release()
	wait := inFlightWait
	var waitUntil time.Time // of a call whose context has no deadline
	if _, ok := cctx.Deadline(); !ok {
		waitUntil = time.Now().Add(defaultRequestTimeout)
	}
	for attempt := 1; ; {
		err := s.fencedOnce(ctx, cctx, op, c, keep, value)
		switch {
		case errors.Is(err, errInFlight) && !waitUntil.IsZero() && time.Now().After(waitUntil):
			// As a request nats.go times out: the stream does not apply
			// the writes it took (a lost quorum).
			return fmt.Errorf("natsstore: %s: %w: a write of a key of the claim stayed in flight for %s", op, stores.ErrUnavailable, defaultRequestTimeout)
		case errors.Is(err, errInFlight):
			// Not the claim's own race: wait for the write in flight,
			// within the call's context.
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-cctx.Done():
				t.Stop()
				return fmt.Errorf("natsstore: %s: %w", op, s.classify(ctx, cctx, context.Cause(cctx)))
			}
			wait = min(2*wait, maxInFlightWait)
			continue
		case !errors.Is(err, errOwnRace):
			return err
		case attempt == maxOwnRaces:
			return fmt.Errorf("natsstore: %s: %w: the claim's own calls changed its keys %d times in a row", op, stores.ErrLostClaim, attempt)
		}
		attempt++
	}
}

// errInFlight is a write of fencedOnce refused as a conflict although
// its key did not change: a replicated stream (nats-server 2.11 and
// later) refuses a conditional write of a key while an earlier write of
// that key is proposed and not yet applied (the claim's own write whose
// outcome was unknown, during a leader election or a lost quorum). The
// call waits and tries again until its context ends (without a deadline,
// for defaultRequestTimeout: then it fails as an outage, as a request
// nats.go timed out does).
var errInFlight = errors.New("natsstore: a write of the key is in flight")

// inFlightWait is the first wait after errInFlight, doubled after each
// up to maxInFlightWait.
const (
	inFlightWait    = 20 * time.Millisecond
	maxInFlightWait = 500 * time.Millisecond
)

// errOwnRace is a write of fencedOnce that found its key changed by
// another call of the same claim (a heartbeat's Extend beside the
// Complete): the key is still the claim's, and the call is tried again.
var errOwnRace = errors.New("natsstore: the key was rewritten by another call of the same claim")

// maxOwnRaces bounds the attempts of a fenced call whose claim's other
// calls keep rewriting its keys.
const maxOwnRaces = 10

// fencedOnce is one attempt of fenced.
func (s *Store) fencedOnce(ctx, cctx context.Context, op string, c *stores.Claim, keep time.Duration, value func(now int64, owner []byte) []byte) error {
	recs := s.records(c.Scope, c.Keys)
	entries := make([]entry, len(recs))
	// ours: keys an earlier attempt of this Complete has completed (it was
	// cut before it wrote them all).
	ours := make([]bool, len(recs))
	nOurs := 0
	by := completedBy(c.Token, subjects(recs))
	for i, r := range recs {
		e, err := s.read(cctx, r)
		if err != nil {
			return fmt.Errorf("natsstore: %s: %w", op, s.classify(ctx, cctx, err))
		}
		if op == "complete" && e.state == stateDone && e.by == by {
			ours[i] = true
			nOurs++
			continue
		}
		if e.state != stateProcessing || e.token != c.Token {
			return fmt.Errorf("natsstore: %s: %w: key %d of the claim is %s", op, stores.ErrLostClaim, i, describe(e, c.Token))
		}
		entries[i] = e
	}
	if nOurs == len(recs) {
		return fmt.Errorf("natsstore: %s: %w: the claim is completed already", op, stores.ErrLostClaim)
	}
	// The owner the claim keeps (the same on every key it wrote), for an
	// Extend to keep.
	var owner []byte
	for i := range entries {
		if !ours[i] {
			owner = entries[i].owner
			break
		}
	}
	v := value(s.clock.Now().UnixNano(), owner)
	var undo []undoItem
	for n, i := range writeOrder(recs) {
		if ours[i] {
			continue
		}
		rev, err := s.write(cctx, recs[i], v, entries[i].rev, keep)
		if err != nil {
			// Put the keys already written back to this claim's
			// processing records, so that a retry of the call can
			// succeed. A write whose outcome is unknown is left as it
			// is: if it landed, the key is this call's (done, released
			// or extended), and a retry fails with ErrLostClaim, which
			// the middleware reconciles by claiming again.
			s.undo(ctx, undo)
			if isConflict(err) {
				// Changed by this claim's own call (an Extend beside
				// this Complete) when the key is still processing under
				// the claim's token: the claim still owns it.
				if e, rerr := s.read(cctx, recs[i]); rerr == nil && e.state == stateProcessing && e.token == c.Token {
					if e.rev == entries[i].rev {
						return errInFlight
					}
					return errOwnRace
				}
				return fmt.Errorf("natsstore: %s: %w: a key of the claim changed under it", op, stores.ErrLostClaim)
			}
			return fmt.Errorf("natsstore: %s: %w", op, s.classify(ctx, cctx, err))
		}
		undo = append(undo, undoItem{rec: recs[i], prev: entries[i], rev: rev})
		if s.testAfterWrite != nil && n < len(recs)-1 {
			s.testAfterWrite(op, n)
		}
	}
	return nil
}

func describe(e entry, token string) string {
	switch {
	case e.state == stateNone:
		return "gone"
	case e.state == stateDone:
		return "done"
	case e.token != token:
		return "held by another claim"
	}
	return "processing"
}
