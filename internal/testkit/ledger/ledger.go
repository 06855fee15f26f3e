package ledger

import (
	"context"
	"errors"
	"sync"
)

// A Ledger records the side effects of a handler under test, so a test can
// check the promise of the dedup middleware: each logical event has exactly
// one effect, none lost, none doubled.
//
// Two ledgers implement it: [Mem], the effect living in the process
// like a call to another service would, for the memory and Redis stores;
// and [SQL], tables in the dedup store's database that a
// transactional-inbox handler writes in the inbox transaction, so effect
// and dedup record commit or roll back together.
//
// The acceptance suite records an [Effect] with only Event set and checks
// Effects. A business simulation (the example's loyalty service) sets all
// of it: per payment (Key) it credits Amount points to a customer
// (Account), and checks the Totals:
//
//	err := l.Record(msg.Context(), ledger.Effect{
//		Event: ev.EventID, Key: ev.PaymentID,
//		Account: ev.CustomerID, Amount: points,
//		Message: msg.UUID,
//	})
//	...
//	t, err := l.Totals(ctx)
//	// t.PerKey[paymentID] == 1 for every payment, t.Balance == t.Amount
//
// Adding to a balance is not idempotent, which is the point: only the dedup
// middleware stands between a redelivery and a doubled balance.
type Ledger interface {
	// Record applies e: appends it and adds e.Amount to e.Account's
	// balance (when e.Account is set), atomically. A SQL writes in
	// the transaction sqlstore.TxFromContext finds in ctx when there is
	// one.
	Record(ctx context.Context, e Effect) error

	// Effects returns every recorded effect, in the order recorded.
	Effects(ctx context.Context) ([]Effect, error)

	// Totals sums up what was recorded.
	Totals(ctx context.Context) (Totals, error)
}

// Effect is one application of the side effect under test.
type Effect struct {
	// Event names the logical event the effect belongs to. The invariant
	// is one effect per Event. Required.
	Event string

	// Key is a business key the effects are also counted by
	// (Totals.PerKey), such as a payment id. Optional.
	Key string

	// Account is the account whose balance Amount is added to. Empty: no
	// balance is kept for this effect (a SQL then writes one row,
	// not two).
	Account string

	// Amount is what the effect adds to Account's balance.
	Amount int64

	// Message names the message that applied the effect (its UUID), for
	// reports. Optional.
	Message string
}

// Totals is what a Ledger holds, summed up.
type Totals struct {
	Effects  int64            // effects recorded
	Amount   int64            // sum of the effects' amounts
	Balance  int64            // sum of the accounts' balances; equals Amount unless a write was torn
	PerEvent map[string]int64 // event -> effects
	PerKey   map[string]int64 // key -> effects, for effects with a Key
}

// ErrNoTx is returned by a SQL configured with RequireTx when ctx
// carries no inbox transaction.
var ErrNoTx = errors.New("testkit: ledger: no inbox transaction in the handler's context")

// errNoEvent refuses an effect without an event: it could never be
// checked.
var errNoEvent = errors.New("testkit: ledger: Effect.Event is empty")

// Mem is a Ledger in memory, safe for concurrent use. Its zero
// value is ready to use.
type Mem struct {
	mu       sync.Mutex
	effects  []Effect
	perEvent map[string]int64
	balances map[string]int64
}

var _ Ledger = (*Mem)(nil)

// NewMem returns an empty Mem.
func NewMem() *Mem { return &Mem{} }

// Record appends e and credits its account. It fails only for an effect
// without an Event.
func (l *Mem) Record(_ context.Context, e Effect) error {
	if e.Event == "" {
		return errNoEvent
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perEvent == nil {
		l.perEvent = map[string]int64{}
		l.balances = map[string]int64{}
	}
	l.effects = append(l.effects, e)
	l.perEvent[e.Event]++
	if e.Account != "" {
		l.balances[e.Account] += e.Amount
	}
	return nil
}

// Effects returns a copy of the recorded effects, in order.
func (l *Mem) Effects(context.Context) ([]Effect, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Effect(nil), l.effects...), nil
}

// Totals sums up the recorded effects.
func (l *Mem) Totals(context.Context) (Totals, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := Totals{
		Effects:  int64(len(l.effects)),
		PerEvent: make(map[string]int64, len(l.perEvent)),
		PerKey:   map[string]int64{},
	}
	for _, e := range l.effects {
		t.Amount += e.Amount
		if e.Key != "" {
			t.PerKey[e.Key]++
		}
	}
	for k, v := range l.perEvent {
		t.PerEvent[k] = v
	}
	for _, b := range l.balances {
		t.Balance += b
	}
	return t, nil
}

// Count returns the number of effects of event: cheap enough to poll.
func (l *Mem) Count(event string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.perEvent[event])
}

// Len returns the number of effects recorded.
func (l *Mem) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.effects)
}

// EventsOf returns the events of effects, in order: what an exactly-once
// assertion over events takes.
func EventsOf(effects []Effect) []string {
	out := make([]string, len(effects))
	for i, e := range effects {
		out[i] = e.Event
	}
	return out
}
