package redisstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"
)

// Hooks for the tests in package redisstore_test.

// EncodeKey returns the Redis key of (scope, key).
func (s *Store) EncodeKey(scope, key string) string { return s.encodeKey(scope, key) }

// Prefix is the prefix of the store's keys.
func (s *Store) Prefix() string { return s.cfg.Prefix }

// Sharded reports whether the store uses the one-key-per-script path.
func (s *Store) Sharded() bool { return s.sharded }

// Redirects is how many MOVED and ASK replies the store's waited
// pipelines (WaitReplicas) followed.
func (s *Store) Redirects() int64 { return s.redirects.Load() }

// TokenLen is the length of a claim token.
const TokenLen = tokenLen

// ClaimWithToken claims (scope, keys) as Claim does, with a given
// token, as a retry of a Claim whose reply was lost would, and returns the
// script's result code (1 claimed, 2 duplicate, 3 in progress).
func (s *Store) ClaimWithToken(ctx context.Context, scope string, keys []string, lease time.Duration, token string) (int, error) {
	rkeys, err := s.recordKeys(scope, keys)
	if err != nil {
		return 0, err
	}
	r, err := s.claim(ctx, rkeys, token, lease, "")
	return int(r.result), err
}

// WriteDone writes a done record without data for every key of keys, with
// the same scripts and arguments Claim and Complete use, pipelined: a
// claim op and a complete op per key, in one round trip.
func (s *Store) WriteDone(ctx context.Context, scope string, keys []string, retention time.Duration) error {
	ops := make([]op, 0, 2*len(keys))
	for _, k := range keys {
		rk := []string{s.encodeKey(scope, k)}
		token := rand.Text()
		ops = append(ops, claimOp(rk, token, time.Minute, ""), completeOp(rk, token, retention, nil))
	}
	vals, errs := s.runAll(ctx, ops)
	for i := range ops {
		if errs[i] != nil {
			return errs[i]
		}
		if i%2 == 0 {
			r, err := parseClaim(vals[i])
			if err != nil {
				return err
			}
			if r.result != 1 {
				return fmt.Errorf("key %q: claim result %d", keys[i/2], r.result)
			}
		} else if n, err := parseFenced(vals[i]); err != nil || n >= 0 {
			return fmt.Errorf("key %q: complete: %d %v", keys[i/2], n, err)
		}
	}
	return nil
}

// Queued returns how many calls wait in the queues of the store's lanes.
func (s *Store) Queued() int {
	n := 0
	if s.lane0 != nil {
		n = s.lane0.b.Queued()
	}
	s.lanes.Range(func(_, l any) bool {
		n += l.(*lane).b.Queued()
		return true
	})
	return n
}

// ListCursor returns the List cursor that resumes on the node at addr
// with the keys of pending, then at SCAN cursor scan: what a List
// returns, or what anyone could write.
func ListCursor(addr string, scan uint64, pending ...string) string {
	return listCursor{addr: addr, scan: scan, pending: pending}.String()
}

// GlobEscape makes s match itself in a SCAN MATCH pattern, as the store
// escapes its prefix.
func GlobEscape(s string) string { return globEscape(s) }
