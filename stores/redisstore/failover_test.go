package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/redistest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestClusterFailover runs on a Redis Cluster of three masters with a
// replica each (cluster-node-timeout 2s) that it starts itself: the
// conformance suite and the replica checks with WaitReplicas 1, then a
// workload of claims and Completes through master SIGKILLs and CLUSTER
// FAILOVER FORCEs, with WaitReplicas 1 (no acknowledged Complete may be
// lost, no key held by two live claims) and without it (the losses are
// logged: Redis replicates asynchronously). Every wait is for an event
// (a node's role, the cluster's state, the workload's progress), with a
// generous bound that only a hung cluster reaches.
func TestClusterFailover(t *testing.T) {
	fc := startFaultCluster(t, redistest.ClusterNodeTimeout(2*time.Second))
	newClient := func(t *testing.T, tap *nodeTap, addrs ...string) *redis.ClusterClient {
		if len(addrs) == 0 {
			addrs = fc.addrs
		}
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 addrs,
			ContextTimeoutEnabled: true,
			MaxRedirects:          8,
			DialTimeout:           time.Second,
			ReadTimeout:           10 * time.Second, // room for waitCfg's WAITs
		})
		if tap != nil {
			cc.OnNewNode(func(c *redis.Client) { c.AddHook(&nodeHook{tap, c.Options().Addr}) })
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	cc := newClient(t, nil)
	cfg := waitCfg

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, factory(cc, cfg), serverTime(cc))
	})

	t.Run("CheckServer", func(t *testing.T) {
		if err := newStore(t, cc, cfg).CheckServer(context.Background()); err != nil {
			t.Fatalf("CheckServer with WaitReplicas 1, a replica for each master: %v", err)
		}
		two := cfg
		two.WaitReplicas = 2
		errtest.Wraps(t, "CheckServer with WaitReplicas 2, one replica for each master", newStore(t, cc, two).CheckServer(context.Background()), redisstore.ErrTooFewReplicas)
	})

	t.Run("WaitOnEveryNodeWritten", func(t *testing.T) {
		ctx := context.Background()
		prefix := testPrefix(t, cc)
		tap := &nodeTap{prefix: prefix, waits: map[string]int{}}
		hc := newClient(t, tap)
		s := newStore(t, hc, redisstore.Config{WaitReplicas: 1, Prefix: prefix})
		keys := keysOnDistinctNodes(t, hc, s, "h", 3)
		cl, err := s.Claim(ctx, "h", keys, time.Minute)
		if err != nil || cl.Result != stores.Claimed {
			t.Fatalf("Claim over three nodes = %v, %v", cl, err)
		}
		if err := s.Complete(ctx, cl, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
		tap.mu.Lock()
		defer tap.mu.Unlock()
		if len(tap.bad) > 0 {
			t.Errorf("pipelines without their one WAIT, last: %v", tap.bad)
		}
		if len(tap.waits) != 3 {
			t.Errorf("WAITs went to %v: want the three masters written", tap.waits)
		}
		for node, n := range tap.waits {
			if n < 2 { // the claim's confirmation of its key, its Complete
				t.Errorf("node %s: %d pipelines with a WAIT, want one for each write", node, n)
			}
		}
	})

	t.Run("ReplicaStopped", func(t *testing.T) {
		master, replica := fc.pair(t, 0)
		// Clients made while the replica is stopped must not read their
		// first slot map from it: it answers nothing.
		var masters []string
		for _, a := range fc.addrs {
			if m, _, _, err := replication(context.Background(), a); err == nil && m {
				masters = append(masters, a)
			}
		}
		mc := newClient(t, nil, masters...)
		fresh := func(t *testing.T) redis.UniversalClient { return newClient(t, nil, masters...) }
		testReplicaStopped(t, cc, mc, fresh, fc.byAddr[replica], cfg, func(s *redisstore.Store, tag string) string {
			return keyOnNode(t, cc, s, "h", tag, master)
		})
		fc.waitOK(t, "after the replica resumed")
	})

	t.Run("MultiKeyReplicaStopped", func(t *testing.T) {
		ctx := context.Background()
		_, replica := fc.pair(t, 1)
		s := newStore(t, cc, redisstore.Config{WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
		held := keysOnDistinctNodes(t, cc, s, "h", 3)
		fresh := keysOnDistinctNodes(t, cc, s, "h", 3)
		hc, err := s.Claim(ctx, "h", held, time.Minute)
		if err != nil || hc.Result != stores.Claimed {
			t.Fatalf("Claim over three nodes = %v, %v", hc, err)
		}
		fc.byAddr[replica].Pause()
		_, err = s.Claim(ctx, "h", fresh, time.Minute)
		errtest.Wraps(t, "Claim over three nodes, one replica stopped", err, redisstore.ErrNotReplicated)
		errtest.Wraps(t, "Complete over three nodes, one replica stopped", s.Complete(ctx, hc, time.Hour, nil), redisstore.ErrNotReplicated)
		fc.byAddr[replica].Resume()
		fc.waitOK(t, "after the replica resumed")
		s = newStore(t, cc, redisstore.Config{WaitReplicas: 1, Prefix: s.Prefix()})
		for _, k := range fresh {
			// The failed claim left none of its keys held.
			if c, err := s.Claim(ctx, "h", []string{k}, time.Minute); err != nil || c.Result != stores.Claimed {
				t.Errorf("Claim(%q) after the failed claim = %v, %v; want claimed", k, c, err)
			}
		}
		// The failed Complete kept the keys it completed; this one
		// confirms them and completes the rest, or finds every key
		// completed already (ErrLostClaim, which the middleware
		// reconciles by claiming again: a Duplicate).
		if err := s.Complete(ctx, hc, time.Hour, nil); err != nil && !errors.Is(err, stores.ErrLostClaim) {
			t.Fatalf("Complete again, the replica back: %v", err)
		}
		for _, k := range held {
			if c, err := s.Claim(ctx, "h", []string{k}, time.Minute); err != nil || c.Result != stores.Duplicate {
				t.Errorf("Claim(%q) after Complete = %v, %v; want duplicate", k, c, err)
			}
		}
	})

	t.Run("Redirects", func(t *testing.T) {
		testWaitRedirects(t, fc, newClient)
	})

	faults := []string{"kill", "force", "kill", "force", "force"}
	t.Run("Failovers", func(t *testing.T) {
		r := runFailovers(t, fc, newClient(t, nil), redisstore.Config{WaitReplicas: 1}, faults)
		if r.lost > 0 || r.doubles > 0 {
			t.Errorf("with WaitReplicas 1: %d acknowledged Completes lost, %d keys held by two live claims", r.lost, r.doubles)
		}
		if r.acked == 0 {
			t.Error("no Complete was acknowledged")
		}
	})

	t.Run("FailoversWithoutWait", func(t *testing.T) {
		r := runFailovers(t, fc, newClient(t, nil), redisstore.Config{}, []string{"force", "kill", "force", "force"})
		t.Logf("without WaitReplicas (not a failure: Redis replicates asynchronously): %d of %d acknowledged Completes lost, %d keys held by two live claims",
			r.lost, r.acked, r.doubles)
	})
}

// nodeTap sees, through a nodeHook on every node client of a
// ClusterClient, the pipelines that carry a write of the store's: it
// counts those that end with their one WAIT, per node, and notes the
// others.
type nodeTap struct {
	prefix string

	mu    sync.Mutex
	waits map[string]int
	bad   [][]string
}

// nodeHook is the tap on the client of the node at addr.
type nodeHook struct {
	*nodeTap
	addr string
}

func (h *nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmdKey(cmd), h.prefix) {
			h.mu.Lock()
			h.bad = append(h.bad, []string{cmd.Name()})
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		mine, waits, writes, sets := false, 0, false, false
		for _, c := range cmds {
			n := strings.ToLower(c.Name())
			names = append(names, n)
			if n == "wait" {
				waits++
			}
			if strings.HasPrefix(cmdKey(c), h.prefix) {
				mine = true
				switch n {
				case "get", "pttl":
				case "set":
					sets = true
				default:
					writes = true
				}
			}
		}
		// A multi-key claim's SET NX GET of each key may go without a
		// WAIT: the claim writes its keys again, each node's share
		// followed by its WAIT, once it holds them all.
		if mine && (writes || sets && waits > 0) {
			h.mu.Lock()
			if waits == 1 && names[len(names)-1] == "wait" {
				h.waits[h.addr]++
			} else {
				h.bad = append(h.bad, names)
			}
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// keyOnNode returns a key, starting with tag, whose record in scope is
// served by the master at addr.
func keyOnNode(t *testing.T, cc *redis.ClusterClient, s *redisstore.Store, scope, tag, addr string) string {
	t.Helper()
	ctx := context.Background()
	for i := range 10000 {
		k := tag + "-" + strconv.Itoa(i)
		c, err := cc.MasterForKey(ctx, s.EncodeKey(scope, k))
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr == addr {
			return k
		}
	}
	t.Fatalf("no key found on %s", addr)
	return ""
}

// faultCluster is the test's cluster: its servers by address, and the
// faults it makes them suffer.
type faultCluster struct {
	t      *testing.T
	addrs  []string
	byAddr map[string]*redistest.RedisServer
	next   int
	last   map[string]bool // the nodes of the last fault's shard
}

// startFaultCluster starts a Redis Cluster of three masters with a
// replica each, with opts, for t.
func startFaultCluster(t *testing.T, opts ...redistest.RedisClusterOption) *faultCluster {
	t.Helper()
	servers := redistest.StartRedisClusterServers(t, append([]redistest.RedisClusterOption{redistest.ClusterReplicas(1)}, opts...)...)
	fc := &faultCluster{t: t, byAddr: map[string]*redistest.RedisServer{}}
	for _, s := range servers {
		fc.addrs = append(fc.addrs, s.Addr)
		fc.byAddr[s.Addr] = s
	}
	return fc
}

// faultTimeout bounds each wait for the cluster: only a cluster that
// does not recover reaches it, however loaded the machine.
const faultTimeout = 2 * time.Minute

// forceAgain is how long a CLUSTER FAILOVER FORCE that changed nothing
// is left before it is sent again: past a manual failover's own time
// limit (5s) and two node timeouts (a master's wait between two votes
// for one shard).
const forceAgain = 10 * time.Second

// replication reads a node's INFO replication: its role, and its
// replica's address (a master) or its master's (a replica).
func replication(ctx context.Context, addr string) (master bool, peer string, synced bool, err error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return false, "", false, err
	}
	field := func(name string) string {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
				return v
			}
		}
		return ""
	}
	if field("role") == "master" {
		// slave0:ip=127.0.0.1,port=20001,state=online,offset=1,lag=0
		var ip, port string
		for _, kv := range strings.Split(field("slave0"), ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		if port != "" {
			peer = ip + ":" + port
		}
		return true, peer, strings.Contains(field("slave0"), "state=online"), nil
	}
	return false, field("master_host") + ":" + field("master_port"), field("master_link_status") == "up" && field("master_sync_in_progress") == "0", nil
}

// pair returns the i-th master (in address order of the servers) and
// its replica.
func (fc *faultCluster) pair(t *testing.T, i int) (master, replica string) {
	t.Helper()
	var masters []string
	for _, a := range fc.addrs {
		if m, peer, _, err := replication(context.Background(), a); err == nil && m && peer != "" {
			masters = append(masters, a)
			if len(masters) == i+1 {
				return a, peer
			}
		}
	}
	t.Fatalf("no %d-th master with a replica among %v", i, masters)
	return "", ""
}

// waitOK waits until every node reports the cluster ok, every slot
// served and every replica in sync with its master.
func (fc *faultCluster) waitOK(t *testing.T, when string) {
	t.Helper()
	start, last := time.Now(), ""
	testkit.Eventually(t, faultTimeout, "the cluster ok "+when, func() error {
		if why := redistest.RedisClusterNotOK(context.Background(), fc.addrs, len(fc.addrs)/2); why != "" {
			last = why
			return errors.New(why)
		}
		return nil
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("the cluster was ok %s after %s (%s)", when, d.Round(time.Millisecond), last)
	}
}

// fault makes one fault happen and waits until the cluster has
// recovered from it, every replica in sync again: "kill" SIGKILLs a
// master, waits for its replica to take over, and starts it again (it
// rejoins as the replica); "force" has a replica take over at once with
// CLUSTER FAILOVER FORCE (the master is not asked, and takes writes
// until it hears of it). It returns what it did.
func (fc *faultCluster) fault(t *testing.T, kind string) string {
	t.Helper()
	ctx := context.Background()
	// A shard other than the last one's: its masters may still refuse
	// to vote for it.
	master, replica := fc.pair(t, fc.next%3)
	for i := 1; i < 3 && (fc.last[master] || fc.last[replica]); i++ {
		master, replica = fc.pair(t, (fc.next+i)%3)
	}
	fc.next++
	fc.last = map[string]bool{master: true, replica: true}
	switch kind {
	case "kill":
		fc.byAddr[master].Kill()
		testkit.Eventually(t, faultTimeout, "the replica taking over from the killed master "+master, func() error {
			if m, _, _, err := replication(ctx, replica); err != nil || !m {
				return fmt.Errorf("replica %s not master (%v)", replica, err)
			}
			return nil
		})
		fc.byAddr[master].Start()
	case "force":
		// The replica still needs the votes of a majority of masters;
		// an election that fails (a master that voted for this shard
		// less than two node timeouts ago refuses) ends the manual
		// failover, which is not tried again by itself. So it is asked
		// again each time one more election could have run.
		var asked time.Time
		testkit.Eventually(t, faultTimeout, "the replica "+replica+" taking over by CLUSTER FAILOVER FORCE", func() error {
			if m, _, _, err := replication(ctx, replica); err != nil || !m {
				if time.Since(asked) > forceAgain {
					if !asked.IsZero() {
						t.Logf("CLUSTER FAILOVER FORCE on %s: no failover yet, asking again", replica)
					}
					asked = time.Now()
					c := redis.NewClient(&redis.Options{Addr: replica})
					err := c.Do(ctx, "cluster", "failover", "force").Err()
					_ = c.Close()
					if err != nil {
						return fmt.Errorf("CLUSTER FAILOVER FORCE on %s: %v", replica, err)
					}
				}
				return fmt.Errorf("replica %s not master (%v)", replica, err)
			}
			if m, _, synced, err := replication(ctx, master); err != nil || m || !synced {
				return fmt.Errorf("old master %s not a replica in sync (%v)", master, err)
			}
			return nil
		})
	default:
		t.Fatalf("unknown fault %q", kind)
	}
	fc.waitOK(t, kind+" of "+master)
	return fmt.Sprintf("%s %s (replica %s)", kind, master, replica)
}

// failoverResult is what a workload through faults found.
type failoverResult struct {
	acked, lost, doubles int
}

// failoverWorkload claims and completes keys from a pool of poolSize
// with workers goroutines, as the middleware would: a failed Claim runs
// nothing, a Complete is retried for completeTimeout on every failure
// not known to be permanent, and a Complete refused as a lost claim is
// reconciled by claiming again (internal/cycle's rules). It tracks the
// live claims (a key claimed while another worker holds it is a double
// claim) and the keys whose Complete was acknowledged.
type failoverWorkload struct {
	s     *redisstore.Store
	scope string

	stop atomic.Bool
	wg   sync.WaitGroup

	mu      sync.Mutex
	gen     []int          // the key of pool slot i is "s<i>-g<gen[i]>"
	live    map[string]int // key -> the worker holding a Claimed claim of it
	doubles []string
	acked   []string
	ran     map[string]int // key -> handler runs
	counts  map[string]int
}

const (
	poolSize        = 200
	workers         = 8
	workloadLease   = 10 * time.Minute // never runs out during the test: no takeover is legitimate
	storeTimeout    = 5 * time.Second
	completeTimeout = time.Minute
)

func (w *failoverWorkload) count(what string) {
	w.mu.Lock()
	w.counts[what]++
	w.mu.Unlock()
}

func (w *failoverWorkload) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// classOf names the class of a store error.
func classOf(err error) string {
	switch {
	case errors.Is(err, redisstore.ErrNotReplicated):
		return "not_replicated"
	case errors.Is(err, stores.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, stores.ErrLostClaim):
		return "lost_claim"
	}
	return "other"
}

// refusedForGood is internal/cycle's refused: no retry changes it.
func refusedForGood(err error) bool {
	return errors.Is(err, stores.ErrLostClaim) || errors.Is(err, stores.ErrClosed) ||
		errors.Is(err, stores.ErrInvalidArgument) || errors.Is(err, stores.ErrInvalidKey)
}

func (w *failoverWorkload) run(id int) {
	defer w.wg.Done()
	for !w.stop.Load() {
		w.mu.Lock()
		slot := rand.IntN(poolSize)
		g := w.gen[slot]
		w.mu.Unlock()
		key := "s" + strconv.Itoa(slot) + "-g" + strconv.Itoa(g)
		c, err := w.call(func(ctx context.Context) (*stores.Claim, error) {
			return w.s.Claim(ctx, w.scope, []string{key}, workloadLease)
		})
		if err != nil {
			// The handler does not run; the message is nacked.
			w.count("claim_error_" + classOf(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		switch c.Result {
		case stores.Duplicate:
			w.count("duplicate")
			w.next(slot, g)
			continue
		case stores.InProgress:
			w.count("in_progress")
			continue
		}
		w.count("claimed")
		if c.Takeover {
			w.count("takeover")
		}
		w.hold(key, id)
		w.mu.Lock()
		w.ran[key]++
		w.mu.Unlock()
		if w.complete(c, id) {
			w.mu.Lock()
			w.acked = append(w.acked, key)
			w.mu.Unlock()
			w.next(slot, g)
		}
		w.unhold(key, id)
	}
}

// call runs one store call under storeTimeout.
func (w *failoverWorkload) call(f func(ctx context.Context) (*stores.Claim, error)) (*stores.Claim, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	return f(ctx)
}

// next moves pool slot to a fresh key once key generation g is done.
func (w *failoverWorkload) next(slot, g int) {
	w.mu.Lock()
	if w.gen[slot] == g {
		w.gen[slot]++
	}
	w.mu.Unlock()
}

func (w *failoverWorkload) hold(key string, id int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if other, ok := w.live[key]; ok && other != id {
		w.doubles = append(w.doubles, key)
	}
	w.live[key] = id
}

func (w *failoverWorkload) unhold(key string, id int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live[key] == id {
		delete(w.live, key)
	}
}

// complete records c done as internal/cycle does, and reports whether
// the message would be acked as recorded (Done, DoneBefore).
func (w *failoverWorkload) complete(c *stores.Claim, id int) bool {
	var deadline time.Time
	retrying := func(call func(ctx context.Context) error) error {
		backoff := 20 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			err := call(ctx)
			cancel()
			if err == nil || refusedForGood(err) {
				return err
			}
			w.count("retry_" + classOf(err))
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(completeTimeout)
			}
			left := deadline.Sub(now)
			if left <= 0 {
				return err
			}
			time.Sleep(min(backoff, left))
			backoff = min(2*backoff, time.Second)
		}
	}
	record := func(c *stores.Claim) error {
		return retrying(func(ctx context.Context) error { return w.s.Complete(ctx, c, time.Hour, nil) })
	}
	err := record(c)
	switch {
	case err == nil:
		w.count("done")
		return true
	case !errors.Is(err, stores.ErrLostClaim):
		w.count("not_recorded")
		return false
	}
	var again *stores.Claim
	if err := retrying(func(ctx context.Context) error {
		var err error
		again, err = w.s.Claim(ctx, c.Scope, c.Keys, workloadLease)
		return err
	}); err != nil {
		w.count("not_recorded")
		return false
	}
	switch again.Result {
	case stores.Duplicate:
		w.count("done_before")
		return true
	case stores.Claimed:
		w.hold(c.Keys[0], id)
		if record(again) == nil {
			w.count("done_reclaimed")
			return true
		}
	case stores.InProgress:
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		err := w.s.Extend(ctx, c, workloadLease)
		cancel()
		if err == nil && record(c) == nil {
			w.count("done_again")
			return true
		}
	}
	w.count("taken_over")
	return false
}

// runFailovers runs the workload on a store of cfg through faults, then
// claims every key whose Complete was acknowledged again: each must be
// a Duplicate.
func runFailovers(t *testing.T, fc *faultCluster, cc *redis.ClusterClient, cfg redisstore.Config, faults []string) failoverResult {
	fc.waitOK(t, "before the workload")
	s := newStore(t, cc, cfg)
	w := &failoverWorkload{s: s, scope: "failover", gen: make([]int, poolSize), live: map[string]int{}, ran: map[string]int{}, counts: map[string]int{}}
	for id := range workers {
		w.wg.Add(1)
		go w.run(id)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			w.stop.Store(true)
			w.wg.Wait()
		}
	}
	defer stop()
	// progress waits until the workload has acknowledged n more
	// Completes: the cluster serves it again, and it writes on.
	progress := func(n int, when string) {
		from := w.ackedCount()
		testkit.Eventually(t, faultTimeout, "the workload acknowledging "+strconv.Itoa(n)+" Completes "+when, func() error {
			if got := w.ackedCount() - from; got < n {
				return fmt.Errorf("%d acknowledged", got)
			}
			return nil
		})
	}
	progress(200, "before the faults")
	for _, f := range faults {
		start := time.Now()
		did := fc.fault(t, f)
		t.Logf("%s: recovered in %s", did, time.Since(start).Round(time.Millisecond))
		progress(200, "after "+did)
	}
	stop()
	fc.waitOK(t, "after the workload")

	// Every acknowledged Complete, claimed again (by workers goroutines:
	// there may be tens of thousands).
	r := failoverResult{acked: len(w.acked), doubles: len(w.doubles)}
	var (
		lost  []string
		mu    sync.Mutex
		wg    sync.WaitGroup
		check = make(chan string)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range check {
				var (
					c   *stores.Claim
					err error
				)
				for try := 0; ; try++ { // the cluster is ok: errors are rare and short
					c, err = w.call(func(ctx context.Context) (*stores.Claim, error) {
						return s.Claim(ctx, w.scope, []string{key}, time.Minute)
					})
					if err == nil || try == 100 {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				mu.Lock()
				switch {
				case err != nil:
					lost = append(lost, key+" (claim failed: "+err.Error()+")")
				case c.Result != stores.Duplicate:
					lost = append(lost, key+" ("+c.Result.String()+")")
				}
				mu.Unlock()
			}
		}()
	}
	for _, key := range w.acked {
		check <- key
	}
	close(check)
	wg.Wait()
	r.lost = len(lost)
	twice := 0
	for _, n := range w.ran {
		if n > 1 {
			twice++
		}
	}
	t.Logf("%d Completes acknowledged, %d of them lost %v; %d keys held by two live claims %v; %d keys run more than once; %d redirects followed; counts %v",
		r.acked, r.lost, firstFew(lost), r.doubles, firstFew(w.doubles), twice, s.Redirects(), w.counts)
	return r
}

func firstFew(s []string) []string {
	return s[:min(len(s), 10)]
}
