package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// The failover test: the store on a JetStream cluster of three
// nats-servers of the test's own, a bucket of three replicas, a workload
// of claims and completes, and faults of the bucket's stream leader.
const (
	failoverWorkers = 8
	failoverPool    = 50
	// failoverCallTimeout is every call's context timeout, and
	// failoverMargin how much later than that a call may return: a call
	// that outlives its context by more is a store that does not bound
	// its calls.
	failoverCallTimeout = 2 * time.Second
	failoverMargin      = time.Second
	// failoverLease outlives the test: no lease runs out, so no claim may
	// be taken over, and any two Claimed claims of one key are a double
	// claim.
	failoverLease = 10 * time.Minute
	// failoverRecovery bounds how long JetStream may take to serve again
	// after a fault (elect a leader, catch a restarted server up): past
	// it, the test checks how the store fails instead (see notRecovered).
	failoverRecovery = 45 * time.Second
	// failoverSteady is how many Completes must be acknowledged after a
	// fault (or before the first) for the store to count as serving.
	failoverSteady = 100
)

// TestClusterFailover runs the store on a JetStream cluster of three
// nats-servers of the test's own, with a bucket of three replicas, under
// the middleware's workload: 8 workers, on two stores (two consumer
// processes, one connected to the stream's leader, one to a follower),
// claim keys of a pool of 50 (every acknowledged key replaced by a new
// one, as a broker delivers new messages; about one Claim in eight finds
// its key held or done) and complete what they claimed, retrying a
// failed Complete (an ErrLostClaim is reconciled by claiming again, as
// the middleware does); a failed Claim means the effect did not run.
// During it:
//
//  1. the bucket's stream leader is killed (SIGKILL) until another is
//     elected and serves, then started again;
//  2. the next leader is paused (SIGSTOP) until another is elected and
//     serves, then continued (SIGCONT);
//  3. both followers of the next leader are killed: the stream has lost
//     its quorum and cannot serve, as a JetStream that does not recover;
//     once every worker has failed a few calls, they are started again.
//
// After each, the test waits until the killed or paused server is a
// current replica again and 100 Completes begun after it were
// acknowledged.
//
// Checked on every call: it returns within its context's timeout (plus a
// margin), and a failure is an outage (stores.ErrUnavailable), the end
// of the call's context, or, for a Complete, ErrLostClaim; nothing
// unclassified. Checked on every answer: no two workers ever hold a
// Claimed claim of one key (no lease runs out in the test), no key found
// done is claimed again, a Duplicate carries the data completed. At the
// end every key whose Complete returned nil (or whose refused Complete
// was found done) is claimed again and must be a Duplicate with its
// data: nothing acknowledged was lost. It logs, per fault, how long
// calls failed (first failure to first success) and the longest time
// without a successful call.
//
// A JetStream that does not serve again within failoverRecovery after a
// fault (nats-server 2.9 sometimes keeps a stream's writes waiting for
// acks, logging "high message lag") is tolerated: the test checks that
// the store keeps failing fast and classified meanwhile, logs it and
// what the servers logged, and restarts the servers one at a time
// (SIGTERM), as an operator would; if the store does not serve even
// then, it skips the final pass, saying so.
//
// It runs on a cluster of the nats-server on $PATH ("system", Debian's
// 2.9.10: records expire by the bucket's MaxAge) and on one of the
// current release ("current": by per-key TTLs, on a replicated stream).
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("TestClusterFailover runs a JetStream cluster through leader failures for half a minute or more: not under -short")
	}
	t.Run("system", func(t *testing.T) { clusterFailover(t, natstest.SystemNATS(t), natsstore.TTLBucket) })
	t.Run("current", func(t *testing.T) { clusterFailover(t, natstest.CurrentNATS(t), natsstore.TTLPerKey) })
}

// clusterFailover is TestClusterFailover on a cluster of bin, where the
// store must expire records by mode.
func clusterFailover(t *testing.T, bin natstest.NATSBin, mode natsstore.TTLMode) {
	cl := bin.StartCluster(t, 3, "")
	cfg := natsstore.Config{Bucket: testBucket(), Replicas: 3}
	adm := newClusterAdmin(t, cl, "KV_"+cfg.Bucket)
	ctx := context.Background()

	// Create the bucket, then put one store's connection on its leader
	// and the other's on a follower: killing the leader then drops one
	// store's connection (it reconnects to another server) and leaves the
	// other's to see the stream without a leader.
	conns := &connEvents{start: time.Now()}
	setup := openClusterStore(t, cl.URL(), cfg, nil)
	if setup.TTLMode() != mode {
		t.Fatalf("the store on the cluster expires records by %s, want %s", setup.TTLMode(), mode)
	}
	_ = setup.Close(ctx)
	leader, ok := adm.waitLeader()
	if !ok {
		t.Fatalf("the bucket's stream has no leader %s after it was created", failoverRecovery)
	}
	follower := (leader + 1) % len(cl.Servers)
	load := &failoverLoad{
		t:      t,
		t0:     conns.start,
		scope:  "failover",
		stores: []*natsstore.Store{openClusterStore(t, serverOrder(cl, leader), cfg, conns.of("store 0")), openClusterStore(t, serverOrder(cl, follower), cfg, conns.of("store 1"))},
	}
	load.start()
	if !load.waitServing(time.Time{}, failoverRecovery) {
		t.Fatalf("the store did not serve %d Completes within %s on a healthy cluster", failoverSteady, failoverRecovery)
	}

	// onLeader waits for the stream's leader and records a fault about
	// to hit it, which the caller ends.
	onLeader := func(what string) (int, *failoverFault, bool) {
		idx, ok := adm.waitLeader()
		if !ok {
			return -1, nil, false
		}
		return idx, load.fault(what + " " + cl.Servers[idx].Name), true
	}
	// The faults, one after the other while the workload runs. Each
	// reports false when JetStream did not serve again within
	// failoverRecovery.
	recovered := true
	for _, fault := range []func() bool{
		// SIGKILL of the leader until another is elected and serves,
		// then a restart of the killed server.
		func() bool {
			idx, f, ok := onLeader("SIGKILL of the stream leader")
			if !ok {
				return false
			}
			defer load.endFault(f)
			srv := cl.Servers[idx]
			srv.Kill()
			adm.down(idx)
			if !adm.elected(f, idx) || !load.waitServing(f.at, failoverRecovery) {
				return false
			}
			srv.Start()
			adm.up(idx)
			return adm.waitCurrent(failoverRecovery) && load.waitServing(time.Now(), failoverRecovery)
		},
		// SIGSTOP of the leader until another is elected and serves,
		// then SIGCONT.
		func() bool {
			idx, f, ok := onLeader("SIGSTOP of the stream leader")
			if !ok {
				return false
			}
			defer load.endFault(f)
			srv := cl.Servers[idx]
			srv.Pause()
			adm.down(idx)
			ok = adm.elected(f, idx) && load.waitServing(f.at, failoverRecovery)
			srv.Resume()
			adm.up(idx)
			return ok && adm.waitCurrent(failoverRecovery) && load.waitServing(time.Now(), failoverRecovery)
		},
		// SIGKILL of both followers: the stream has lost its quorum
		// and cannot serve until they are back, as a JetStream that
		// does not recover. Every call meanwhile must fail bounded and
		// classified (checked on each); then both are started again.
		func() bool {
			idx, f, ok := onLeader("SIGKILL of both followers (no quorum) of the stream leader")
			if !ok {
				return false
			}
			defer load.endFault(f)
			var others []int
			for i := range cl.Servers {
				if i != idx {
					others = append(others, i)
				}
			}
			for _, i := range others {
				cl.Servers[i].Kill()
				adm.down(i)
			}
			// Every worker fails a few calls begun after the fault.
			load.waitFailed(f.at, 3*failoverWorkers)
			for _, line := range lastLines(cl.Servers[idx].Log("quorum", "stalled", "lag", "JetStream"), 8) {
				t.Logf("%s meanwhile: %s", cl.Servers[idx].Name, line)
			}
			f.restarted = time.Now()
			for _, i := range others {
				cl.Servers[i].Start()
				adm.up(i)
			}
			return adm.waitCurrent(failoverRecovery) && load.waitServing(f.restarted, failoverRecovery)
		},
	} {
		if recovered = fault(); !recovered {
			break
		}
	}
	if !recovered {
		recovered = load.notRecovered(cl, adm)
	}
	load.stop()
	load.report()
	conns.report(t, cl)
	if !recovered {
		t.Logf("JetStream did not serve again even after restarting every server: the final check of the %d acknowledged records is skipped (the checks above held: every call bounded and classified, no double claim)", load.acked)
		return
	}
	load.finalPass()
}

// openClusterStore opens a store on url (a server list) whose
// connection reconnects for ever, pings its server every second (a
// paused server is left after 2 unanswered pings), and is closed when
// the test ends. Its disconnections and reconnections go to events,
// when not nil.
func openClusterStore(t *testing.T, url string, cfg natsstore.Config, events func(string)) *natsstore.Store {
	t.Helper()
	if events == nil {
		events = func(string) {}
	}
	nc := connect(t, url, nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { events(fmt.Sprint("disconnected: ", err)) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { events("reconnected to " + nc.ConnectedUrl()) }),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	var s *natsstore.Store
	var err error
	// A cluster just formed may not know every peer yet to place three
	// replicas (an outage error): try again.
	for deadline := time.Now().Add(failoverRecovery); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err = natsstore.New(ctx, nc, cfg)
		cancel()
		if err == nil || !errors.Is(err, stores.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("natsstore.New on the cluster: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// connEvents records what became of the stores' connections.
type connEvents struct {
	start  time.Time
	mu     sync.Mutex
	events []string
}

// of returns the recorder of one connection.
func (c *connEvents) of(name string) func(string) {
	return func(what string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.events = append(c.events, fmt.Sprintf("+%s %s %s", time.Since(c.start).Round(time.Millisecond), name, what))
	}
}

func (c *connEvents) report(t *testing.T, cl *natstest.NATSCluster) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for _, s := range cl.Servers {
		names = append(names, s.URL(), s.Name, strconv.Itoa(s.Port), s.Name)
	}
	r := strings.NewReplacer(names...)
	t.Logf("the stores' connections: %d events", len(c.events))
	for _, e := range c.events {
		t.Log(r.Replace(e))
	}
}

// serverOrder is the cluster's server list starting with server first.
func serverOrder(cl *natstest.NATSCluster, first int) string {
	urls := cl.URLs()
	return strings.Join(append(urls[first:], urls[:first]...), ",")
}

// clusterAdmin asks the cluster about the bucket's stream, through a
// connection to each server that stays with it (no other server is
// tried), skipping the servers the test has killed or paused.
type clusterAdmin struct {
	t      *testing.T
	cl     *natstest.NATSCluster
	js     []jetstream.JetStream
	stream string

	mu   sync.Mutex
	gone map[int]bool
}

func newClusterAdmin(t *testing.T, cl *natstest.NATSCluster, stream string) *clusterAdmin {
	a := &clusterAdmin{t: t, cl: cl, stream: stream, gone: map[int]bool{}}
	for _, s := range cl.Servers {
		nc := connect(t, s.URL(), nats.IgnoreDiscoveredServers(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		a.js = append(a.js, js)
	}
	return a
}

func (a *clusterAdmin) down(i int) { a.mu.Lock(); a.gone[i] = true; a.mu.Unlock() }
func (a *clusterAdmin) up(i int)   { a.mu.Lock(); delete(a.gone, i); a.mu.Unlock() }

// info returns the stream's info as a server the test has not killed or
// paused reports it.
func (a *clusterAdmin) info() (*jetstream.StreamInfo, error) {
	var err error
	for i, js := range a.js {
		a.mu.Lock()
		gone := a.gone[i]
		a.mu.Unlock()
		if gone {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var st jetstream.Stream
		st, err = js.Stream(ctx, a.stream)
		cancel()
		if err == nil {
			return st.CachedInfo(), nil
		}
	}
	return nil, err
}

// leader returns the index of the stream's leader, if it has one that
// the test has not killed or paused.
func (a *clusterAdmin) leader() (int, bool) {
	info, err := a.info()
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		return -1, false
	}
	i := a.cl.Index(info.Cluster.Leader)
	a.mu.Lock()
	defer a.mu.Unlock()
	return i, i >= 0 && !a.gone[i]
}

// waitLeader waits for the stream to have a leader the test has not
// faulted, and returns it; false when it has none after
// failoverRecovery.
func (a *clusterAdmin) waitLeader() (int, bool) {
	deadline := time.Now().Add(failoverRecovery)
	for {
		if i, ok := a.leader(); ok {
			return i, true
		}
		if time.Now().After(deadline) {
			return -1, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// elected waits for the stream to elect a leader other than the server
// faulted, records when it saw it, and reports whether that happened
// within failoverRecovery.
func (a *clusterAdmin) elected(f *failoverFault, faulted int) bool {
	deadline := time.Now().Add(failoverRecovery)
	for {
		if i, ok := a.leader(); ok && i != faulted {
			f.elected, f.newLeader = time.Now(), a.cl.Servers[i].Name
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitCurrent waits until the stream has a leader and every other
// replica is online and current (caught up), and reports whether that
// happened within timeout.
func (a *clusterAdmin) waitCurrent(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		info, err := a.info()
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == len(a.cl.Servers)-1 &&
			!slices.ContainsFunc(info.Cluster.Replicas, func(p *jetstream.PeerInfo) bool { return !p.Current || p.Offline }) {
			return true
		}
		if time.Now().After(deadline) {
			a.t.Logf("the stream's replicas are not all current %s after the server came back: %+v, %v", timeout, info, err)
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// failoverCall is one store call of the workload.
type failoverCall struct {
	op         string
	start, end time.Time
	err        error
}

// failoverFault is one fault and what the test saw of it.
type failoverFault struct {
	name      string
	at, end   time.Time // the signal; when the test moved on
	elected   time.Time // when a new leader was seen
	newLeader string
	restarted time.Time // when the test started the killed servers again, if it did
}

// failoverLoad is the workload and what it saw.
type failoverLoad struct {
	t      *testing.T
	t0     time.Time // the times logged are from it
	scope  string
	stores []*natsstore.Store

	stopping chan struct{} // closed: the workers take no new key
	wg       sync.WaitGroup

	mu         sync.Mutex
	calls      []failoverCall
	faults     []*failoverFault
	pool       []string
	fresh      int
	holder     map[string]int  // keys with a Claimed claim: the worker holding it
	completed  map[string]bool // keys whose Complete returned nil
	reconciled map[string]bool // keys found done after a Complete refused as lost
	sent       map[string]bool // keys a Complete was sent for
	unknown    map[string]bool // keys a Claim failed for: it may have left them processing
	answers    map[stores.Result]int
	acked      int // Completes that returned nil
	orphans    int // keys left processing by a Claim whose outcome was unknown
	gaveUp     int // claims whose Complete never succeeded
	problems   int
}

func (l *failoverLoad) start() {
	l.stopping = make(chan struct{})
	l.holder, l.completed, l.reconciled = map[string]int{}, map[string]bool{}, map[string]bool{}
	l.sent, l.unknown, l.answers = map[string]bool{}, map[string]bool{}, map[stores.Result]int{}
	for range failoverPool {
		l.pool = append(l.pool, l.newKey())
	}
	for w := range failoverWorkers {
		l.wg.Add(1)
		go l.worker(w)
	}
	l.t.Cleanup(l.stop) // before the stores close, even when the test fails
}

// stop stops the workers: each finishes the claim it holds, retrying
// its Complete for failoverRecovery at most.
func (l *failoverLoad) stop() {
	select {
	case <-l.stopping:
	default:
		close(l.stopping)
	}
	l.wg.Wait()
}

func (l *failoverLoad) newKey() string {
	l.fresh++
	return fmt.Sprintf("k%06d", l.fresh)
}

// problem reports a broken guarantee (the first 30 in full).
func (l *failoverLoad) problem(format string, args ...any) {
	l.mu.Lock()
	l.problems++
	n := l.problems
	l.mu.Unlock()
	if n <= 30 {
		l.t.Errorf(format, args...)
	} else if n == 31 {
		l.t.Errorf("more problems follow; not shown")
	}
}

// call makes one store call under its own timeout and checks it was
// bounded and classified.
func (l *failoverLoad) call(op string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), failoverCallTimeout)
	start := time.Now()
	err := f(ctx)
	end := time.Now()
	cancel()
	l.mu.Lock()
	l.calls = append(l.calls, failoverCall{op: op, start: start, end: end, err: err})
	l.mu.Unlock()
	if d := end.Sub(start); d > failoverCallTimeout+failoverMargin {
		l.problem("%s returned %s after it began, its context's timeout was %s: the store did not bound the call (err %v)", op, d.Round(time.Millisecond), failoverCallTimeout, err)
	}
	if err != nil && !classified(op, err) {
		l.problem("%s failed unclassified: %v", op, err)
	}
	return err
}

// classified reports an error of an allowed class: an outage, the end of
// the call's context, a call made (or cut short) while the connection
// fails over and another server answers (natsstore.ErrNotConnected), or a
// Complete's lost claim.
func classified(op string, err error) bool {
	return errors.Is(err, stores.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, natsstore.ErrNotConnected) || (op == "complete" && errors.Is(err, stores.ErrLostClaim))
}

func (l *failoverLoad) stopped() bool {
	select {
	case <-l.stopping:
		return true
	default:
		return false
	}
}

func (l *failoverLoad) worker(w int) {
	defer l.wg.Done()
	s := l.stores[w%len(l.stores)]
	for !l.stopped() {
		l.mu.Lock()
		key := l.pool[rand.IntN(len(l.pool))]
		l.mu.Unlock()
		var c *stores.Claim
		err := l.call("claim", func(ctx context.Context) error {
			var err error
			c, err = s.Claim(ctx, l.scope, []string{key}, failoverLease)
			return err
		})
		l.mu.Lock()
		if err != nil {
			l.unknown[key] = true
		} else {
			l.answers[c.Result]++
		}
		l.mu.Unlock()
		if err != nil {
			time.Sleep(20 * time.Millisecond) // the broker redelivers later
			continue
		}
		switch c.Result {
		case stores.Claimed:
			l.claimed(w, key, c)
			l.complete(s, w, key, c)
		case stores.Duplicate:
			l.duplicate(key, c.Data)
		case stores.InProgress:
			l.inProgress(key)
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// claimed checks a Claimed answer: nobody else holds the key, and it was
// never found done.
func (l *failoverLoad) claimed(w int, key string, c *stores.Claim) {
	l.mu.Lock()
	other, held := l.holder[key]
	done := l.completed[key] || l.reconciled[key]
	l.holder[key] = w
	l.mu.Unlock()
	switch {
	case held:
		l.problem("double claim: worker %d claimed %s, which worker %d holds", w, key, other)
	case done:
		l.problem("lost record: worker %d claimed %s, whose Complete was acknowledged", w, key)
	case c.Takeover:
		l.problem("worker %d took %s over, though no lease runs out in this test", w, key)
	}
}

// complete completes c, retrying a failed Complete until it succeeds
// (after the workload stops, for failoverRecovery at most).
func (l *failoverLoad) complete(s *natsstore.Store, w int, key string, c *stores.Claim) {
	backoff := 20 * time.Millisecond
	var deadline time.Time
	for {
		l.mu.Lock()
		l.sent[key] = true
		l.mu.Unlock()
		err := l.call("complete", func(ctx context.Context) error { return s.Complete(ctx, c, time.Hour, []byte(key)) })
		switch {
		case err == nil:
			l.mu.Lock()
			delete(l.holder, key)
			l.completed[key] = true
			l.acked++
			l.retire(key)
			l.mu.Unlock()
			return
		case errors.Is(err, stores.ErrLostClaim):
			// An earlier attempt whose reply was lost completed it: the
			// middleware claims again to learn why.
			l.reconcile(s, w, key)
			return
		}
		if l.stopped() {
			if deadline.IsZero() {
				deadline = time.Now().Add(failoverRecovery)
			} else if time.Now().After(deadline) {
				l.mu.Lock()
				l.gaveUp++ // the key stays held: nobody claims it again
				l.mu.Unlock()
				return
			}
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// reconcile claims key again after its Complete was refused as a lost
// claim: since no lease runs out here, it must be found done.
func (l *failoverLoad) reconcile(s *natsstore.Store, w int, key string) {
	for range 100 {
		var c *stores.Claim
		err := l.call("claim", func(ctx context.Context) error {
			var err error
			c, err = s.Claim(ctx, l.scope, []string{key}, failoverLease)
			return err
		})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		switch c.Result {
		case stores.Duplicate:
			if string(c.Data) != key {
				l.problem("%s, found done after a Complete refused as lost, has data %q", key, c.Data)
			}
			l.mu.Lock()
			delete(l.holder, key)
			l.reconciled[key] = true
			l.retire(key)
			l.mu.Unlock()
		case stores.Claimed:
			l.problem("lost record: worker %d's Complete of %s was refused as lost, and the key was then free (claimed again)", w, key)
		default:
			l.problem("worker %d's Complete of %s was refused as lost, but the key is still processing", w, key)
		}
		return
	}
	l.problem("worker %d could not claim %s again after its Complete was refused as lost", w, key)
}

func (l *failoverLoad) duplicate(key string, data []byte) {
	l.mu.Lock()
	sent := l.sent[key]
	l.retire(key)
	l.mu.Unlock()
	if !sent {
		l.problem("%s is a Duplicate, but no Complete was sent for it", key)
	}
	if string(data) != key {
		l.problem("%s is a Duplicate with data %q", key, data)
	}
}

// inProgress retires a key that nobody holds and that a Claim with an
// unknown outcome may have left processing: it stays so until its lease
// runs out, after the test.
func (l *failoverLoad) inProgress(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, held := l.holder[key]; !held && l.unknown[key] && slices.Contains(l.pool, key) {
		l.orphans++
		l.retire(key)
	}
}

// retire replaces key in the pool by a new one (l.mu held).
func (l *failoverLoad) retire(key string) {
	if i := slices.Index(l.pool, key); i >= 0 {
		l.pool[i] = l.newKey()
	}
}

// fault records a fault about to happen.
func (l *failoverLoad) fault(name string) *failoverFault {
	f := &failoverFault{name: name, at: time.Now()}
	l.mu.Lock()
	l.faults = append(l.faults, f)
	l.mu.Unlock()
	l.t.Logf("%s (+%s)", name, l.since(f.at))
	return f
}

func (l *failoverLoad) endFault(f *failoverFault) { f.end = time.Now() }

func (l *failoverLoad) since(t time.Time) time.Duration { return t.Sub(l.t0).Round(time.Millisecond) }

// waitServing waits until failoverSteady Completes that began after
// since have been acknowledged, and reports whether that happened within
// timeout.
func (l *failoverLoad) waitServing(since time.Time, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		n := 0
		l.mu.Lock()
		for _, c := range slices.Backward(l.calls) {
			if c.end.Before(since) {
				break // calls are appended as they end
			}
			if c.op == "complete" && c.err == nil && !c.start.Before(since) {
				n++
			}
		}
		l.mu.Unlock()
		if n >= failoverSteady {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFailed waits until n calls begun after since have failed (each
// checked bounded and classified), for failoverRecovery at most.
func (l *failoverLoad) waitFailed(since time.Time, n int) {
	deadline := time.Now().Add(failoverRecovery)
	for time.Now().Before(deadline) {
		failed := 0
		l.mu.Lock()
		for _, c := range slices.Backward(l.calls) {
			if c.end.Before(since) {
				break
			}
			if c.err != nil && !c.start.Before(since) {
				failed++
			}
		}
		l.mu.Unlock()
		if failed >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.t.Errorf("fewer than %d calls failed within %s of the fault", n, failoverRecovery)
}

// notRecovered is what the test does when JetStream did not serve again
// within failoverRecovery of a fault: it checks that the store fails
// fast and classified (every call of the workload is checked so; here a
// few more, made one after the other), logs what the servers say, and
// restarts them one at a time (SIGTERM, then start again), as an
// operator would. It reports whether the store serves again after that.
func (l *failoverLoad) notRecovered(cl *natstest.NATSCluster, adm *clusterAdmin) bool {
	l.t.Logf("JetStream did not serve the bucket again within %s of the last fault; checking that the store fails fast and classified", failoverRecovery)
	s := l.stores[0]
	for i := range 5 {
		start := time.Now()
		err := l.call("claim", func(ctx context.Context) error {
			_, err := s.Claim(ctx, l.scope, []string{fmt.Sprint("probe-", i)}, failoverLease)
			return err
		})
		l.t.Logf("a Claim while JetStream does not serve: %v after %s", err, time.Since(start).Round(time.Millisecond))
	}
	for _, srv := range cl.Servers {
		for _, line := range lastLines(srv.Log("quorum", "stalled", "lag", "leader", "JetStream"), 15) {
			l.t.Logf("%s: %s", srv.Name, line)
		}
	}
	for i, srv := range cl.Servers {
		l.t.Logf("restarting %s (SIGTERM)", srv.Name)
		srv.Stop()
		srv.Start()
		adm.up(i)
	}
	l.mu.Lock()
	f := l.faults[len(l.faults)-1]
	l.mu.Unlock()
	f.restarted = time.Now()
	ok := adm.waitCurrent(failoverRecovery) && l.waitServing(f.restarted, failoverRecovery)
	f.end = time.Now()
	l.t.Logf("after restarting every server, the store serves again: %t", ok)
	return ok
}

func lastLines(lines []string, n int) []string { return lines[max(len(lines)-n, 0):] }

// report logs the workload's figures, and per fault how long calls
// failed after it.
func (l *failoverLoad) report() {
	l.mu.Lock()
	defer l.mu.Unlock()
	var failed, unavailable, deadline, lost int
	for _, c := range l.calls {
		switch {
		case c.err == nil:
			continue
		case errors.Is(c.err, stores.ErrUnavailable):
			unavailable++
		case errors.Is(c.err, context.DeadlineExceeded):
			deadline++
		case errors.Is(c.err, stores.ErrLostClaim):
			lost++
		}
		failed++
	}
	l.t.Logf("%d calls, %d failed (%d ErrUnavailable, %d at their deadline, %d Completes refused as lost claims and reconciled); %d Completes acknowledged, %d found done when reconciled; %d keys left processing by a Claim whose outcome was unknown; %d claims never completed",
		len(l.calls), failed, unavailable, deadline, lost, l.acked, len(l.reconciled), l.orphans, l.gaveUp)
	var slowest time.Duration
	for _, c := range l.calls {
		slowest = max(slowest, c.end.Sub(c.start))
	}
	l.t.Logf("the workers' Claims answered: %d claimed, %d duplicate, %d in progress", l.answers[stores.Claimed], l.answers[stores.Duplicate], l.answers[stores.InProgress])
	l.t.Logf("slowest call: %s (context timeout %s)", slowest.Round(time.Millisecond), failoverCallTimeout)
	for _, f := range l.faults {
		l.t.Logf("%s: %s", f.name, l.outage(f))
	}
}

// outage describes how calls fared after f (l.mu held): when the first
// call failed, when the first call begun after that failure (and after
// the servers' restart, for a fault that restarted them) succeeded, and
// the first Complete (a write: a stream without quorum may still answer
// some calls), the longest time without a successful call from the
// fault until the test moved on, and the errors seen.
func (l *failoverLoad) outage(f *failoverFault) string {
	var firstFail, firstOK, firstWrite *failoverCall
	fails := map[string]int{}
	var samples []string
	var ends []time.Time
	for i := range l.calls {
		c := &l.calls[i]
		if c.end.Before(f.at) || (!f.end.IsZero() && c.start.After(f.end)) {
			continue
		}
		if c.err != nil {
			if firstFail == nil {
				firstFail = c
			}
			if firstWrite == nil {
				fails[errClass(c.err)]++
				if msg := c.op + ": " + c.err.Error(); len(samples) < 4 && !slices.Contains(samples, msg) {
					samples = append(samples, msg)
				}
			}
			continue
		}
		ends = append(ends, c.end)
		// After a restart, the first successes begun after it: a stream
		// without quorum may still answer some calls before.
		if firstFail != nil && !c.start.Before(firstFail.end) && !c.start.Before(f.restarted) {
			if firstOK == nil {
				firstOK = c
			}
			if firstWrite == nil && c.op == "complete" {
				firstWrite = c
			}
		}
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	last := f.at
	for _, e := range ends {
		gap = max(gap, e.Sub(last))
		last = e
	}
	after := func(t time.Time) string { return "+" + t.Sub(f.at).Round(time.Millisecond).String() }
	var b strings.Builder
	if !f.elected.IsZero() {
		fmt.Fprintf(&b, "new leader %s seen %s; ", f.newLeader, after(f.elected))
	}
	if !f.restarted.IsZero() {
		fmt.Fprintf(&b, "servers started again %s; ", after(f.restarted))
	}
	switch {
	case firstFail == nil:
		b.WriteString("no call failed")
	case firstOK == nil || firstWrite == nil:
		fmt.Fprintf(&b, "calls failed from %s and no Complete succeeded again", after(firstFail.end))
	case !f.restarted.IsZero():
		fmt.Fprintf(&b, "calls failed from %s; after the restart, first success %s (%s after it), first Complete %s (%s after it)",
			after(firstFail.end), after(firstOK.end), firstOK.end.Sub(f.restarted).Round(time.Millisecond),
			after(firstWrite.end), firstWrite.end.Sub(f.restarted).Round(time.Millisecond))
	default:
		fmt.Fprintf(&b, "calls failed from %s: first success %s (%s of failing), first Complete %s (%s)",
			after(firstFail.end), after(firstOK.end), firstOK.end.Sub(firstFail.end).Round(time.Millisecond),
			after(firstWrite.end), firstWrite.end.Sub(firstFail.end).Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "; longest time without a successful call %s; failures until then %v; errors %q", gap.Round(time.Millisecond), fails, samples)
	return b.String()
}

func errClass(err error) string {
	switch {
	case errors.Is(err, stores.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, stores.ErrLostClaim):
		return "lost_claim"
	case errors.Is(err, natsstore.ErrNotConnected):
		return "not_connected"
	}
	return "other"
}

// finalPass claims again every key found done, and checks each is a
// Duplicate with its data.
func (l *failoverLoad) finalPass() {
	l.mu.Lock()
	var keys []string
	for k := range l.completed {
		keys = append(keys, k)
	}
	for k := range l.reconciled {
		keys = append(keys, k)
	}
	l.mu.Unlock()
	ch := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	lost := 0
	for w := range failoverWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := l.stores[w%len(l.stores)]
			for key := range ch {
				var c *stores.Claim
				var err error
				for range 50 {
					err = l.call("claim", func(ctx context.Context) error {
						var err error
						c, err = s.Claim(ctx, l.scope, []string{key}, failoverLease)
						return err
					})
					if err == nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				switch {
				case err != nil:
					l.problem("final pass: claiming %s again failed: %v", key, err)
				case c.Result != stores.Duplicate || string(c.Data) != key:
					mu.Lock()
					lost++
					mu.Unlock()
					l.problem("lost record: %s, acknowledged done, is %s (data %q) when claimed again", key, c.Result, c.Data)
				}
			}
		}()
	}
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	wg.Wait()
	l.t.Logf("final pass: %d keys acknowledged done claimed again, %d lost", len(keys), lost)
}
