package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/testkit"
)

// e2eBroker is a broker the e2e section drives: a publisher, and a way to
// make a fresh subscriber per run (its own consumer group or queue).
type e2eBroker struct {
	name   string
	pub    message.Publisher
	newSub func(run string) (message.Subscriber, error)
	topic  func(run string) string
	close  func()
}

func openKfake() (*e2eBroker, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(4))
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
	return &e2eBroker{
		name: "kfake",
		pub:  pub,
		newSub: func(run string) (message.Subscriber, error) {
			scfg := kafka.DefaultSaramaSubscriberConfig()
			scfg.Version = sarama.V2_8_0_0
			scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			s, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: "bench-" + run,
				OverwriteSaramaConfig:  scfg,
				InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1},
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

func openRabbit() (*e2eBroker, error) {
	url := testkit.AMQPURL()
	cfg := amqp.NewDurableQueueConfig(url)
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ is not reachable at %s (set AMQP_URL): %w", redactDSN(url), err)
	}
	var subs []message.Subscriber
	var queues []string
	return &e2eBroker{
		name: "rabbitmq",
		pub:  pub,
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

// consumeRate publishes n messages to a fresh topic, then runs a router
// that consumes them (through mw when not nil) and returns messages per
// second from the router's start to the last message handled.
func consumeRate(ctx context.Context, b *e2eBroker, n int, mw message.HandlerMiddleware) (float64, error) {
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
	var handled atomic.Int64
	done := make(chan struct{})
	h := r.AddNoPublisherHandler("bench-"+run, topic, sub, func(*message.Message) error {
		if handled.Add(1) == int64(n) {
			close(done)
		}
		return nil
	})
	if mw != nil {
		h.AddMiddleware(mw)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	<-r.Running()
	start := time.Now()
	select {
	case <-done:
	case err := <-runErr:
		return 0, fmt.Errorf("router stopped: %v", err)
	case <-time.After(5 * time.Minute):
		_ = r.Close()
		return 0, fmt.Errorf("consumed %d of %d messages in 5 minutes", handled.Load(), n)
	}
	rate := float64(n) / time.Since(start).Seconds()
	_ = r.Close()
	<-runErr
	return rate, nil
}

// runE2E measures a router on kfake and on RabbitMQ with and without the
// dedup middleware (redisstore, message id + business key).
func runE2E(ctx context.Context, o *options) ([]result, error) {
	const sec = "e2e"
	opened, cleanup, err := testkit.OpenStore(ctx, testkit.StoreParams{
		Kind:     testkit.StoreRedis,
		Name:     "dedupbench:e2e:" + runID() + ":",
		PoolSize: 64,
		Teardown: true,
		Redis:    redisstore.Config{SkipServerCheck: true},
	})
	if err != nil {
		var u *testkit.UnreachableError
		if errors.As(err, &u) {
			return skipped(sec, err.Error()), nil
		}
		return nil, err
	}
	defer cleanup(context.Background()) //nolint:errcheck
	store, rc := opened.Store, opened.Redis
	// The floor under every store call: one sequential round trip.
	var pings []time.Duration
	for range o.scale(2000, 50) {
		t := time.Now()
		if err := rc.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		pings = append(pings, time.Since(t))
	}
	rs := []result{{sec, "e2e_redis_ping_mean_us", micros(mean(pings)), "us", "one go-redis PING round trip, sequential"}}

	// A diagnostic beside the goal: the same middleware on memstore, a
	// store without a network round trip, shows what the middleware costs
	// the router by itself.
	memOpened, memCleanup, err := testkit.OpenStore(ctx, testkit.StoreParams{Kind: testkit.StoreMemory})
	if err != nil {
		return nil, err
	}
	defer memCleanup(context.Background()) //nolint:errcheck
	mem := memOpened.Store

	lat := &storeLatencies{}
	newMW := func(v e2eVariant) (*middleware.Middleware, error) {
		s := store
		if v.memstore {
			s = mem
		}
		mode := middleware.ModeLease
		if v.async {
			mode = middleware.ModeAsyncComplete
		}
		return middleware.New(middleware.Config{
			Mode:  mode,
			Store: s,
			Key: keyfuncs.All(
				keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
				keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id")),
			),
			Metrics: lat,
		})
	}

	n := o.scale(5000, 5)
	for _, open := range []func() (*e2eBroker, error){openKfake, openRabbit} {
		b, err := open()
		if err != nil {
			rs = append(rs, skipped(sec, err.Error())...)
			continue
		}
		without, err := consumeRate(ctx, b, n, nil)
		if err != nil {
			b.close()
			return rs, fmt.Errorf("%s without dedup: %w", b.name, err)
		}
		rs = append(rs, result{sec, "e2e_" + b.name + "_plain_msgs_per_s", without, "msgs/s", fmt.Sprintf("%d messages, router without dedup", n)})
		for _, v := range e2eVariants {
			name, note := v.name, v.note
			mw, err := newMW(v)
			if err != nil {
				b.close()
				return rs, err
			}
			lat.reset()
			with, err := consumeRate(ctx, b, n, mw.Middleware)
			if cerr := mw.Close(ctx); err == nil {
				err = cerr
			}
			if err != nil {
				b.close()
				return rs, fmt.Errorf("%s %s: %w", b.name, name, err)
			}
			claim, complete := lat.means()
			rs = append(rs,
				result{sec, "e2e_" + b.name + "_" + name + "_msgs_per_s", with, "msgs/s", note},
				result{sec, "e2e_" + b.name + "_" + name + "_vs_plain_ratio", with / without, "x", goalNote(!v.memstore, "goal >= 0.9")},
				result{sec, "e2e_" + b.name + "_" + name + "_claim_mean_us", micros(claim), "us", "mean Claim latency seen by the middleware"},
				result{sec, "e2e_" + b.name + "_" + name + "_complete_mean_us", micros(complete), "us", "mean Complete latency (after the ack with AsyncComplete)"},
			)
		}
		b.close()
	}
	return rs, nil
}

// e2eVariant is one way the router runs with the dedup middleware.
type e2eVariant struct {
	name, note      string
	async, memstore bool
}

var e2eVariants = []e2eVariant{
	{name: "dedup", note: "with dedup (redisstore, id + business key)"},
	{name: "dedup_async", note: "with dedup and AsyncComplete", async: true},
	{name: "dedup_memstore", note: "diagnostic: with dedup on memstore (no store round trip)", memstore: true},
}

// storeLatencies records the middleware's Claim and Complete latencies.
type storeLatencies struct {
	mu               sync.Mutex
	claims, complete []time.Duration
}

func (l *storeLatencies) Observe(string, middleware.Outcome) {}

func (l *storeLatencies) ObserveStore(_, op string, d time.Duration, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch op {
	case middleware.OpClaim:
		l.claims = append(l.claims, d)
	case middleware.OpComplete:
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
