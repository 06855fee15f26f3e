package stores

import (
	"errors"
	"fmt"
	"time"
)

// ErrTooLarge is wrapped by the error of a Complete or Commit whose data
// is larger than the store keeps (Capabilities.MaxData, or a server limit
// found when the write is refused). It wraps [ErrInvalidArgument]: the
// call changed nothing, and the same data will be refused again. The
// middleware then records the message done without its data.
var ErrTooLarge = fmt.Errorf("%w: data too large for the store", ErrInvalidArgument)

// Capabilities is what a store can hold and do. The middleware and the
// publisher read it when they are built (New) and refuse a configuration
// the store cannot honour there, before any handler runs: a limit found
// only when a Complete is refused, after the effect, is a doubled effect.
//
// A zero bound means the store has no bound of its own for it (a duration
// is then capped at about 292 years, see the package doc on time). A
// store must refuse, with [ErrInvalidArgument] (or [ErrInvalidKey] for
// keys, [ErrTooLarge] for data) and before any I/O, exactly what exceeds
// the bounds it states, and accept everything within them; storetest
// checks both.
type Capabilities struct {
	// Kind names the store in errors: "natsstore", "sqlstore (postgres,
	// daily partitions)".
	Kind string

	// MaxLease is the longest lease Claim and Extend accept.
	MaxLease time.Duration
	// MaxRetention is the longest retention Complete and Inbox.Begin
	// accept.
	MaxRetention time.Duration
	// MaxScope is the longest scope, in bytes, a call accepts.
	MaxScope int
	// MaxKey is the longest key, in bytes, Claim and Begin accept. Stores
	// that keep keys as digests have none.
	MaxKey int
	// MaxData is the most bytes of data Complete and InboxTx.Commit keep.
	MaxData int
	// BoundsSetting names the setting that raises MaxLease and
	// MaxRetention where they follow from another one
	// ("sqlstore.Config.PartitionDaysAhead"); empty when the bounds are
	// settings of their own, or fixed.
	BoundsSetting string

	// NonBlocking: no call waits on I/O or on another process (memstore).
	// The middleware skips its per-call timeout contexts, pure overhead
	// there, and completes before the ack in ModeAsyncComplete.
	NonBlocking bool
	// Admin: the store implements [Admin].
	Admin bool
	// Inbox: the store implements [Inbox] (the transactional inbox).
	Inbox bool
	// JoinedTx: the store implements [TxJoiner]: Inbox.Begin joins a
	// transaction the caller carries in its context.
	JoinedTx bool
	// Owners: the store implements [OwnerClaimer]: a claim keeps an owner
	// with its processing records, and a takeover or an in-progress
	// result returns it.
	Owners bool
}

// CheckOwner returns nil when an [OwnerClaimer] keeps owner (at most
// [MaxOwner] bytes), or an error wrapping [ErrInvalidArgument].
func CheckOwner(owner []byte) error {
	return invalid(CheckBound("owner", len(owner), MaxOwner, "MaxOwner"))
}

// CheckBound is the one check of a value against a store's bound, used by
// every store and by the middleware and publisher at New: it returns nil
// when v is within bound (a zero bound is no bound), or an error naming
// what, v, the bound's name and its value, such as "lease 2h0m0s is
// longer than the store's MaxLease (1h0m0s)". The error wraps no
// sentinel: the Capabilities methods wrap it in [ErrInvalidArgument] for
// a store call, New wraps it in dedup.ErrInvalidConfig.
func CheckBound[T time.Duration | int](what string, v, bound T, boundName string) error {
	if bound <= 0 || v <= bound {
		return nil
	}
	if d, ok := any(v).(time.Duration); ok {
		return fmt.Errorf("%s %s is longer than %s (%s)", what, d, boundName, time.Duration(bound))
	}
	return fmt.Errorf("%s of %d bytes is longer than %s (%d bytes)", what, v, boundName, bound)
}

// checkPositive returns nil when d is positive, or an error wrapping
// [ErrInvalidArgument] naming what.
func checkPositive(what string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s must be positive, got %s", ErrInvalidArgument, what, d)
	}
	return nil
}

// invalid wraps a failed bound check in [ErrInvalidArgument].
func invalid(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
}

// CheckLease returns nil when the store accepts lease (positive, within
// MaxLease), or the reason it would refuse it.
func (c Capabilities) CheckLease(lease time.Duration) error {
	return errors.Join(checkPositive("lease", lease), invalid(CheckBound("lease", lease, c.MaxLease, "the store's MaxLease")))
}

// CheckRetention returns nil when the store accepts retention (positive,
// within MaxRetention), or the reason it would refuse it.
func (c Capabilities) CheckRetention(retention time.Duration) error {
	return errors.Join(checkPositive("retention", retention),
		invalid(CheckBound("retention", retention, c.MaxRetention, "the store's MaxRetention")))
}

// CheckScope returns nil when the store accepts scope (within MaxScope).
func (c Capabilities) CheckScope(scope string) error {
	return invalid(CheckBound("scope", len(scope), c.MaxScope, "the store's MaxScope"))
}

// CheckData returns nil when the store keeps data, or an error wrapping
// [ErrTooLarge].
func (c Capabilities) CheckData(data []byte) error {
	if c.MaxData > 0 && len(data) > c.MaxData {
		return fmt.Errorf("%w: %d bytes of data, the store keeps at most %d", ErrTooLarge, len(data), c.MaxData)
	}
	return nil
}
