// Package cycle is the claim cycle the dedup middleware and the publisher
// decorator share, written once: the check of a configuration against
// the store's capabilities, the bounded and timed store calls, the
// classification of their errors, the wait for a run in progress, the
// lease heartbeat, the record of a message done after its effect (retried
// for every failure not known to be permanent, and reconciled when the
// claim is found lost) and the record's data format. The adapters keep
// only what differs: what the effect is (a handler, a publish) and how a
// message reaches it.
package cycle

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Side is what differs in what the two adapters report.
type Side struct {
	// Name is "consumer" or "producer" (dedup.side on spans).
	Name string
	// Prefix starts every error: "dedup: " or "dedup: publish: ".
	Prefix string
	// Effect names the effect in log lines: "the handler", "the publish".
	Effect string
	// LostLease is logged when the heartbeat finds the lease of a
	// running effect taken over.
	LostLease string
	// Permanent is logged, at error level, for a message failed for
	// good: what the side's user can do about it. BadKey, when set,
	// replaces it for a message without a key or whose key was recorded
	// for another payload, which the message or the key function must fix.
	Permanent, BadKey string
}

// Consumer and Producer are the sides of the middleware and the publisher.
var (
	Consumer = Side{Name: "consumer", Prefix: "dedup: ", Effect: "the handler",
		LostLease: "Dedup lease lost while the handler runs (another consumer took the message over): cancelling the handler's context",
		Permanent: "Dedup cannot process this message, and no retry will help: route it to a poison queue (dedup.IsPermanent)"}
	// No poison queue stands in front of a publish: Publish returns the
	// error to the code that called it, and publishes nothing.
	Producer = Side{Name: "producer", Prefix: "dedup: publish: ", Effect: "the publish",
		LostLease: "Dedup lease lost while the publish runs (another producer took the message over): it may publish the message too",
		Permanent: "Dedup cannot publish this message, and no retry will help: Publish returns the error to its caller (dedup.IsPermanent)",
		BadKey:    "Dedup cannot publish this message: Publish returns the error to its caller, who must fix the message or the key function"}
)

// Needs is what an adapter's configuration asks of the store besides the
// policy's durations.
type Needs struct {
	Mode dedup.Mode
	// Scope is the configured scope, "" when it is chosen per message.
	Scope string
	// JoinTx: ModeTransactional joins a transaction the caller carries
	// (the publisher's outbox).
	JoinTx bool
	// Fingerprint, when set, is kept with each done record and checked
	// against a duplicate's (EncodeFor, Duplicate).
	Fingerprint func(*message.Message) []byte
	// PublishedAt, when set, tells a claimed message's age (Claimed).
	PublishedAt func(*message.Message) (time.Time, bool)
}

// Check returns nil when store can honour policy and needs, or an error
// wrapping dedup.ErrInvalidConfig that names the setting, its value and
// the store's bound. The policy's zero durations are taken as their
// defaults.
func Check(store stores.Store, policy dedup.Policy, needs Needs) error {
	if store == nil {
		return fmt.Errorf("%w: Store is required", dedup.ErrInvalidConfig)
	}
	p := policy.WithDefaults()
	caps := store.Capabilities()
	kind := caps.Kind
	if kind == "" {
		kind = storeType(store)
	}
	refuse := func(setting string, err error, hint string) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("%w: %s: %w; %s", dedup.ErrInvalidConfig, setting, err, hint)
	}
	lower := "lower it, or raise the store's bound"
	if caps.BoundsSetting != "" {
		lower = "lower it, or raise " + caps.BoundsSetting
	}
	if needs.Mode == dedup.ModeTransactional {
		if _, ok := store.(stores.Inbox); !ok || !caps.Inbox {
			return fmt.Errorf("%w: ModeTransactional needs a store with a transactional inbox (stores.Inbox, such as sqlstore); %s has none", dedup.ErrInvalidConfig, kind)
		}
		if _, ok := store.(stores.TxJoiner); needs.JoinTx && (!ok || !caps.JoinedTx) {
			return fmt.Errorf("%w: ModeTransactional needs a store that joins the caller's transaction (stores.TxJoiner, such as sqlstore); %s does not", dedup.ErrInvalidConfig, kind)
		}
		if p.OnStoreError == dedup.FailOpen {
			return fmt.Errorf("%w: FailOpen cannot be combined with ModeTransactional (the record must commit with the effect's writes)", dedup.ErrInvalidConfig)
		}
	} else if err := refuse("Lease", stores.CheckBound("lease", p.Lease, caps.MaxLease, kind+"'s MaxLease"), lower); err != nil {
		return err
	}
	if err := refuse("Retention", stores.CheckBound("retention", p.Retention, caps.MaxRetention, kind+"'s MaxRetention"), lower); err != nil {
		return err
	}
	return refuse("Scope", stores.CheckBound("scope", len(needs.Scope), caps.MaxScope, kind+"'s MaxScope"), "use a shorter Scope")
}

// Cycle runs the claim cycle on one store, for one adapter. It is safe for
// concurrent use; its only background work, the heartbeat, stops by itself
// once no claim is held.
type Cycle struct {
	store  stores.Store
	caps   stores.Capabilities
	inbox  stores.Inbox
	joiner stores.TxJoiner
	p      dedup.Policy
	side   Side
	// timed: Metrics wants store latencies (it is not NopMetrics).
	timed bool
	tr    tracing
	beats beats

	fingerprint func(*message.Message) []byte
	publishedAt func(*message.Message) (time.Time, bool)
}

// storeType names a store without a Kind by its Go type.
func storeType(s stores.Store) string { return fmt.Sprintf("%T", s) }

// New returns the cycle for store under policy, or an error wrapping
// dedup.ErrInvalidConfig: a mode the side does not have, the error of
// policy.Validate, or of Check.
func New(store stores.Store, policy dedup.Policy, side Side, needs Needs) (*Cycle, error) {
	switch {
	case needs.Mode > dedup.ModeTransactional:
		return nil, fmt.Errorf("%w: Mode must be ModeLease, ModeAsyncComplete or ModeTransactional, got %s", dedup.ErrInvalidConfig, needs.Mode)
	case needs.Mode == dedup.ModeAsyncComplete && side == Producer:
		return nil, fmt.Errorf("%w: Mode must be ModeLease or ModeTransactional: ModeAsyncComplete is the consumer middleware's", dedup.ErrInvalidConfig)
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if err := Check(store, policy, needs); err != nil {
		return nil, err
	}
	c := &Cycle{store: store, caps: store.Capabilities(), p: policy.WithDefaults(), side: side,
		fingerprint: needs.Fingerprint, publishedAt: needs.PublishedAt}
	if needs.Mode == dedup.ModeTransactional {
		c.inbox = store.(stores.Inbox)
	}
	c.joiner, _ = store.(stores.TxJoiner)
	if _, nop := c.p.Metrics.(dedup.NopMetrics); !nop {
		c.timed = true
	}
	c.tr = newTracing(c.p.Tracing, c.caps, store, needs.Mode, side)
	c.beats = beats{cycle: c}
	return c, nil
}

// Key returns k, or the default key function, keyfuncs.MessageID().
func Key(k keyfuncs.KeyFunc) keyfuncs.KeyFunc {
	if k == nil {
		return keyfuncs.MessageID()
	}
	return k
}

// Policy returns the policy with its defaults.
func (c *Cycle) Policy() dedup.Policy { return c.p }

// NonBlocking reports a store whose calls never wait.
func (c *Cycle) NonBlocking() bool { return c.caps.NonBlocking }

// Store returns the store.
func (c *Cycle) Store() stores.Store { return c.store }

// Observe counts an outcome.
func (c *Cycle) Observe(scope string, o dedup.Outcome) { c.p.Metrics.Observe(scope, o) }

// Logger is the policy's logger.
func (c *Cycle) Logger() watermill.LoggerAdapter { return c.p.Logger }

// Fields are the log fields of a message.
func (c *Cycle) Fields(msg *message.Message, scope string, keys []string) watermill.LogFields {
	f := watermill.LogFields{"message_uuid": msg.UUID, "scope": scope}
	if keys != nil {
		f["keys"] = keys
	}
	return f
}

// Errorf returns an error starting with the side's prefix and naming the
// scope and the message.
func (c *Cycle) Errorf(msg *message.Message, scope, format string, args ...any) error {
	return fmt.Errorf("%sscope %q: message %s: %w", c.side.Prefix, scope, keyfuncs.Name(msg), fmt.Errorf(format, args...))
}

// Permanent counts and logs a message failed for good, and returns err.
// Nothing is dropped silently: whatever the caller does with the error (a
// poison queue, a nack for ever, a failed publish), the logger has seen it.
func (c *Cycle) Permanent(msg *message.Message, scope string, keys []string, o dedup.Outcome, err error) error {
	c.Observe(scope, o)
	f := c.Fields(msg, scope, keys)
	f["outcome"] = o.String()
	line := c.side.Permanent
	if c.side.BadKey != "" && (o == dedup.OutcomeNoKey || o == dedup.OutcomeFingerprintMismatch) {
		line = c.side.BadKey
	}
	c.p.Logger.Error(line, err, f)
	return err
}

// NoKey fails a message its key function could not key (err, or no keys
// at all), for good.
func (c *Cycle) NoKey(msg *message.Message, scope string, keys []string, err error) error {
	if err == nil && len(keys) == 0 {
		err = fmt.Errorf("%w: message %s: the key function returned no keys", keyfuncs.ErrNoKey, keyfuncs.Name(msg))
	}
	return c.Permanent(msg, scope, nil, dedup.OutcomeNoKey, fmt.Errorf("%sscope %q: %w", c.side.Prefix, scope, err))
}

// InProgress counts and returns dedup.ErrInProgress for a message whose
// keys another run holds.
func (c *Cycle) InProgress(msg *message.Message, scope string, keys []string) error {
	c.Observe(scope, dedup.OutcomeInProgress)
	return fmt.Errorf("%w: message %s, scope %q, keys %q", dedup.ErrInProgress, keyfuncs.Name(msg), scope, keys)
}

// Unexpected is the error of a store that returned a result outside the
// contract.
func (c *Cycle) Unexpected(scope string, r stores.Result) error {
	return fmt.Errorf("%sscope %q: store %T returned result %s", c.side.Prefix, scope, c.store, r)
}

// Takeover counts and logs a claim that took over an expired lease: the
// run that held it may have stopped after its effect, which then runs
// twice (the bounded duplicate of the lease mode).
func (c *Cycle) Takeover(msg *message.Message, scope string, keys []string) {
	c.Observe(scope, dedup.OutcomeTakeover)
	c.p.Logger.Info("Took over an expired dedup lease: the run that held it may have stopped after "+c.side.Effect+" ran", c.Fields(msg, scope, keys))
}
