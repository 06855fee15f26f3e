// Package publisher deduplicates on the producer side: a Watermill
// message.PublisherDecorator, on the same stores, key functions and
// metrics as the consumer middleware, that publishes each message once
// per window however often the producer retries — an HTTP handler retried
// by its client, a cron job that fires twice, a producer restarted in the
// middle of a batch. It is the dedup on send of SQS FIFO queues (five
// minutes) or Kafka's idempotent producer (one producer session), for
// every Watermill publisher, with a window of your choice and a store
// shared by every producer instance.
//
//	dp, err := publisher.New(publisher.Config{
//		Store: store,
//		Key:   keyfuncs.JSON("order_id"), // the business event, whatever its UUID
//	})
//	...
//	pub, err := dp.Decorate(kafkaPublisher) // or router.AddPublisherDecorators(dp.Decorate)
//	...
//	err = pub.Publish("orders", msg) // published once per Window
//
// # Flow
//
// For every message of a Publish(topic, msgs...) call:
//
//  1. keys := Config.Key(msg). A message that cannot be keyed fails the
//     whole call with an error wrapping keyfuncs.ErrNoKey before anything
//     is claimed or published; it is logged and counted (OutcomeNoKey).
//  2. Claim the keys in the scope (by default "publish:" and the topic),
//     for Lease. A message that shares a key with an earlier message of
//     the same call is a duplicate of it.
//  3. Duplicate: the message is not published (OutcomeDuplicate).
//     InProgress (another producer is publishing it): claim again every
//     InProgressPoll for up to InProgressWait, then fail the call with
//     ErrInProgress. A store failure fails the call (FailClosed) or, for
//     an outage under FailOpen, publishes the message unprotected.
//  4. The claimed messages are published in one call of the decorated
//     publisher, in their order. When it fails, every claim of the call is
//     released and its error returned, so the caller's retry publishes
//     them.
//  5. Success: every claim is completed, keeping its record for Window.
//
// A call that fails publishes nothing and leaves no claim behind, except
// that the decorated publisher may have sent some of the messages before
// it failed (Kafka and AMQP publishers send one message after another):
// those are published again by the retry.
//
// # Guarantees
//
//	what happens                                 ModeLease                         ModeTransactional
//	producer retries a publish within Window     published once                    enters the outbox once
//	two producers publish the same key at once   once; the other waits or gets     once; the other waits for the
//	                                             ErrInProgress                     first transaction to end
//	the publish call fails                       claims released; retry publishes  savepoints rolled back; retry
//	                                             (again, for messages it sent)     publishes
//	producer dies between publish and record     keys held for Lease, then a       nothing is committed: record
//	                                             retry publishes again             and outbox row go together
//	a publish call outlasts Lease                another producer may take the     — (no lease)
//	                                             keys over and publish again
//	the decorated publisher panics               claims released, panic goes on    savepoints rolled back, panic
//	                                                                               goes on
//	the record cannot be written after publish   logged, counted (store_error);    Publish fails; the caller
//	                                             a retry within Lease gets         rolls its transaction back
//	                                             ErrInProgress, after it publishes
//	retry after Window                           published again                   enters the outbox again
//	store unavailable                            FailClosed: error, nothing        error, nothing published
//	                                             published; FailOpen: published,
//	                                             counted (bypassed)
//
// ModeLease is at-least-once publishing, exactly-once within the window
// otherwise. ModeTransactional, with watermill-sql's publisher on the same
// transaction as the record, is exactly-once into the outbox.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// Decorator deduplicates what the publishers it decorates publish. Its
// Decorate method is a message.PublisherDecorator. One Decorator may
// decorate many publishers; it is safe for concurrent use and holds no
// background work.
type Decorator struct {
	cfg       Config
	inbox     stores.Inbox    // ModeTransactional
	joiner    stores.TxJoiner // ModeTransactional
	noTimeout bool            // the store never blocks
	timed     bool            // Metrics wants store latencies
}

// New returns a Decorator for cfg, or an error wrapping
// middleware.ErrInvalidConfig.
func New(cfg Config) (*Decorator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	d := &Decorator{cfg: cfg}
	if cfg.Mode == ModeTransactional {
		d.inbox = cfg.Store.(stores.Inbox)
		d.joiner = cfg.Store.(stores.TxJoiner)
	}
	if cfg.Store.Capabilities().NonBlocking {
		d.noTimeout = true
	}
	if _, nop := cfg.Metrics.(middleware.NopMetrics); !nop {
		d.timed = true
	}
	return d, nil
}

// Decorate returns pub publishing through the Decorator. It is a
// message.PublisherDecorator: pass d.Decorate to
// router.AddPublisherDecorators, or call it on a publisher of your own.
// Closing the returned publisher closes pub.
func (d *Decorator) Decorate(pub message.Publisher) (message.Publisher, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: Decorate needs a publisher, got nil", middleware.ErrInvalidConfig)
	}
	return &dedupPublisher{d: d, pub: pub}, nil
}

type dedupPublisher struct {
	d   *Decorator
	pub message.Publisher
}

// Publish publishes the messages of msgs that were not published within
// the window.
func (p *dedupPublisher) Publish(topic string, msgs ...*message.Message) error {
	return p.d.publish(p.pub, topic, msgs)
}

// Close closes the decorated publisher.
func (p *dedupPublisher) Close() error { return p.pub.Close() }

func (d *Decorator) scope(topic string) string {
	if d.cfg.Scope != "" {
		return d.cfg.Scope
	}
	return DefaultScopePrefix + topic
}

// item is one message of a Publish call and what became of it.
type item struct {
	msg  *message.Message
	keys []string
	// dupOf is the index of an earlier message of the call that shares a
	// key with this one, or -1.
	dupOf  int
	claim  *stores.Claim  // a Claimed claim (ModeLease)
	tx     stores.InboxTx // a Claimed inbox transaction (ModeTransactional)
	send   bool           // to publish: claimed, or bypassed under FailOpen
	bypass bool
	// decided: claimed, duplicate or bypassed; busy: in progress at the
	// last claim.
	decided, busy bool
}

func (d *Decorator) publish(pub message.Publisher, topic string, msgs []*message.Message) error {
	if len(msgs) == 0 {
		return pub.Publish(topic)
	}
	scope := d.scope(topic)
	items, err := d.keyItems(scope, msgs)
	if err != nil {
		return err
	}
	if d.cfg.Mode == ModeTransactional {
		return d.publishTx(pub, topic, scope, items)
	}
	return d.publishLease(pub, topic, scope, items)
}

// keyItems keys every message, and marks the messages that repeat a key
// of an earlier one in the call.
func (d *Decorator) keyItems(scope string, msgs []*message.Message) ([]item, error) {
	items := make([]item, len(msgs))
	seen := make(map[string]int, len(msgs))
	for i, msg := range msgs {
		if msg == nil {
			return nil, fmt.Errorf("%w: message %d of the call is nil", middleware.ErrInvalidConfig, i)
		}
		keys, err := d.cfg.Key(msg)
		if err == nil && len(keys) == 0 {
			err = fmt.Errorf("%w: message %s: the key function returned no keys", keyfuncs.ErrNoKey, keyfuncs.Name(msg))
		}
		if err != nil {
			return nil, d.permanent(msg, scope, nil, middleware.OutcomeNoKey, fmt.Errorf("dedup: publish: scope %q: %w", scope, err))
		}
		items[i] = item{msg: msg, keys: keys, dupOf: -1}
		for _, k := range keys {
			if j, ok := seen[k]; ok && items[i].dupOf < 0 {
				items[i].dupOf = j
			}
		}
		if items[i].dupOf < 0 {
			for _, k := range keys {
				seen[k] = i
			}
		}
	}
	return items, nil
}

// publishLease is the flow of ModeLease (see the package doc).
func (d *Decorator) publishLease(pub message.Publisher, topic, scope string, items []item) error {
	if err := d.claimAll(scope, items); err != nil {
		return err
	}
	send := d.toSend(scope, items)
	if len(send) == 0 {
		return nil
	}
	if err := guarded(pub, topic, send, func() { d.releaseAll(scope, items, true) }); err != nil {
		n := d.releaseAll(scope, items, true)
		return fmt.Errorf("dedup: publish: %d message(s) to topic %q failed (%d claim(s) released, so a retry publishes them): %w", len(send), topic, n, err)
	}
	d.each(items, func(_ int, it *item) {
		if it.claim != nil {
			d.complete(scope, it)
		}
	})
	return nil
}

// claimAll claims the keys of every message of the call. When another
// producer holds a key it waits up to InProgressWait, claiming again every
// InProgressPoll — without holding the claims it got meanwhile: two
// producers publishing overlapping batches would otherwise each hold what
// the other waits for. On failure every claim of the call is released.
func (d *Decorator) claimAll(scope string, items []item) error {
	var deadline time.Time
	for {
		errs := make([]error, len(items))
		var busy atomic.Int32
		d.each(items, func(i int, it *item) {
			if it.dupOf >= 0 || it.decided {
				return
			}
			res, err := d.claimItem(scope, it)
			errs[i] = err
			if res == stores.InProgress {
				busy.Add(1)
			}
		})
		if err := errors.Join(errs...); err != nil {
			d.releaseAll(scope, items, false)
			return err
		}
		if busy.Load() == 0 {
			return nil
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(d.cfg.InProgressWait)
		}
		wait := min(d.cfg.InProgressPoll/2+rand.N(d.cfg.InProgressPoll), time.Until(deadline))
		d.releaseAll(scope, items, false)
		if wait > 0 {
			sleepCtx(items[0].msg.Context(), wait)
		}
		for i := range items {
			if ctx := items[i].msg.Context(); ctx.Err() != nil {
				d.cfg.Metrics.Observe(scope, middleware.OutcomeCancelled)
				return fmt.Errorf("dedup: publish: scope %q: message %s: its context ended while it waited for another producer: %w", scope, keyfuncs.Name(items[i].msg), context.Cause(ctx))
			}
		}
		if wait <= 0 {
			for i := range items {
				if it := &items[i]; it.busy {
					d.cfg.Metrics.Observe(scope, middleware.OutcomeInProgress)
					return fmt.Errorf("%w: message %s, scope %q, keys %q", ErrInProgress, keyfuncs.Name(it.msg), scope, it.keys)
				}
			}
		}
	}
}

// guarded publishes send with pub; when pub panics, it runs undo (which
// gives the call's claims or records back) before the panic goes on up.
func guarded(pub message.Publisher, topic string, send []*message.Message, undo func()) error {
	done := false
	defer func() {
		if !done {
			undo()
		}
	}()
	err := pub.Publish(topic, send...)
	done = true
	return err
}

// toSend counts what the claims decided, and returns the messages to
// publish, in the caller's order.
func (d *Decorator) toSend(scope string, items []item) []*message.Message {
	send := make([]*message.Message, 0, len(items))
	for i := range items {
		it := &items[i]
		if it.send {
			send = append(send, it.msg)
			if !it.bypass {
				d.cfg.Metrics.Observe(scope, middleware.OutcomeClaimed)
			}
			continue
		}
		d.cfg.Metrics.Observe(scope, middleware.OutcomeDuplicate)
		f := d.fields(it.msg, scope, it.keys)
		if it.dupOf >= 0 {
			f["duplicate_of"] = items[it.dupOf].msg.UUID
		}
		d.cfg.Logger.Debug("Dedup: not publishing a message published within the window", f)
	}
	return send
}

// each runs fn for every item, concurrently when there are several (the
// stores batch concurrent calls into shared round trips).
func (d *Decorator) each(items []item, fn func(i int, it *item)) {
	if len(items) == 1 {
		fn(0, &items[0])
		return
	}
	const maxConcurrent = 32
	sem := make(chan struct{}, maxConcurrent)
	var wg sync.WaitGroup
	for i := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i, &items[i])
		}()
	}
	wg.Wait()
}

// claimItem claims it's keys once and decides what becomes of it:
// Claimed (to publish) and Duplicate are decided; InProgress is not.
func (d *Decorator) claimItem(scope string, it *item) (stores.Result, error) {
	it.busy = false
	c, err := d.claim(it.msg.Context(), scope, it.keys)
	if err != nil {
		return 0, d.claimFailed(scope, it, err)
	}
	switch c.Result {
	case stores.Claimed:
		it.claim, it.send, it.decided = c, true, true
		if c.Takeover {
			d.cfg.Metrics.Observe(scope, middleware.OutcomeTakeover)
			d.cfg.Logger.Info("Dedup: took over an expired publish claim: the producer that held it may have published the message before it stopped", d.fields(it.msg, scope, it.keys))
		}
	case stores.Duplicate:
		it.decided = true
	case stores.InProgress:
		it.busy = true
	}
	return c.Result, nil
}

// claimFailed handles a Claim that failed, by the class of its error, as
// the middleware does: bad keys are permanent, a cancelled message fails,
// an outage is bypassed under FailOpen, everything else fails the call.
func (d *Decorator) claimFailed(scope string, it *item, err error) error {
	msg := it.msg
	if errors.Is(err, stores.ErrInvalidKey) {
		return d.permanent(msg, scope, it.keys, middleware.OutcomeNoKey, fmt.Errorf("dedup: publish: scope %q: %w: message %s: %w", scope, keyfuncs.ErrNoKey, keyfuncs.Name(msg), err))
	}
	if cerr := msg.Context().Err(); cerr != nil {
		d.cfg.Metrics.Observe(scope, middleware.OutcomeCancelled)
		return fmt.Errorf("dedup: publish: scope %q: message %s: its context ended before the store answered: %w", scope, keyfuncs.Name(msg), errors.Join(cerr, err))
	}
	d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
	if d.cfg.OnStoreError == middleware.FailOpen && (errors.Is(err, stores.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		d.cfg.Metrics.Observe(scope, middleware.OutcomeBypassed)
		f := d.fields(msg, scope, it.keys)
		f["error"] = err.Error()
		d.cfg.Logger.Error("Dedup store unavailable: publishing UNPROTECTED (fail-open); reconcile these keys", err, f)
		it.send, it.bypass, it.decided = true, true, true
		return nil
	}
	return fmt.Errorf("%w: publish: message %s, scope %q: %w", middleware.ErrStore, keyfuncs.Name(msg), scope, err)
}

// releaseAll releases every claim of the call, and returns how many;
// count reports them as OutcomeReleased (a failed publish), and not
// counting them is for a claim given back to wait or after another
// message's failure.
func (d *Decorator) releaseAll(scope string, items []item, count bool) int {
	var n atomic.Int32
	d.each(items, func(_ int, it *item) {
		if it.claim == nil {
			return
		}
		c := it.claim
		it.claim, it.send, it.decided = nil, false, false
		if err := d.release(it.msg.Context(), c); err != nil {
			d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
			f := d.fields(it.msg, scope, it.keys)
			d.cfg.Logger.Error("Dedup: could not release a publish claim: a retry gets ErrInProgress until its lease runs out", err, f)
			return
		}
		if count {
			d.cfg.Metrics.Observe(scope, middleware.OutcomeReleased)
		}
		n.Add(1)
	})
	return int(n.Load())
}

// complete records a published message done for Window. An outage is
// retried a few times; a record that cannot be written is logged and
// counted, and the publish still succeeds: the message went out.
func (d *Decorator) complete(scope string, it *item) {
	backoff := 50 * time.Millisecond
	var err error
	for attempt := 1; ; attempt++ {
		if err = d.completeOnce(it.msg.Context(), it.claim); err == nil {
			return
		}
		if attempt == 3 || !(errors.Is(err, stores.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
			break
		}
		time.Sleep(backoff)
		backoff *= 2
	}
	d.cfg.Metrics.Observe(scope, middleware.OutcomeStoreError)
	f := d.fields(it.msg, scope, it.keys)
	f["lease"] = d.cfg.Lease.String()
	d.cfg.Logger.Error("Dedup: the message was published but its record could not be written: a retry within the lease gets ErrInProgress, one after it publishes again", err, f)
}

// permanent counts and logs a message failed for good, and returns err.
func (d *Decorator) permanent(msg *message.Message, scope string, keys []string, o middleware.Outcome, err error) error {
	d.cfg.Metrics.Observe(scope, o)
	f := d.fields(msg, scope, keys)
	f["outcome"] = o.String()
	d.cfg.Logger.Error("Dedup cannot publish this message, and no retry will help", err, f)
	return err
}

func (d *Decorator) fields(msg *message.Message, scope string, keys []string) watermill.LogFields {
	f := watermill.LogFields{"message_uuid": msg.UUID, "scope": scope}
	if keys != nil {
		f["keys"] = keys
	}
	return f
}

// sleepCtx sleeps for d, or until ctx is done (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
