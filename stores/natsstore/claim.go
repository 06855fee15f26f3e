package natsstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// Claim, and the undo of what a call that failed or gave up had written.
//
// How a claim runs. A claim of one key first tries to create it (a write
// at revision 0): a key never written, the common case of a new message,
// is claimed in one round trip. Otherwise, and for several keys, it reads
// every key, in the caller's order, and answers Duplicate at the first
// live done record and InProgress when a key is processing under a live
// lease, without writing anything. Otherwise it writes a processing
// record under a new token to every key, one key after the other in a
// fixed order (by subject), each write conditional on the revision it
// read. If a write finds its key changed since the read (a concurrent
// claim, complete or release), the keys already written are put back as
// they were, at the revision this claim gave them (a taken-over expired
// lease gets its old owner's record back, so that owner can still
// complete), and the claim starts again from the reads; after 8 such
// rounds it answers InProgress. Undos run within the caller's context;
// what is left when it ends goes on in the background, bounded by 2s,
// until Close.

// Claim implements [stores.Store]. It is all-or-nothing, and no key is
// ever held by two claims: each key is taken by a compare-and-set, and a
// claim that returns Claimed holds every key. What it gives up is
// isolation: a concurrent claim sharing a key may see it held and answer
// InProgress although the first claim then gives the key back (both
// messages are retried later, never lost, never run twice), and under
// concurrent writers a Duplicate's Data is that of the first key seen
// done. A key the claim cannot put back (the connection dropped, or ctx
// ended with a write's outcome unknown) stays processing under a token
// nobody holds until its lease runs out, and is then taken over like the
// key of a crashed consumer.
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	return s.ClaimOwned(ctx, scope, keys, lease, nil)
}

// ClaimOwned implements [stores.OwnerClaimer]: owner follows the token in
// the processing value (see the value layout).
func (s *Store) ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*stores.Claim, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckKeys(keys), s.Capabilities().CheckLease(lease), stores.CheckOwner(owner)); err != nil {
		return nil, fmt.Errorf("natsstore: claim: %w", err)
	}
	recs := s.records(scope, keys)
	c := &stores.Claim{Scope: scope, Keys: slices.Clone(keys)}
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsstore: claim: %w", err)
	}
	defer release()
	if len(recs) == 1 {
		// The common case, a new message: one create, one round trip.
		ok, err := s.claimNew(ctx, cctx, recs[0], lease, owner, c)
		if err != nil {
			return nil, fmt.Errorf("natsstore: claim: %w", s.classify(ctx, cctx, err))
		}
		if ok {
			return c, nil
		}
	}
	for attempt := 1; ; attempt++ {
		res, err := s.claimOnce(ctx, cctx, recs, lease, owner, c)
		if err != nil {
			return nil, fmt.Errorf("natsstore: claim: %w", s.classify(ctx, cctx, err))
		}
		if res || attempt == maxClaimAttempts {
			if !res {
				c.Result = stores.InProgress
			}
			return c, nil
		}
	}
}

// claimNew claims r if it has never been written (or MaxAge removed
// its last message): a write at revision 0, the KV create. It reports
// false, having written nothing, when the key has a message (a record or
// a purge marker): the claim then reads it.
func (s *Store) claimNew(ctx, cctx context.Context, r record, lease time.Duration, owner []byte, c *stores.Claim) (bool, error) {
	token := newToken()
	_, err := s.write(cctx, r, processingValue(addNanos(s.clock.Now().UnixNano(), lease), token, owner), 0, keepProcessing(lease))
	switch {
	case err == nil:
		c.Result, c.Token = stores.Claimed, token
		return true, nil
	case isConflict(err):
		return false, nil
	}
	s.undo(ctx, []undoItem{{rec: r, token: token}}) // the outcome is unknown
	return false, err
}

// claimOnce runs one round of Claim. It reports false, with c
// unchanged, when a write found its key changed since the read and the
// claim must start again. owner is kept with the records it writes; c's
// Owner is the first held record's (InProgress) or the first taken over
// record's (a takeover) that keeps one.
func (s *Store) claimOnce(ctx, cctx context.Context, recs []record, lease time.Duration, owner []byte, c *stores.Claim) (bool, error) {
	now := s.clock.Now().UnixNano()
	entries := make([]entry, len(recs))
	live, takeover := false, false
	var held, expired []byte
	for i, r := range recs {
		e, err := s.read(cctx, r)
		if err != nil {
			return false, err
		}
		switch {
		case e.state == stateDone && e.at > now:
			c.Result, c.Data = stores.Duplicate, e.data
			return true, nil
		case e.state == stateProcessing && e.at > now:
			live = true
			if held == nil {
				held = e.owner
			}
		case e.state == stateProcessing:
			takeover = true
			if expired == nil {
				expired = e.owner
			}
		}
		entries[i] = e
	}
	if live {
		c.Result, c.Owner = stores.InProgress, held
		return true, nil
	}
	token := newToken()
	value := processingValue(addNanos(now, lease), token, owner)
	var undo []undoItem
	for n, i := range writeOrder(recs) {
		rev, err := s.write(cctx, recs[i], value, entries[i].rev, keepProcessing(lease))
		if err != nil {
			if !isConflict(err) {
				// The outcome of this write is unknown: undo finds out.
				undo = append(undo, undoItem{rec: recs[i], prev: entries[i], token: token})
			}
			s.undo(ctx, undo)
			if isConflict(err) {
				return false, nil
			}
			return false, err
		}
		undo = append(undo, undoItem{rec: recs[i], prev: entries[i], rev: rev})
		if s.testAfterWrite != nil && n < len(recs)-1 {
			s.testAfterWrite("claim", n)
		}
	}
	c.Result, c.Token, c.Takeover, c.Owner = stores.Claimed, token, takeover, expired
	return true, nil
}

// keepProcessing is how long a processing record of lease must stay:
// its lease, and one more after it ran out, so that a takeover then is
// reported as one (Claim.Takeover).
func keepProcessing(lease time.Duration) time.Duration { return 2 * lease }

// undoItem is a write to take back: put prev back under rec, at rev, the
// revision the write made, or when rev is 0 (the write's outcome is
// unknown) at the revision found, if the key holds token.
type undoItem struct {
	rec   record
	prev  entry
	rev   uint64
	token string
}

// undo puts back what items wrote, last first. It runs at once while
// the caller is there, within the caller's context: a call never
// outlives its context to give back its writes. What is left when the
// caller's context ends (or when it had ended already) goes on in the
// background, until Close. Either way it is bounded by undoTimeout. A
// key that changed again since is left alone: it is someone else's now.
func (s *Store) undo(ctx context.Context, items []undoItem) {
	if len(items) == 0 {
		return
	}
	if ctx.Err() == nil {
		uctx, cancel := context.WithTimeout(ctx, undoTimeout)
		items = s.undoNow(uctx, items)
		cancel()
		if len(items) == 0 || ctx.Err() == nil {
			return // done, or out of time with the caller still there
		}
	}
	s.bgMu.Lock()
	if s.bgStopped {
		s.bgMu.Unlock()
		return // closed: the leases will run out
	}
	s.bg.Add(1)
	s.bgMu.Unlock()
	go func() {
		defer s.bg.Done()
		uctx, cancel := context.WithTimeout(s.bgCtx, undoTimeout)
		defer cancel()
		s.undoNow(uctx, items)
	}()
}

// undoNow puts back what items wrote, last first, and returns the items
// it did not get to, or did not finish, when ctx ended: putting one
// back again is safe (each write is conditional on the revision, so one
// that landed makes its retry a no-op).
func (s *Store) undoNow(ctx context.Context, items []undoItem) []undoItem {
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return nil // the connection is down: the leases will run out
	}
	defer release()
	for i := len(items) - 1; i >= 0; i-- {
		if ctx.Err() != nil {
			return items[:i+1]
		}
		it := items[i]
		rev := it.rev
		if rev == 0 {
			e, err := s.read(cctx, it.rec)
			if err != nil && ctx.Err() != nil {
				return items[:i+1]
			}
			if err != nil || e.state != stateProcessing || e.token != it.token {
				continue
			}
			rev = e.rev
		}
		var value []byte // none: a purge marker
		var keep time.Duration
		if it.prev.state == stateProcessing {
			// Its lease is not in the record: MaxLease bounds it.
			value = it.prev.raw
			keep = min(max(time.Duration(it.prev.at-s.clock.Now().UnixNano()), 0), maxTTL) + s.cfg.MaxLease
		}
		if _, err := s.write(cctx, it.rec, value, rev, keep); err != nil && ctx.Err() != nil {
			return items[:i+1]
		}
	}
	return nil
}
