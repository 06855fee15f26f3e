package cycle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake is a store whose calls the test scripts: each func field, when
// set, answers instead of the memstore underneath. It counts the calls
// and keeps the data each Complete was given.
type fake struct {
	stores.Store
	caps     func(stores.Capabilities) stores.Capabilities
	claim    func(n int) (*stores.Claim, error)
	complete func(n int, data []byte) error
	release  func(n int) error
	extend   func(n int) error

	claims, completes, releases, extends atomic.Int32

	mu        sync.Mutex
	datas     [][]byte
	deadlines []bool // whether each call's context had a deadline
}

func (f *fake) Capabilities() stores.Capabilities {
	c := f.Store.Capabilities()
	c.NonBlocking = false
	if f.caps != nil {
		c = f.caps(c)
	}
	return c
}

func (f *fake) sawDeadline(ctx context.Context) {
	_, ok := ctx.Deadline()
	f.mu.Lock()
	f.deadlines = append(f.deadlines, ok)
	f.mu.Unlock()
}

func (f *fake) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	n := int(f.claims.Add(1))
	f.sawDeadline(ctx)
	if f.claim != nil {
		if c, err := f.claim(n); c != nil || err != nil {
			return c, err
		}
	}
	return f.Store.Claim(ctx, scope, keys, lease)
}

func (f *fake) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	n := int(f.completes.Add(1))
	f.mu.Lock()
	f.datas = append(f.datas, data)
	f.mu.Unlock()
	if f.complete != nil {
		if err := f.complete(n, data); err != nil {
			return err
		}
	}
	return f.Store.Complete(ctx, c, retention, data)
}

func (f *fake) Release(ctx context.Context, c *stores.Claim) error {
	n := int(f.releases.Add(1))
	if f.release != nil {
		if err := f.release(n); err != nil {
			return err
		}
	}
	return f.Store.Release(ctx, c)
}

func (f *fake) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	n := int(f.extends.Add(1))
	if f.extend != nil {
		if err := f.extend(n); err != nil {
			return err
		}
	}
	return f.Store.Extend(ctx, c, lease)
}

func (f *fake) data(i int) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.datas[i]
}

type env struct {
	t       *testing.T
	clock   *storetest.FakeClock
	mem     *memstore.Store
	store   *fake
	metrics *testkit.Metrics
	logger  *watermill.CaptureLoggerAdapter
}

func newEnv(t *testing.T) *env {
	t.Helper()
	clock := storetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	mem, err := memstore.New(memstore.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close(context.Background()) })
	return &env{t: t, clock: clock, mem: mem, store: &fake{Store: mem}, metrics: &testkit.Metrics{}, logger: watermill.NewCaptureLogger()}
}

// cycle returns a cycle on the env's store; p's Metrics and Logger are
// the env's unless set.
func (e *env) cycle(side cycle.Side, p dedup.Policy, needs cycle.Needs) *cycle.Cycle {
	e.t.Helper()
	if p.Metrics == nil {
		p.Metrics = e.metrics
	}
	if p.Logger == nil {
		p.Logger = e.logger
	}
	c, err := cycle.New(e.store, p, side, needs)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) errorLogs() string {
	var out []string
	for _, l := range e.logger.Captured()[watermill.ErrorLogLevel] {
		out = append(out, l.Msg)
	}
	return strings.Join(out, "\n")
}

func newMsg(uuid string) *message.Message { return message.NewMessage(uuid, nil) }

// claimed claims key for the test.
func (e *env) claimed(c *cycle.Cycle, key string) *stores.Claim {
	e.t.Helper()
	cl, err := c.Claim(context.Background(), "s", []string{key})
	if err != nil || cl.Result != stores.Claimed {
		e.t.Fatalf("claim %s: %v, %v", key, cl, err)
	}
	return cl
}

// vanishOnFirstComplete makes the store's first Complete release cl (its
// record vanishes) and fail with lost; later Completes fail with then.
func (e *env) vanishOnFirstComplete(t *testing.T, cl *stores.Claim, lost, then error) {
	e.store.complete = func(n int, _ []byte) error {
		if n == 1 {
			if err := e.mem.Release(context.Background(), cl); err != nil {
				t.Fatal(err)
			}
			return lost
		}
		return then
	}
}

func (e *env) state(key string) (stores.RecordState, bool) {
	e.t.Helper()
	r, err := e.mem.Get(context.Background(), "s", key)
	if errors.Is(err, stores.ErrNotFound) {
		return 0, false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return r.State, true
}

// complete completes cl as the adapters do: held by the heartbeat.
func complete(c *cycle.Cycle, ctx context.Context, msg *message.Message, cl *stores.Claim, data []byte) (cycle.Recorded, []byte) {
	b := c.Hold(ctx, cl)
	defer c.Drop(b)
	b.Completing()
	return c.Complete(ctx, msg, b, data)
}

var errReset = errors.New("read tcp 127.0.0.1:50000->127.0.0.1:6379: read: connection reset by peer")

func TestCheck(t *testing.T) {
	mem := newEnv(t).mem
	bounded := func(c stores.Capabilities) stores.Store {
		return &fake{Store: mem, caps: func(stores.Capabilities) stores.Capabilities { return c }}
	}
	inbox := &inboxStore{fake: &fake{Store: mem}}
	for _, tc := range []struct {
		name   string
		store  stores.Store
		policy dedup.Policy
		needs  cycle.Needs
		want   string // "" for nil
	}{
		{"no store", nil, dedup.Policy{}, cycle.Needs{}, "Store is required"},
		{"within bounds", bounded(stores.Capabilities{MaxLease: time.Minute, MaxRetention: time.Hour, MaxScope: 3}), dedup.Policy{Lease: time.Minute, Retention: time.Hour}, cycle.Needs{Scope: "abc"}, ""},
		{"lease", bounded(stores.Capabilities{Kind: "k", MaxLease: time.Minute}), dedup.Policy{Lease: time.Minute + 1}, cycle.Needs{}, "Lease: lease 1m0.000000001s is longer than k's MaxLease (1m0s)"},
		{"default lease", bounded(stores.Capabilities{MaxLease: time.Second}), dedup.Policy{}, cycle.Needs{}, "Lease: lease 30s is longer"},
		{"lease, transactional", &inboxStore{fake: &fake{Store: mem, caps: func(c stores.Capabilities) stores.Capabilities { c.MaxLease = time.Second; c.Inbox = true; return c }}}, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, ""},
		{"retention", bounded(stores.Capabilities{MaxRetention: time.Hour}), dedup.Policy{Retention: time.Hour + 1}, cycle.Needs{}, "Retention: retention 1h0m0.000000001s is longer"},
		{"default retention", bounded(stores.Capabilities{MaxRetention: time.Hour}), dedup.Policy{}, cycle.Needs{}, "Retention: retention 24h0m0s is longer"},
		{"retention, transactional", &inboxStore{fake: &fake{Store: mem, caps: func(c stores.Capabilities) stores.Capabilities { c.MaxRetention = time.Hour; c.Inbox = true; return c }}}, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, "Retention: retention 24h0m0s is longer"},
		{"scope", bounded(stores.Capabilities{MaxScope: 3}), dedup.Policy{}, cycle.Needs{Scope: "abcd"}, "Scope: scope of 4 bytes is longer than"},
		{"kind from the type", bounded(stores.Capabilities{MaxScope: 3}), dedup.Policy{}, cycle.Needs{Scope: "abcd"}, "*cycle_test.fake's MaxScope (3 bytes)"},
		{"no inbox", mem, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, "ModeTransactional needs a store with a transactional inbox"},
		{"inbox not stated", &inboxStore{fake: &fake{Store: mem}}, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, "ModeTransactional needs a store with a transactional inbox"},
		{"inbox stated, not implemented", bounded(stores.Capabilities{Inbox: true}), dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, "ModeTransactional needs a store with a transactional inbox"},
		{"inbox", inbox.stating(true, false), dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, ""},
		{"no joiner", inbox.stating(true, false), dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional, JoinTx: true}, "joins the caller's transaction"},
		{"joiner not stated", &joinerStore{inbox.stating(true, false)}, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional, JoinTx: true}, "joins the caller's transaction"},
		{"joiner", &joinerStore{inbox.stating(true, true)}, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional, JoinTx: true}, ""},
		{"fail-open, transactional", inbox.stating(true, false), dedup.Policy{OnStoreError: dedup.FailOpen}, cycle.Needs{Mode: dedup.ModeTransactional}, "FailOpen cannot be combined with ModeTransactional"},
		{"fail-open, lease", mem, dedup.Policy{OnStoreError: dedup.FailOpen}, cycle.Needs{}, ""},
		{"no bounds", mem, dedup.Policy{Lease: 1 << 62, Retention: 1 << 62}, cycle.Needs{Scope: "abcd"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cycle.Check(tc.store, tc.policy, tc.needs)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, dedup.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check = %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		side   cycle.Side
		policy dedup.Policy
		needs  cycle.Needs
		want   string
	}{
		{"unknown mode", cycle.Consumer, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional + 1}, "Mode must be"},
		{"async producer", cycle.Producer, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeAsyncComplete}, "ModeAsyncComplete is the consumer middleware's"},
		{"bad policy", cycle.Consumer, dedup.Policy{Lease: -1}, cycle.Needs{}, "Lease must not be negative"},
		{"store check", cycle.Consumer, dedup.Policy{}, cycle.Needs{Mode: dedup.ModeTransactional}, "transactional inbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cycle.New(e.store, tc.policy, tc.side, tc.needs)
			if !errors.Is(err, dedup.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
	for _, side := range []cycle.Side{cycle.Consumer, cycle.Producer} {
		for _, mode := range []dedup.Mode{dedup.ModeLease, dedup.ModeAsyncComplete} {
			if side == cycle.Producer && mode == dedup.ModeAsyncComplete {
				continue
			}
			c, err := cycle.New(e.store, dedup.Policy{}, side, cycle.Needs{Mode: mode})
			if err != nil {
				t.Fatalf("%v %s: %v", side, mode, err)
			}
			if p := c.Policy(); p.Lease != dedup.DefaultLease || p.Retention != dedup.DefaultRetention || p.Tuning.InProgressPoll != dedup.DefaultInProgressPoll || p.Logger == nil || p.Metrics == nil {
				t.Fatalf("policy %+v, want the defaults", p)
			}
		}
	}
}

func TestKeyDefault(t *testing.T) {
	keys, err := cycle.Key(nil)(newMsg("m-1"))
	if err != nil || len(keys) != 1 || keys[0] != "m-1" {
		t.Fatalf("default key = %q, %v; want the message id", keys, err)
	}
	own := keyfuncs.Metadata("k")
	msg := newMsg("m-1")
	msg.Metadata.Set("k", "v")
	if keys, _ := cycle.Key(own)(msg); len(keys) != 1 || keys[0] != "v" {
		t.Fatalf("a key function of one's own = %q, want it used", keys)
	}
}

// TestStoreCallsAreBounded: every call of a store that may block carries
// StoreTimeout as its deadline; a store that never blocks gets the
// caller's context as it is; the calls after the effect ignore the
// message's cancellation; metrics see every call.
func TestStoreCallsAreBounded(t *testing.T) {
	e := newEnv(t)
	c := e.cycle(cycle.Consumer, dedup.Policy{StoreTimeout: time.Hour}, cycle.Needs{})
	ctx, cancel := context.WithCancel(context.Background())
	cl, err := c.Claim(ctx, "s", []string{"k"})
	if err != nil {
		t.Fatal(err)
	}
	cancel() // the message's context ends: what follows the effect still runs
	if got, _ := complete(c, context.WithoutCancel(ctx), newMsg("m"), cl, nil); got != cycle.Done {
		t.Fatalf("Complete = %v, want Done", got)
	}
	if !e.store.deadlines[0] {
		t.Error("the Claim of a store that may block had no deadline")
	}
	if n := e.metrics.Calls(dedup.OpClaim); n != 1 {
		t.Errorf("%d claims observed, want 1", n)
	}
	if n := e.metrics.Calls(dedup.OpComplete); n != 1 {
		t.Errorf("%d completes observed, want 1", n)
	}

	// Never blocking: no deadline, no timing when nobody observes.
	nb := newEnv(t)
	nb.store.caps = func(c stores.Capabilities) stores.Capabilities { c.NonBlocking = true; return c }
	c2, err := cycle.New(nb.store, dedup.Policy{}, cycle.Consumer, cycle.Needs{})
	if err != nil {
		t.Fatal(err)
	}
	if !c2.NonBlocking() {
		t.Fatal("NonBlocking() = false for a store that says it never blocks")
	}
	if _, err := c2.Claim(context.Background(), "s", []string{"k"}); err != nil {
		t.Fatal(err)
	}
	if nb.store.deadlines[0] {
		t.Error("a store that never blocks got a deadline")
	}
	if c2.Store() != stores.Store(nb.store) {
		t.Error("Store() is not the store")
	}
}

func TestClaimFailed(t *testing.T) {
	outage := fmt.Errorf("%w: connection refused", stores.ErrUnavailable)
	for _, tc := range []struct {
		name      string
		err       error
		policy    dedup.StoreErrorPolicy
		cancelled bool
		side      cycle.Side
		bypass    bool
		wantIs    []error
		permanent bool
		outcomes  []dedup.Outcome
		prefix    string
	}{
		{name: "outage, fail-closed", err: outage, wantIs: []error{dedup.ErrStore, stores.ErrUnavailable}, outcomes: []dedup.Outcome{dedup.OutcomeStoreError}, prefix: "dedup: store call failed: message m, scope"},
		{name: "outage, fail-open", err: outage, policy: dedup.FailOpen, bypass: true, outcomes: []dedup.Outcome{dedup.OutcomeStoreError, dedup.OutcomeBypassed}},
		{name: "timeout, fail-open", err: fmt.Errorf("claim: %w", context.DeadlineExceeded), policy: dedup.FailOpen, bypass: true, outcomes: []dedup.Outcome{dedup.OutcomeStoreError, dedup.OutcomeBypassed}},
		{name: "unclassified, fail-open", err: errReset, policy: dedup.FailOpen, wantIs: []error{dedup.ErrStore, errReset}, outcomes: []dedup.Outcome{dedup.OutcomeStoreError}},
		{name: "closed, fail-open", err: stores.ErrClosed, policy: dedup.FailOpen, wantIs: []error{dedup.ErrStore, stores.ErrClosed}, outcomes: []dedup.Outcome{dedup.OutcomeStoreError}},
		{name: "cancelled", err: outage, policy: dedup.FailOpen, cancelled: true, wantIs: []error{context.Canceled, stores.ErrUnavailable}, outcomes: []dedup.Outcome{dedup.OutcomeCancelled}, prefix: `dedup: scope "s": message m: its context ended`},
		{name: "bad key", err: fmt.Errorf("%w: too long", stores.ErrInvalidKey), policy: dedup.FailOpen, wantIs: []error{keyfuncs.ErrNoKey, stores.ErrInvalidKey}, permanent: true, outcomes: []dedup.Outcome{dedup.OutcomeNoKey}},
		{name: "producer", err: outage, side: cycle.Producer, wantIs: []error{dedup.ErrStore}, outcomes: []dedup.Outcome{dedup.OutcomeStoreError}, prefix: "dedup: store call failed: publish: message m"},
		{name: "producer, bad key", err: fmt.Errorf("%w: too long", stores.ErrInvalidKey), side: cycle.Producer, wantIs: []error{keyfuncs.ErrNoKey}, permanent: true, outcomes: []dedup.Outcome{dedup.OutcomeNoKey}, prefix: `dedup: publish: scope "s"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			side := tc.side
			if side == (cycle.Side{}) {
				side = cycle.Consumer
			}
			c := e.cycle(side, dedup.Policy{OnStoreError: tc.policy}, cycle.Needs{})
			msg := newMsg("m")
			if tc.cancelled {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				msg.SetContext(ctx)
			}
			bypass, err := c.ClaimFailed(msg, "s", []string{"k"}, tc.err)
			if bypass != tc.bypass {
				t.Fatalf("bypass = %v, want %v", bypass, tc.bypass)
			}
			if tc.bypass != (err == nil) {
				t.Fatalf("err = %v with bypass %v", err, bypass)
			}
			for _, w := range tc.wantIs {
				if !errors.Is(err, w) {
					t.Errorf("err = %v, want it to wrap %v", err, w)
				}
			}
			if dedup.IsPermanent(err) != tc.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", err, !tc.permanent, tc.permanent)
			}
			if tc.prefix != "" && !strings.HasPrefix(fmt.Sprint(err), tc.prefix) {
				t.Errorf("err = %q, want it to start %q", err, tc.prefix)
			}
			total := 0
			for _, o := range tc.outcomes {
				if e.metrics.Outcome(o) != 1 {
					t.Errorf("%s counted %d times, want 1", o, e.metrics.Outcome(o))
				}
			}
			for _, n := range e.metrics.Outcomes() {
				total += n
			}
			if total != len(tc.outcomes) {
				t.Errorf("%d outcomes counted (%v), want %v", total, e.metrics.Outcomes(), tc.outcomes)
			}
			if (tc.bypass || tc.permanent) != (e.errorLogs() != "") {
				t.Errorf("error log %q: want a line exactly for a bypass or a permanent failure", e.errorLogs())
			}
		})
	}
}

func TestAwait(t *testing.T) {
	t.Run("no wait", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		called := false
		err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) { called = true; return false, nil })
		if !errors.Is(err, dedup.ErrInProgress) || called || e.metrics.Outcome(dedup.OutcomeInProgress) != 1 {
			t.Fatalf("err %v, called %v, counted %d: want ErrInProgress at once, counted", err, called, e.metrics.Outcome(dedup.OutcomeInProgress))
		}
	})
	t.Run("freed", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: time.Hour, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}, cycle.Needs{})
		n := 0
		err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) { n++; return n < 3, nil })
		if err != nil || n != 3 {
			t.Fatalf("err %v after %d tries, want nil after 3", err, n)
		}
		if e.metrics.Outcome(dedup.OutcomeInProgress) != 0 {
			t.Error("a wait that ended with the keys free counted in_progress")
		}
	})
	t.Run("poll longer than the wait", func(t *testing.T) {
		// A poll of an hour in a 50ms wait: one try at its end (or two,
		// the second at once should the first come a hair early), never
		// a loop of them.
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: 50 * time.Millisecond, Tuning: dedup.Tuning{InProgressPoll: time.Hour}}, cycle.Needs{})
		n := 0
		err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) { n++; return true, nil })
		if !errors.Is(err, dedup.ErrInProgress) || n < 1 || n > 2 {
			t.Fatalf("err %v after %d tries, want ErrInProgress after 1 or 2", err, n)
		}
	})
	t.Run("1ns poll", func(t *testing.T) {
		// Half of a 1ns poll is 0: the wait must still wait.
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: time.Hour, Tuning: dedup.Tuning{InProgressPoll: time.Nanosecond}}, cycle.Needs{})
		n := 0
		err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) { n++; return n < 3, nil })
		if err != nil || n != 3 {
			t.Fatalf("err %v after %d tries, want nil after 3", err, n)
		}
	})
	t.Run("claim fails", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: time.Hour, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}, cycle.Needs{})
		err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) { return false, errReset })
		if err != errReset {
			t.Fatalf("err %v, want the claim's own", err)
		}
	})
	t.Run("wait ends", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: 20 * time.Millisecond, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}, cycle.Needs{})
		n := 0
		err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) { n++; return true, nil })
		if !errors.Is(err, dedup.ErrInProgress) || n == 0 {
			t.Fatalf("err %v after %d tries, want ErrInProgress after some", err, n)
		}
	})
	t.Run("polls every InProgressPoll, give or take half", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			poll := 100 * time.Millisecond
			c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: time.Hour, Tuning: dedup.Tuning{Heartbeat: -1, InProgressPoll: poll}}, cycle.Needs{})
			last, n := time.Now(), 0
			err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) {
				n++
				if d := time.Since(last); d < poll/2 || d >= poll*3/2 {
					t.Errorf("try %d came %s after the one before, want within [%s, %s)", n, d, poll/2, poll*3/2)
				}
				last = time.Now()
				return n < 20, nil
			})
			if err != nil || n != 20 {
				t.Fatalf("err %v after %d tries, want nil after 20", err, n)
			}
		})
	})
	t.Run("the last try is at InProgressWait", func(t *testing.T) {
		// A poll longer than the wait: one try, at its end, and none
		// after it (the keys free by then are not claimed).
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: 10 * time.Millisecond, Tuning: dedup.Tuning{Heartbeat: -1, InProgressPoll: time.Hour}}, cycle.Needs{})
			start, n := time.Now(), 0
			var at time.Duration
			err := c.Await(newMsg("m"), "s", []string{"k"}, func() (bool, error) {
				n++
				at = time.Since(start)
				return n < 2, nil
			})
			if !errors.Is(err, dedup.ErrInProgress) || n != 1 || at != 10*time.Millisecond {
				t.Fatalf("err %v after %d tries, the first at %s; want ErrInProgress after one, at 10ms", err, n, at)
			}
		})
	})
	t.Run("cancelled", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Producer, dedup.Policy{InProgressWait: time.Hour, Tuning: dedup.Tuning{InProgressPoll: time.Hour}}, cycle.Needs{})
		ctx, cancel := context.WithCancelCause(context.Background())
		msg := newMsg("m")
		msg.SetContext(ctx)
		cause := errors.New("shutting down")
		cancel(cause)
		err := c.Await(msg, "s", []string{"k"}, func() (bool, error) { t.Fatal("claimed after the context ended"); return false, nil })
		if !errors.Is(err, cause) || !strings.HasPrefix(err.Error(), "dedup: publish: ") || e.metrics.Outcome(dedup.OutcomeCancelled) != 1 {
			t.Fatalf("err %v, cancelled %d: want the cause, counted", err, e.metrics.Outcome(dedup.OutcomeCancelled))
		}
	})
}

func TestComplete(t *testing.T) {
	quick := dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: 50 * time.Millisecond}}
	t.Run("done", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, quick, cycle.Needs{})
		got, data := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d"))
		if got != cycle.Done || data != nil || e.store.completes.Load() != 1 {
			t.Fatalf("Complete = %v, %q after %d calls", got, data, e.store.completes.Load())
		}
		if st, _ := e.state("k"); st != stores.StateDone || string(e.store.data(0)) != "d" {
			t.Fatalf("record %v with data %q", st, e.store.data(0))
		}
	})
	t.Run("retried through failures not known to be permanent", func(t *testing.T) {
		for _, fail := range []error{errReset, fmt.Errorf("%w: gone", stores.ErrUnavailable), context.DeadlineExceeded, stores.ErrTxAborted} {
			e := newEnv(t)
			e.store.complete = func(n int, _ []byte) error {
				if n < 3 {
					return fail
				}
				return nil
			}
			c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: time.Hour}}, cycle.Needs{})
			got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d"))
			if got != cycle.Done || e.store.completes.Load() != 3 || string(e.store.data(2)) != "d" {
				t.Fatalf("%v: Complete = %v after %d calls, last data %q; want Done on the third, with the data", fail, got, e.store.completes.Load(), e.store.data(2))
			}
			if e.metrics.Outcome(dedup.OutcomeStoreError) != 0 {
				t.Errorf("%v: a Complete that landed counted store_error", fail)
			}
		}
	})
	t.Run("given up after CompleteTimeout, once more without the data", func(t *testing.T) {
		e := newEnv(t)
		e.store.complete = func(int, []byte) error { return errReset }
		c := e.cycle(cycle.Consumer, quick, cycle.Needs{})
		start := time.Now()
		got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d"))
		n := int(e.store.completes.Load())
		if got != cycle.NotRecorded || n < 3 {
			t.Fatalf("Complete = %v after %d calls, want NotRecorded after several", got, n)
		}
		if time.Since(start) < 50*time.Millisecond {
			t.Errorf("gave up after %s, before CompleteTimeout", time.Since(start))
		}
		if n > 10 {
			t.Errorf("%d Completes in a CompleteTimeout of 50ms: the retries do not back off", n)
		}
		if e.store.data(n-1) != nil || e.store.data(n-2) == nil {
			t.Error("the last attempt was not the one without the data")
		}
		if st, _ := e.state("k"); st != stores.StateProcessing {
			t.Fatalf("record %v, want it left processing", st)
		}
		if e.metrics.Outcome(dedup.OutcomeStoreError) != 1 || !strings.Contains(e.errorLogs(), "without them") || !strings.Contains(e.errorLogs(), "stays processing") {
			t.Fatalf("store errors %d, log %q: want the dropped data and the failure counted and logged", e.metrics.Outcome(dedup.OutcomeStoreError), e.errorLogs())
		}
		// The store did not refuse the data: it did not answer in time.
		if logs := e.errorLogs(); strings.Contains(logs, "will not keep") || !strings.Contains(logs, "within Tuning.CompleteTimeout") {
			t.Fatalf("log %q: want the data dropped for the deadline, not for a refusal", logs)
		}
	})
	t.Run("given up on a fingerprint alone", func(t *testing.T) {
		// A record with no outputs keeps only the fingerprint: the log
		// says that is what goes, not outputs the handler never made.
		e := newEnv(t)
		e.store.complete = func(_ int, data []byte) error {
			if data != nil {
				return errReset
			}
			return nil
		}
		c := e.cycle(cycle.Consumer, quick, cycle.Needs{})
		complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), record.Encode([]byte("fp"), nil))
		logs := e.errorLogs()
		if !strings.Contains(logs, "could not record the message's payload fingerprint") || strings.Contains(logs, "outputs") {
			t.Fatalf("log %q: want the fingerprint named as what was dropped, and no outputs", logs)
		}
	})
	t.Run("given up without data", func(t *testing.T) {
		e := newEnv(t)
		e.store.complete = func(int, []byte) error { return errReset }
		c := e.cycle(cycle.Consumer, quick, cycle.Needs{})
		if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), nil); got != cycle.NotRecorded {
			t.Fatalf("Complete = %v, want NotRecorded", got)
		}
		if e.metrics.Outcome(dedup.OutcomeStoreError) != 1 {
			t.Fatalf("store errors %d, want 1", e.metrics.Outcome(dedup.OutcomeStoreError))
		}
	})
	t.Run("stopped by ctx", func(t *testing.T) {
		e := newEnv(t)
		ctx, cancel := context.WithCancel(context.Background())
		e.store.complete = func(n int, _ []byte) error {
			if n == 2 {
				cancel()
			}
			return errReset
		}
		c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: time.Hour}}, cycle.Needs{})
		if got, _ := complete(c, ctx, newMsg("m"), e.claimed(c, "k"), []byte("d")); got != cycle.NotRecorded {
			t.Fatalf("Complete = %v, want NotRecorded", got)
		}
		if n := e.store.completes.Load(); n != 2 {
			t.Fatalf("%d Completes, want 2: none after ctx ended", n)
		}
	})
	t.Run("closed store", func(t *testing.T) {
		e := newEnv(t)
		e.store.complete = func(int, []byte) error { return fmt.Errorf("memstore: complete: %w", stores.ErrClosed) }
		c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: time.Hour}}, cycle.Needs{})
		if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d")); got != cycle.NotRecorded || e.store.completes.Load() != 1 {
			t.Fatalf("Complete = %v after %d calls, want NotRecorded after 1", got, e.store.completes.Load())
		}
	})
	t.Run("refused data", func(t *testing.T) {
		for _, refusal := range []error{stores.ErrTooLarge, stores.ErrInvalidArgument, stores.ErrInvalidKey} {
			e := newEnv(t)
			e.store.complete = func(_ int, data []byte) error {
				if data != nil {
					return refusal
				}
				return nil
			}
			c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: time.Hour}}, cycle.Needs{})
			if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d")); got != cycle.Done || e.store.completes.Load() != 2 {
				t.Fatalf("%v: Complete = %v after %d calls, want Done after 2 (not retried, then without the data)", refusal, got, e.store.completes.Load())
			}
			if e.metrics.Outcome(dedup.OutcomeStoreError) != 1 || !strings.Contains(e.errorLogs(), "without them") || !strings.Contains(e.errorLogs(), "will not keep the record's outputs and fingerprint") {
				t.Fatalf("%v: the dropped data was not counted and logged as refused, outputs and fingerprint: %q", refusal, e.errorLogs())
			}
		}
	})
	t.Run("refused without data", func(t *testing.T) {
		e := newEnv(t)
		e.store.complete = func(int, []byte) error { return stores.ErrInvalidArgument }
		c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: time.Hour}}, cycle.Needs{})
		if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), nil); got != cycle.NotRecorded || e.store.completes.Load() != 1 {
			t.Fatalf("Complete = %v after %d calls, want NotRecorded after 1", got, e.store.completes.Load())
		}
	})
	t.Run("backoff doubles up to a second", func(t *testing.T) {
		// On the bubble's clock: the attempts' times are exact.
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			var at []time.Time
			e.store.complete = func(n int, _ []byte) error {
				at = append(at, time.Now())
				if n <= 8 {
					return errReset
				}
				return nil
			}
			c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{Heartbeat: -1, CompleteTimeout: time.Hour}}, cycle.Needs{})
			if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d")); got != cycle.Done {
				t.Fatalf("Complete = %v, want Done", got)
			}
			ms := time.Millisecond
			want := []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}
			if len(at) != len(want)+1 {
				t.Fatalf("%d Completes, want %d", len(at), len(want)+1)
			}
			for i, w := range want {
				if d := at[i+1].Sub(at[i]); d != w {
					t.Fatalf("attempt %d came %s after the one before, want %s", i+2, d, w)
				}
			}
		})
	})
	t.Run("the last attempt is at the deadline", func(t *testing.T) {
		// CompleteTimeout 30ms: attempts at 0, 20ms (the backoff) and
		// 30ms (the deadline, not 60ms); at the deadline the data is
		// dropped and the record completed without it, at once.
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			var at []time.Duration
			start := time.Now()
			e.store.complete = func(n int, _ []byte) error {
				at = append(at, time.Since(start))
				if n <= 3 {
					return errReset
				}
				return nil
			}
			c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{Heartbeat: -1, CompleteTimeout: 30 * time.Millisecond}}, cycle.Needs{})
			if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d")); got != cycle.Done {
				t.Fatalf("Complete = %v, want Done", got)
			}
			want := []time.Duration{0, 20 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond}
			if fmt.Sprint(at) != fmt.Sprint(want) {
				t.Fatalf("attempts at %v, want %v", at, want)
			}
			if string(e.store.data(2)) != "d" || e.store.data(3) != nil {
				t.Fatalf("data of the last two attempts %q, %q; want the data, then none", e.store.data(2), e.store.data(3))
			}
			if e.metrics.Outcome(dedup.OutcomeStoreError) != 1 || !strings.Contains(e.errorLogs(), "within Tuning.CompleteTimeout") {
				t.Fatalf("store errors %d, log %q: want the dropped data counted and logged", e.metrics.Outcome(dedup.OutcomeStoreError), e.errorLogs())
			}
		})
	})
	t.Run("data larger than the store keeps", func(t *testing.T) {
		e := newEnv(t)
		e.store.caps = func(c stores.Capabilities) stores.Capabilities { c.MaxData = 3; return c }
		c := e.cycle(cycle.Consumer, quick, cycle.Needs{})
		if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("abcd")); got != cycle.Done || e.store.completes.Load() != 1 || e.store.data(0) != nil {
			t.Fatalf("Complete = %v, %d calls, data %q: want one Complete without the data", got, e.store.completes.Load(), e.store.data(0))
		}
		e2 := newEnv(t)
		e2.store.caps = e.store.caps
		c2 := e2.cycle(cycle.Consumer, quick, cycle.Needs{})
		if got, _ := complete(c2, context.Background(), newMsg("m"), e2.claimed(c2, "k"), []byte("abc")); got != cycle.Done || string(e2.store.data(0)) != "abc" {
			t.Fatalf("data of MaxData bytes: %v, %q; want it kept", got, e2.store.data(0))
		}
	})
}

// TestCompleteReconciles: a Complete refused with ErrLostClaim claims the
// keys again to learn why.
func TestCompleteReconciles(t *testing.T) {
	lost := fmt.Errorf("%w: token", stores.ErrLostClaim)
	t.Run("reply lost", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		e.store.complete = func(n int, _ []byte) error {
			if n == 2 {
				return lost
			}
			return nil
		}
		cl := e.claimed(c, "k")
		// The first attempt lands but its reply is lost (a failure the
		// cycle retries); the retry finds the claim gone.
		e.store.complete = func(n int, data []byte) error {
			if n == 1 {
				if err := e.mem.Complete(context.Background(), cl, time.Hour, data); err != nil {
					t.Fatal(err)
				}
				return errReset
			}
			return nil
		}
		got, data := complete(c, context.Background(), newMsg("m"), cl, []byte("mine"))
		if got != cycle.DoneBefore || string(data) != "mine" {
			t.Fatalf("Complete = %v, %q; want DoneBefore with the data that landed", got, data)
		}
		if e.metrics.Outcome(dedup.OutcomeLostClaim) != 0 || e.errorLogs() != "" {
			t.Fatalf("a lost reply was reported: lost_claim %d, log %q", e.metrics.Outcome(dedup.OutcomeLostClaim), e.errorLogs())
		}
	})
	t.Run("record vanished", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		cl := e.claimed(c, "k")
		e.vanishOnFirstComplete(t, cl, lost, nil)
		if got, _ := complete(c, context.Background(), newMsg("m"), cl, []byte("d")); got != cycle.Done {
			t.Fatalf("Complete = %v, want Done (this run recorded under a new claim)", got)
		}
		if st, _ := e.state("k"); st != stores.StateDone || string(e.store.data(1)) != "d" {
			t.Fatalf("record %v, data %q", st, e.store.data(1))
		}
	})
	t.Run("record vanished, the new Complete fails", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		cl := e.claimed(c, "k")
		e.vanishOnFirstComplete(t, cl, lost, stores.ErrClosed)
		// The effect happened: the message is not claimed lost (a nack
		// would run it again); the new claim is kept, so that a
		// duplicate within the lease is held off.
		if got, _ := complete(c, context.Background(), newMsg("m"), cl, nil); got != cycle.NotRecorded {
			t.Fatalf("Complete = %v, want NotRecorded", got)
		}
		if st, _ := e.state("k"); st != stores.StateProcessing || e.store.releases.Load() != 0 || e.metrics.Outcome(dedup.OutcomeLostClaim) != 0 {
			t.Fatalf("record %v, %d releases, lost_claim %d: want the new claim kept, nothing claimed lost", st, e.store.releases.Load(), e.metrics.Outcome(dedup.OutcomeLostClaim))
		}
	})
	t.Run("still ours", func(t *testing.T) {
		// A store that fails a Complete as a lost claim while the record
		// is still the claim's: the claim still extends, so it is
		// recorded again, not reported taken over.
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		e.store.complete = func(n int, _ []byte) error {
			if n == 1 {
				return lost
			}
			return nil
		}
		if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte("d")); got != cycle.Done {
			t.Fatalf("Complete = %v, want Done", got)
		}
		if st, _ := e.state("k"); st != stores.StateDone || e.metrics.Outcome(dedup.OutcomeLostClaim) != 0 || e.errorLogs() != "" {
			t.Fatalf("record %v, lost_claim %d, log %q", st, e.metrics.Outcome(dedup.OutcomeLostClaim), e.errorLogs())
		}
	})
	t.Run("taken over", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{Lease: time.Minute}, cycle.Needs{})
		cl := e.claimed(c, "k")
		e.clock.Advance(2 * time.Minute)
		other := e.claimed(c, "k") // takes the expired lease over
		if !other.Takeover {
			t.Fatal("no takeover")
		}
		got, _ := complete(c, context.Background(), newMsg("m"), cl, []byte("d"))
		if got != cycle.TakenOver || e.metrics.Outcome(dedup.OutcomeLostClaim) != 1 || !strings.Contains(e.errorLogs(), "claim lost") {
			t.Fatalf("Complete = %v, lost_claim %d, log %q", got, e.metrics.Outcome(dedup.OutcomeLostClaim), e.errorLogs())
		}
	})
	t.Run("claim fails", func(t *testing.T) {
		// The keys cannot be claimed again to learn why: the effect
		// happened, and claiming it lost (a nack) could run it again.
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: 50 * time.Millisecond}}, cycle.Needs{})
		cl := e.claimed(c, "k")
		e.store.complete = func(int, []byte) error { return lost }
		e.store.claim = func(int) (*stores.Claim, error) { return nil, errReset }
		if got, _ := complete(c, context.Background(), newMsg("m"), cl, nil); got != cycle.NotRecorded {
			t.Fatalf("Complete = %v, want NotRecorded", got)
		}
		if n := e.store.claims.Load(); n < 3 {
			t.Fatalf("%d claims, want the reconciling claim retried", n)
		}
		if e.metrics.Outcome(dedup.OutcomeLostClaim) != 0 || e.metrics.Outcome(dedup.OutcomeStoreError) != 1 || !strings.Contains(e.errorLogs(), "claiming the keys again failed") {
			t.Fatalf("lost_claim %d, store_error %d, log %q", e.metrics.Outcome(dedup.OutcomeLostClaim), e.metrics.Outcome(dedup.OutcomeStoreError), e.errorLogs())
		}
	})
}

func TestRelease(t *testing.T) {
	e := newEnv(t)
	c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
	if err := c.Release(context.Background(), e.claimed(c, "a"), true); err != nil || e.metrics.Outcome(dedup.OutcomeReleased) != 1 {
		t.Fatalf("Release = %v, released %d", err, e.metrics.Outcome(dedup.OutcomeReleased))
	}
	if _, ok := e.state("a"); ok {
		t.Fatal("the record is still there")
	}
	if err := c.Release(context.Background(), e.claimed(c, "b"), false); err != nil || e.metrics.Outcome(dedup.OutcomeReleased) != 1 {
		t.Fatalf("an uncounted Release was counted: %v", err)
	}
	lostClaim := e.claimed(c, "c")
	if err := e.mem.Release(context.Background(), lostClaim); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(context.Background(), lostClaim, true); !errors.Is(err, stores.ErrLostClaim) || e.metrics.Outcome(dedup.OutcomeLostClaim) != 1 {
		t.Fatalf("Release of a lost claim = %v, lost_claim %d", err, e.metrics.Outcome(dedup.OutcomeLostClaim))
	}
	e.store.release = func(int) error { return errReset }
	if err := c.Release(context.Background(), e.claimed(c, "d"), true); err != errReset || e.metrics.Outcome(dedup.OutcomeStoreError) != 1 || !strings.Contains(e.errorLogs(), "release failed") {
		t.Fatalf("a failed Release: %v, store errors %d, log %q", err, e.metrics.Outcome(dedup.OutcomeStoreError), e.errorLogs())
	}
}

func TestDuplicate(t *testing.T) {
	e := newEnv(t)
	fp := func(fp string) cycle.Needs {
		return cycle.Needs{Fingerprint: func(*message.Message) []byte { return []byte(fp) }}
	}
	c := e.cycle(cycle.Consumer, dedup.Policy{}, fp("fp"))
	out := message.NewMessage("out-1", []byte("x"))
	data := record.Encode([]byte("fp"), []*message.Message{out})

	got, err := c.Duplicate(newMsg("m"), "s", []string{"k"}, data)
	if err != nil || len(got) != 1 || got[0].UUID != "out-1" || e.metrics.Outcome(dedup.OutcomeDuplicate) != 1 {
		t.Fatalf("Duplicate = %v, %v", got, err)
	}
	if _, err := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{}).Duplicate(newMsg("m"), "s", []string{"k"}, data); err != nil {
		t.Fatalf("without a fingerprint function: %v", err)
	}
	other := e.cycle(cycle.Consumer, dedup.Policy{}, fp("other"))
	if _, err := other.Duplicate(newMsg("m"), "s", []string{"k"}, record.Encode(nil, []*message.Message{out})); err != nil {
		t.Fatalf("a record kept without a fingerprint: %v", err)
	}
	_, err = other.Duplicate(newMsg("m"), "s", []string{"k"}, data)
	if !errors.Is(err, dedup.ErrFingerprintMismatch) || !dedup.IsPermanent(err) || e.metrics.Outcome(dedup.OutcomeFingerprintMismatch) != 1 {
		t.Fatalf("mismatch: %v", err)
	}
	_, err = c.Duplicate(newMsg("m"), "s", []string{"k"}, []byte{9, 9})
	if !errors.Is(err, dedup.ErrCorruptRecord) || !dedup.IsPermanent(err) || e.metrics.Outcome(dedup.OutcomeCorruptRecord) != 1 || !strings.HasPrefix(err.Error(), `dedup: scope "s": message m: `) {
		t.Fatalf("corrupt: %v", err)
	}
}

func TestSmallReports(t *testing.T) {
	e := newEnv(t)
	c := e.cycle(cycle.Producer, dedup.Policy{}, cycle.Needs{})
	msg := newMsg("m")
	if err := c.InProgress(msg, "s", []string{"k"}); !errors.Is(err, dedup.ErrInProgress) || e.metrics.Outcome(dedup.OutcomeInProgress) != 1 || !strings.Contains(err.Error(), `message m, scope "s", keys ["k"]`) {
		t.Fatalf("InProgress = %v", err)
	}
	err := c.NoKey(msg, "s", nil, nil)
	if !errors.Is(err, keyfuncs.ErrNoKey) || !strings.HasPrefix(err.Error(), `dedup: publish: scope "s": `) || !strings.Contains(err.Error(), "returned no keys") || e.metrics.Outcome(dedup.OutcomeNoKey) != 1 {
		t.Fatalf("NoKey without an error = %v", err)
	}
	own := fmt.Errorf("%w: field missing", keyfuncs.ErrNoKey)
	if err := c.NoKey(msg, "s", nil, own); !errors.Is(err, own) {
		t.Fatalf("NoKey = %v, want the key function's error", err)
	}
	if err := c.Unexpected("s", stores.Result(9)); !strings.Contains(err.Error(), "returned result unknown") {
		t.Fatalf("Unexpected = %v", err)
	}
	c.Takeover(msg, "s", []string{"k"})
	if e.metrics.Outcome(dedup.OutcomeTakeover) != 1 || len(e.logger.Captured()[watermill.InfoLogLevel]) != 1 {
		t.Fatal("a takeover was not counted and logged")
	}
	f := c.Fields(msg, "s", nil)
	if f["message_uuid"] != "m" || f["scope"] != "s" {
		t.Fatalf("Fields = %v", f)
	}
	if _, ok := f["keys"]; ok {
		t.Fatal("Fields has keys it was not given")
	}
	if c.Logger() != watermill.LoggerAdapter(e.logger) {
		t.Fatal("Logger() is not the policy's")
	}
}

// inboxStore is a fake with a scripted inbox.
type inboxStore struct {
	*fake
	inbox, joined bool // what Capabilities states
	begin         func(ctx context.Context) (stores.InboxTx, error)
}

func (s *inboxStore) stating(inbox, joined bool) *inboxStore {
	return &inboxStore{fake: s.fake, inbox: inbox, joined: joined, begin: s.begin}
}

func (s *inboxStore) Capabilities() stores.Capabilities {
	c := s.fake.Capabilities()
	c.Inbox, c.JoinedTx = c.Inbox || s.inbox, c.JoinedTx || s.joined
	return c
}

func (s *inboxStore) Begin(ctx context.Context, _ string, _ []string, _ time.Duration) (stores.InboxTx, error) {
	return s.begin(ctx)
}

type joinerStore struct{ *inboxStore }

type txKey struct{}

func (joinerStore) JoinedTx(ctx context.Context) (any, bool) {
	tx := ctx.Value(txKey{})
	return tx, tx != nil
}

// tx is a scripted InboxTx.
type tx struct {
	commit      func(data []byte) error
	commits     [][]byte
	rollbacks   int
	rollbackErr error
}

func (*tx) Result() stores.Result                          { return stores.Claimed }
func (*tx) Data() []byte                                   { return nil }
func (*tx) Context(parent context.Context) context.Context { return parent }
func (t *tx) Commit(_ context.Context, data []byte) error {
	t.commits = append(t.commits, data)
	if t.commit != nil {
		return t.commit(data)
	}
	return nil
}
func (t *tx) Rollback(context.Context) error { t.rollbacks++; return t.rollbackErr }

func TestTransactionalCalls(t *testing.T) {
	e := newEnv(t)
	var deadlines []bool
	store := &joinerStore{&inboxStore{fake: e.store, inbox: true, joined: true, begin: func(ctx context.Context) (stores.InboxTx, error) {
		_, ok := ctx.Deadline()
		deadlines = append(deadlines, ok)
		return &tx{}, nil
	}}}
	c, err := cycle.New(store, dedup.Policy{Metrics: e.metrics, Logger: e.logger}, cycle.Producer, cycle.Needs{Mode: dedup.ModeTransactional, JoinTx: true})
	if err != nil {
		t.Fatal(err)
	}
	// Begin of its own transaction: bounded by StoreTimeout. Joined to
	// the caller's: bounded by the caller's context only.
	if _, err := c.Begin(context.Background(), "s", []string{"k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Begin(context.WithValue(context.Background(), txKey{}, 1), "s", []string{"k"}); err != nil {
		t.Fatal(err)
	}
	if len(deadlines) != 2 || !deadlines[0] || deadlines[1] {
		t.Fatalf("deadlines %v, want [true false]", deadlines)
	}
	if n := e.metrics.Calls(dedup.OpBegin); n != 2 {
		t.Fatalf("%d begins observed", n)
	}

	// Without a joiner, every Begin is bounded.
	deadlines = nil
	own, err := cycle.New(store.inboxStore, dedup.Policy{Metrics: e.metrics}, cycle.Consumer, cycle.Needs{Mode: dedup.ModeTransactional})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := own.Begin(context.WithValue(context.Background(), txKey{}, 1), "s", []string{"k"}); err != nil || len(deadlines) != 1 || !deadlines[0] {
		t.Fatalf("Begin without a joiner: %v, deadlines %v", err, deadlines)
	}

	// Commit keeps what fits, and drops what the store would not keep.
	small := &tx{}
	if err := c.Commit(context.Background(), "s", small, []byte("d")); err != nil || len(small.commits) != 1 || string(small.commits[0]) != "d" {
		t.Fatalf("Commit: %v, %q", err, small.commits)
	}
	refusing := &tx{commit: func(data []byte) error {
		if data != nil {
			return fmt.Errorf("commit: %w", stores.ErrTooLarge)
		}
		return nil
	}}
	if err := c.Commit(context.Background(), "s", refusing, []byte("d")); err != nil || len(refusing.commits) != 2 || refusing.commits[1] != nil {
		t.Fatalf("Commit refused as too large: %v, %q: want a second Commit without the data", err, refusing.commits)
	}
	failing := &tx{commit: func([]byte) error { return errReset }}
	if err := c.Commit(context.Background(), "s", failing, []byte("d")); err != errReset || len(failing.commits) != 1 {
		t.Fatalf("a failed Commit: %v after %d: want its error, not retried", err, len(failing.commits))
	}
	e.store.caps = func(c stores.Capabilities) stores.Capabilities { c.MaxData = 1; return c }
	bounded, err := cycle.New(store, dedup.Policy{Metrics: e.metrics, Logger: e.logger}, cycle.Producer, cycle.Needs{Mode: dedup.ModeTransactional, JoinTx: true})
	if err != nil {
		t.Fatal(err)
	}
	big := &tx{}
	if err := bounded.Commit(context.Background(), "s", big, []byte("dd")); err != nil || len(big.commits) != 1 || big.commits[0] != nil {
		t.Fatalf("data above MaxData: %v, %q: want one Commit without it", err, big.commits)
	}
	rb := &tx{}
	if err := c.Rollback(context.Background(), "s", rb); err != nil || rb.rollbacks != 1 {
		t.Fatalf("Rollback: %v, %d", err, rb.rollbacks)
	}
	if n := e.metrics.Calls(dedup.OpRollback); n != 1 {
		t.Fatalf("%d rollbacks observed", n)
	}
}
