package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/testkit"
)

// e2eBroker is a broker the e2e section drives: a publisher, and a way to
// make a fresh subscriber per run (its own consumer group or queue).
type e2eBroker struct {
	name string // in the RESULT names: kfake1, kfake16, rabbitmq1, ...
	desc string

	// inFlight is how many messages the router has at once: the topic's
	// partitions, or the consumers on the queue (each with a prefetch of
	// one). A message occupies one of them for inFlight ÷ rate.
	inFlight int
	// handlers is how many router handlers subscribe to the topic: one
	// for Kafka (the subscriber runs a goroutine per partition), one per
	// consumer for RabbitMQ (each Subscribe opens a channel and a
	// consumer) and watermill-sql.
	handlers int
	// n is how many messages a run consumes.
	n int
	// cases are what the router is measured with, plain first.
	cases []e2eCase

	pub    message.Publisher
	newSub func(run string) (message.Subscriber, error)
	topic  func(run string) string
	close  func()
}

// sequential says whether the broker hands over one message at a time.
func (b *e2eBroker) sequential() bool { return b.inFlight == 1 }

// openKfake starts an in-process Kafka whose topics have partitions
// partitions, consumed by watermill-kafka's consumer-group subscriber (a
// goroutine per partition, each waiting for its message's ack).
func openKfake(partitions, n int) (*e2eBroker, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions))
	if err != nil {
		return nil, err
	}
	brokers := cluster.ListenAddrs()
	pcfg := kafka.DefaultSaramaSyncPublisherConfig()
	pcfg.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pcfg}, watermill.NopLogger{})
	if err != nil {
		cluster.Close()
		return nil, err
	}
	var subs []message.Subscriber
	cases := sequentialCases
	if partitions > 1 {
		cases = concurrentCases
	}
	return &e2eBroker{
		name:     "kfake" + strconv.Itoa(partitions),
		desc:     fmt.Sprintf("kfake, %d partition(s)", partitions),
		inFlight: partitions,
		handlers: 1,
		n:        n,
		cases:    cases,
		pub:      pub,
		newSub: func(run string) (message.Subscriber, error) {
			scfg := kafka.DefaultSaramaSubscriberConfig()
			scfg.Version = sarama.V2_8_0_0
			scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			s, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: "bench-" + run,
				OverwriteSaramaConfig:  scfg,
				InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1},
			}, watermill.NopLogger{})
			if err == nil {
				subs = append(subs, s)
			}
			return s, err
		},
		topic: func(run string) string { return "bench-" + run },
		close: func() {
			for _, s := range subs {
				_ = s.Close()
			}
			_ = pub.Close()
			cluster.Close()
		},
	}, nil
}

// openRabbit returns RabbitMQ with consumers consumers on each run's
// queue: as many router handlers on the topic, each a channel and a
// consumer with watermill-amqp's durable-queue defaults (prefetch 1).
func openRabbit(consumers, n int) (*e2eBroker, error) {
	url := testkit.AMQPURL()
	cfg := amqp.NewDurableQueueConfig(url)
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ is not reachable at %s (set AMQP_URL): %w", redactDSN(url), err)
	}
	var subs []message.Subscriber
	var queues []string
	cases := sequentialCases
	if consumers > 1 {
		cases = concurrentCases
	}
	return &e2eBroker{
		name:     "rabbitmq" + strconv.Itoa(consumers),
		desc:     fmt.Sprintf("RabbitMQ, %d consumer(s), prefetch 1", consumers),
		inFlight: consumers,
		handlers: consumers,
		n:        n,
		cases:    cases,
		pub:      pub,
		newSub: func(string) (message.Subscriber, error) {
			s, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
			if err == nil {
				subs = append(subs, s)
			}
			return s, err
		},
		topic: func(run string) string {
			q := "dedup-bench-" + run
			queues = append(queues, q)
			return q
		},
		close: func() {
			for _, s := range subs {
				_ = s.Close()
			}
			_ = pub.Close()
			if conn, err := amqp091.Dial(url); err == nil {
				if ch, err := conn.Channel(); err == nil {
					for _, q := range queues {
						_, _ = ch.QueueDelete(q, false, false, false)
					}
					_ = ch.Close()
				}
				_ = conn.Close()
			}
		},
	}, nil
}

// openSQLPubSub returns watermill-sql's PostgreSQL pub/sub: one consumer
// group reading a topic table in order, one message at a time.
func openSQLPubSub(ctx context.Context, n int) (*e2eBroker, error) {
	db, err := testkit.OpenDB(ctx, testkit.StoreParams{Kind: testkit.StorePostgres, PoolSize: 4})
	if err != nil {
		return nil, err
	}
	schema := wsql.DefaultPostgreSQLSchema{}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	var subs []*wsql.Subscriber
	var topics []string
	return &e2eBroker{
		name:     "sqlpg",
		desc:     "watermill-sql on PostgreSQL, one consumer group",
		inFlight: 1,
		handlers: 1,
		n:        n,
		cases:    sqlCases,
		pub:      pub,
		newSub: func(run string) (message.Subscriber, error) {
			s, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
				ConsumerGroup:    "bench_" + run,
				SchemaAdapter:    schema,
				OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
				InitializeSchema: true,
				PollInterval:     10 * time.Millisecond,
			}, watermill.NopLogger{})
			if err == nil {
				subs = append(subs, s)
			}
			return s, err
		},
		topic: func(run string) string {
			t := "dedup_bench_" + run
			topics = append(topics, t)
			return t
		},
		close: func() {
			for _, s := range subs {
				_ = s.Close()
			}
			_ = pub.Close()
			for _, t := range topics {
				dropTable(db, `"watermill_`+t+`"`)
				dropTable(db, `"watermill_offsets_`+t+`"`)
			}
			_ = db.Close()
		},
	}, nil
}

func dropTable(db *sql.DB, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table)
}

// e2eRun is what one run measured.
type e2eRun struct {
	rate            float64 // messages per second, first handled to last
	claim, complete time.Duration
}

// consumeRate publishes b.n messages to a fresh topic, then runs a router
// that consumes them (through mw when not nil) and returns messages per
// second from the first message handled to the last: the broker's start
// (a consumer group's join, say) is not in it.
func consumeRate(ctx context.Context, b *e2eBroker, mw message.HandlerMiddleware) (float64, error) {
	n := b.n
	run := runID()
	topic := b.topic(run)
	sub, err := b.newSub(run)
	if err != nil {
		return 0, err
	}
	// Subscribe first where the broker needs a queue or group to exist.
	if s, ok := sub.(message.SubscribeInitializer); ok {
		if err := s.SubscribeInitialize(topic); err != nil {
			return 0, err
		}
	}
	for i := 0; i < n; i += 100 {
		batch := make([]*message.Message, 0, 100)
		for j := i; j < min(i+100, n); j++ {
			batch = append(batch, message.NewMessage(run+"-"+strconv.Itoa(j), []byte(`{"payment_id":"P`+strconv.Itoa(j)+`"}`)))
		}
		if err := b.pub.Publish(topic, batch...); err != nil {
			return 0, err
		}
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	if mw != nil {
		r.AddMiddleware(mw)
	}
	var handled atomic.Int64
	var first atomic.Pointer[time.Time]
	done := make(chan struct{})
	for i := range b.handlers {
		r.AddNoPublisherHandler("bench-"+run+"-"+strconv.Itoa(i), topic, sub, func(*message.Message) error {
			switch handled.Add(1) {
			case 1:
				t := time.Now()
				first.Store(&t)
			case int64(n):
				close(done)
			}
			return nil
		})
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	select {
	case <-done:
	case err := <-runErr:
		return 0, fmt.Errorf("router stopped: %v", err)
	case <-time.After(5 * time.Minute):
		_ = r.Close()
		return 0, fmt.Errorf("consumed %d of %d messages in 5 minutes", handled.Load(), n)
	}
	elapsed := time.Duration(0)
	if f := first.Load(); f != nil { // nil only if message 1's handler has not got that far
		elapsed = time.Since(*f)
	}
	rate := float64(n-1) / elapsed.Seconds()
	_ = r.Close()
	<-runErr
	return rate, nil
}

// e2eCase is one way the router runs.
type e2eCase struct {
	name, note string
	store      string // "redis", "postgres", "memory"; "" for none
	async      bool
	// deduplicator runs Watermill's Deduplicator instead of this
	// middleware.
	deduplicator bool
	// diagnostic cases have no goal.
	diagnostic bool
}

var (
	casePlain         = e2eCase{name: "plain", note: "router without dedup"}
	caseRedis         = e2eCase{name: "dedup_redis", note: "ModeLease on redisstore, id + business key", store: "redis"}
	caseAsyncRedis    = e2eCase{name: "dedup_async_redis", note: "ModeAsyncComplete on redisstore", store: "redis", async: true}
	casePostgres      = e2eCase{name: "dedup_postgres", note: "ModeLease on sqlstore PostgreSQL, id + business key", store: "postgres"}
	caseAsyncPostgres = e2eCase{name: "dedup_async_postgres", note: "ModeAsyncComplete on sqlstore PostgreSQL", store: "postgres", async: true}
	caseMemstore      = e2eCase{name: "dedup_memstore", note: "diagnostic: ModeLease on memstore (no round trip)", store: "memory", diagnostic: true}
	caseDeduplicator  = e2eCase{name: "watermill_deduplicator", note: "Watermill's Deduplicator (in-process map, message id)", deduplicator: true, diagnostic: true}

	// e2eBrokerNames are the brokers in the order they run.
	e2eBrokerNames = []string{"kfake1", "kfake16", "rabbitmq1", "rabbitmq16", "sqlpg"}

	sequentialCases = []e2eCase{casePlain, caseRedis, caseAsyncRedis, caseMemstore, caseDeduplicator}
	concurrentCases = []e2eCase{casePlain, caseRedis, caseAsyncRedis, casePostgres, caseAsyncPostgres, caseMemstore, caseDeduplicator}
	sqlCases        = []e2eCase{casePlain, caseRedis, caseAsyncRedis}
)

func e2eCaseNames() []string {
	var names []string
	for _, c := range concurrentCases[1:] {
		names = append(names, c.name)
	}
	return names
}

// e2eStores are the stores the cases run on, opened once for the section.
type e2eStores struct {
	byName  map[string]stores.Store
	missing map[string]string // why a store could not be opened
	redis   *testkit.OpenedStore
}

func openE2EStores(ctx context.Context) (*e2eStores, func(), error) {
	s := &e2eStores{byName: map[string]stores.Store{}, missing: map[string]string{}}
	var cleanups []func(context.Context) error
	cleanup := func() {
		for _, c := range slices.Backward(cleanups) {
			_ = c(context.Background())
		}
	}
	for _, p := range []struct {
		name   string
		params testkit.StoreParams
	}{
		{"memory", testkit.StoreParams{Kind: testkit.StoreMemory}},
		{"redis", testkit.StoreParams{
			Kind:     testkit.StoreRedis,
			Name:     "dedupbench:e2e:" + runID() + ":",
			PoolSize: 64,
			Teardown: true,
			Redis:    redisstore.Config{SkipServerCheck: true},
		}},
		{"postgres", testkit.StoreParams{
			Kind:         testkit.StorePostgres,
			Name:         "dedup_bench_e2e_" + runID(),
			PoolSize:     16,
			CreateSchema: true,
			Teardown:     true,
		}},
	} {
		o, c, err := testkit.OpenStore(ctx, p.params)
		if err != nil {
			var u *testkit.UnreachableError
			if errors.As(err, &u) {
				s.missing[p.name] = err.Error()
				continue
			}
			cleanup()
			return nil, nil, err
		}
		cleanups = append(cleanups, c)
		s.byName[p.name] = o.Store
		if p.name == "redis" {
			s.redis = o
		}
	}
	return s, cleanup, nil
}

// runE2E measures a router on each broker without dedup and with each
// case, side by side in alternating rounds: a sequential Kafka partition
// and RabbitMQ consumer, 16 partitions and 16 consumers, and watermill-sql
// on PostgreSQL.
func runE2E(ctx context.Context, o *options) ([]result, error) {
	const sec = "e2e"
	st, cleanup, err := openE2EStores(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	var rs []result
	for _, name := range []string{"redis", "postgres"} {
		if why, ok := st.missing[name]; ok {
			rs = append(rs, skipped(sec, "the cases on "+name+": "+why)...)
		}
	}
	if st.redis != nil {
		// The floor under every Redis call: one sequential round trip.
		var pings []time.Duration
		for range o.scale(2000, 50) {
			t := time.Now()
			if err := st.redis.Redis.Ping(ctx).Err(); err != nil {
				return nil, err
			}
			pings = append(pings, time.Since(t))
		}
		rs = append(rs, result{sec, "e2e_redis_ping_mean_us", micros(mean(pings)), "us", "one go-redis PING round trip, sequential"})
	}

	rounds := o.scale(3, 3)
	n := o.scale(5000, 5)
	// RabbitMQ acks each message in a round trip of its own: fewer
	// messages, so that its runs take about as long as the others.
	nRabbit := o.scale(3000, 3)
	openers := map[string]func() (*e2eBroker, error){
		"kfake1":     func() (*e2eBroker, error) { return openKfake(1, n) },
		"kfake16":    func() (*e2eBroker, error) { return openKfake(16, n) },
		"rabbitmq1":  func() (*e2eBroker, error) { return openRabbit(1, nRabbit) },
		"rabbitmq16": func() (*e2eBroker, error) { return openRabbit(16, nRabbit) },
		"sqlpg":      func() (*e2eBroker, error) { return openSQLPubSub(ctx, o.scale(1500, 5)) },
	}
	lat := &storeLatencies{}
	for _, name := range e2eBrokerNames {
		if len(o.brokers) > 0 && !o.brokers[name] {
			continue
		}
		b, err := openers[name]()
		if err != nil {
			rs = append(rs, skipped(sec, err.Error())...)
			continue
		}
		start := time.Now()
		brs, err := measureBroker(ctx, b, st, lat, rounds, o)
		b.close()
		rs = append(rs, brs...)
		if err != nil {
			return rs, fmt.Errorf("%s: %w", b.name, err)
		}
		fmt.Fprintf(os.Stderr, "bench: e2e %s done in %s\n", b.name, time.Since(start).Round(time.Millisecond))
	}
	return rs, nil
}

// measureBroker runs every case of b, plain included, once a round, and
// reports the medians of the rates and of the rounds' ratios.
func measureBroker(ctx context.Context, b *e2eBroker, st *e2eStores, lat *storeLatencies, rounds int, o *options) ([]result, error) {
	const sec = "e2e"
	var cases []e2eCase
	for _, c := range b.cases {
		if _, ok := st.missing[c.store]; ok {
			continue
		}
		if c != casePlain && len(o.cases) > 0 && !o.cases[c.name] {
			continue
		}
		cases = append(cases, c)
	}
	// One run unmeasured: the broker's first consumer pays for connections
	// and buffers the others find ready.
	if _, err := consumeRate(ctx, b, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	runs := map[string][]e2eRun{}
	for round := range rounds {
		// Each round starts one case further on, so that no case always
		// runs on a broker just used by the same neighbour.
		for i := range cases {
			c := cases[(round+i)%len(cases)]
			r, err := runCase(ctx, b, c, st, lat)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			runs[c.name] = append(runs[c.name], r)
		}
	}
	plain := runs[casePlain.name]
	// each applies f to the runs of a case round by round.
	each := func(rr []e2eRun, f func(r e2eRun, round int) float64) []float64 {
		xs := make([]float64, len(rr))
		for i, r := range rr {
			xs[i] = f(r, i)
		}
		return xs
	}
	rate := func(r e2eRun, _ int) float64 { return r.rate }
	// perMsg is the time a message occupies its partition or consumer.
	perMsg := func(r e2eRun) time.Duration {
		return time.Duration(float64(b.inFlight) / r.rate * float64(time.Second))
	}
	prefix := "e2e_" + b.name + "_"
	rs := []result{{sec, prefix + "plain_msgs_per_s", median(each(plain, rate)), "msgs/s",
		fmt.Sprintf("%s, %d messages, router without dedup; %s", b.desc, b.n, spread(each(plain, rate)))}}
	for _, c := range cases[1:] {
		rr := runs[c.name]
		ratios := each(rr, func(r e2eRun, i int) float64 { return r.rate / plain[i].rate })
		added := each(rr, func(r e2eRun, i int) float64 { return micros(perMsg(r) - perMsg(plain[i])) })
		rs = append(rs,
			result{sec, prefix + c.name + "_msgs_per_s", median(each(rr, rate)), "msgs/s", c.note},
			result{sec, prefix + c.name + "_vs_plain_ratio", median(ratios), "x",
				goalNote(!b.sequential() && !c.diagnostic, "goal >= 0.9; ") + spread(ratios)},
			result{sec, prefix + c.name + "_added_us", median(added), "us",
				"time added to a message on its partition/consumer; " + spread(added)},
		)
		if c.deduplicator {
			continue
		}
		claims := each(rr, func(r e2eRun, _ int) float64 { return micros(r.claim) })
		rs = append(rs,
			result{sec, prefix + c.name + "_claim_mean_us", median(claims), "us", "mean Claim latency seen by the middleware"},
			result{sec, prefix + c.name + "_complete_mean_us", median(each(rr, func(r e2eRun, _ int) float64 { return micros(r.complete) })), "us",
				"mean Complete latency (after the ack with AsyncComplete)"},
		)
		if c.store == "memory" {
			continue // no round trip to compare with
		}
		over := each(rr, func(r e2eRun, i int) float64 {
			return float64(perMsg(r)-perMsg(plain[i])) / float64(r.claim)
		})
		goal := ""
		if b.sequential() {
			goal = "goal <= 1.1; "
			if !c.async {
				goal = "Claim and Complete on the path: about 2; "
			}
		}
		rs = append(rs, result{sec, prefix + c.name + "_added_over_claim_ratio", median(over), "x", goal + spread(over)})
	}
	// AsyncComplete against ModeLease on the same store, round by round.
	for _, pair := range [][2]e2eCase{{caseRedis, caseAsyncRedis}, {casePostgres, caseAsyncPostgres}} {
		lease, async := runs[pair[0].name], runs[pair[1].name]
		if len(lease) == 0 || len(async) == 0 {
			continue
		}
		ratios := each(async, func(r e2eRun, i int) float64 { return r.rate / lease[i].rate })
		rs = append(rs, result{sec, prefix + "async_vs_lease_" + pair[0].store + "_ratio", median(ratios), "x",
			goalNote(b.sequential(), "goal >= 1.0; ") + spread(ratios)})
	}
	return rs, nil
}

// spread says over how many rounds a median was taken, and its range.
func spread(xs []float64) string {
	if len(xs) == 1 {
		return "1 round"
	}
	return fmt.Sprintf("median of %d rounds (%s to %s)", len(xs), formatValue(slices.Min(xs)), formatValue(slices.Max(xs)))
}

// runCase runs the router on b once as c says.
func runCase(ctx context.Context, b *e2eBroker, c e2eCase, st *e2eStores, lat *storeLatencies) (e2eRun, error) {
	switch {
	case c.store == "" && !c.deduplicator:
		rate, err := consumeRate(ctx, b, nil)
		return e2eRun{rate: rate}, err
	case c.deduplicator:
		// Its cleanup goroutine cannot be stopped (it runs on
		// context.Background()); one is left per run.
		d := &wmw.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
		rate, err := consumeRate(ctx, b, d.Middleware)
		return e2eRun{rate: rate}, err
	}
	mode := dedup.ModeLease
	if c.async {
		mode = dedup.ModeAsyncComplete
	}
	mw, err := middleware.New(middleware.Config{
		Mode:  mode,
		Store: st.byName[c.store],
		Key: keyfuncs.All(
			keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
			keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id")),
		),
		Policy: dedup.Policy{Metrics: lat},
	})
	if err != nil {
		return e2eRun{}, err
	}
	lat.reset()
	rate, err := consumeRate(ctx, b, mw.Middleware)
	// Close waits for the Completes still in flight, so their latencies
	// are counted.
	if cerr := mw.Close(ctx); err == nil {
		err = cerr
	}
	claim, complete := lat.means()
	return e2eRun{rate: rate, claim: claim, complete: complete}, err
}

// storeLatencies records the middleware's Claim and Complete latencies.
type storeLatencies struct {
	mu               sync.Mutex
	claims, complete []time.Duration
}

func (l *storeLatencies) Observe(string, dedup.Outcome) {}

func (l *storeLatencies) ObserveStore(_, op string, d time.Duration, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch op {
	case dedup.OpClaim:
		l.claims = append(l.claims, d)
	case dedup.OpComplete:
		l.complete = append(l.complete, d)
	}
}

func (l *storeLatencies) reset() {
	l.mu.Lock()
	l.claims, l.complete = nil, nil
	l.mu.Unlock()
}

// means returns the mean Claim and Complete latencies: what a sequential
// consumer waits per message.
func (l *storeLatencies) means() (claim, complete time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return mean(l.claims), mean(l.complete)
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}
