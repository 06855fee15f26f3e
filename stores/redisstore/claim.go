package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// Claim implements [stores.Store].
//
// On one node (a *redis.Client, or any client with a Prefix holding a hash
// tag) it is one script, atomic over all keys. A claim of one key is a SET
// NX GET, followed by the claim script only when the key is processing
// (see claimOne).
//
// In Redis Cluster, a claim of several keys claims them one call per key,
// in the order of their Redis keys; a key that is done or held stops the
// claim, and the keys already taken are put back exactly as they were (a
// taken-over expired lease is restored with its remaining TTL). The result
// is all-or-nothing, and no key is ever held by two claims. What it gives up
// is isolation: while a claim is under way, a concurrent claim sharing one
// of its keys may see that key held and get InProgress although the first
// claim then fails too, so both messages are retried later (never lost,
// never run twice). The fixed order makes sure that of two such claims at
// least one wins the keys they share, as with ordered locking.
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	return s.ClaimOwned(ctx, scope, keys, lease, nil)
}

// ClaimOwned implements [stores.OwnerClaimer]: owner follows the lease in
// the processing value (see the value layout).
func (s *Store) ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*stores.Claim, error) {
	rkeys, err := s.recordKeys(scope, keys)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err, s.Capabilities().CheckLease(lease), stores.CheckOwner(owner)); err != nil {
		return nil, fmt.Errorf("redisstore: claim: %w", err)
	}
	token := rand.Text()
	ctx = s.traced(ctx)
	r, err := s.claim(ctx, rkeys, token, lease, ownerSuffix(owner))
	if err != nil {
		return nil, fmt.Errorf("redisstore: claim: %w", s.classifyCall(ctx, s.cutByWait(ctx, err)))
	}
	c := &stores.Claim{Scope: scope, Keys: keys}
	switch r.result {
	case 1:
		c.Result, c.Token, c.Takeover = stores.Claimed, token, len(r.taken) > 0
		for _, p := range r.taken {
			if c.Owner = ownerOf(p.value); c.Owner != nil {
				break
			}
		}
	case 2:
		rec, err := decodeValue(r.value)
		if err != nil {
			return nil, fmt.Errorf("redisstore: claim: %w", err)
		}
		c.Result, c.Data = stores.Duplicate, rec.data
	default:
		c.Result, c.Owner = stores.InProgress, ownerOf(r.value)
	}
	return c, nil
}

// claim claims rkeys under token: one key with claimOne, several with one
// script on one node, or key by key in Redis Cluster (claimOrdered).
// A claim that failed gives back what it took (see giveBack). suffix is
// the owner's (ownerSuffix).
func (s *Store) claim(ctx context.Context, rkeys []string, token string, lease time.Duration, suffix string) (claimReply, error) {
	var (
		r   claimReply
		err error
	)
	switch {
	case len(rkeys) == 1:
		r, err = s.claimOne(ctx, rkeys[0], token, lease, suffix, true)
	case s.sharded:
		return s.claimOrdered(ctx, rkeys, token, lease, suffix) // gives back itself
	default:
		r, err = s.claimScript(ctx, rkeys, token, lease, suffix, true)
	}
	if err != nil {
		s.giveBack(ctx, undoOf(err), lease)
	}
	return r, err
}

func (s *Store) claimScript(ctx context.Context, rkeys []string, token string, lease time.Duration, suffix string, wait bool) (claimReply, error) {
	o := claimOp(rkeys, token, lease, suffix)
	o.nowait = !wait
	v, err := s.run(ctx, o)
	if err != nil {
		return claimReply{}, err
	}
	return parseClaim(v)
}

// claimOne claims one key. It first sends SET key processing NX GET PX
// (Redis 7.0 and later), which settles the two common cases in one plain
// command, cheaper for Redis than a script: the key is free (the SET took
// it: Claimed), or it holds a done record (the SET changed nothing and
// returned it: Duplicate). Only when the key is processing — a lease that
// may have run out, or this very token after a retried claim — does it run
// the claim script, which reads the lease against the key's PTTL. On a
// server older than 7.0, which refuses NX with GET, it goes straight to the
// script from then on. With WaitReplicas, what it writes is confirmed by
// its pipeline's WAIT unless !wait (the caller confirms it).
func (s *Store) claimOne(ctx context.Context, rkey, token string, lease time.Duration, suffix string, wait bool) (claimReply, error) {
	if !s.noSetNXGet.Load() {
		o := claimSetOp(rkey, token, lease, suffix)
		o.nowait = !wait
		v, err := s.run(ctx, o)
		switch {
		case errors.Is(err, redis.Nil):
			return claimReply{result: 1}, nil
		case err == nil:
			if prev, ok := v.(string); ok {
				if rec, err := decodeValue(prev); err == nil && !rec.processing {
					return claimReply{result: 2, value: prev}, nil
				}
			}
			// Processing, or not ours to read: the script decides.
		case isSetNXGetRefused(err):
			s.noSetNXGet.Store(true)
		case isWriteRefused(err):
			// Out of memory (or a replica): writes are refused, reads
			// served. The script reads first, so a done record is still
			// a Duplicate; only a key it must write fails.
		default:
			return claimReply{}, err
		}
	}
	return s.claimScript(ctx, []string{rkey}, token, lease, suffix, wait)
}

// claimOrdered claims rkeys one call (claimOne) per key in ascending key
// order, for keys that may live on different nodes (Redis Cluster, a
// Ring), where a script may touch one key only. It returns a reply as
// claimScript would for all keys at once.
//
// When a key is done or held, it puts the keys it took back exactly as
// they were. No key is ever held by two tokens, the final outcome is
// all-or-nothing, and the fixed order means that of several claims
// competing for shared keys at least one gets them all (as ordered
// locking avoids deadlock). The cost is an extra round trip per extra
// key, and transient InProgress answers to claims that overlap one under
// way.
//
// With WaitReplicas the keys are taken without a WAIT each, and the claim
// is confirmed once it holds them all (see confirm): the WAITs of its
// nodes run at once, not one after the other, and a claim that stops
// (Duplicate, InProgress) waits for none.
func (s *Store) claimOrdered(ctx context.Context, rkeys []string, token string, lease time.Duration, suffix string) (claimReply, error) {
	order := make([]int, len(rkeys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case rkeys[a] < rkeys[b]:
			return -1
		case rkeys[a] > rkeys[b]:
			return 1
		}
		return 0
	})

	var (
		heldKeys []heldKey
		taken    []prevOf
		stop     claimReply
	)
	for _, i := range order {
		var err error
		stop, err = s.claimOne(ctx, rkeys[i], token, lease, suffix, false)
		if err != nil {
			undo := undoOps(token, processingValue(token, ms(lease), suffix), heldKeys)
			if u := undoOf(err); u != nil {
				undo = append(undo, u...) // a claim not replicated
			} else {
				// The key's outcome is unknown: undo it too (the scripts
				// are token-checked, so undoing a key we did not get is
				// a no-op).
				undo = append(undo, releaseOp([]string{rkeys[i]}, token))
			}
			s.giveBack(ctx, undo, lease)
			return claimReply{}, err
		}
		if stop.result != 1 {
			break
		}
		h := heldKey{key: rkeys[i], at: time.Now()}
		for _, p := range stop.taken { // at most one: one key per call
			p.index = i
			taken = append(taken, p)
			h.prev, h.tookOver = p, true
		}
		heldKeys = append(heldKeys, h)
	}
	if stop.result == 1 {
		if err := s.confirm(ctx, heldKeys, token, lease); err != nil {
			s.giveBack(ctx, undoOps(token, processingValue(token, ms(lease), suffix), heldKeys), lease)
			return claimReply{}, err
		}
		return claimReply{result: 1, taken: taken}, nil
	}

	// A key is done or held: give back what we took, and find out whether
	// any key of the claim is done (Duplicate beats InProgress, and the
	// data returned is that of the first done key in the claim's order).
	undone := s.giveBackLater(undoOps(token, processingValue(token, ms(lease), suffix), heldKeys), lease)
	stop.index = order[len(heldKeys)]
	r, err := s.peekDone(ctx, rkeys, stop)
	waitWhile(ctx, undone)
	return r, err
}

// confirm has the replicas of their nodes acknowledge the keys a claim
// took under token (with WaitReplicas; nothing to do without): it writes
// each key's processing record again, checked against the token (an
// Extend of the claim), each node's share followed by its WAIT, the nodes
// at once. A WAIT covers every write its node made before it, the first
// write of the key among them; it must follow a write of its own
// connection (from Redis 7.2 on, a WAIT covers the writes of its own
// connection only), hence the write again. A key no longer ours (a
// failover lost it) fails the claim as not replicated too.
func (s *Store) confirm(ctx context.Context, heldKeys []heldKey, token string, lease time.Duration) error {
	if !s.waiting() {
		return nil
	}
	ops := make([]op, len(heldKeys))
	for i, h := range heldKeys {
		ops[i] = extendOp([]string{h.key}, token, lease)
	}
	vals, errs := s.runAll(ctx, ops)
	var first error
	for i := range ops {
		err := errs[i]
		if err == nil {
			if lost, perr := parseFenced(vals[i]); perr != nil {
				err = perr
			} else if lost >= 0 {
				err = fmt.Errorf("%w: key %q was no longer the claim's when confirmed", ErrNotReplicated, printable(heldKeys[i].key))
			}
		}
		// Another error than not replicated says more (an outage).
		if err != nil && (first == nil || errors.Is(first, ErrNotReplicated)) {
			first = err
		}
	}
	return first
}

// peekDone reads every key of a failed claim and returns Duplicate with the
// first done key's value in the claim's key order, or else stop's result
// (the key that stopped the claim may have expired since).
func (s *Store) peekDone(ctx context.Context, rkeys []string, stop claimReply) (claimReply, error) {
	cmds := s.getAll(ctx, rkeys)
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return claimReply{}, err
		}
		rec, err := decodeValue(v)
		if err != nil {
			return claimReply{}, err
		}
		if !rec.processing {
			return claimReply{result: 2, index: i, value: v}, nil
		}
	}
	return stop, nil
}

// giveBack sends undo, the ops that give back what a failed claim of
// lease took (a key that was free is deleted, a key taken over from an
// expired lease gets its previous record and TTL back), in the
// background, bounded by the lease or by the longest TTL it puts back
// (after them the keys are free anyway), and by undoTimeout at least. It
// waits for them while ctx lasts, so that a caller without a deadline
// finds the keys free when the call returns, and no caller waits past its
// deadline for them. It is best effort: a key it cannot reach stays
// processing under the claim's token, and frees itself when the lease
// runs out.
func (s *Store) giveBack(ctx context.Context, undo []op, lease time.Duration) {
	waitWhile(ctx, s.giveBackLater(undo, lease))
}

// giveBackLater is giveBack without the wait: it returns a channel
// closed once the undo is done (nil when there is none to do, or the
// store is closed).
func (s *Store) giveBackLater(undo []op, lease time.Duration) <-chan struct{} {
	if len(undo) == 0 {
		return nil
	}
	bound := max(lease, undoTimeout)
	for _, o := range undo {
		if o.script == putBackScript {
			if ttl, err := strconv.ParseInt(o.args[2].(string), 10, 64); err == nil {
				bound = max(bound, time.Duration(ttl)*time.Millisecond)
			}
		}
	}
	return s.background(bound, func(ctx context.Context) { s.runEachNode(ctx, undo) })
}
