package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/watermill-dedup/dedup/stores"
)

// A TxFinder finds, in the context given to Begin, a transaction for
// Begin to join (see Config.JoinTx): a watermill-sql subscriber's, put in
// the message's context by the subscriber. It returns nil and no error
// when ctx carries none, and an error when ctx carries a transaction the
// store cannot join: Begin then fails with ErrTxNotJoinable and that
// error, rather than open a transaction of its own beside the one the
// handler writes in.
//
// The finders of watermill-sql's subscribers are in packages of their
// own, so that sqlstore compiles no watermill-sql major: SubscriberTx of
// github.com/watermill-dedup/dedup/stores/sqlstore/wsql3 for v3, and of
// github.com/watermill-dedup/dedup/stores/sqlstore/wsql4 for v4.
type TxFinder func(ctx context.Context) (*sql.Tx, error)

// ErrTxNotJoinable is what Begin fails with when Config.JoinTx finds in
// its context a transaction the store cannot join (the finder's error
// says which and why; with watermill-sql v4, a subscriber on pgx rather
// than database/sql). Nothing was written. It wraps
// stores.ErrInvalidArgument: the middleware nacks the message and logs
// the error, at every delivery, until the configuration changes.
var ErrTxNotJoinable = fmt.Errorf("%w: the context carries a transaction the store cannot join", stores.ErrInvalidArgument)

// errJoinWatermillTx is Validate's refusal of JoinWatermillTx alone.
// JoinWatermillTx no longer finds watermill-sql's transaction by itself:
// sqlstore imports no watermill-sql major, so that a build on one
// compiles nothing of the other. Config.JoinTx names the finder:
// wsql3.SubscriberTx (github.com/watermill-dedup/dedup/stores/sqlstore/wsql3)
// for watermill-sql v3, wsql4.SubscriberTx (.../stores/sqlstore/wsql4) for
// v4. Without it Begin would open a transaction of its own where the
// handler expects the subscriber's.
var errJoinWatermillTx = errors.New("sqlstore: JoinWatermillTx needs JoinTx: wsql3.SubscriberTx for watermill-sql v3, wsql4.SubscriberTx for v4")

// refusedTx is what JoinedTx reports for a transaction Begin refuses:
// not one Begin would join, but neither a context without one, since
// Begin would not open a transaction of its own there either. Equal for
// the same refusal, so that a caller comparing the transactions of
// several messages goes on to Begin and its error.
type refusedTx struct{ reason string }
