package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
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
//   - Complete, Release and Extend first read every key and its TTL and
//     check that it is still processing under the claim's token (nothing
//     changes if one is not), then apply the token-checked script to every
//     key. The check and the apply are one round trip apart: when a key is
//     taken over, or forgotten, in that window, or the connection fails
//     mid-way, the keys already applied are put back as the check read
//     them (value and remaining TTL), so the call fails having changed
//     nothing, as on one node. Only a put-back that cannot reach its node
//     leaves a key applied; the error then says so, and the key is one the
//     claim still owned a round trip earlier.

// claimOrdered claims rkeys one call (claimOne) per key in ascending key
// order. It returns a reply as claimScript would for all keys at once.
//
// With WaitReplicas the keys are taken without a WAIT each, and the claim
// is confirmed once it holds them all (see confirm): the WAITs of its
// nodes run at once, not one after the other, and a claim that stops
// (Duplicate, InProgress) waits for none.
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
		stop, err = s.claimOne(ctx, rkeys[i], token, lease, false)
		if err != nil {
			undo := undoOps(token, processingValue(token, ms(lease)), heldKeys)
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
			s.giveBack(ctx, undoOps(token, processingValue(token, ms(lease)), heldKeys), lease)
			return claimReply{}, err
		}
		return claimReply{result: 1, taken: taken}, nil
	}

	// A key is done or held: give back what we took, and find out whether
	// any key of the claim is done (Duplicate beats InProgress, and the
	// data returned is that of the first done key in the claim's order).
	undone := s.giveBackLater(undoOps(token, processingValue(token, ms(lease)), heldKeys), lease)
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

// heldKey is a key a claim in progress took, and what it held before.
type heldKey struct {
	key      string
	prev     prevOf
	tookOver bool
	at       time.Time // when the reply that took it over arrived
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

// runEachNode is runPipelined with one pipeline per node (the node of each
// op's key, in Cluster and Ring), the nodes at once: a node slow to
// answer, or that must be sent a script again (NOSCRIPT), holds up its own
// ops only. The give-backs use it.
func (s *Store) runEachNode(ctx context.Context, ops []op) ([]any, []error) {
	if !s.sharded || len(ops) < 2 {
		return s.runPipelined(ctx, ops)
	}
	groups := map[string][]int{}
	for i, o := range ops {
		addr := s.nodeAddr(ctx, o.firstKey())
		groups[addr] = append(groups[addr], i)
	}
	if len(groups) == 1 {
		return s.runPipelined(ctx, ops)
	}
	vals, errs := make([]any, len(ops)), make([]error, len(ops))
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := make([]op, len(idx))
			for j, i := range idx {
				part[j] = ops[i]
			}
			v, e := s.runPipelined(ctx, part)
			for j, i := range idx {
				vals[i], errs[i] = v[j], e[j]
			}
		}()
	}
	wg.Wait()
	return vals, errs
}

// undoOps returns the ops that undo a claim of heldKeys under token, whose
// records were written as written. A key taken over gets its previous record back, with what was left
// of its TTL when the takeover read it (less the time since, rounded down:
// an expired lease stays expired, and the record is forgotten no sooner
// than it would have been), also when our own record, of a shorter lease,
// has expired meanwhile.
func undoOps(token, written string, heldKeys []heldKey) []op {
	ops := make([]op, len(heldKeys))
	for i, h := range heldKeys {
		if h.tookOver && h.prev.pttl > 0 {
			ops[i] = putBackOp(h.key, written, h.prev.value, h.prev.pttl-time.Since(h.at).Milliseconds())
		} else {
			ops[i] = releaseOp([]string{h.key}, token)
		}
	}
	return ops
}

// undoTimeout bounds the undo of a claim whose caller gave up, and is
// the least time an undo is given (a claim's lease may be shorter than
// a round trip).
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
// different nodes: check every key, then apply key by key, putting back
// the keys applied when another cannot be (see the comment at the top of
// this file).
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
				// (see wait.go): the op refuses again, touching the
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
