package acceptance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/ledger"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// Metadata set on every message the suite publishes.
const (
	// MetadataEvent names the logical event a message carries; the ledger
	// counts effects by it. It survives republishing under a new message
	// id and bad payloads.
	MetadataEvent = "acceptance_event"

	// MetadataShard is a small decimal number. A backend with several
	// shards (Kafka partitions) should route messages with the same value
	// to the same shard and different values (modulo Features.Shards) to
	// different shards, so that a deliberate duplicate reaches another
	// consumer than its original.
	MetadataShard = "acceptance_shard"

	// MetadataPublishedAt is the RFC 3339 time the event was first
	// published (middleware.Config.PublishedAt reads it).
	MetadataPublishedAt = "acceptance_published_at"
)

// eventField is the JSON field of the payload that the business key reads.
const eventField = "event_id"

type keyKind string

const (
	// keyMessageID: the middleware's default key.
	keyMessageID keyKind = "message_id"
	// keyIDAndEvent: message id and business key in one record, what
	// keyfuncs recommends for side-effecting consumers.
	keyIDAndEvent keyKind = "message_id+event_id"
	// keyNativeAndEvent: the backend's documented key of a native
	// producer's id (Native.Key) and the business key in one record.
	keyNativeAndEvent keyKind = "native+event_id"
)

// keyFunc returns the key function of k; native is the backend's native
// client, for keyNativeAndEvent.
func (k keyKind) keyFunc(native *Native) (keyfuncs.KeyFunc, error) {
	switch k {
	case keyIDAndEvent:
		return keyfuncs.All(
			keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
			keyfuncs.Prefix("evt:", keyfuncs.JSON(eventField)),
		), nil
	case keyNativeAndEvent:
		if native == nil {
			return nil, errors.New("acceptance: a native key on a backend without Native")
		}
		return keyfuncs.All(
			keyfuncs.Prefix("msg:", native.Key),
			keyfuncs.Prefix("evt:", keyfuncs.JSON(eventField)),
		), nil
	}
	return keyfuncs.MessageID(), nil
}

// nativeIDField is the field of a native message's payload that holds the
// producer's id (NativeMessage.ID): the suite matches deliveries to what
// it published by it, not by the key functions under test.
const nativeIDField = "message_id"

// nativePayload is the payload of a native message of event, published
// under the producer's id id.
func nativePayload(id, event string) []byte {
	return fmt.Appendf(nil, `{"%s":%q,"%s":%q,"amount":1}`, nativeIDField, id, eventField, event)
}

// nativeIdentity reads the producer's id and the event of a native
// message from its payload.
func nativeIdentity(payload []byte) (id, event string) {
	var p map[string]any
	_ = json.Unmarshal(payload, &p)
	id, _ = p[nativeIDField].(string)
	event, _ = p[eventField].(string)
	return id, event
}

// crashPoint is where a consumer dies.
type crashPoint string

const (
	// crashAfterEffect: after the side effect, before Complete (lease
	// mode) or before the commit (transactional mode).
	crashAfterEffect crashPoint = "after_effect"
	// crashAfterComplete: after Complete or the commit, before the ack.
	crashAfterComplete crashPoint = "after_complete"
)

// consumerSpec describes one consumer: its router handler and what the
// handler does. It is JSON-encoded for child processes.
type consumerSpec struct {
	Name        string // unique in the scenario
	Handler     string // router handler name, hence the dedup scope
	Group       string
	Topic       string
	OutTopic    string `json:",omitempty"` // produce one output per event
	PoisonTopic string `json:",omitempty"` // route permanent errors there
	Downstream  bool   `json:",omitempty"` // count effects as "out:<event>"
	// Native: the messages come from the backend's native producer
	// (Backend.Native). The consumer uses Native's subscriber and reads
	// Native.PublishedAt, and a delivery is identified by the producer's
	// id and the event in its payload (see nativeIdentity) instead of the
	// Watermill UUID and metadata.
	Native bool `json:",omitempty"`
	Key    keyKind

	Lease, Heartbeat, Retention    time.Duration
	InProgressWait, InProgressPoll time.Duration
	StoreTimeout                   time.Duration
	FailOpen                       bool `json:",omitempty"`
	PublishedAt                    bool `json:",omitempty"`

	// FailFirst fails each event's first attempt (every fifth by a
	// panic). In transactional mode the effect is written first, so the
	// rollback is checked too.
	FailFirst bool `json:",omitempty"`
	// FlakyPublish makes the router's publisher of outputs fail
	// intermittently.
	FlakyPublish bool `json:",omitempty"`
	// Crash kills the consumer at a point for these events (once each).
	Crash map[string]crashPoint `json:",omitempty"`
	// Hang makes the first attempt of these events hang (lease expiry).
	Hang map[string]bool `json:",omitempty"`
	// RetryDelay is slept after a failed delivery before it is nacked,
	// as a broker's redelivery delay, so a failing store does not spin.
	RetryDelay time.Duration
}

// delivery is one delivery of a message to a consumer.
type delivery struct {
	id       uint64
	uuid     string
	event    string
	consumer string
	proc     *proc

	// stalled is set while the delivery hangs (consumerCore.hang): its
	// heartbeats do not reach the store, as a stalled process's do not.
	stalled atomic.Bool

	// guarded by proc.mu
	claimed     bool  // a Claim of the delivery returned stores.Claimed
	effect      bool  // the memory-ledger effect was applied
	completed   bool  // Complete (or the commit) succeeded
	completeErr error // the last Complete (or commit) failed with it
}

func (d *delivery) key() string { return d.consumer + "/" + strconv.FormatUint(d.id, 10) }

func (d *delivery) lastCompleteErr() error {
	d.proc.mu.Lock()
	defer d.proc.mu.Unlock()
	return d.completeErr
}

// setCompleted records the outcome of a Complete or commit.
func (d *delivery) setCompleted(err error) {
	d.proc.mu.Lock()
	d.completed = d.completed || err == nil
	d.completeErr = err
	if d.completed {
		delete(d.proc.acked, d)
	}
	d.proc.mu.Unlock()
}

type deliveryKey struct{}

func withDelivery(ctx context.Context, d *delivery) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

func deliveryFrom(ctx context.Context) *delivery {
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}

// proc is the process state of a consumer generation: in-process
// consumers "die" by killing it. A dead proc applies no more effects and
// its store calls fail, as if the process were gone, while its goroutines
// still run; its open transactions are rolled back, as a database does
// when a client's connection dies.
type proc struct {
	mu   sync.Mutex
	dead bool
	live map[*delivery]struct{}
	// acked holds, under AsyncComplete, the deliveries acked after their
	// effect whose Complete has not landed yet: their records are still
	// processing, as a live delivery's between effect and Complete.
	acked     map[*delivery]struct{}
	rollbacks map[*probeTx]struct{}
}

func newProc() *proc {
	return &proc{live: map[*delivery]struct{}{}, acked: map[*delivery]struct{}{}, rollbacks: map[*probeTx]struct{}{}}
}

func (p *proc) isDead() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dead
}

// do runs f while p is alive, atomically with respect to kill.
func (p *proc) do(f func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return false
	}
	f()
	return true
}

func (p *proc) begin(d *delivery) bool {
	return p.do(func() { p.live[d] = struct{}{} })
}

func (p *proc) end(d *delivery) {
	p.mu.Lock()
	delete(p.live, d)
	p.mu.Unlock()
}

// kill marks p dead and returns the deliveries it had in flight and
// those caught between their effect and their Complete: in lease mode
// each of those may run again. Under AsyncComplete the window goes on
// after the ack, until the Complete lands: acked deliveries whose Complete
// is still in flight count too. Open transactions are rolled back.
func (p *proc) kill() (live, window []*delivery) {
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return nil, nil
	}
	p.dead = true
	for d := range p.live {
		live = append(live, d)
		if d.effect && !d.completed {
			window = append(window, d)
		}
	}
	for d := range p.acked {
		if _, counted := p.live[d]; !counted && !d.completed {
			window = append(window, d)
		}
	}
	p.acked = map[*delivery]struct{}{}
	txs := make([]*probeTx, 0, len(p.rollbacks))
	for tx := range p.rollbacks {
		txs = append(txs, tx)
	}
	p.rollbacks = map[*probeTx]struct{}{}
	p.mu.Unlock()
	for _, tx := range txs {
		_ = tx.InboxTx.Rollback(context.Background())
	}
	return live, window
}

var (
	errCrashed      = errors.New("acceptance: consumer crashed (simulated)")
	errDead         = errors.New("acceptance: the consumer process is dead (simulated)")
	errFirstAttempt = errors.New("acceptance: first attempt fails (simulated)")
	errPublish      = errors.New("acceptance: publish failed (simulated)")
	errAckLost      = errors.New("acceptance: published, but the broker's ack was lost (simulated)")
)

// sink receives what a consumer does: the test process's run, or a child
// process's pipe to it.
type sink interface {
	dedup.Metrics
	delivered(d *delivery)
	handled(d *delivery, err error)
	// effect applies the effect of d to the memory ledger.
	effect(d *delivery, event string)
	// entered: the store saw d's Claim or Begin.
	entered(d *delivery)
	// completed: d's Complete or commit returned err.
	completed(d *delivery, err error)
	// storeCalled: a store call of d, traced (see storeCall).
	storeCalled(d *delivery, c storeCall)
	// incomplete: d was acked although its last Complete failed (the
	// middleware acks once CompleteTimeout has passed): its record runs out
	// like a crashed consumer's, and a later duplicate may run again.
	incomplete(d *delivery)
	// claimCrash reports whether the crash planned for event is still to
	// happen, and takes it; claimHang likewise for a planned hang.
	claimCrash(event string) bool
	claimHang(event string) bool
	// crash kills the consumer running d at point. It returns the error
	// for the handler to return, when it returns at all.
	crash(d *delivery, point crashPoint) error
	// hang blocks the first attempt of a hanging event until the scenario
	// lets it go on (it returns false when the scenario ended first).
	hang(d *delivery) bool
}

// consumerCore builds the router of one consumer from its spec. It is the
// same in the test process and in a child process.
type consumerCore struct {
	spec   consumerSpec
	sink   sink
	store  stores.Store // wrapped with probeStore
	ledger Ledger       // the store's ledger (transactional mode), or nil
	txMode bool
	async  bool    // Store.AsyncComplete
	native *Native // Backend.Native, for a Native consumer
	logger watermill.LoggerAdapter

	// mw is the middleware under AsyncComplete, closed by closeMiddleware;
	// nil otherwise.
	mw *middleware.Middleware

	// currentProc returns the proc new deliveries belong to.
	currentProc func() *proc
	// nackOnDeath: a dead proc's deliveries return an error at once, so
	// the broker redelivers them (the crash emulation of a backend that
	// is not Persistent). Otherwise they block until dead is closed, as a
	// dead process acks nothing and the broker redelivers to the next
	// consumer of the group.
	nackOnDeath bool
	dead        <-chan struct{}

	// hook, when set, takes over the effect of some deliveries (the
	// lifecycle scenarios hold handlers with it); in-process consumers
	// only.
	hook handlerHook

	ids      atomic.Uint64
	attempts sync.Map // "kind/event" -> true
	fails    atomic.Int64
}

// handlerHook lets a scenario run the effect of a delivery itself, where
// and when it wants: handle returns false when it leaves d to the usual
// handler, or true and the handler's error once it applied the effect
// with apply (or failed).
type handlerHook interface {
	handle(ctx context.Context, d *delivery, apply func(context.Context) error) (bool, error)
}

func newConsumerCore(spec consumerSpec, s sink, opened Opened, b Backend, st Store, logger watermill.LoggerAdapter) *consumerCore {
	return &consumerCore{
		spec:   spec,
		sink:   s,
		store:  wrapStore(opened.Store, s),
		ledger: opened.Ledger,
		txMode: st.Transactional,
		async:  st.AsyncComplete,
		native: b.Native,
		logger: logger,
	}
}

// newSubscriber returns the subscriber of spec on b: Native's for a
// Native consumer when the backend has one of its own.
func newSubscriber(t testing.TB, b Backend, env Env, spec consumerSpec) (message.Subscriber, error) {
	if spec.Native && b.Native != nil && b.Native.NewSubscriber != nil {
		return b.Native.NewSubscriber(t, env, spec.Group)
	}
	return b.NewSubscriber(t, env, spec.Group)
}

// closeTimeout bounds closeMiddleware: more than any CompleteTimeout (the
// lease) of a scenario.
const closeTimeout = defaultLease + time.Minute

// closeMiddleware closes the middleware of an AsyncComplete consumer
// once its router stopped, waiting for the Completes in flight, then
// reports the deliveries of p (the live proc, nil when dead) acked while
// their Complete never landed: their records run out like a crashed
// consumer's. It does nothing for a consumer in the default mode.
func (c *consumerCore) closeMiddleware(p *proc) error {
	if c.mw == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	err := c.mw.Close(ctx)
	if p == nil {
		return err
	}
	p.mu.Lock()
	var incomplete []*delivery
	if !p.dead {
		for d := range p.acked {
			// (A refused Complete is reconciled: the record is done.)
			if !d.completed && !errors.Is(d.completeErr, stores.ErrLostClaim) {
				incomplete = append(incomplete, d)
			}
		}
	}
	p.mu.Unlock()
	for _, d := range incomplete {
		c.sink.incomplete(d)
	}
	return err
}

// dieQuietly is what the delivery of a dead proc returns.
func (c *consumerCore) dieQuietly() error {
	if !c.nackOnDeath {
		<-c.dead
	}
	return errCrashed
}

// router returns the consumer's router on sub, publishing outputs and
// poisoned messages with pub.
func (c *consumerCore) router(sub message.Subscriber, pub message.Publisher) (*message.Router, error) {
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, c.logger)
	if err != nil {
		return nil, err
	}
	key, err := c.spec.Key.keyFunc(c.native)
	if err != nil {
		return nil, err
	}
	mode := dedup.ModeLease
	switch {
	case c.txMode:
		mode = dedup.ModeTransactional
	case c.async:
		mode = dedup.ModeAsyncComplete
	}
	cfg := middleware.Config{
		Store: c.store,
		Mode:  mode,
		Key:   key,
		Policy: dedup.Policy{
			Lease:          c.spec.Lease,
			Retention:      c.spec.Retention,
			StoreTimeout:   c.spec.StoreTimeout,
			InProgressWait: c.spec.InProgressWait,
			Metrics:        c.sink,
			Logger:         c.logger,
			Tuning:         dedup.Tuning{Heartbeat: c.spec.Heartbeat, InProgressPoll: c.spec.InProgressPoll},
		},
	}
	if c.spec.FailOpen {
		cfg.OnStoreError = dedup.FailOpen
	}
	if c.spec.PublishedAt {
		cfg.PublishedAt = middleware.MetadataTime(MetadataPublishedAt)
	}
	if c.spec.Native && c.native != nil && c.native.PublishedAt != nil {
		cfg.PublishedAt = c.native.PublishedAt
	}
	mw, err := middleware.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("dedup middleware: %w", err)
	}
	c.mw = mw
	dedupMW := mw.Middleware
	var h *message.Handler
	if c.spec.OutTopic != "" {
		out := pub
		if c.spec.FlakyPublish {
			out = &flakyPublisher{Publisher: pub}
		}
		h = r.AddHandler(c.spec.Handler, c.spec.Topic, sub, c.spec.OutTopic, out, c.handle)
	} else {
		h = r.AddNoPublisherHandler(c.spec.Handler, c.spec.Topic, sub, func(msg *message.Message) error {
			_, err := c.handle(msg)
			return err
		})
	}
	h.AddMiddleware(c.observe)
	if c.spec.PoisonTopic != "" {
		poison, err := wmw.PoisonQueueWithFilter(pub, c.spec.PoisonTopic, dedup.IsPermanent)
		if err != nil {
			return nil, err
		}
		h.AddMiddleware(poison)
	}
	h.AddMiddleware(c.crashAfterComplete, wmw.Recoverer, dedupMW)
	return r, nil
}

// observe is the outermost middleware: it ties the delivery to the
// consumer's current proc and reports it.
func (c *consumerCore) observe(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		p := c.currentProc()
		d := &delivery{
			id:       c.ids.Add(1),
			uuid:     msg.UUID,
			event:    msg.Metadata.Get(MetadataEvent),
			consumer: c.spec.Name,
			proc:     p,
		}
		if c.spec.Native {
			d.uuid, d.event = nativeIdentity(msg.Payload)
		}
		if !p.begin(d) {
			// Delivered to a consumer that is already dead: it never sees
			// the message, which stays unacked until the subscriber goes.
			return nil, c.dieQuietly()
		}
		defer p.end(d)
		msg.SetContext(withDelivery(msg.Context(), d))
		c.sink.delivered(d)
		out, err := next(msg)
		if p.isDead() {
			// A dead process acks nothing.
			c.sink.handled(d, errCrashed)
			return nil, c.dieQuietly()
		}
		c.sink.handled(d, err)
		if c.async {
			// Acked before its Complete landed: until it does, the record
			// is processing (see proc.kill; closeMiddleware reports a
			// Complete that never landed).
			if err == nil {
				p.do(func() {
					// (A fail-open bypass has no claim, hence no Complete.)
					if d.claimed && d.effect && !d.completed {
						p.acked[d] = struct{}{}
					}
				})
			}
		} else if cerr := d.lastCompleteErr(); err == nil && cerr != nil && !errors.Is(cerr, stores.ErrLostClaim) {
			// (A refused Complete is reconciled: the record is done.)
			c.sink.incomplete(d)
		}
		if err != nil && c.spec.RetryDelay > 0 {
			time.Sleep(c.spec.RetryDelay)
		}
		return out, err
	}
}

// crashAfterComplete kills the consumer after a successful Complete (or
// commit), before the ack, for the events planned so.
func (c *consumerCore) crashAfterComplete(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := next(msg)
		d := deliveryFrom(msg.Context())
		if err == nil && d != nil && c.spec.Crash[d.event] == crashAfterComplete && c.sink.claimCrash(d.event) {
			return nil, c.sink.crash(d, crashAfterComplete)
		}
		return out, err
	}
}

func (c *consumerCore) firstAttempt(kind, event string) bool {
	_, loaded := c.attempts.LoadOrStore(kind+"/"+event, true)
	return !loaded
}

// handle is the business handler: one effect per event.
func (c *consumerCore) handle(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	d := deliveryFrom(ctx)
	if d == nil {
		return nil, errors.New("acceptance: message without a delivery in its context")
	}
	event := d.event
	if c.spec.Downstream {
		event = "out:" + event
	}
	if c.spec.FailFirst && c.firstAttempt("fail", event) {
		if c.ledger != nil {
			// Transactional: write the effect, then fail: the rollback
			// must take it away.
			if err := c.ledger.Record(ctx, ledger.Effect{Event: event}); err != nil {
				return nil, err
			}
		}
		if c.fails.Add(1)%5 == 0 {
			panic("acceptance: first attempt panics (simulated)")
		}
		return nil, errFirstAttempt
	}
	if c.spec.Hang[d.event] && c.sink.claimHang(d.event) {
		if skip, err := c.hang(ctx, d); skip || err != nil {
			return nil, err
		}
	}
	applied := false
	if c.hook != nil {
		taken, err := c.hook.handle(ctx, d, func(ctx context.Context) error { return c.apply(ctx, d, event) })
		if err != nil {
			return nil, err
		}
		applied = taken
	}
	if !applied {
		if err := c.apply(ctx, d, event); err != nil {
			return nil, err
		}
	}
	if c.spec.Crash[d.event] == crashAfterEffect && c.sink.claimCrash(d.event) {
		return nil, c.sink.crash(d, crashAfterEffect)
	}
	if c.spec.OutTopic != "" {
		out := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"%s":%q,"kind":"output"}`, eventField, d.event))
		out.Metadata.Set(MetadataEvent, d.event)
		out.Metadata.Set(MetadataShard, msg.Metadata.Get(MetadataShard))
		out.Metadata.Set(MetadataPublishedAt, time.Now().UTC().Format(time.RFC3339Nano))
		return []*message.Message{out}, nil
	}
	return nil, nil
}

// apply records the effect of d.
func (c *consumerCore) apply(ctx context.Context, d *delivery, event string) error {
	if c.ledger != nil {
		return c.ledger.Record(ctx, ledger.Effect{Event: event})
	}
	if !d.proc.do(func() {
		c.sink.effect(d, event)
		d.effect = true
	}) {
		return errCrashed
	}
	return nil
}

// hang stalls the first attempt of an event past its lease. Lease mode:
// until another delivery took the event over and applied its effect;
// then, like a fenced write, the stalled run checks its claim before its
// effect, skips the effect when the claim is lost, and returns success so
// that its Complete is attempted — and refused. Transactional mode: until
// another delivery reached the store (and waits on the record's lock);
// then it applies the effect and commits.
func (c *consumerCore) hang(ctx context.Context, d *delivery) (skip bool, err error) {
	d.stalled.Store(true)
	released := c.sink.hang(d)
	d.stalled.Store(false)
	if !released {
		return false, errCrashed
	}
	if c.txMode {
		return false, nil
	}
	claim, ok := middleware.ClaimFromContext(ctx)
	if !ok {
		return false, errors.New("acceptance: no claim in the handler's context")
	}
	err = c.store.Extend(context.WithoutCancel(ctx), claim, c.spec.Lease)
	switch {
	case errors.Is(err, stores.ErrLostClaim):
		return true, nil
	case err != nil:
		return false, err
	}
	return false, nil
}

// flakyPublisher fails every other publish call, half of the failures
// after publishing (an ack lost on the way back).
type flakyPublisher struct {
	message.Publisher
	calls atomic.Int64
}

func (p *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	switch p.calls.Add(1) % 4 {
	case 1:
		return errPublish
	case 3:
		if err := p.Publisher.Publish(topic, msgs...); err != nil {
			return err
		}
		return errAckLost
	}
	return p.Publisher.Publish(topic, msgs...)
}

// wrapStore wraps a store so that the calls of a dead proc fail and the
// outcomes reach the sink. It keeps stores.Inbox when the store has it.
func wrapStore(s stores.Store, sk sink) stores.Store {
	p := &probeStore{inner: s, sink: sk}
	if inbox, ok := s.(stores.Inbox); ok {
		return &probeInbox{probeStore: p, inbox: inbox}
	}
	return p
}

type probeStore struct {
	inner stores.Store
	sink  sink
}

var (
	_ stores.Store = (*probeStore)(nil)
	_ stores.Inbox = (*probeInbox)(nil)
)

func deadCheck(ctx context.Context) (*delivery, error) {
	d := deliveryFrom(ctx)
	if d != nil && d.proc.isDead() {
		return d, errDead
	}
	return d, nil
}

func (s *probeStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	d, err := deadCheck(ctx)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return s.inner.Claim(ctx, scope, keys, lease)
	}
	s.sink.entered(d)
	sent := time.Now()
	c, err := s.inner.Claim(ctx, scope, keys, lease)
	call := storeCall{op: opClaim, delivery: d.key(), event: d.event, err: err != nil, sent: sent, returned: time.Now(),
		cancelled: err != nil && errors.Is(ctx.Err(), context.Canceled)}
	d.proc.mu.Lock()
	call.again = d.claimed
	if err == nil && c != nil {
		call.result, call.takeover = c.Result, c.Takeover
		d.claimed = d.claimed || c.Result == stores.Claimed
	}
	d.proc.mu.Unlock()
	s.sink.storeCalled(d, call)
	return c, err
}

func (s *probeStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	d, err := deadCheck(ctx)
	if err != nil {
		return err
	}
	sent := time.Now()
	err = s.inner.Complete(ctx, c, retention, data)
	if d != nil {
		s.sink.storeCalled(d, storeCall{op: opComplete, delivery: d.key(), event: d.event, err: err != nil, sent: sent, returned: time.Now()})
		d.setCompleted(err)
		s.sink.completed(d, err)
	}
	return err
}

func (s *probeStore) Release(ctx context.Context, c *stores.Claim) error {
	if _, err := deadCheck(ctx); err != nil {
		return err
	}
	return s.inner.Release(ctx, c)
}

func (s *probeStore) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	d, err := deadCheck(ctx)
	if err != nil {
		return err
	}
	if d != nil && d.stalled.Load() {
		// A hung delivery's heartbeat, which a stalled process would not
		// send: it never reaches the store, and is not traced (the lease
		// runs from the last Extend that did).
		return nil
	}
	sent := time.Now()
	err = s.inner.Extend(ctx, c, lease)
	if d != nil {
		s.sink.storeCalled(d, storeCall{op: opExtend, delivery: d.key(), event: d.event, err: err != nil, sent: sent, returned: time.Now()})
	}
	return err
}

// Capabilities are the wrapped store's.
func (s *probeStore) Capabilities() stores.Capabilities { return s.inner.Capabilities() }

// Close does nothing: the suite closes the store it opened.
func (s *probeStore) Close(context.Context) error { return nil }

type probeInbox struct {
	*probeStore
	inbox stores.Inbox
}

func (s *probeInbox) Begin(ctx context.Context, scope string, keys []string, retention time.Duration) (stores.InboxTx, error) {
	d, err := deadCheck(ctx)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return s.inbox.Begin(ctx, scope, keys, retention)
	}
	s.sink.entered(d)
	sent := time.Now()
	tx, err := s.inbox.Begin(ctx, scope, keys, retention)
	call := storeCall{op: opBegin, delivery: d.key(), event: d.event, err: err != nil, sent: sent, returned: time.Now()}
	if err == nil {
		call.result = tx.Result()
	}
	s.sink.storeCalled(d, call)
	if err != nil || tx.Result() != stores.Claimed {
		return tx, err
	}
	ptx := &probeTx{InboxTx: tx, d: d, sink: s.sink}
	if !d.proc.do(func() { d.proc.rollbacks[ptx] = struct{}{} }) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, errDead
	}
	return ptx, nil
}

// probeTx is a transaction of a delivery: a dead proc's commit rolls back.
type probeTx struct {
	stores.InboxTx
	d    *delivery
	sink sink
}

func (t *probeTx) forget() {
	p := t.d.proc
	p.mu.Lock()
	delete(p.rollbacks, t)
	p.mu.Unlock()
}

func (t *probeTx) Commit(ctx context.Context, data []byte) error {
	if t.d.proc.isDead() {
		_ = t.InboxTx.Rollback(ctx)
		t.forget()
		return errDead
	}
	sent := time.Now()
	err := t.InboxTx.Commit(ctx, data)
	t.forget()
	t.sink.storeCalled(t.d, storeCall{op: opCommit, delivery: t.d.key(), event: t.d.event, err: err != nil, sent: sent, returned: time.Now()})
	t.d.setCompleted(err)
	t.sink.completed(t.d, err)
	return err
}

func (t *probeTx) Rollback(ctx context.Context) error {
	t.forget()
	return t.InboxTx.Rollback(ctx)
}
