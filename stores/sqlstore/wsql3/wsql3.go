package wsql3

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore/internal/wsqlguard"
)

// ErrNotGuarded is SubscriberTx's error for the transaction of a
// subscriber not built by NewSubscriber: its commit is not tied to the
// router's ack. Begin fails with it (and with sqlstore.ErrTxNotJoinable),
// writing nothing.
var ErrNotGuarded = errors.New("wsql3: the subscriber was not built by wsql3.NewSubscriber")

// Subscriber is a watermill-sql v3 subscriber whose transaction commits
// only what the router acked (see the package doc).
type Subscriber struct {
	guard *wsqlguard.Subscriber
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber is wsql.NewSubscriber, guarded. config.AckDeadline keeps
// its meaning (nil: 30s; it must be positive): a delivery that outlives
// it is given up and its batch rolled back, and delivered again.
func NewSubscriber(db wsql.Beginner, config wsql.SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if db == nil {
		return nil, errors.New("wsql3: db is nil")
	}
	deadline := wsqlguard.DefaultAckDeadline
	if config.AckDeadline != nil {
		if *config.AckDeadline <= 0 {
			return nil, fmt.Errorf("wsql3: AckDeadline must be positive, got %s", *config.AckDeadline)
		}
		deadline = *config.AckDeadline
	}
	none := wsqlguard.NoDeadline
	config.AckDeadline = &none
	sub, err := wsql.NewSubscriber(beginner{db}, config, logger)
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

func (b beginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	return wsqlguard.BeginTx(ctx, func(ctx context.Context) (*sql.Tx, error) { return b.Beginner.BeginTx(ctx, opts) })
}

// SubscriberTx is a sqlstore.TxFinder: it returns the transaction a
// Subscriber's message carries in ctx, or nil when ctx carries none. The
// transaction of a watermill-sql subscriber not built by NewSubscriber is
// refused with ErrNotGuarded.
func SubscriberTx(ctx context.Context) (*sql.Tx, error) {
	tx, ok := wsql.TxFromContext(ctx)
	if !ok || tx == nil {
		return nil, nil
	}
	if !wsqlguard.Delivered(ctx) {
		return nil, ErrNotGuarded
	}
	return tx, nil
}

var _ sqlstore.TxFinder = SubscriberTx
