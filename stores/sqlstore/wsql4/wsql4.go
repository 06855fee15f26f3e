package wsql4

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/internal/wsqlguard"
)

// ErrNotDatabaseSQL is SubscriberTx's error for a subscriber transaction
// that is not database/sql's (see the package doc): Begin fails with it
// (and with sqlstore.ErrTxNotJoinable), writing nothing.
var ErrNotDatabaseSQL = errors.New("wsql4: the subscriber's transaction is not a database/sql one")

// ErrNotGuarded is SubscriberTx's error for the transaction of a
// subscriber not built by NewSubscriber: its commit is not tied to the
// router's ack. Begin fails with it (and with sqlstore.ErrTxNotJoinable),
// writing nothing.
var ErrNotGuarded = errors.New("wsql4: the subscriber was not built by wsql4.NewSubscriber")

// Subscriber is a watermill-sql v4 subscriber whose transaction commits
// only what the router acked (see wsql3's package doc).
type Subscriber struct {
	guard *wsqlguard.Subscriber
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber is wsql.NewSubscriber on wsql.BeginnerFromStdSQL(db),
// guarded. config.AckDeadline keeps its meaning (nil: 30s; 0: none): a
// delivery that outlives it is given up and its batch rolled back, and
// delivered again.
func NewSubscriber(db wsql.SQLBeginner, config wsql.SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if db == nil {
		return nil, errors.New("wsql4: db is nil")
	}
	deadline := wsqlguard.DefaultAckDeadline
	if config.AckDeadline != nil {
		if *config.AckDeadline < 0 {
			return nil, fmt.Errorf("wsql4: AckDeadline must not be negative, got %s", *config.AckDeadline)
		}
		deadline = *config.AckDeadline
	}
	var none time.Duration
	config.AckDeadline = &none
	if config.OffsetsAdapter != nil {
		config.OffsetsAdapter = ackedRows{config.OffsetsAdapter}
	}
	sub, err := wsql.NewSubscriber(beginner{wsql.BeginnerFromStdSQL(db)}, config, logger)
	if err != nil {
		return nil, err
	}
	return &Subscriber{guard: wsqlguard.New(sub, deadline, logger)}, nil
}

// Subscribe implements message.Subscriber.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return s.guard.Subscribe(ctx, topic)
}

// SubscribeInitialize implements message.SubscribeInitializer.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	return s.guard.SubscribeInitialize(topic)
}

// Close implements message.Subscriber: it waits for the deliveries in
// flight to be acked or nacked, or to reach their AckDeadline, then
// closes the watermill-sql subscriber, which commits what was acked.
func (s *Subscriber) Close() error { return s.guard.Close() }

// beginner begins the subscriber's transactions on a context the guard
// can end.
type beginner struct{ wsql.Beginner }

func (b beginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (wsql.Tx, error) {
	return wsqlguard.BeginTx(ctx, func(ctx context.Context) (wsql.Tx, error) { return b.Beginner.BeginTx(ctx, opts) })
}

// ackedRows gives the offsets adapter only the rows of a batch up to the
// last acked one. watermill-sql v4 passes every row of a batch to
// AckMessageQuery, also of a batch cut short (by Close): the queue
// adapters (PostgreSQLQueueOffsetsAdapter, MySQLQueueOffsetsAdapter) ack
// all of them, undelivered rows included, while the others ack up to
// LastRow.
type ackedRows struct{ wsql.OffsetsAdapter }

func (a ackedRows) AckMessageQuery(params wsql.AckMessageQueryParams) (wsql.Query, error) {
	for i, row := range params.Rows {
		if row.Offset == params.LastRow.Offset {
			params.Rows = params.Rows[:i+1]
			break
		}
	}
	return a.OffsetsAdapter.AckMessageQuery(params)
}

// SubscriberTx is a sqlstore.TxFinder: it returns the *sql.Tx of the
// transaction a Subscriber's message carries in ctx, or nil when ctx
// carries none. A pgx transaction is refused with ErrNotDatabaseSQL, the
// transaction of a subscriber not built by NewSubscriber with
// ErrNotGuarded.
func SubscriberTx(ctx context.Context) (*sql.Tx, error) {
	tx, ok := wsql.TxFromContext(ctx)
	if !ok || tx == nil {
		return nil, nil
	}
	var std *sql.Tx
	switch t := tx.(type) {
	case *wsql.StdSQLTx:
		if t == nil {
			return nil, nil
		}
		std = t.Tx
	case wsql.StdSQLTx:
		std = t.Tx
	case *wsql.PgxTx, wsql.PgxTx:
		return nil, fmt.Errorf("%w: it is pgx's (a subscriber on wsql.BeginnerFromPgx)", ErrNotDatabaseSQL)
	default:
		return nil, fmt.Errorf("%w: it is a %T", ErrNotDatabaseSQL, tx)
	}
	if !wsqlguard.Delivered(ctx) {
		return nil, ErrNotGuarded
	}
	return std, nil
}

var _ sqlstore.TxFinder = SubscriberTx
