package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
)

// Metadata the producer sets on every message.
const (
	metaPublishedAt = "published_at" // RFC 3339, when the event was first published: the ttl-miss check
	metaCustomerID  = "customer_id"  // the Kafka partition key
	metaAttempt     = "producer_attempt"
)

// paymentCompleted is the event the producer publishes: a payment done.
type paymentCompleted struct {
	EventID    string      `json:"event_id"`
	Type       string      `json:"type"`
	PaymentID  string      `json:"payment_id"`
	CustomerID string      `json:"customer_id"`
	Amount     json.Number `json:"amount"`
}

// plannedMessage is one message the producer will publish.
type plannedMessage struct {
	uuid        string
	event       paymentCompleted
	publishedAt time.Time
	attempt     int // 1 for the original, 2 for a producer retry
	stale       bool
}

// plan is the whole run, decided before it starts so that the progress bar
// knows its total and the summary knows what to expect.
type plan struct {
	messages []plannedMessage
	expected map[string]int64 // payment id -> points
	events   int              // distinct events (= payments)
	retries  int              // republished under a new message id
	stale    int
}

func (p plan) expectedTotal() int64 {
	var t int64
	for _, v := range p.expected {
		t += v
	}
	return t
}

// makePlan draws the events from cfg.Seed: amounts, customers, which events
// the producer republishes under a new message id, and the message ids,
// which decide which messages the faults hit. Nothing drawn depends on the
// run id, so -seed alone reproduces a run's faults: runs never share a
// message id's namespace anyway, since every topic, queue, table and key
// prefix carries the run id. Only the payment ids (the ledger's keys) do.
func makePlan(cfg Config, runID string, now time.Time) plan {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	ids := rand.New(rand.NewPCG(cfg.Seed, 0x1d5))
	p := plan{expected: map[string]int64{}}
	add := func(i int, stale bool) {
		kind := "evt"
		if stale {
			kind = "old"
		}
		ev := paymentCompleted{
			EventID:    fmt.Sprintf("%s-%06d", kind, i), // a foreign Kafka record's key: its partition, hence its offset
			Type:       "payment.completed",
			PaymentID:  fmt.Sprintf("PAY-%s-%s-%06d", runID, kind, i),
			CustomerID: fmt.Sprintf("CUS-%04d", rng.IntN(cfg.Customers)),
			Amount:     json.Number(fmt.Sprintf("%d.%02d", 1+rng.IntN(500), rng.IntN(100))),
		}
		pts, _ := ev.points()
		p.expected[ev.PaymentID] = pts
		p.events++
		at := now
		if stale {
			// Published before the retention window began: if it had been
			// handled then, its record would be gone by now.
			at = now.Add(-cfg.Retention - time.Hour)
			p.stale++
		}
		p.messages = append(p.messages, plannedMessage{uuid: newUUID(ids), event: ev, publishedAt: at, attempt: 1, stale: stale})
		if !stale && rng.Float64() < cfg.RepublishRate {
			// A producer retry: it timed out waiting for the broker and
			// sent the same event again, under a new message id.
			p.messages = append(p.messages, plannedMessage{uuid: newUUID(ids), event: ev, publishedAt: at, attempt: 2})
			p.retries++
		}
	}
	for i := range cfg.Events {
		add(i, false)
	}
	for i := range cfg.StaleEvents {
		add(i, true)
	}
	return p
}

// newUUID draws a version 4 UUID from rng.
func newUUID(rng *rand.Rand) string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rng.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rng.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func (m plannedMessage) message() (*message.Message, error) {
	payload, err := json.Marshal(m.event)
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(m.uuid, payload)
	msg.Metadata.Set(metaPublishedAt, m.publishedAt.UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(metaCustomerID, m.event.CustomerID)
	msg.Metadata.Set(metaAttempt, strconv.Itoa(m.attempt))
	return msg, nil
}

// publishAll publishes the plan. A message whose publish fails is sent
// again under a new message id, as a real producer would: the broker may
// have stored it anyway, which is one more duplicate for the consumer.
func publishAll(ctx context.Context, prod producer, topic string, p plan, tr *tracker) (publishFailures int, err error) {
	publishFailures, err = publishMessages(ctx, prod, topic, p.messages, tr)
	if err == nil {
		tr.producerDone()
	}
	return publishFailures, err
}

// publishMessages publishes msgs, part of a plan, as publishAll does.
func publishMessages(ctx context.Context, prod producer, topic string, msgs []plannedMessage, tr *tracker) (publishFailures int, err error) {
	const attempts = 5
	for _, pm := range msgs {
		for attempt := 1; ; attempt++ {
			// The tracker waits for the message once the broker has it:
			// only then is its reference known (a Kafka record's offset).
			ref, err := prod.publish(ctx, topic, pm)
			if err == nil {
				tr.expect(ref)
				break
			}
			publishFailures++
			if attempt == attempts || ctx.Err() != nil {
				return publishFailures, fmt.Errorf("publish event %s to %s (%d attempts): %w", pm.event.EventID, topic, attempt, err)
			}
			pm.uuid = watermill.NewUUID()
			select {
			case <-ctx.Done():
				return publishFailures, ctx.Err()
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
			}
		}
	}
	return publishFailures, nil
}

// Injected faults. They are errors the router logs at debug level only.
var (
	errInjected        = errors.New("injected fault")
	errInjectedFailure = fmt.Errorf("%w: transient failure before the side effect", errInjected)
	errInjectedCrash   = fmt.Errorf("%w: consumer crashed after the side effect, before the record was done", errInjected)
	errInjectedLostAck = fmt.Errorf("%w: ack lost after the message was handled", errInjected)
)

// faults injects the redeliveries of the scenario, chosen by a hash of the
// seed and an id, so that neither concurrency nor the run id changes what
// is hit. A failure and a crash hit an event (its event_id) at most once,
// at the handler's first run for it, whichever of the event's messages
// (the original or a producer retry) claims it first; a lost ack hits a
// message (its id) at most once:
//
//   - failure: the handler's first run fails before its side effect;
//   - crash: the consumer dies after the side effect and before the record
//     is done. In lease mode the claim is abandoned (neither completed nor
//     released, see crashStore), so the redelivery waits for the lease to
//     expire and takes it over: the side effect runs a second time, the
//     bounded duplicate of lease mode. In transactional mode the
//     transaction is never committed: nothing happened;
//   - lost ack: the message was handled and recorded, but the ack never
//     reached the broker, which redelivers it: a duplicate.
type faults struct {
	seed                          uint64
	failRate, crashRate, lostRate float64
	abandon                       func(*stores.Claim) // lease mode's crash, nil otherwise

	mu                        sync.Mutex
	onCount                   func(kind string) // each fault injected, for a consumer process's report; nil: none
	ran                       map[string]bool   // events whose handler already ran once
	acked                     map[string]bool   // messages already considered for a lost ack
	failures, crashes, losses int
}

func newFaults(cfg Config, abandon func(*stores.Claim)) *faults {
	return &faults{
		seed: cfg.Seed, failRate: cfg.FailRate, crashRate: cfg.CrashRate, lostRate: cfg.LostAckRate,
		abandon: abandon,
		ran:     map[string]bool{}, acked: map[string]bool{},
	}
}

func (f *faults) hit(ref, kind string, rate float64) bool {
	if rate <= 0 {
		return false
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%s", f.seed, kind, ref)
	// FNV's high bits are poorly mixed for similar inputs: finish with
	// splitmix64's mixer before taking 53 bits.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11)/(1<<53) < rate
}

// firstRun reports whether the handler runs for ref for the first time.
func (f *faults) firstRun(ref string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ran[ref] {
		return false
	}
	f.ran[ref] = true
	return true
}

// inner wraps the handler, inside the dedup middleware: failures and
// crashes happen while the message is claimed.
func (f *faults) inner(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ev := eventOf(msg)
		first := f.firstRun(ev)
		if first && f.hit(ev, "fail", f.failRate) {
			f.count(&f.failures)
			return nil, errInjectedFailure
		}
		out, err := h(msg)
		if err != nil || !first || !f.hit(ev, "crash", f.crashRate) {
			return out, err
		}
		f.count(&f.crashes)
		if c, ok := middleware.ClaimFromContext(msg.Context()); ok && f.abandon != nil {
			f.abandon(c)
		}
		return nil, errInjectedCrash
	}
}

// eventOf is the event_id of msg's payload, or its messageRef when it has
// none (a bad event: the handler refuses it anyway).
func eventOf(msg *message.Message) string {
	var ev struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(msg.Payload, &ev) == nil && ev.EventID != "" {
		return "event:" + ev.EventID
	}
	return messageRef(msg)
}

// outer wraps the dedup middleware: the ack of a handled message is lost.
func (f *faults) outer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		ref := messageRef(msg)
		f.mu.Lock()
		first := !f.acked[ref]
		f.acked[ref] = true
		f.mu.Unlock()
		if first && f.hit(ref, "lostack", f.lostRate) {
			f.count(&f.losses)
			return nil, errInjectedLostAck
		}
		return out, nil
	}
}

func (f *faults) count(n *int) {
	f.mu.Lock()
	*n++
	onCount := f.onCount
	f.mu.Unlock()
	if onCount != nil {
		switch n {
		case &f.failures:
			onCount(faultFailure)
		case &f.crashes:
			onCount(faultCrash)
		case &f.losses:
			onCount(faultLostAck)
		}
	}
}

// The kinds of fault, as a consumer process reports them (processes.go).
const (
	faultFailure = "failure"
	faultCrash   = "crash"
	faultLostAck = "lost-ack"
)

// add counts a fault of kind injected elsewhere: in a consumer process.
func (f *faults) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch kind {
	case faultFailure:
		f.failures++
	case faultCrash:
		f.crashes++
	case faultLostAck:
		f.losses++
	}
}

func (f *faults) counts() (failures, crashes, losses int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures, f.crashes, f.losses
}

// crashStore is the store as seen by a consumer that crashes: the claims it
// abandons are never released (the process is gone), so their records stay
// processing until the lease expires. Everything else passes through.
type crashStore struct {
	stores.Store

	mu        sync.Mutex
	abandoned map[string]bool // claim tokens
}

func newCrashStore(s stores.Store) *crashStore {
	return &crashStore{Store: s, abandoned: map[string]bool{}}
}

func (s *crashStore) abandon(c *stores.Claim) {
	s.mu.Lock()
	s.abandoned[c.Token] = true
	s.mu.Unlock()
}

// Release of an abandoned claim does nothing: a dead process releases
// nothing.
func (s *crashStore) Release(ctx context.Context, c *stores.Claim) error {
	s.mu.Lock()
	dead := s.abandoned[c.Token]
	delete(s.abandoned, c.Token)
	s.mu.Unlock()
	if dead {
		return nil
	}
	return s.Store.Release(ctx, c)
}

// tracker follows every delivery from outside all middlewares: how many
// times each message was delivered, and which were acked. The run is over
// when the producer is done and every message it published was acked.
// Messages are known by messageRef: the UUID, or a foreign Kafka record's
// partition and offset.
type tracker struct {
	mu         sync.Mutex
	deliveries map[string]int  // message id -> deliveries
	acked      map[string]bool // message id -> acked at least once
	expected   map[string]bool // message ids published (or being published)
	pending    int             // expected and not yet acked
	produced   bool
	done       chan struct{}
	closed     bool
	onFirstAck func()
	totalDeliv int
	poisoned   int
	nacks      nackCauses
}

// nackCauses counts the deliveries that ended in a nack, by why: each is
// a redelivery to come.
type nackCauses struct {
	failures, crashes, lostAcks, storeErrors, inProgress, other int
}

func (n *nackCauses) add(err error) { n.addCause(nackCause(err)) }

// Causes of a nack, as a consumer process reports them (processes.go).
const (
	nackFailure    = "failure"
	nackCrash      = "crash"
	nackLostAck    = "lost-ack"
	nackInProgress = "in-progress"
	nackStoreError = "store-error"
	nackOther      = "other"
)

func nackCause(err error) string {
	switch {
	case errors.Is(err, errInjectedFailure):
		return nackFailure
	case errors.Is(err, errInjectedCrash):
		return nackCrash
	case errors.Is(err, errInjectedLostAck):
		return nackLostAck
	case errors.Is(err, dedup.ErrInProgress):
		return nackInProgress
	case errors.Is(err, dedup.ErrStore):
		return nackStoreError
	}
	return nackOther
}

func (n *nackCauses) addCause(cause string) {
	switch cause {
	case nackFailure:
		n.failures++
	case nackCrash:
		n.crashes++
	case nackLostAck:
		n.lostAcks++
	case nackInProgress:
		n.inProgress++
	case nackStoreError:
		n.storeErrors++
	default:
		n.other++
	}
}

// nack counts a nack of cause, in a consumer process.
func (t *tracker) nack(cause string) {
	t.mu.Lock()
	t.nacks.addCause(cause)
	t.mu.Unlock()
}

func newTracker(onFirstAck func()) *tracker {
	return &tracker{
		deliveries: map[string]int{}, acked: map[string]bool{}, expected: map[string]bool{},
		done: make(chan struct{}), onFirstAck: onFirstAck,
	}
}

// expect adds a message the broker accepted, by its reference
// (messageRef). It may have been handled and acked already.
func (t *tracker) expect(ref string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.expected[ref] {
		return
	}
	t.expected[ref] = true
	switch {
	case !t.acked[ref]:
		t.pending++
	case t.onFirstAck != nil:
		t.onFirstAck()
	}
}

func (t *tracker) producerDone() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.produced = true
	t.maybeDone()
}

func (t *tracker) maybeDone() {
	if t.produced && t.pending == 0 && !t.closed {
		t.closed = true
		close(t.done)
	}
}

// middleware is the outermost router middleware.
func (t *tracker) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ref := messageRef(msg)
		t.deliver(ref)
		out, err := h(msg)
		if err != nil {
			t.mu.Lock()
			t.nacks.add(err)
			t.mu.Unlock()
		}
		if err == nil {
			if poisoned(msg) {
				t.poison()
			}
			t.ack(ref)
		}
		return out, err
	}
}

// poisoned reports whether the poison queue published msg (and acked it).
func poisoned(msg *message.Message) bool {
	return msg.Metadata.Get(wmw.ReasonForPoisonedKey) != ""
}

// deliver counts a delivery of the message ref.
func (t *tracker) deliver(ref string) {
	t.mu.Lock()
	t.deliveries[ref]++
	t.totalDeliv++
	t.mu.Unlock()
}

// poison counts a message the poison queue took.
func (t *tracker) poison() {
	t.mu.Lock()
	t.poisoned++
	t.mu.Unlock()
}

func (t *tracker) ack(ref string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.acked[ref] {
		return
	}
	t.acked[ref] = true
	if t.expected[ref] {
		t.pending--
		if t.onFirstAck != nil {
			t.onFirstAck()
		}
	}
	t.maybeDone()
}

// limit bounds how many messages are handled at once, as a consumer's
// worker pool would: gochannel alone hands every published message to its
// own goroutine at once. It sits outside the dedup middleware, so a message
// waiting for a slot holds no claim whose lease could run out.
func limit(n int) message.HandlerMiddleware {
	slots := make(chan struct{}, n)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			select {
			case slots <- struct{}{}:
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
			defer func() { <-slots }()
			return h(msg)
		}
	}
}

// ackedCount is the number of messages acked at least once.
func (t *tracker) ackedCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.acked)
}

// expectedCount is the number of messages published.
func (t *tracker) expectedCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.expected)
}

type deliveryStats struct {
	deliveries, distinct, redelivered, unacked, poisoned int
	nacks                                                nackCauses
}

func (t *tracker) stats() deliveryStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return deliveryStats{
		deliveries:  t.totalDeliv,
		distinct:    len(t.deliveries),
		redelivered: t.totalDeliv - len(t.deliveries),
		unacked:     t.pending,
		poisoned:    t.poisoned,
		nacks:       t.nacks,
	}
}
