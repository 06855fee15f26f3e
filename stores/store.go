package stores

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors shared by every store. Stores wrap them with context
// (%w); callers test them with [errors.Is].
var (
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("dedup store: closed")

	// ErrLostClaim is returned by Complete, Release and Extend when the
	// claim's token no longer owns the record: its lease expired and another
	// consumer took the record over, or the record was already completed or
	// released. Nothing was changed.
	ErrLostClaim = errors.New("dedup store: claim lost (lease expired and record taken over, or already completed/released)")

	// ErrInvalidKey is returned by Claim for an empty key list, an empty
	// key, or a key longer than the store accepts (a documented bound of
	// the store's; keyfuncs bounds keys to 256 bytes), and by Admin's Get
	// and Delete for such a key. A store must not touch its backend for
	// it.
	ErrInvalidKey = errors.New("dedup store: invalid key")

	// ErrInvalidArgument is returned for a non-positive lease or retention
	// (or one past a documented bound of the store), a scope longer than
	// the store accepts, a claim that is not a Claimed result of this
	// store, or an Admin call's bad state, limit or cursor. A store must
	// not touch its backend for it.
	ErrInvalidArgument = errors.New("dedup store: invalid argument")

	// ErrUnavailable is wrapped by every error that means the backend
	// could not be reached or could not serve the call now: the outage
	// class (see the package doc). The call's outcome is unknown. Only
	// what is known to be an outage wraps it, never a refusal of the
	// client (credentials, TLS, permissions), however it shows up.
	ErrUnavailable = errors.New("dedup store: backend unavailable")

	// ErrTxAborted reports a transaction the database has ended under its
	// client: it rolled it back (a deadlock, a lock wait timeout) or an
	// earlier statement failed and left it aborted. [Inbox.Begin] returns
	// it for a transaction it must join (it wrote nothing: the
	// transaction's owner must end it, and the message must be retried in
	// a new one); [InboxTx.Commit] and Rollback for the message's own
	// transaction ended under the handler. Statements run in such a
	// transaction would otherwise run outside any transaction (MySQL) or
	// fail (PostgreSQL).
	ErrTxAborted = errors.New("dedup store: the database aborted the transaction")
)

// Result is the outcome of a Claim.
type Result uint8

const (
	// Claimed: the caller now owns every key of the claim and must run the
	// handler, then Complete or Release.
	Claimed Result = iota + 1
	// Duplicate: at least one key has a live done record. The message was
	// already handled; ack it without running the handler.
	Duplicate
	// InProgress: no key is done, but at least one is processing under a
	// valid lease held by someone else. Do not ack; retry later.
	InProgress
)

// String returns "claimed", "duplicate" or "in_progress".
func (r Result) String() string {
	switch r {
	case Claimed:
		return "claimed"
	case Duplicate:
		return "duplicate"
	case InProgress:
		return "in_progress"
	default:
		return "unknown"
	}
}

// Claim is what Claim returns. For a Claimed result it is the handle that
// Complete, Release and Extend take; callers must not modify it.
type Claim struct {
	// Scope and Keys are the arguments of the Claim call.
	Scope string
	Keys  []string

	// Result says what happened.
	Result Result

	// Token is the fencing token of a Claimed result: a fresh random or
	// otherwise unique value for each successful claim. Empty otherwise.
	Token string

	// Takeover is true when a Claimed result took over at least one record
	// whose previous owner's lease had expired (the previous owner may have
	// crashed after its side effect: this is the bounded duplicate of lease
	// mode, worth counting). A store must keep an expired processing record
	// for at least one more lease length, so a takeover soon after expiry is
	// reported; one much later may look like a fresh claim.
	Takeover bool

	// Data holds, for a Duplicate result, the bytes stored by Complete on the
	// done record (the first done key's, in key order). The middleware keeps
	// the handler's produced messages and the payload fingerprint there.
	// Empty when nothing was stored.
	Data []byte

	// Owner is the owner kept by another claim's processing record (see
	// [OwnerClaimer]): for a Claimed result with Takeover, the record
	// taken over's; for InProgress, the held record's (of one such key
	// that keeps one: the first in key order on most stores, the first
	// in the store's own order where it claims in another, as redisstore
	// on a cluster does). Nil when the record keeps none, or the store
	// keeps no owners.
	Owner []byte
}

// MaxOwner is the most bytes of owner an [OwnerClaimer] must keep.
const MaxOwner = 64

// OwnerClaimer is implemented by stores that keep a small owner blob with
// the processing records a claim makes (Capabilities.Owners), for the
// next claim to learn whose run it took over or waits for. The middleware
// keeps the trace context of the claiming run there when
// dedup.Tracing.LinkRuns asks for it. Stores without it are used through
// Claim, and nothing is kept.
type OwnerClaimer interface {
	// ClaimOwned is Claim that keeps owner (opaque, at most [MaxOwner]
	// bytes; nil or empty keeps none) with every processing record it
	// writes, until the record is completed, released or taken over. A
	// claim of a record kept with an owner returns it in [Claim].Owner
	// when it takes the record over or finds it in progress. A longer
	// owner fails with [ErrInvalidArgument], before any I/O.
	ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*Claim, error)
}

// Store is the dedup record store. Implementations must be safe for
// concurrent use by many goroutines and, unless documented otherwise, by many
// processes sharing the same backend.
//
// Errors are for backend failures and contract violations only: a Duplicate
// or InProgress result is not an error. Every method returns an error
// wrapping [ErrClosed] after Close.
type Store interface {
	// Claim atomically checks and claims every key of keys in scope for
	// lease, following the state machine in the package doc:
	//
	//   - if any key has a live done record, the result is Duplicate (and
	//     Data holds that record's data);
	//   - else if any key is processing under a valid lease, InProgress;
	//   - else every key is claimed with one fresh token: Claimed.
	//
	// It is all-or-nothing: a Duplicate or InProgress result leaves no key
	// claimed or changed. Keys may repeat; a repeated key counts once. An
	// empty keys slice or an empty key fails with [ErrInvalidKey] and a
	// non-positive lease with [ErrInvalidArgument], before any I/O.
	Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*Claim, error)

	// Complete marks every key of a Claimed claim done until now+retention
	// and stores data (which may be nil) with it. It fails with
	// [ErrLostClaim] and changes nothing if any key is no longer processing
	// under the claim's token.
	Complete(ctx context.Context, c *Claim, retention time.Duration, data []byte) error

	// Release deletes the processing records of a Claimed claim so a
	// redelivery can claim them again. It fails with [ErrLostClaim] and
	// changes nothing if any key is no longer processing under the claim's
	// token.
	Release(ctx context.Context, c *Claim) error

	// Extend sets the lease of a Claimed claim to now+lease (a heartbeat for
	// handlers that outlive their lease). It fails with [ErrLostClaim] and
	// changes nothing if any key is no longer processing under the claim's
	// token.
	Extend(ctx context.Context, c *Claim, lease time.Duration) error

	// Capabilities states what the store can hold and do (see
	// [Capabilities]). It does no I/O, never changes after the store is
	// built, and answers after Close too.
	Capabilities() Capabilities

	// Close stops the store's background work and releases what the store
	// itself opened. It never closes a client the caller handed in. The
	// store is closed when Close returns, whatever ctx; ctx bounds only the
	// wait for background work to stop (ctx's error when it ends first).
	// It is idempotent.
	Close(ctx context.Context) error
}

// Clock tells stores the time. Stores that compute leases and expiry in
// the process take one in their Config so tests can move time without
// sleeping; nil means [SystemClock].
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ClockOrSystem returns c, or SystemClock when c is nil.
func ClockOrSystem(c Clock) Clock {
	if c == nil {
		return SystemClock{}
	}
	return c
}

// Inbox is implemented by stores that can write the dedup record in the same
// database transaction as the handler's own writes (the transactional
// inbox): commit writes effect and record together, rollback neither,
// so there is no duplicate effect even when a consumer crashes.
//
// The middleware uses it instead of Claim/Complete when its Config asks for
// transactional mode.
type Inbox interface {
	// Begin opens a transaction (or a savepoint inside a transaction already
	// carried by ctx) and inserts a done record for every key, valid until
	// now+retention. Concurrent Begins for the same key serialise on the
	// record's primary key: the second sees the first's outcome once it
	// commits or rolls back.
	//
	// When any key already has a live done record the transaction is rolled
	// back before Begin returns and the InboxTx reports Duplicate with the
	// record's Data; when a key is held by a live lease-mode claim (a store
	// shared by both modes) it is rolled back too and reports InProgress.
	// Commit and Rollback are then no-ops.
	//
	// ctx bounds Begin itself, including its wait for a concurrent Begin
	// of the same key: when ctx ends first, Begin fails with ctx's error
	// and leaves nothing behind. The transaction Begin opens outlives ctx;
	// it ends with Commit or Rollback, which the caller must call. A
	// transaction to join that is no longer usable fails Begin with
	// [ErrTxAborted], before anything is written.
	Begin(ctx context.Context, scope string, keys []string, retention time.Duration) (InboxTx, error)
}

// InboxTx is one message's transaction in an [Inbox].
type InboxTx interface {
	// Result is Claimed, Duplicate or InProgress.
	Result() Result
	// Data is the stored data of a Duplicate result.
	Data() []byte
	// Context returns parent carrying the transaction, for the handler to
	// find with the store's TxFromContext.
	Context(parent context.Context) context.Context
	// Commit stores data on the records and commits the transaction. ctx
	// bounds it: when ctx ends (or the connection breaks) before the
	// database answers, Commit fails and the outcome is unknown: a
	// redelivery finds the record done (Duplicate) or not (it runs again,
	// its effects having been rolled back with the record). A joined
	// transaction found aborted fails with [ErrTxAborted].
	Commit(ctx context.Context, data []byte) error
	// Rollback undoes the records and everything the handler wrote in the
	// transaction. It is safe to call after Commit or Rollback (a no-op).
	Rollback(ctx context.Context) error
}

// TxJoiner is implemented by an [Inbox] whose Begin can work inside a
// transaction the caller carries in ctx (sqlstore.WithTx) instead of
// opening its own. JoinedTx returns the transaction Begin(ctx, ...) would
// join (a comparable value: the same transaction gives equal values), and
// false when it would open its own. Callers whose guarantee needs the
// record to commit with their own writes (the transactional publisher
// writing to an outbox) check it before Begin.
type TxJoiner interface {
	JoinedTx(ctx context.Context) (tx any, ok bool)
}
