package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// Complete implements [stores.Store]. A record whose lease ran out but that
// nobody took over yet is still the claim's: a slow handler finishing just
// after its lease completes fine, for up to one more lease length.
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	rkeys, err := s.claimKeys(ctx, c, errors.Join(s.Capabilities().CheckRetention(retention), s.checkData(data)))
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	err = s.fenced(ctx, "complete", c, rkeys, func(keys []string) op {
		return completeOp(keys, c.Token, retention, data)
	})
	return s.tooLargeAfter(ctx, data, err)
}

// Release implements [stores.Store].
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	rkeys, err := s.claimKeys(ctx, c, nil)
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	return s.fenced(ctx, "release", c, rkeys, func(keys []string) op {
		return releaseOp(keys, c.Token)
	})
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	rkeys, err := s.claimKeys(ctx, c, s.Capabilities().CheckLease(lease))
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	return s.fenced(ctx, "extend", c, rkeys, func(keys []string) op {
		return extendOp(keys, c.Token, lease)
	})
}

// claimKeys checks a call on claim c whose other argument's check is arg
// (see storekit.CheckCall), and returns c's record keys.
func (s *Store) claimKeys(ctx context.Context, c *stores.Claim, arg error) ([]string, error) {
	var rkeys []string
	err := storekit.CheckClaim(c)
	if err == nil && len(c.Token) != tokenLen {
		err = fmt.Errorf("%w: not a Claimed claim of a redisstore", stores.ErrInvalidArgument)
	}
	if err == nil {
		if rkeys, err = s.recordKeys(c.Scope, c.Keys); err != nil {
			err = fmt.Errorf("%w: the claim's keys are invalid: %w", stores.ErrInvalidArgument, err)
		}
	}
	return rkeys, storekit.CheckCall(ctx, s.closed.Load(), err, arg)
}

// fenced runs the token-checked op that build makes for rkeys: as one
// script on one node, or key by key in Redis Cluster (see fencedSharded).
func (s *Store) fenced(ctx context.Context, what string, c *stores.Claim, rkeys []string, build func([]string) op) error {
	ctx = s.traced(ctx)
	if s.waiting() {
		// A refusal is confirmed by the WAIT too (see op.touching).
		untouched := build
		build = func(keys []string) op { return untouched(keys).touching() }
	}
	if s.sharded && len(rkeys) > 1 {
		return s.fencedSharded(ctx, what, c, rkeys, build)
	}
	v, err := s.run(ctx, build(rkeys))
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", what, s.classifyCall(ctx, s.cutByWait(ctx, err)))
	}
	lost, err := parseFenced(v)
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", what, err)
	}
	if lost >= 0 {
		return s.lostClaim(what, c, rkeys[lost])
	}
	return nil
}

// checkData refuses data above MaxData, or above what a node
// CheckServer read would take.
func (s *Store) checkData(data []byte) error {
	return storekit.CheckData(s.Capabilities(), data, s.serverMaxData.Load(), "its proto-max-bulk-len is below Config.MaxData")
}

// lostClaim builds the ErrLostClaim error for the record key rkey of c.
func (s *Store) lostClaim(what string, c *stores.Claim, rkey string) error {
	for _, k := range c.Keys {
		if s.encodeKey(c.Scope, k) == rkey {
			return fmt.Errorf("redisstore: %s: %w: scope %q key %q", what, stores.ErrLostClaim, c.Scope, k)
		}
	}
	return fmt.Errorf("redisstore: %s: %w: scope %q", what, stores.ErrLostClaim, c.Scope)
}

// fencedSharded runs a token-checked op on several keys that may live on
// different nodes (Redis Cluster, a Ring), where a script may touch one
// key only, so Redis cannot make the call atomic; it keeps the
// contract's outcomes anyway. It first reads every key and its TTL and
// checks that it is still processing under the claim's token (nothing
// changes if one is not), then applies the token-checked script to every
// key. The check and the apply are one round trip apart: when a key is
// taken over, or forgotten, in that window, or the connection fails
// mid-way, the keys already applied are put back as the check read them
// (value and remaining TTL), so the call fails having changed nothing, as
// on one node. Only a put-back that cannot reach its node leaves a key
// applied; the error then says so, and the key is one the claim still
// owned a round trip earlier.
//
// A Complete is not put back when it fails otherwise than by a lost key:
// it writes each done record tagged with completedBy of the claim, and
// fails with the error, the keys it completed left done; a retry of the
// same claim's Complete takes those keys for its own (confirming them with
// WAIT, with WaitReplicas) and completes the rest. So a Complete cut
// part-way (a node failing over, a write sent again by go-redis that finds
// its key done already) never returns nil while a key is still processing,
// and never ErrLostClaim for a key it completed itself.
func (s *Store) fencedSharded(ctx context.Context, what string, c *stores.Claim, rkeys []string, build func([]string) op) error {
	complete := what == "complete"
	var by string
	if complete {
		by = completedBy(c.Token, rkeys)
		untagged := build
		build = func(keys []string) op { return untagged(keys).doneBy(by) }
	}
	snaps, err := s.snapshot(ctx, rkeys)
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", what, s.classifyCall(ctx, s.cutByWait(ctx, err)))
	}
	var (
		apply []int // processing under the claim's token
		ours  []int // completed by an earlier attempt of this Complete
	)
	for i, sn := range snaps {
		if !sn.exists {
			return s.lostClaim(what, c, rkeys[i])
		}
		rec, err := decodeValue(sn.value)
		if err != nil {
			return err
		}
		switch {
		case rec.processing && rec.token == c.Token:
			apply = append(apply, i)
		case complete && !rec.processing && rec.by == by:
			ours = append(ours, i)
		default:
			if s.waiting() {
				// Confirm the refusal as one node's fenced call would
				// (see op.touching): the op refuses again, touching the
				// record, and its WAIT covers what the check read.
				if _, errs := s.runAll(ctx, []op{build(rkeys[i : i+1])}); errs[0] != nil {
					return fmt.Errorf("redisstore: %s: %w", what, s.classifyCall(ctx, s.cutByWait(ctx, errs[0])))
				}
			}
			return s.lostClaim(what, c, rkeys[i])
		}
	}

	// With WaitReplicas the keys completed earlier are confirmed too: the
	// op refuses them, touching each, and its WAIT covers the record.
	send := apply
	if s.waiting() {
		send = append(slices.Clip(apply), ours...)
	}
	completedAlready := func() error {
		return fmt.Errorf("redisstore: %s: %w: scope %q: the claim is completed already", what, stores.ErrLostClaim, c.Scope)
	}
	if len(send) == 0 {
		return completedAlready()
	}
	ops := make([]op, len(rkeys))
	sent := make([]op, len(send))
	for j, i := range send {
		ops[i] = build(rkeys[i : i+1])
		sent[j] = ops[i]
	}
	vals, errs := s.runAll(ctx, sent)
	var (
		touched  []int // applied, or maybe (an error): to put back on failure
		refused  []int // refused: completed by this claim already, or lost
		lost     = -1
		firstErr error
	)
	for j, i := range send {
		if errs[j] != nil {
			firstErr = firstNonNil(firstErr, errs[j])
			touched = append(touched, i)
			continue
		}
		idx, err := parseFenced(vals[j])
		switch {
		case err != nil:
			firstErr = firstNonNil(firstErr, err)
		case j >= len(apply):
			// A key completed earlier, confirmed.
		case idx >= 0:
			refused = append(refused, i)
		default:
			touched = append(touched, i)
		}
	}
	if complete && len(refused) > 0 {
		// A write sent again (its reply lost) finds its own record.
		refused, err = s.notOurs(ctx, rkeys, refused, by)
		firstErr = firstNonNil(firstErr, err)
	}
	if len(refused) > 0 {
		lost = refused[0]
	}
	switch {
	case lost < 0 && firstErr == nil && len(apply) == 0:
		return completedAlready()
	case lost < 0 && firstErr == nil:
		return nil
	}
	if lost < 0 && complete {
		return fmt.Errorf("redisstore: %s: %w (the keys completed are kept: a retry completes the rest)", what, s.classifyCall(ctx, s.cutByWait(ctx, firstErr)))
	}
	undoErr := s.putBack(ctx, rkeys, ops, snaps, touched)
	if lost >= 0 {
		err = s.lostClaim(what, c, rkeys[lost])
	} else {
		err = fmt.Errorf("redisstore: %s: %w", what, s.classifyCall(ctx, s.cutByWait(ctx, firstErr)))
	}
	if undoErr != nil {
		return fmt.Errorf("%w (and %d of %d keys applied could not be put back: %w)", err, len(touched), len(rkeys), s.classify(undoErr))
	}
	return err
}

// notOurs returns the keys of refused (indexes into rkeys) that do not
// hold a done record of by, read now; an error when they cannot be read.
func (s *Store) notOurs(ctx context.Context, rkeys []string, refused []int, by string) ([]int, error) {
	keys := make([]string, len(refused))
	for j, i := range refused {
		keys[j] = rkeys[i]
	}
	var lost []int
	for j, cmd := range s.getAll(ctx, keys) {
		v, err := cmd.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		if rec, derr := decodeValue(v); err != nil || derr != nil || rec.processing || rec.by != by {
			lost = append(lost, refused[j])
		}
	}
	return lost, nil
}

// snap is a key as fencedSharded's check read it.
type snap struct {
	exists bool
	value  string
	pttl   int64     // ms
	at     time.Time // when the reply arrived
}

// snapshot reads the value and the TTL of every key, a pipeline per node.
func (s *Store) snapshot(ctx context.Context, rkeys []string) ([]snap, error) {
	gets := make([]*redis.StringCmd, len(rkeys))
	ttls := make([]*redis.Cmd, len(rkeys))
	watch := s.watchKeys(ctx, rkeys)
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range rkeys {
			gets[i] = p.Get(ctx, k)
			// Raw milliseconds: PTTL as a time.Duration overflows for a
			// record of the longest lease (2 x 292 years).
			ttls[i] = p.Do(ctx, "pttl", k)
		}
		return nil
	})
	at := time.Now()
	snaps := make([]snap, len(rkeys))
	for i := range rkeys {
		v, err := gets[i].Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err == nil {
			_, err = ttls[i].Int64()
		}
		if err != nil {
			readFailed(ctx, watch, i, err)
			return nil, err
		}
		ttl, _ := ttls[i].Int64()
		if ttl <= 0 { // gone between the GET and the PTTL
			continue
		}
		snaps[i] = snap{exists: true, value: v, pttl: ttl, at: at}
	}
	return snaps, nil
}

// getAll reads rkeys in one pipeline (split per node by go-redis); each
// command carries its own result or error. A read cut short while WAITs
// held its node up marks the call of ctx held (see readFailed).
func (s *Store) getAll(ctx context.Context, rkeys []string) []*redis.StringCmd {
	cmds := make([]*redis.StringCmd, len(rkeys))
	watch := s.watchKeys(ctx, rkeys)
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range rkeys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	for i, cmd := range cmds {
		readFailed(ctx, watch, i, cmd.Err())
	}
	return cmds
}

// putBack undoes the ops of the keys at touched: each gets the value and
// what is left of the TTL it had at its snapshot, if it still holds what
// its op wrote (or nothing). As giveBack does, it runs in the background,
// bounded by the longest of those TTLs (the records put back have expired
// after it), and by undoTimeout at least, and the caller waits for it
// while ctx lasts; it returns the first error of a put-back that ended
// meanwhile.
func (s *Store) putBack(ctx context.Context, rkeys []string, ops []op, snaps []snap, touched []int) error {
	if len(touched) == 0 {
		return nil
	}
	undo := make([]op, len(touched))
	ttl := undoTimeout.Milliseconds()
	for j, i := range touched {
		written := "" // a delete
		if ops[i].script == setScript {
			written = ops[i].args[1].(string)
			if written[0] == processingID {
				// An Extend: its script kept the record's owner.
				written += ownerSuffix(ownerOf(snaps[i].value))
			}
		}
		undo[j] = putBackOp(rkeys[i], written, snaps[i].value, snaps[i].pttl-time.Since(snaps[i].at).Milliseconds())
		ttl = max(ttl, snaps[i].pttl)
	}
	var first error
	done := s.background(time.Duration(ttl)*time.Millisecond, func(ctx context.Context) {
		_, errs := s.runEachNode(ctx, undo)
		for _, err := range errs {
			first = firstNonNil(first, err)
		}
	})
	if done == nil {
		return stores.ErrClosed
	}
	select {
	case <-done:
		return first
	case <-ctx.Done():
		return nil // still under way
	}
}

// firstNonNil returns first unless it is nil, else err.
func firstNonNil(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
