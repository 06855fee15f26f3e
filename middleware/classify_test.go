package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// failingStore fails every Claim and Begin with what fail returns for the
// call's context (nil: the memstore underneath answers the Claim).
type failingStore struct {
	stores.Store
	fail func(ctx context.Context) error
}

// Capabilities are the wrapped store's, but it may block (a store that
// never blocks gets no per-call timeouts) and it has an inbox.
func (f failingStore) Capabilities() stores.Capabilities {
	c := mayBlock(f.Store.Capabilities())
	c.Inbox = true
	return c
}

func (f failingStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	if err := f.fail(ctx); err != nil {
		return nil, err
	}
	return f.Store.Claim(ctx, scope, keys, lease)
}

func (f failingStore) Begin(ctx context.Context, _ string, _ []string, _ time.Duration) (stores.InboxTx, error) {
	if err := f.fail(ctx); err != nil {
		return nil, err
	}
	return nil, errors.New("failingStore: Begin only fails")
}

// blockUntilDone is a store call that never gets an answer: it returns
// when its context ends, with the context's error.
func blockUntilDone(ctx context.Context) error {
	<-ctx.Done()
	return fmt.Errorf("store call: %w", ctx.Err())
}

func failWith(err error) func(context.Context) error {
	return func(context.Context) error { return err }
}

// want is what the middleware must do with a message whose Claim (lease
// mode) or Begin (transactional mode) failed.
type want struct {
	runs      bool    // the handler runs (unprotected)
	errs      []error // the returned error wraps each (nil error when runs)
	permanent bool    // dedup.IsPermanent
	outcome   dedup.Outcome
}

// TestFailureClassification is the failure classification table of the
// README's guarantee section: for each kind of failure, what the
// middleware does under FailClosed and FailOpen, in lease and in
// transactional mode. FailOpen may bypass the store only for an outage;
// cancellation, a closed store and bad input never run the handler
// unprotected.
func TestFailureClassification(t *testing.T) {
	outage := fmt.Errorf("%w: dial tcp 127.0.0.1:6379: connect: connection refused", stores.ErrUnavailable)
	nack := func(errs ...error) want {
		return want{errs: append([]error{dedup.ErrStore}, errs...), outcome: dedup.OutcomeStoreError}
	}
	bypass := want{runs: true, outcome: dedup.OutcomeBypassed}
	cancelled := want{errs: []error{context.Canceled}, outcome: dedup.OutcomeCancelled}
	badKey := want{errs: []error{keyfuncs.ErrNoKey, stores.ErrInvalidKey}, permanent: true, outcome: dedup.OutcomeNoKey}

	rows := []struct {
		name      string
		fail      func(context.Context) error
		cancelMsg bool // the message's context ended before the store answered
		// What happens under FailClosed (lease and transactional), under
		// FailOpen (lease only: transactional mode refuses FailOpen).
		failClosed, failOpen want
	}{
		{name: "outage", fail: failWith(outage),
			failClosed: nack(stores.ErrUnavailable), failOpen: bypass},
		{name: "store call timeout", fail: blockUntilDone,
			failClosed: nack(context.DeadlineExceeded), failOpen: bypass},
		{name: "cancellation", fail: blockUntilDone, cancelMsg: true,
			failClosed: cancelled, failOpen: cancelled},
		{name: "closed store", fail: failWith(fmt.Errorf("memstore: %w", stores.ErrClosed)),
			failClosed: nack(stores.ErrClosed), failOpen: nack(stores.ErrClosed)},
		{name: "bad argument", fail: failWith(fmt.Errorf("%w: scope is 2000 bytes, longer than MaxKeyLen (1024)", stores.ErrInvalidArgument)),
			failClosed: nack(stores.ErrInvalidArgument), failOpen: nack(stores.ErrInvalidArgument)},
		{name: "bad key", fail: failWith(fmt.Errorf("%w: key 0 is 2000 bytes", stores.ErrInvalidKey)),
			failClosed: badKey, failOpen: badKey},
		{name: "unclassified store error", fail: failWith(errors.New(`ERROR: relation "dedup_inbox" does not exist (SQLSTATE 42P01)`)),
			failClosed: nack(), failOpen: nack()},
		{name: "dead outer transaction", fail: failWith(fmt.Errorf("%w: Error 1305: SAVEPOINT sqlstore_1 does not exist", stores.ErrTxAborted)),
			failClosed: nack(stores.ErrTxAborted), failOpen: nack(stores.ErrTxAborted)},
		{name: "not replicated", fail: failWith(fmt.Errorf("redisstore: claim: %w: 0 of 1 replicas of 127.0.0.1:7000 acknowledged the write within 1s", errNotReplicated)),
			failClosed: nack(errNotReplicated), failOpen: nack(errNotReplicated)},
	}
	readme := readmeFailureTable(t)
	for _, row := range rows {
		cells, ok := readme[row.name]
		if !ok {
			t.Errorf("README's failure table has no row %q", row.name)
		}
		for i, w := range []want{row.failClosed, row.failOpen, row.failClosed} {
			if ok && !strings.HasPrefix(cells[i], w.readme()) {
				t.Errorf("README's failure table, row %q, column %d: %q; the middleware does %q", row.name, i+1, cells[i], w.readme())
			}
		}
		for _, mode := range []string{"lease", "transactional"} {
			for _, policy := range []dedup.StoreErrorPolicy{dedup.FailClosed, dedup.FailOpen} {
				if mode == "transactional" && policy == dedup.FailOpen {
					continue // refused by Validate
				}
				w := row.failClosed
				if policy == dedup.FailOpen {
					w = row.failOpen
				}
				t.Run(fmt.Sprintf("%s/%s/%s", row.name, mode, policy), func(t *testing.T) {
					inner := failingStore{Store: newMemstore(t), fail: row.fail}
					metrics := &testkit.Metrics{}
					mw := testkit.DedupMiddleware(t, middleware.Config{
						Store: inner, Scope: "s", Policy: dedup.Policy{OnStoreError: policy, Metrics: metrics, StoreTimeout: 50 * time.Millisecond}, Mode: map[string]dedup.Mode{"lease": dedup.ModeLease, "transactional": dedup.ModeTransactional}[mode]})
					msg := message.NewMessage("m-1", nil)
					if row.cancelMsg {
						ctx, cancel := context.WithCancel(context.Background())
						cancel()
						msg.SetContext(ctx)
					}
					ran := false
					_, err := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(msg)
					if ran != w.runs {
						t.Fatalf("handler ran = %v, want %v (err %v)", ran, w.runs, err)
					}
					if w.runs && err != nil {
						t.Fatalf("err = %v, want nil (ack)", err)
					}
					if !w.runs && err == nil {
						t.Fatal("err = nil (ack) for a message whose handler did not run")
					}
					for _, target := range w.errs {
						if !errors.Is(err, target) {
							t.Errorf("err = %v, want one wrapping %v", err, target)
						}
					}
					if got := dedup.IsPermanent(err); got != w.permanent {
						t.Errorf("IsPermanent(%v) = %v, want %v", err, got, w.permanent)
					}
					if metrics.Outcome(w.outcome) != 1 {
						t.Errorf("outcome %s counted %d times, want 1 (outcomes %v)", w.outcome, metrics.Outcome(w.outcome), metrics.Outcomes())
					}
					if !w.runs && metrics.Outcome(dedup.OutcomeBypassed) != 0 {
						t.Error("a bypass was counted for a message whose handler did not run")
					}
				})
			}
		}
	}
}

var _ stores.Inbox = failingStore{}

// readme is how the README's failure table starts the cell of w.
func (w want) readme() string {
	switch {
	case w.runs:
		return "run unprotected"
	case w.permanent:
		return "poison"
	case w.outcome == dedup.OutcomeCancelled:
		return "nack, counted `cancelled`"
	}
	return "nack"
}

// readmeFailureTable reads the first table of the README's "Failures, by
// kind" section: failure -> its fail-closed, fail-open and transactional
// cells.
func readmeFailureTable(t *testing.T) map[string][3]string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### Failures, by kind")
	if !ok {
		t.Fatal(`README.md has no "### Failures, by kind" section`)
	}
	rows := map[string][3]string{}
	inTable := false
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 5 || strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows[strings.TrimSpace(cells[0])] = [3]string{strings.TrimSpace(cells[2]), strings.TrimSpace(cells[3]), strings.TrimSpace(cells[4])}
	}
	return rows
}

// TestCompleteRetriesOutliveTheMessageContext: CompleteTimeout promises
// that a store outage shorter than it loses and doubles nothing. The
// retries of a failed Complete must go on when the message's context ends
// meanwhile (an outer Timeout middleware, a subscriber shutting down):
// acking with the record still processing would let the next delivery
// after the lease run the handler again.
func TestCompleteRetriesOutliveTheMessageContext(t *testing.T) {
	clock := storetest.NewFakeClock(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Events, not timers: the message's context ends once the first
	// Complete failed, while it is retried, and the store comes back
	// after the third failed.
	store := &completeFailures{flakyStore: &flakyStore{Store: newMemstoreClock(t, clock)}}
	store.onFail = func(n int32) {
		switch n {
		case 1:
			cancel()
		case 3:
			store.down.Store(false)
		}
	}
	lease := time.Minute
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Lease: lease, Tuning: dedup.Tuning{CompleteTimeout: time.Minute}}})
	l := newLedger()
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		l.apply(msg.UUID)
		store.down.Store(true) // the store goes away right after the effect...
		return nil, nil
	})
	msg := message.NewMessage("m-1", nil)
	msg.SetContext(ctx)
	// ...and the message's context ends while Complete is retried.
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if store.down.Load() {
		t.Fatal("acked while the store was still down: the Complete gave up when the message's context ended")
	}
	clock.Advance(2 * lease)
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	l.assertExactlyOnce(t, []string{"m-1"})
}

// Records done before Fingerprint was turned on carry no fingerprint:
// their duplicates are acked, not refused as a mismatch.
func TestRecordWithoutFingerprintIsADuplicate(t *testing.T) {
	store := newMemstore(t)
	ran := 0
	h := func(*message.Message) ([]*message.Message, error) { ran++; return nil, nil }
	before := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Key: keyfuncs.JSON("id")})
	if _, err := before(h)(message.NewMessage("1", []byte(`{"id":"A"}`))); err != nil {
		t.Fatal(err)
	}
	metrics := &testkit.Metrics{}
	after := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Key: keyfuncs.JSON("id"), Fingerprint: middleware.PayloadFingerprint, Policy: dedup.Policy{Metrics: metrics}})
	if _, err := after(h)(message.NewMessage("2", []byte(`{"id":"A"}`))); err != nil {
		t.Fatalf("duplicate of a record without a fingerprint: %v, want an ack", err)
	}
	if ran != 1 || metrics.Outcome(dedup.OutcomeDuplicate) != 1 {
		t.Fatalf("handler ran %d times, %d duplicates counted; want 1 and 1", ran, metrics.Outcome(dedup.OutcomeDuplicate))
	}
}

// A failed Complete is retried with a backoff, not in a busy loop: over a
// 300ms CompleteTimeout the store sees a handful of attempts.
func TestCompleteRetriesBackOff(t *testing.T) {
	store := &flakyStore{Store: newMemstore(t)}
	mw := testkit.DedupMiddleware(t, middleware.Config{Store: store, Scope: "s", Policy: dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: 300 * time.Millisecond, Heartbeat: -1}}})
	var before int64
	h := mw(func(*message.Message) ([]*message.Message, error) {
		store.down.Store(true)
		before = store.calls.Load()
		return nil, nil
	})
	// The effect happened: acked after CompleteTimeout even though the
	// record could not be written.
	if _, err := h(message.NewMessage("m-1", nil)); err != nil {
		t.Fatal(err)
	}
	// Attempts at 0, 20, 60, 140 and 300ms at the most.
	if n := store.calls.Load() - before; n < 2 || n > 10 {
		t.Fatalf("%d Complete attempts in a 300ms CompleteTimeout, want a few (a doubling backoff from 20ms)", n)
	}
}
