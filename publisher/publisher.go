package publisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// Decorator deduplicates what the publishers it decorates publish. Its
// Decorate method is a message.PublisherDecorator. One Decorator may
// decorate many publishers; it is safe for concurrent use and holds no
// background work between calls.
type Decorator struct {
	cfg    Config
	cyc    *cycle.Cycle
	key    keyfuncs.KeyFunc
	joiner stores.TxJoiner // ModeTransactional
}

// New returns a Decorator for cfg, or an error wrapping
// dedup.ErrInvalidConfig: an invalid field, or a setting the store cannot
// honour, named with the store's bound.
func New(cfg Config) (*Decorator, error) {
	cyc, err := cfg.cycle()
	if err != nil {
		return nil, err
	}
	joiner, _ := cfg.Store.(stores.TxJoiner) // ModeTransactional: checked by cycle.New
	return &Decorator{cfg: cfg, cyc: cyc, key: cycle.Key(cfg.Key), joiner: joiner}, nil
}

// Decorate returns pub publishing through the Decorator. It is a
// message.PublisherDecorator: pass d.Decorate to
// router.AddPublisherDecorators, or call it on a publisher of your own.
// Closing the returned publisher closes pub.
func (d *Decorator) Decorate(pub message.Publisher) (message.Publisher, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: Decorate needs a publisher, got nil", dedup.ErrInvalidConfig)
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
	beat   *cycle.Beat    // the claim's heartbeat while it is published
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
	if d.cfg.Mode == dedup.ModeTransactional {
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
			return nil, fmt.Errorf("%w: message %d of the call is nil", dedup.ErrInvalidConfig, i)
		}
		keys, err := d.key(msg)
		if err != nil || len(keys) == 0 {
			return nil, d.cyc.NoKey(msg, scope, keys, err)
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
	for i := range items {
		if it := &items[i]; it.claim != nil {
			it.beat = d.cyc.Hold(it.msg.Context(), it.claim)
		}
	}
	if err := guarded(pub, topic, send, func() { d.releaseAll(scope, items, true) }); err != nil {
		n := d.releaseAll(scope, items, true)
		return fmt.Errorf("dedup: publish: %d message(s) to topic %q failed (%d claim(s) released, so a retry publishes them): %w", len(send), topic, n, err)
	}
	// The messages went out: record them, retrying every failure that is
	// not known to be permanent. Publish succeeds whatever the records
	// become; the cycle logs and counts what it could not record.
	d.each(items, func(_ int, it *item) {
		if it.claim == nil {
			return
		}
		it.beat.Completing()
		// Published already: what the record became can only be
		// reported, and Finish has logged and counted it.
		_, _ = d.cyc.Finish(context.WithoutCancel(it.msg.Context()), it.msg, it.beat, d.cyc.EncodeFor(it.msg, nil), nil)
		it.beat = nil
	})
	return nil
}

// claimAll claims the keys of every message of the call. When another
// producer holds a key it waits up to InProgressWait, claiming again every
// InProgressPoll — without holding the claims it got meanwhile: two
// producers publishing overlapping batches would otherwise each hold what
// the other waits for. On failure every claim of the call is released.
func (d *Decorator) claimAll(scope string, items []item) error {
	var roundErr error
	round := func() (busy bool, err error) {
		errs := make([]error, len(items))
		var n atomic.Int32
		d.each(items, func(i int, it *item) {
			if it.dupOf >= 0 || it.decided {
				return
			}
			res, err := d.claimItem(scope, it)
			errs[i] = err
			if res == stores.InProgress {
				n.Add(1)
			}
		})
		if roundErr = errors.Join(errs...); roundErr != nil {
			d.releaseAll(scope, items, false)
			return false, roundErr
		}
		if n.Load() == 0 {
			return false, nil
		}
		d.releaseAll(scope, items, false)
		return true, nil
	}
	busy, err := round()
	if err != nil || !busy {
		return err
	}
	for i := range items {
		if it := &items[i]; it.busy {
			if err := d.cyc.Await(it.msg, scope, it.keys, round); roundErr == nil {
				return err
			}
			return roundErr
		}
	}
	return nil
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
				d.cyc.Claimed(it.msg, scope, it.keys)
			}
			continue
		}
		d.cyc.Observe(scope, dedup.OutcomeDuplicate)
		f := d.cyc.Fields(it.msg, scope, it.keys)
		if it.dupOf >= 0 {
			f["duplicate_of"] = items[it.dupOf].msg.UUID
		}
		d.cyc.Logger().Debug("Dedup: not publishing a message published within the window", f)
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
	c, err := d.cyc.Claim(it.msg.Context(), scope, it.keys)
	var r stores.Result
	var takeover bool
	if err == nil {
		r, takeover = c.Result, c.Takeover
	}
	v, err := d.cyc.Decide(it.msg, scope, it.keys, r, takeover, err)
	switch v {
	case cycle.Run:
		it.claim, it.send, it.decided = c, true, true
	case cycle.Bypass:
		it.send, it.bypass, it.decided = true, true, true
	case cycle.Skip:
		it.decided = true
	case cycle.Busy:
		it.busy = true
	}
	return r, err
}

// releaseAll releases every claim of the call, and returns how many;
// count reports them as OutcomeReleased (a failed publish), and not
// counting them is for a claim given back to wait or after another
// message's failure.
func (d *Decorator) releaseAll(scope string, items []item, count bool) int {
	var n atomic.Int32
	d.each(items, func(_ int, it *item) {
		if it.beat != nil {
			d.cyc.Drop(it.beat)
			it.beat = nil
		}
		if it.claim == nil {
			return
		}
		c := it.claim
		it.claim, it.send, it.decided = nil, false, false
		if d.cyc.Release(it.msg.Context(), c, count) == nil {
			n.Add(1)
		}
	})
	return int(n.Load())
}
