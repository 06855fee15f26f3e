package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
)

// traced returns ctx carrying a waitTrace for the store call it is the
// context of (with WaitReplicas).
func (s *Store) traced(ctx context.Context) context.Context {
	if !s.waiting() {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, new(waitTrace))
}

// wrote reports whether the answer v, err of o rests on a write the
// WAIT must confirm: a claim that took its keys, a fenced call that
// applied or (touching) was refused, a put-back that put back.
//
// A call whose answer rests on a write — a Claim that claimed, a fenced
// call that applied — succeeds only when its pipeline's WAIT saw at
// least WaitReplicas replicas. A fenced call refused (ErrLostClaim) is
// confirmed too: its script writes the refusing record's expiry again
// (unchanged) before refusing, so that the WAIT covers the record it
// read. That matters for a Complete retried after ErrNotReplicated: its
// first attempt may have landed, unconfirmed, on a master about to lose
// it in a failover; the retry on that master finds the record done and
// is refused, and the middleware then claims again and takes the
// Duplicate for "recorded". Confirming the refusal keeps that from
// acknowledging a record the replicas do not have. Claims answering
// Duplicate or InProgress wrote nothing, and their answers are not held
// to the WAIT. A multi-key claim in Cluster takes its keys one by one
// without a WAIT, and once it holds them all writes each again (checked
// against its token) with a WAIT per node, the nodes at once (see
// confirm): its WAITs do not add up, and a claim that stops waits for
// none.
func wrote(o op, v any, err error) bool {
	switch o.script {
	case nil: // claimSetOp: redis.Nil when the SET took the key
		return errors.Is(err, redis.Nil)
	case claimScript:
		r, perr := parseClaim(v)
		return err == nil && perr == nil && r.result == 1
	case setScript, delScript:
		return err == nil
	case putBackScript:
		n, ok := v.(int64)
		return err == nil && ok && n == 0
	}
	return false
}

// redirect is an op a node answered with MOVED or ASK.
type redirect struct {
	i    int
	key  string
	ask  bool
	addr string
	err  error
}

// isRedirect parses a MOVED or ASK reply.
func isRedirect(err error) (ask bool, addr string, ok bool) {
	var re redis.Error
	if !errors.As(err, &re) {
		return false, "", false
	}
	f := strings.Fields(re.Error())
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return false, "", false
	}
	return f[0] == "ASK", f[2], true
}

// runWaited sends ops, grouped by the node that serves them, as one
// pipeline per node that ends with WAIT, and returns each op's reply and
// error; an op whose answer rests on a write (see wrote) that the WAIT
// did not confirm fails with ErrNotReplicated instead, and a claim among
// them is given back. Ops a node redirects (MOVED, ASK) go again, with
// their own WAIT, to the node named, up to the ClusterClient's
// MaxRedirects times; NOSCRIPT replies go again with EVAL.
//
// With Config.WaitReplicas, acknowledged means replicated.
//
// Redis replicates asynchronously: a master answers a write before any
// replica has it, and a failover that promotes a replica which had not
// received it loses the write although the client was told it
// succeeded. WAIT numreplicas timeout blocks the client's connection
// until the replicas have acknowledged every write the connection made
// before it (its last write's replication offset, and so everything the
// master wrote up to there, whoever wrote it), or the timeout passes,
// and answers how many replicas did. It cannot run in a script, and it
// counts the writes of its own connection only: it must follow the
// writes on the connection that carried them. A ClusterClient pipeline
// sends a keyless command to whichever node it likes, and a write
// redirected by MOVED to another node, so with WaitReplicas the store
// groups its ops by node itself and sends each group, then one WAIT,
// as one pipeline on that node's client (the ClusterClient's own client
// for the node: same pool, same options), following MOVED and ASK
// itself.
func (s *Store) runWaited(ctx context.Context, ops []op, deadline time.Time) ([]any, []error) {
	vals, errs := make([]any, len(ops)), make([]error, len(ops))
	pending := make([]int, len(ops))
	for i := range pending {
		pending[i] = i
	}
	if node, ok := s.client.(*redis.Client); ok {
		// One node, which redirects nothing: no grouping.
		for _, r := range s.runNode(ctx, node, ops, pending, nil, vals, errs, deadline) {
			errs[r.i] = r.err
		}
		return vals, errs
	}
	var (
		to     = map[int]*redis.Client{} // where a redirect sends an op
		asking = map[int]bool{}
	)
	for attempt := 0; len(pending) > 0; attempt++ {
		groups := map[*redis.Client][]int{}
		var order []*redis.Client
		for _, i := range pending {
			node := to[i]
			if node == nil {
				var err error
				if node, err = nodeFor(ctx, s.client, ops[i].firstKey()); err != nil {
					// No slot map could be read: why is the class.
					errs[i] = fmt.Errorf("finding the node of the call: %w", s.classify(err))
					continue
				}
			}
			if groups[node] == nil {
				order = append(order, node)
			}
			groups[node] = append(groups[node], i)
		}
		var (
			mu        sync.Mutex
			redirects []redirect
			wg        sync.WaitGroup
		)
		run := func(node *redis.Client, idx []int) {
			rs := s.runNode(ctx, node, ops, idx, asking, vals, errs, deadline)
			mu.Lock()
			redirects = append(redirects, rs...)
			mu.Unlock()
		}
		for _, node := range order[1:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(node, groups[node])
			}()
		}
		if len(order) > 0 {
			run(order[0], groups[order[0]])
		}
		wg.Wait()
		pending = s.followRedirects(ctx, redirects, attempt, to, asking, errs)
	}
	return vals, errs
}

// followRedirects returns the ops of redirects to send again, and where
// (in to and asking); an op redirected more often than the client
// allows fails as unavailable.
func (s *Store) followRedirects(ctx context.Context, redirects []redirect, attempt int, to map[int]*redis.Client, asking map[int]bool, errs []error) []int {
	if len(redirects) == 0 {
		return nil
	}
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok || attempt >= cc.Options().MaxRedirects {
		for _, r := range redirects {
			errs[r.i] = fmt.Errorf("%w: the cluster redirected the call %d times: %w", stores.ErrUnavailable, attempt+1, r.err)
		}
		return nil
	}
	s.redirects.Add(int64(len(redirects)))
	// ForEachShard reloads the slot map first, so the node named is
	// known (a replica just promoted was known as a replica).
	nodes := map[string]*redis.Client{}
	var mu sync.Mutex
	err := cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes[c.Options().Addr] = c
		mu.Unlock()
		return nil
	})
	var pending []int
	for _, r := range redirects {
		node := nodes[r.addr]
		if node == nil && !r.ask {
			// Not in the map read just now: the master of the slot by
			// that map, if it has one.
			node, _ = cc.MasterForKey(ctx, r.key)
		}
		if node == nil {
			errs[r.i] = fmt.Errorf("%w: the cluster redirected the call to %s, a node the client does not know (%v): %w", stores.ErrUnavailable, r.addr, err, r.err)
			continue
		}
		to[r.i], asking[r.i] = node, r.ask
		pending = append(pending, r.i)
	}
	return pending
}

// runNode sends the ops of idx to node, then WAIT, in one pipeline (and
// those the node did not have the script of again, with EVAL, then
// WAIT), and sets their results; a claim whose write was not confirmed
// fails with an error that carries the ops giving it back (see undoOf).
// The WAIT answers by deadline (see waitTimeout), and is left out when
// every op is nowait. It returns the ops the node redirected.
func (s *Store) runNode(ctx context.Context, node *redis.Client, ops []op, idx []int, asking map[int]bool, vals []any, errs []error, deadline time.Time) (redirects []redirect) {
	eval := false
	addr := node.Options().Addr
	for len(idx) > 0 {
		cmds := make([]*redis.Cmd, len(idx))
		var (
			wait    *redis.Cmd
			timeout = s.waitTimeout(deadline)
			waits   = slices.ContainsFunc(idx, func(i int) bool { return !ops[i].nowait })
			others  = s.watchWaits(addr)
			own     uint64
		)
		if waits {
			own = 1
			s.waitsOf(addr).sent(true)
		}
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, i := range idx {
				o := ops[i]
				if asking[i] {
					p.Do(ctx, "asking")
				}
				switch {
				case o.script == nil:
					cmds[j] = p.Do(ctx, o.args...)
				case eval:
					cmds[j] = o.script.Eval(ctx, p, o.keys, o.args...)
				default:
					cmds[j] = o.script.EvalSha(ctx, p, o.keys, o.args...)
				}
			}
			if waits {
				wait = p.Do(ctx, "wait", s.cfg.WaitReplicas, ms(timeout))
			}
			return nil
		})
		if waits {
			s.waitsOf(addr).sent(false)
		}
		var (
			n    int64
			werr error
		)
		if waits {
			n, werr = wait.Int64()
		}
		short := waits && (werr != nil || n < int64(s.cfg.WaitReplicas))
		if short {
			// A node that did not answer, or whose replicas did not:
			// maybe a failover under way. Have the slot map read again
			// (go-redis does it after its own failed calls, and
			// coalesces the reloads), so that the retries find the new
			// master.
			reloadSlots(ctx, s.client)
		}
		var again []int
		for j, i := range idx {
			o := ops[i]
			v, err := cmds[j].Result()
			if err != nil && v != nil && !isRedisError(err) {
				// The reply was read, and the pipeline failed after it,
				// in its WAIT (the caller's deadline): go-redis sets the
				// pipeline's error on every command that had none. Every
				// reply of the store's is a value, or a server's error.
				err = nil
			}
			if v == nil {
				// Not answered: a deadline, a timeout or the pool's
				// while other calls' WAITs held the node up is theirs.
				o.trace.holdIf(err, func() bool { return others(own) })
			}
			if o.script != nil && err != nil && isNoScript(err) && !eval {
				again = append(again, i)
				continue
			}
			if ask, addr, ok := isRedirect(err); ok {
				redirects = append(redirects, redirect{i: i, key: o.firstKey(), ask: ask, addr: addr, err: err})
				continue
			}
			if waits && o.trace != nil && (err == nil || isRedisError(err)) {
				o.trace.held.Store(true) // the call waited for this WAIT
			}
			vals[i], errs[i] = v, err
			if short && !o.nowait && wrote(o, v, err) {
				vals[i], errs[i] = nil, s.notReplicated(node, n, werr, timeout, claimUndo(o, v, err))
			}
		}
		idx, eval = again, true
	}
	return redirects
}

// waitMargin is the most of the time left to a caller that a WAIT leaves
// for its answer to come back (a quarter of it, up to this).
const waitMargin = 250 * time.Millisecond

// waitTimeout is the timeout of a WAIT whose answer is due by deadline
// (zero: none): WaitTimeout, or less, so that a write its replicas did
// not acknowledge in time fails as not replicated before its caller's
// deadline rather than by it. A WAIT 0 would wait for ever: at least
// 1ms.
func (s *Store) waitTimeout(deadline time.Time) time.Duration {
	d := s.cfg.WaitTimeout
	if !deadline.IsZero() {
		left := time.Until(deadline)
		d = min(d, left-min(left/4, waitMargin))
	}
	return max(d, time.Millisecond)
}

// cutByWait turns err, the error of a store call made under ctx (see
// traced), into an ErrNotReplicated when it is a deadline, a timeout or
// the pool's (see waitCut) and the store's own WAITs held the call up:
// its time went to waiting for replicas, or for connections and lanes
// that WAITs held, and what it wrote, if anything, is of unknown
// durability (a claim is given back). Those are outages to the
// middleware, which FailOpen runs handlers through unprotected; a master
// whose replicas lag is not one.
//
// The store's waits stay inside the caller's deadline. A WAIT's timeout
// is WaitTimeout, or less when the earliest deadline of the calls it
// confirms is nearer (see waitTimeout), so that a write the replicas did
// not acknowledge in time fails as not replicated before that deadline.
// And whatever the timing, a call that the store's own WAITs held up and
// that then ran out of its deadline (its reply read but not its WAIT's,
// a later step of it with no time left, or a wait in its lane behind
// pipelines waiting in their WAIT) fails with ErrNotReplicated, not with
// the deadline (see cutByWait): a deadline is an outage to the
// middleware, which FailOpen runs handlers through unprotected, and a
// master whose replicas lag is not down. Each node has a lane of its own
// (pipeline.go), so that one node's lag holds up the calls on its keys
// only.
func (s *Store) cutByWait(ctx context.Context, err error) error {
	t := traceOf(ctx)
	if t == nil || !t.held.Load() || !waitCut(err) || errors.Is(err, ErrNotReplicated) {
		return err
	}
	return fmt.Errorf("%w: the call ran out of time while it waited for the replicas of its nodes (%v)", ErrNotReplicated, err)
}

// nodeWaits counts the pipelines ending with WAIT of one node: those out
// now, and all sent so far.
type nodeWaits struct {
	out   atomic.Int32
	total atomic.Uint64
}

// sent counts a pipeline with WAIT going out (true) or back (false).
func (w *nodeWaits) sent(out bool) {
	if out {
		w.total.Add(1)
		w.out.Add(1)
	} else {
		w.out.Add(-1)
	}
}

// waitsOf returns the nodeWaits of the node at addr.
func (s *Store) waitsOf(addr string) *nodeWaits {
	if w, ok := s.waits.Load(addr); ok {
		return w.(*nodeWaits)
	}
	w, _ := s.waits.LoadOrStore(addr, new(nodeWaits))
	return w.(*nodeWaits)
}

// watchWaits starts watching the node at addr: the func it returns
// reports whether a pipeline with WAIT of another call was out there at
// any time since, own being the number the caller sent itself since
// (and has had back).
func (s *Store) watchWaits(addr string) func(own uint64) bool {
	w := s.waitsOf(addr)
	out, total := w.out.Load() > 0, w.total.Load()
	return func(own uint64) bool { return out || w.out.Load() > 0 || w.total.Load()-total > own }
}

// watchKeys is watchWaits for the node of each of rkeys (with
// WaitReplicas; nil without): the func it returns reports for the i-th.
func (s *Store) watchKeys(ctx context.Context, rkeys []string) func(i int) bool {
	if !s.waiting() {
		return nil
	}
	byAddr := map[string]func(uint64) bool{}
	watch := make([]func(uint64) bool, len(rkeys))
	for i, k := range rkeys {
		addr := nodeAddr(ctx, s.client, k)
		if byAddr[addr] == nil {
			byAddr[addr] = s.watchWaits(addr)
		}
		watch[i] = byAddr[addr]
	}
	return func(i int) bool { return watch[i](0) }
}

// readFailed marks the call of ctx held up by WAITs when err, the error
// of a read of its i-th key, is one their wait causes on that key's
// node, by watch (see watchKeys).
func readFailed(ctx context.Context, watch func(int) bool, i int, err error) {
	if watch != nil {
		traceOf(ctx).holdIf(err, func() bool { return watch(i) })
	}
}

// notReplicated is the error of a write whose WAIT on node answered n
// replicas, or failed with werr; undo gives back what it took, if it is
// a claim.
func (s *Store) notReplicated(node *redis.Client, n int64, werr error, timeout time.Duration, undo []op) error {
	addr := node.Options().Addr
	if werr != nil {
		// The cause is told, not wrapped: the write was done, and only
		// its durability is unknown (not an outage, whatever WAIT's
		// connection did).
		return &replicationError{fmt.Sprintf("%v: WAIT %d on %s failed: %v", ErrNotReplicated, s.cfg.WaitReplicas, addr, werr), undo}
	}
	return &replicationError{fmt.Sprintf("%v: %d of %d replicas of %s acknowledged the write within %s", ErrNotReplicated, n, s.cfg.WaitReplicas, addr, timeout), undo}
}
