package dedup

import (
	"fmt"
	"strings"
)

// Mode is how a message is recorded done.
type Mode uint8

const (
	// ModeLease (the default) claims the keys under a lease before the
	// effect, extends the lease while it runs, and records the message
	// done (Complete) before the message is acked (or Publish returns).
	// It works with every store.
	ModeLease Mode = iota

	// ModeAsyncComplete (the middleware only) is ModeLease, but acks a
	// message as soon as its handler succeeds and records it done in the
	// background, where the store's batching folds the Complete into the
	// same round trips as the next claims. A sequential consumer (one
	// Kafka partition, one RabbitMQ consumer) then waits for one store
	// round trip per message instead of two.
	//
	// The price is a window, from the ack until the Complete lands
	// (normally one store round trip; through a store failure up to
	// Tuning.CompleteTimeout after the first failed attempt), in which the
	// record is still processing:
	//   - a duplicate arriving in it at this middleware waits for the
	//     Complete (as the first delivery's ack would have in ModeLease);
	//     at another consumer it gets ErrInProgress (nack and retry); either
	//     way nothing runs twice;
	//   - a crash in it leaves the record processing until the lease
	//     expires, after which a duplicate runs the handler again: the
	//     exposure of a crash between the effect and Complete in
	//     ModeLease, now also after the ack;
	//   - outputs are returned before they are recorded, so a lost
	//     Complete means a later duplicate re-runs instead of re-emitting.
	//
	// On a store that never blocks (stores.Capabilities.NonBlocking, such
	// as memstore) there is no round trip to hide, and the Complete runs
	// before the ack as in ModeLease.
	//
	// Close the Middleware after the router has stopped: Close waits for
	// the Completes in flight.
	ModeAsyncComplete

	// ModeTransactional writes the record in a database transaction: the
	// store must support stores.Inbox (sqlstore does). There is no lease:
	// a concurrent duplicate waits on the record's primary key until the
	// first transaction ends. It cannot be combined with FailOpen.
	//
	// In the middleware (the transactional inbox) the record is written
	// in the same transaction as the handler's own writes, which the
	// handler finds in its message context (sqlstore.TxFromContext):
	// effects written in the store's database are never doubled. In the
	// publisher (the transactional outbox) the record is written in the
	// caller's transaction, beside the rows a transactional publisher
	// (watermill-sql on the same transaction) writes for the message: the
	// store must also support stores.TxJoiner.
	ModeTransactional
)

// String returns "lease", "async-complete" or "transactional".
func (m Mode) String() string {
	switch m {
	case ModeLease:
		return "lease"
	case ModeAsyncComplete:
		return "async-complete"
	case ModeTransactional:
		return "transactional"
	default:
		return fmt.Sprintf("Mode(%d)", uint8(m))
	}
}

// ParseMode returns the Mode s names: "lease", "async-complete" or
// "transactional" (Mode.String's names; case and surrounding spaces do
// not matter), or an error wrapping ErrInvalidConfig.
func ParseMode(s string) (Mode, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	for m := ModeLease; m <= ModeTransactional; m++ {
		if name == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%w: mode %q: want lease, async-complete or transactional", ErrInvalidConfig, s)
}
