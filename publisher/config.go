package publisher

import (
	"errors"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// DefaultScopePrefix starts the default scope, which is the prefix and
// the topic.
const DefaultScopePrefix = "publish:"

// Config configures a Decorator. The zero value of every field but Store
// means its documented default.
type Config struct {
	// Store keeps the records. Required. Producers sharing a store (and a
	// scope) publish each message once between them. New refuses a Policy
	// the store cannot honour (a Lease or Retention beyond its
	// stores.Capabilities).
	Store stores.Store

	// Mode is dedup.ModeLease (the default) or dedup.ModeTransactional:
	// the record is written in the caller's database transaction, beside
	// the rows a transactional publisher (watermill-sql on the same
	// transaction: the outbox pattern) writes for the message. Store must
	// then implement stores.Inbox and stores.TxJoiner (sqlstore does), and
	// every message's context must carry the transaction
	// (sqlstore.WithTx), the same for every message of a call; a message
	// without it fails the call with ErrNoTransaction and nothing is
	// published. Record and outbox row commit or roll back together, so
	// the event enters the outbox once, whatever crashes.
	Mode dedup.Mode

	// Key builds the keys a message claims. The default is
	// keyfuncs.MessageID(), which catches a producer retrying the same
	// *message.Message; a producer that builds a new message (a new UUID)
	// for each attempt needs a business key (keyfuncs.JSON,
	// keyfuncs.Metadata) or keyfuncs.PayloadSHA256().
	Key keyfuncs.KeyFunc

	// Scope separates the records of different publishers. The default is
	// DefaultScopePrefix followed by the topic, so the same key published
	// to two topics is published to each once.
	Scope string

	// Policy holds the settings the publisher shares with the consumer
	// middleware; see dedup.Policy for each and its default. On the
	// producer side:
	//   - Retention is the window: a message published again within it
	//     is not published; after it, it is.
	//   - Lease is how long a claim holds a message's keys while it is
	//     published, extended every Tuning.Heartbeat while the decorated
	//     publisher runs and the record is written. A producer that dies
	//     between its publish and the record leaves the keys held this
	//     long; a retry after it publishes again.
	//   - OnStoreError: FailOpen publishes unprotected through a store
	//     outage, counted (dedup.OutcomeBypassed) and logged.
	//   - InProgressWait: how long a publish whose keys another producer
	//     is publishing waits for that publish to finish.
	//   - Metrics: OutcomeClaimed for a message published under a claim,
	//     OutcomeDuplicate for one not published, OutcomeReleased for a
	//     claim released after a failed publish, and OutcomeNoKey,
	//     OutcomeInProgress, OutcomeStoreError, OutcomeBypassed,
	//     OutcomeTakeover, OutcomeLostClaim and OutcomeCancelled.
	dedup.Policy
}

// ErrNoTransaction is returned in dedup.ModeTransactional for a message
// whose context carries no transaction for the store to join. Nothing was
// published.
var ErrNoTransaction = errors.New("dedup: the message's context carries no transaction (set it with sqlstore.WithTx)")

// Validate reports the first invalid field, naming it and the bound, or
// a setting the store cannot honour, naming the store's bound. Its errors
// wrap dedup.ErrInvalidConfig.
func (c Config) Validate() error {
	_, err := c.cycle()
	return err
}

// cycle returns the claim cycle of a valid c.
func (c Config) cycle() (*cycle.Cycle, error) {
	return cycle.New(c.Store, c.Policy, cycle.Producer, cycle.Needs{Mode: c.Mode, Scope: c.Scope, JoinTx: true})
}
