package wsqlguard

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// NoDeadline is the AckDeadline to build the watermill-sql subscriber
// with when the major cannot do without one (v3): longer than any
// process lives. The guard keeps the real one.
const NoDeadline = 100 * 365 * 24 * time.Hour

// DefaultAckDeadline is watermill-sql's default AckDeadline.
const DefaultAckDeadline = 30 * time.Second

// ErrClosed is what Subscribe returns after Close.
var ErrClosed = errors.New("wsqlguard: subscriber closed")

type subscriptionKey struct{}

type deliveryKey struct{}

// BeginTx begins a watermill-sql subscriber's transaction with begin:
// when ctx is a guarded subscription's, on a context the guard ends, and
// the guard keeps the transaction to roll it back; otherwise (the
// subscriber's schema set-up, say) on ctx itself.
func BeginTx[T interface{ Rollback() error }](ctx context.Context, begin func(context.Context) (T, error)) (T, error) {
	s, ok := ctx.Value(subscriptionKey{}).(*subscription)
	if !ok {
		return begin(ctx)
	}
	txCtx, cancel := context.WithCancel(ctx)
	tx, err := begin(txCtx)
	if err != nil {
		cancel()
		return tx, err
	}
	s.began(cancel, tx)
	return tx, nil
}

// Abort rolls back the transaction of the delivery whose context is ctx,
// at once, and has the guard let the subscriber go on to a new one: for
// a transaction the database ended under its client (on MySQL a deadlock
// rolls it back on the server while the client's *sql.Tx stays open, and
// every later statement in it, the subscriber's offset ack included, runs
// in autocommit). It does nothing for a context no guard delivered.
func Abort(ctx context.Context) {
	if s, ok := ctx.Value(deliveryKey{}).(*subscription); ok {
		s.abort()
	}
}

// Delivered reports whether ctx is the context of a message a Subscriber
// delivered.
func Delivered(ctx context.Context) bool {
	_, ok := ctx.Value(deliveryKey{}).(*subscription)
	return ok
}

// Subscriber guards a watermill-sql subscriber (see the package doc).
type Subscriber struct {
	inner    message.Subscriber
	deadline time.Duration // 0: none
	logger   watermill.LoggerAdapter

	mu      sync.Mutex
	closed  bool
	subs    []*subscription
	closing chan struct{}
	wg      sync.WaitGroup // forwarders
	done    chan struct{}  // closed when Close has closed inner
	err     error          // inner's Close
}

// New guards inner, which must begin its transactions with BeginTx and
// have no AckDeadline of its own; ackDeadline is the one to keep (0:
// none).
func New(inner message.Subscriber, ackDeadline time.Duration, logger watermill.LoggerAdapter) *Subscriber {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Subscriber{inner: inner, deadline: ackDeadline, logger: logger, closing: make(chan struct{}), done: make(chan struct{})}
}

// Subscribe implements message.Subscriber. When ctx ends (a router
// cancels it as it closes), the subscription stops taking messages and
// the context of the delivery in flight ends, but not its transaction:
// once the delivery is acked, nacked or past its deadline, the
// watermill-sql subscription ends too, unless Close has begun, which
// commits what was acked. Ended by its context, watermill-sql rolls its
// transaction back: the messages acked in it are delivered again, their
// effects having been rolled back with them.
func (g *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, ErrClosed
	}
	s := &subscription{outer: ctx, logger: g.logger.With(watermill.LogFields{"topic": topic})}
	sctx, cancel := context.WithCancel(context.WithoutCancel(context.WithValue(ctx, subscriptionKey{}, s)))
	s.cancel = cancel
	in, err := g.inner.Subscribe(sctx, topic)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan *message.Message)
	g.subs = append(g.subs, s)
	g.wg.Add(1)
	go g.forward(s, in, out)
	return out, nil
}

// SubscribeInitialize implements message.SubscribeInitializer when the
// guarded subscriber does.
func (g *Subscriber) SubscribeInitialize(topic string) error {
	if i, ok := g.inner.(message.SubscribeInitializer); ok {
		return i.SubscribeInitialize(topic)
	}
	return nil
}

// Close stops taking messages, waits for the deliveries in flight to be
// acked, nacked or to reach their deadline, then closes the guarded
// subscriber: it commits what was acked. A second Close waits for the
// first. It does not bound the wait for a handler with no deadline (an
// AckDeadline of 0): the router's CloseTimeout bounds its own, and the
// database rolls back the transaction of a process that exits meanwhile.
func (g *Subscriber) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		<-g.done
		return g.err
	}
	g.closed = true
	close(g.closing)
	g.mu.Unlock()

	g.wg.Wait()
	g.err = g.inner.Close()
	for _, s := range g.subs {
		s.cancel()
	}
	close(g.done)
	return g.err
}

// forward hands the messages of one subscription to the router, one at a
// time as watermill-sql delivers them, and each ack or nack back.
func (g *Subscriber) forward(s *subscription, in <-chan *message.Message, out chan<- *message.Message) {
	defer g.wg.Done()
	defer close(out)
	for {
		var msg *message.Message
		select {
		case m, ok := <-in:
			if !ok {
				s.cancel()
				return
			}
			msg = m
		case <-g.closing:
			return
		case <-s.outer.Done():
			g.ended(s)
			return
		}
		if !g.deliver(s, msg, out) {
			if s.outer.Err() != nil {
				g.ended(s)
			}
			return
		}
	}
}

// ended ends the watermill-sql subscription of s, whose context ended,
// unless Close has begun (it commits what was acked).
func (g *Subscriber) ended(s *subscription) {
	select {
	case <-g.closing:
	default:
		s.cancel()
	}
}

// deliver passes msg to the router and its ack or nack back to
// watermill-sql; it reports false when the guard is closing or the
// subscription's context ended, and msg was not delivered (the guarded
// subscriber's Close ends it).
func (g *Subscriber) deliver(s *subscription, msg *message.Message, out chan<- *message.Message) bool {
	deadline, dead := s.delivery(g.deadline)
	if dead {
		// A message of a transaction the guard rolled back: let
		// watermill-sql go on to the statement that fails and to a new
		// transaction, which delivers it again.
		msg.Ack()
		return true
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	// The handler's context: the message's, which ends when watermill-sql
	// gives the delivery up, also ended by the subscription's.
	ctx, cancel := context.WithCancel(context.WithValue(msg.Context(), deliveryKey{}, s))
	defer cancel()
	defer context.AfterFunc(s.outer, cancel)()
	fwd := msg.Copy()
	fwd.SetContext(ctx)
	select {
	case out <- fwd:
	case <-g.closing:
		return false
	case <-s.outer.Done():
		return false
	case <-expired:
		s.expired(msg)
		return true
	case <-msg.Context().Done():
		return true
	}
	select {
	case <-fwd.Acked():
		s.acked()
		msg.Ack()
	case <-fwd.Nacked():
		if s.isDead() {
			msg.Ack() // as above: watermill-sql would resend it in the rolled back transaction
		} else {
			msg.Nack()
		}
	case <-expired:
		s.expired(msg)
	case <-msg.Context().Done():
		// watermill-sql gave the delivery up: its context ended, and with
		// it the transaction's, which is rolled back.
	}
	return true
}

// subscription is one Subscribe: watermill-sql runs its transactions one
// after another, and delivers one message at a time, resending a nacked
// one until it is acked.
type subscription struct {
	outer  context.Context // the context Subscribe was given
	logger watermill.LoggerAdapter
	cancel context.CancelFunc // the watermill-sql subscription's context

	mu       sync.Mutex
	txCancel context.CancelFunc            // the current transaction's context
	tx       interface{ Rollback() error } // the current transaction
	dead     bool                          // it was rolled back
	deadline time.Time                     // of the message being delivered; zero: none yet
}

// began records the transaction watermill-sql began, after the last one
// ended.
func (s *subscription) began(cancel context.CancelFunc, tx interface{ Rollback() error }) {
	s.mu.Lock()
	prev := s.txCancel
	s.txCancel, s.tx, s.dead, s.deadline = cancel, tx, false, time.Time{}
	s.mu.Unlock()
	if prev != nil {
		prev() // watermill-sql ended that transaction before beginning this one
	}
}

// delivery returns the deadline of a delivery (a message resent after a
// nack keeps the deadline of its first delivery, as with watermill-sql's
// own, whatever its uuid), or reports that its transaction was rolled
// back.
func (s *subscription) delivery(d time.Duration) (deadline time.Time, dead bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return time.Time{}, true
	}
	if s.deadline.IsZero() && d > 0 {
		s.deadline = time.Now().Add(d)
	}
	return s.deadline, false
}

// acked ends the deadline of the message delivered last: the next one
// gets one of its own.
func (s *subscription) acked() {
	s.mu.Lock()
	s.deadline = time.Time{}
	s.mu.Unlock()
}

func (s *subscription) isDead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

// abort rolls the current transaction back before anything else can run
// in it: its context ends (database/sql refuses to commit it), and
// Rollback returns once database/sql has marked it done, so that no
// statement of watermill-sql's runs in it any more (on MySQL, in a
// transaction the server rolled back, one would run in autocommit).
func (s *subscription) abort() {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return
	}
	s.dead = true
	cancel, tx := s.txCancel, s.tx
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if tx != nil {
		_ = tx.Rollback() // ErrTxDone when the context's end got there first
	}
}

// expired rolls back the transaction of msg, which outlived its
// deadline, then lets watermill-sql go on: the commit that follows the
// delivery's end fails.
func (s *subscription) expired(msg *message.Message) {
	s.abort()
	s.logger.Info("Delivery outlived the AckDeadline, its transaction rolled back", watermill.LogFields{"message_uuid": msg.UUID})
	msg.Ack()
}
