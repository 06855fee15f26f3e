package stores

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the admin interface, wrapped like the others.
var (
	// ErrNotFound is returned by Get and Delete when (scope, key) has no
	// record.
	ErrNotFound = errors.New("dedup store: no such record")

	// ErrWrongState is returned by Delete when the record is not in the
	// state the caller asked to delete (a done record asked to be
	// released, a processing one asked to be forgotten). Nothing was
	// changed.
	ErrWrongState = errors.New("dedup store: record is in another state")

	// ErrNotSupported is returned for a request the store's layout cannot
	// serve, such as a List by scope on a store that keeps records under
	// a digest of (scope, key). Nothing was done.
	ErrNotSupported = errors.New("dedup store: not supported by the store's layout")
)

// RecordState is the state of a record.
type RecordState uint8

const (
	// StateProcessing is a record claimed by a consumer that has not
	// completed it: its handler is running, or it crashed and the lease
	// will run out.
	StateProcessing RecordState = iota + 1
	// StateDone is a completed record: its message is a duplicate until
	// the record expires.
	StateDone
)

// String returns "processing" or "done".
func (s RecordState) String() string {
	switch s {
	case StateProcessing:
		return "processing"
	case StateDone:
		return "done"
	default:
		return fmt.Sprintf("RecordState(%d)", uint8(s))
	}
}

// ParseRecordState is the inverse of RecordState.String.
func ParseRecordState(s string) (RecordState, error) {
	switch s {
	case "processing":
		return StateProcessing, nil
	case "done":
		return StateDone, nil
	}
	return 0, fmt.Errorf("%w: record state %q: want processing or done", ErrInvalidArgument, s)
}

// Record is one record as the admin interface reports it.
type Record struct {
	// Scope and Key are the record's (scope, key) when ScopeKnown and
	// KeyKnown say the store knows them: always for Get and Delete, which
	// are given them; in a List, only where the layout keeps them (see
	// the package doc).
	Scope      string
	Key        string
	ScopeKnown bool
	KeyKnown   bool

	// ID is the store's own name for the record, printable: a hash in
	// hexadecimal (memstore), the record ID as a UUID (sqlstore, see
	// sqlstore.RecordID), the Redis key with bytes outside printable
	// ASCII written \xHH as redis-cli shows them (redisstore), the KV
	// key, a digest of (scope, key) in 22 characters (natsstore). Every
	// record a store holds has a distinct ID, the same in Get, List and
	// Delete, and GetByID and DeleteByID find the record by it.
	ID string

	// State is StateProcessing or StateDone.
	State RecordState

	// Token is a processing record's fencing token, as Claim returned it
	// in stores.Claim.Token. Empty for a done record.
	Token string

	// Owner is the owner a processing record keeps (see [OwnerClaimer]),
	// nil for none and for a done record.
	Owner []byte

	// LeaseUntil is when a processing record's lease ends (another Claim
	// may then take it over). Zero for a done record.
	LeaseUntil time.Time

	// ExpiresAt is when a done record's retention ends (a Claim is then
	// Claimed again). Zero for a processing record.
	ExpiresAt time.Time

	// Expired reports a record past its LeaseUntil or ExpiresAt that the
	// store still holds: a Claim treats it as gone (or takes it over),
	// and Purge, or the store on its own, deletes it.
	Expired bool

	// Data is a done record's data, as Complete stored it (nil for none,
	// and for a processing record).
	Data []byte
}

// ListOptions selects the records of a List.
type ListOptions struct {
	// Scope, when not empty, lists only the records of this scope.
	// A layout that does not keep scopes fails with [ErrNotSupported].
	Scope string

	// KeyPrefix, when not empty, lists only the records whose key is
	// known and starts with it. A layout that does not keep keys fails
	// with [ErrNotSupported]; redisstore's keys stored as digests are
	// never listed then.
	KeyPrefix string

	// State, when not zero, lists only the records in this state.
	State RecordState

	// After is the cursor a previous List returned, to list the next
	// page; empty for the first page. A cursor is opaque, and only valid
	// for the same store and the same options.
	After string

	// Limit is the most records one page holds: 0 means DefaultListLimit,
	// at most MaxListLimit.
	Limit int
}

// Bounds of ListOptions.Limit.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
)

// Counts are records by state.
type Counts struct {
	// Processing counts the processing records whose lease is live.
	Processing int64
	// Done counts the done records within their retention.
	Done int64
	// Expired counts the records past their lease or retention that the
	// store still holds (see Record.Expired).
	Expired int64
}

// Total is the number of records counted.
func (c Counts) Total() int64 { return c.Processing + c.Done + c.Expired }

// Stats describes the records a store holds.
type Stats struct {
	Counts

	// OldestExpiry and NewestExpiry are the earliest and the latest
	// ExpiresAt of the done records, expired or not. Zero when there is
	// none.
	OldestExpiry time.Time
	NewestExpiry time.Time

	// Bytes is the approximate space the records take in the backend
	// (with its indexes and overhead, as the backend reports it), or -1
	// when the store cannot tell.
	Bytes int64

	// PerScope reports whether Scopes breaks the counts down by scope:
	// false where the layout does not keep scopes (see the package doc).
	PerScope bool

	// Scopes are the counts of each scope that has records, sorted by
	// scope, when PerScope.
	Scopes []ScopeStats

	// Skipped counts what Stats found among the store's records that is
	// not one of them, and passed over (as List does): redisstore's keys
	// under its Prefix that are not in its layout, hold a value it did
	// not write, or that its Config.Foreign names. SkippedSample holds a
	// few of them (at most MaxSkippedSample), written as Record.ID
	// writes a record's. A store whose records nothing else shares
	// reports none.
	Skipped       int64
	SkippedSample []string
}

// MaxSkippedSample is the most keys Stats.SkippedSample holds.
const MaxSkippedSample = 5

// ScopeStats are the records of one scope.
type ScopeStats struct {
	Scope string
	Counts
	// OldestExpiry and NewestExpiry as in Stats, for this scope.
	OldestExpiry time.Time
	NewestExpiry time.Time
}

// Admin is implemented by stores whose records an operator can inspect and
// change (memstore, redisstore, sqlstore, natsstore). Every method follows
// the error classes of the package doc and fails with [ErrClosed] after
// Close.
//
// Records may change between two calls, or during one that scans: what
// Admin reports is a recent view, not a snapshot.
type Admin interface {
	// Get returns the record of (scope, key), live or expired, or an
	// error wrapping [ErrNotFound] when there is none. An empty key fails
	// with [ErrInvalidKey].
	Get(ctx context.Context, scope, key string) (Record, error)

	// List returns one page of the records opts selects, in the store's
	// own order, and the cursor of the next page ("" after the last). A
	// record held from the first page to the last is listed at least
	// once; a scan that the backend does in steps (redisstore's SCAN) may
	// list a record twice when the backend resizes its tables meanwhile.
	// A Scope or KeyPrefix the layout cannot filter on fails with
	// [ErrNotSupported]; a bad cursor, state or limit with
	// [ErrInvalidArgument].
	List(ctx context.Context, opts ListOptions) (records []Record, next string, err error)

	// Delete deletes the record of (scope, key) if it is in state want,
	// whoever holds it, and returns it as it was. A done record deleted
	// is forgotten: the next delivery of its message runs the handler. A
	// processing record deleted frees its claim for another consumer:
	// its owner's Complete, Release and Extend then fail with
	// [ErrLostClaim]. A record in the other state fails with an error
	// wrapping [ErrWrongState] and is returned unchanged; no record, with
	// [ErrNotFound]. want must be StateProcessing or StateDone
	// ([ErrInvalidArgument] otherwise).
	Delete(ctx context.Context, scope, key string, want RecordState) (Record, error)

	// GetByID returns the record whose ID (Record.ID, as Get, List and
	// Delete report it) is id, live or expired: the way to a record that
	// a List showed on a layout that keeps neither scope nor key. Its
	// Scope and Key are filled in as far as the layout keeps them, as in
	// a List. An id that is not in the form of the store's IDs fails
	// with [ErrInvalidArgument]; no record, with [ErrNotFound].
	GetByID(ctx context.Context, id string) (Record, error)

	// DeleteByID is Delete of the record whose ID is id: it deletes the
	// record if it is in state want, whoever holds it, and returns it as
	// it was, with the errors of Delete and GetByID.
	DeleteByID(ctx context.Context, id string, want RecordState) (Record, error)

	// Stats counts the records. It may read every record.
	Stats(ctx context.Context) (Stats, error)

	// Purge deletes the records the store may forget now (expired done
	// records; processing records whose lease ended longer ago than the
	// store keeps them, see the package doc) and returns how many it
	// deleted. A store whose backend expires records by itself
	// (redisstore) deletes nothing and returns 0.
	Purge(ctx context.Context) (int64, error)
}
