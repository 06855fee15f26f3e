package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
)

// Multi-key operations when the keys of one claim can live on different
// nodes (Redis Cluster, Ring). A script may then touch one key only, so
// Redis cannot make the whole claim atomic; these functions keep the
// contract's outcomes anyway:
//
//   - Claim takes keys one at a time in ascending Redis-key order and, when
//     a key is done or held, puts the ones it took back exactly as they
//     were. No key is ever held by two tokens, the final outcome is
//     all-or-nothing, and the fixed order means that of several claims
//     competing for shared keys at least one gets them all (as ordered
//     locking avoids deadlock). The cost is an extra round trip per extra
//     key, and transient InProgress answers to claims that overlap one
//     under way.
//
//   - Complete, Release and Extend first read every key and check that it
//     is still processing under the claim's token (nothing changes if one
//     is not), then apply the token-checked script to every key. The check
//     and the apply are one round trip apart; only a lease running out in
//     exactly that window (or the connection failing mid-way) can leave
//     some keys applied and others not, which the error then reports. A
//     key left processing expires with its lease and can be taken over:
//     the usual "at most one extra run" of lease mode, never a lost
//     message. The middleware extends leases while a handler runs, so the
//     lease normally has most of its length left when Complete runs.

// claimOrdered claims rkeys one call (claimOne) per key in ascending key
// order. It returns a reply as claimScript would for all keys at once.
func (s *Store) claimOrdered(ctx context.Context, rkeys []string, token string, lease time.Duration) (claimReply, error) {
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
		stop, err = s.claimOne(ctx, rkeys[i], token, lease)
		if err != nil {
			// The key's outcome is unknown: undo it too (the scripts are
			// token-checked, so undoing a key we did not get is a no-op).
			heldKeys = append(heldKeys, heldKey{key: rkeys[i]})
			s.undo(ctx, token, heldKeys)
			return claimReply{}, err
		}
		if stop.result != 1 {
			break
		}
		h := heldKey{key: rkeys[i]}
		for _, p := range stop.taken { // at most one: one key per call
			p.index = i
			taken = append(taken, p)
			h.prev, h.tookOver = p, true
		}
		heldKeys = append(heldKeys, h)
	}
	if stop.result == 1 {
		return claimReply{result: 1, taken: taken}, nil
	}

	// A key is done or held: give back what we took, and find out whether
	// any key of the claim is done (Duplicate beats InProgress, and the
	// data returned is that of the first done key in the claim's order).
	s.undo(ctx, token, heldKeys)
	stop.index = order[len(heldKeys)]
	return s.peekDone(ctx, rkeys, stop)
}

// heldKey is a key a claim in progress took, and what it held before.
type heldKey struct {
	key      string
	prev     prevOf
	tookOver bool
}

// undo puts back the keys of heldKeys that are still ours: a key that was
// free is deleted, a key taken over from an expired lease gets its previous
// record and TTL back. It is best effort; a key it cannot reach stays
// processing under our token and frees itself when the lease runs out.
func (s *Store) undo(ctx context.Context, token string, heldKeys []heldKey) {
	if len(heldKeys) == 0 {
		return
	}
	// A cancelled ctx must not leave keys held that we could still free.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	s.runAll(ctx, undoOps(token, heldKeys))
}

// undoOps returns the ops that undo a claim under token of heldKeys.
func undoOps(token string, heldKeys []heldKey) []op {
	ops := make([]op, len(heldKeys))
	for i, h := range heldKeys {
		if h.tookOver && h.prev.pttl > 0 {
			ops[i] = restoreOp(h.key, token, h.prev.value, h.prev.pttl)
		} else {
			ops[i] = releaseOp([]string{h.key}, token)
		}
	}
	return ops
}

// undoTimeout bounds the undo of a failed multi-key claim in Redis Cluster,
// and of a claim whose caller gave up.
const undoTimeout = 2 * time.Second

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

// fencedSharded runs a token-checked op on several keys that may live on
// different nodes: check every key, then apply key by key (see the comment
// at the top of this file).
func (s *Store) fencedSharded(ctx context.Context, what string, c *stores.Claim, rkeys []string, build func([]string) op) error {
	cmds := s.getAll(ctx, rkeys)
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if errors.Is(err, redis.Nil) {
			return s.lostClaim(what, c, rkeys[i])
		}
		if err != nil {
			return fmt.Errorf("redisstore: %s: %w", what, classify(err))
		}
		rec, err := decodeValue(v)
		if err != nil {
			return err
		}
		if !rec.processing || rec.token != c.Token {
			return s.lostClaim(what, c, rkeys[i])
		}
	}

	ops := make([]op, len(rkeys))
	for i := range rkeys {
		ops[i] = build(rkeys[i : i+1])
	}
	vals, errs := s.runAll(ctx, ops)
	var (
		applied, lost int
		firstErr      error
		lostKey       string
	)
	for i := range ops {
		if errs[i] != nil {
			firstErr = firstNonNil(firstErr, errs[i])
			continue
		}
		idx, err := parseFenced(vals[i])
		switch {
		case err != nil:
			firstErr = firstNonNil(firstErr, err)
		case idx >= 0:
			lost++
			if lostKey == "" {
				lostKey = rkeys[i]
			}
		default:
			applied++
		}
	}
	switch {
	case lost > 0:
		err := s.lostClaim(what, c, lostKey)
		return fmt.Errorf("%w (applied to %d of %d keys: a lease ran out during the call)", err, applied, len(rkeys))
	case firstErr != nil:
		return fmt.Errorf("redisstore: %s: applied to %d of %d keys: %w", what, applied, len(rkeys), classify(firstErr))
	}
	return nil
}

// firstNonNil returns first unless it is nil, else err.
func firstNonNil(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// getAll reads rkeys in one pipeline (split per node by go-redis); each
// command carries its own result or error.
func (s *Store) getAll(ctx context.Context, rkeys []string) []*redis.StringCmd {
	cmds := make([]*redis.StringCmd, len(rkeys))
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range rkeys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	return cmds
}
