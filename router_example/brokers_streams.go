package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/jsguard"
	"github.com/watermill-dedup/dedup/internal/storeopen"
)

// NATS JetStream settings of the example's streams and consumers.
const (
	// natsDuplicates is the streams' Duplicates window: JetStream drops
	// a publish whose Nats-Msg-Id it stored within it.
	natsDuplicates = 2 * time.Minute
	// natsMaxAge is how long a stream keeps a message, acked or not: past
	// it no redelivery can come.
	natsMaxAge = 7 * 24 * time.Hour
	// natsAckWait: a delivery not acked within it (a crashed consumer's)
	// is delivered again, to any member of the group. MaxDeliver is
	// unlimited.
	natsAckWait = 30 * time.Second
	// natsRetryEvery: one message in natsRetryEvery is sent twice under
	// its Nats-Msg-Id, as a client does that retries a publish whose ack
	// it did not get, to show what the stream's dedup catches.
	natsRetryEvery = 20
)

// Redis Streams claim settings: an entry pending (delivered, not acked)
// for redisClaimIdle is claimed by a live member of the group, which looks
// every redisClaimInterval.
const (
	redisClaimIdle     = 30 * time.Second
	redisClaimInterval = 5 * time.Second
)

// natsStreamName is the JetStream stream of a topic: stream names may not
// hold dots, subjects may.
func natsStreamName(topic string) string { return strings.ReplaceAll(topic, ".", "_") }

func natsStreamConfig(topic string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       natsStreamName(topic),
		Subjects:   []string{topic},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: natsDuplicates,
		MaxAge:     natsMaxAge,
	}
}

// openNATS is NATS JetStream through watermill-nats: a stream per topic,
// a durable consumer per group (explicit acks, AckWait natsAckWait,
// unlimited MaxDeliver; a nack is a Nak, redelivered at once), and a
// publisher that sets Nats-Msg-Id to the message UUID, so that the stream
// drops a resend of one message within natsDuplicates: the broker's first
// line of defence against the producer's own publish retries.
func (b *broker) openNATS(ctx context.Context, cfg Config, logger watermill.LoggerAdapter, closers, removers *teardown) error {
	// Without the credentials the URL may carry (a password, a token).
	b.addr = storeopen.RedactNATSURL(cfg.NATSURL)
	// nats.go takes no context: await ends the wait at a signal.
	natsConnect := func(what string) (*nats.Conn, error) {
		return await(ctx, what, func() (*nats.Conn, error) {
			return connect.NATS(ctx, cfg.NATSURL, cfg.NATSAuth)
		}, (*nats.Conn).Close)
	}
	nc, err := natsConnect("connecting to NATS at " + b.addr)
	if err != nil {
		return err
	}
	closers.add("close the NATS connection", func(context.Context) error { nc.Close(); return nil })
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("NATS at %s: JetStream is not available (start nats-server with -js): %w", b.addr, err)
	}
	// Before anything is created or registered for -cleanup: a refused
	// run deletes nothing.
	if err := b.refuseUsedNATSStream(ctx, js); err != nil {
		return err
	}
	pub := &natsPublisher{js: js}
	b.pub = pub
	b.brokerDedup = pub.summary
	// The subscriber's own connection: its Close drains it.
	subConn, err := natsConnect("connecting the NATS subscriber to " + b.addr)
	if err != nil {
		return err
	}
	closers.add("close the NATS subscriber's connection", func(context.Context) error { subConn.Close(); return nil })
	sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{
		Conn:            subConn,
		Logger:          logger,
		AckWaitTimeout:  natsAckWait,
		ConfigureStream: natsStreamConfig,
		ResourceInitializer: func(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
			c, err := js.CreateOrUpdateConsumer(ctx, natsStreamName(topic), jetstream.ConsumerConfig{
				Durable:       b.group,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       natsAckWait,
				MaxDeliver:    -1,
				DeliverPolicy: jetstream.DeliverAllPolicy,
			})
			if err != nil {
				return nil, nil, err
			}
			return jsguard.Consumer{Consumer: c, Logger: logger}, nil, nil // the group outlives the subscriber: -cleanup deletes it
		},
	})
	if err != nil {
		return fmt.Errorf("NATS at %s: %w", b.addr, err)
	}
	closers.add("close the NATS subscriber", func(context.Context) error { return sub.Close() })
	b.sub = sub
	removers.add("delete JetStream streams "+natsStreamName(b.topic)+", "+natsStreamName(b.poisonTopic)+" (and their consumers)", func(ctx context.Context) error {
		nc, err := connect.NATS(ctx, cfg.NATSURL, cfg.NATSAuth)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		var errs []error
		for _, t := range []string{b.topic, b.poisonTopic} {
			if err := js.DeleteStream(ctx, natsStreamName(t)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				errs = append(errs, fmt.Errorf("delete stream %s: %w", natsStreamName(t), err))
			}
		}
		return errors.Join(errs...)
	})
	return nil
}

// refuseUsedNATSStream fails with a *runIDUsedError when the run's stream
// was published to: an earlier run of that id left its messages there.
// This run's would repeat their Nats-Msg-Ids (-seed makes the same message
// ids), and the stream would drop them as duplicates for natsDuplicates,
// delivering nothing; and what the earlier run left unacked would be
// delivered in this run.
func (b *broker) refuseUsedNATSStream(ctx context.Context, js jetstream.JetStream) error {
	name := natsStreamName(b.topic)
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for the stream of an earlier run with -run-id %s on NATS at %s: %w", b.runID, b.addr, err)
	}
	st := s.CachedInfo().State
	if st.LastSeq == 0 {
		return nil // made, never published to: nothing of an earlier run in it
	}
	// This run's message ids repeat that run's (-seed): the stream would
	// drop them as duplicates (within its Duplicates window,
	// natsDuplicates) and deliver what that run left unacked.
	return &runIDUsedError{RunID: b.runID, What: fmt.Sprintf("the JetStream stream %s at %s holds its %d messages", name, b.addr, st.LastSeq)}
}

// natsPublisher publishes as watermill-nats does (the UUID and metadata
// in headers), with the Nats-Msg-Id header set to the UUID, and waits for
// the stream's ack. One message in natsRetryEvery it sends twice, as a
// client retrying a publish whose ack was lost; it counts what the stream
// dropped as duplicates.
type natsPublisher struct {
	js      jetstream.JetStream
	retried atomic.Int64 // same-id resends
	dropped atomic.Int64 // publishes the stream dropped as duplicates
}

func (p *natsPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		nm, err := (&wmnats.NATSMarshaler{}).Marshal(topic, m)
		if err != nil {
			return err
		}
		nm.Header.Set(nats.MsgIdHdr, m.UUID)
		sends := 1
		if retryPublish(m.UUID) {
			sends = 2
			p.retried.Add(1)
		}
		for range sends {
			ack, err := p.js.PublishMsg(m.Context(), nm)
			if err != nil {
				return fmt.Errorf("publish %s to %s: %w", m.UUID, topic, err)
			}
			if ack.Duplicate {
				p.dropped.Add(1)
			}
		}
	}
	return nil
}

func (p *natsPublisher) Close() error { return nil } // the connection is closed by the broker's closers

// retryPublish picks the messages natsPublisher sends twice: a fixed
// share of UUIDs, so a -seed reproduces them.
func retryPublish(uuid string) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uuid))
	return h.Sum32()%natsRetryEvery == 0
}

func (p *natsPublisher) summary() string {
	return fmt.Sprintf("JetStream publish dedup (Nats-Msg-Id, %s window) dropped %d of %d same-id publish retries; "+
		"it cannot catch redeliveries (nacks, lost acks, a crashed consumer's messages after AckWait) "+
		"nor republishes under a new message id: the middleware does",
		natsDuplicates, p.dropped.Load(), p.retried.Load())
}

// openRedisStreams is Redis Streams through watermill-redisstream: a
// stream per topic and a consumer group (XREADGROUP); a nack resends the
// entry to the same consumer, and an entry left pending for
// redisClaimIdle (a crashed consumer's) is claimed by a live member. The
// publisher and the subscriber each have a client of their own, which
// their Close closes.
func (b *broker) openRedisStreams(ctx context.Context, cfg Config, logger watermill.LoggerAdapter, closers, removers *teardown) error {
	// The server must answer first, as for the Redis store: the
	// subscriber would otherwise retry its reads until the run's
	// -timeout, saying nothing. admin, the client that asked, deletes
	// the streams under -cleanup.
	admin, target, err := openRedis(ctx, cfg)
	if err != nil {
		return err
	}
	closers.add("close the Redis Streams admin client", func(context.Context) error { return admin.Close() })
	b.addr = target.Display
	// Before anything is created or registered for -cleanup: a refused
	// run deletes nothing.
	if err := b.refuseUsedRedisStream(ctx, admin); err != nil {
		return err
	}
	client := func() *redis.Client { return redis.NewClient(target.Options()) }
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client()}, logger)
	if err != nil {
		return err
	}
	closers.add("close the Redis Streams publisher", func(context.Context) error { return pub.Close() })
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        client(),
		ConsumerGroup:                 b.group,
		NackResendSleep:               50 * time.Millisecond,
		ClaimInterval:                 redisClaimInterval,
		MaxIdleTime:                   redisClaimIdle,
		OldestId:                      "0",
		DisableIndefiniteInitialBlock: true,
		ShouldStopOnReadErrors: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
		},
	}, logger)
	if err != nil {
		return err
	}
	closers.add("close the Redis Streams subscriber", func(context.Context) error { return sub.Close() })
	b.pub, b.sub = pub, sub
	removers.add("delete Redis streams "+b.topic+", "+b.poisonTopic+" (and their groups)", func(ctx context.Context) error {
		return admin.Del(ctx, b.topic, b.poisonTopic).Err()
	})
	return nil
}

// refuseUsedRedisStream fails with a *runIDUsedError when the run's
// stream holds entries: an earlier run of that id left them there. Those
// its consumer group had not read or acked would be delivered in this
// run, among this run's messages of the same ids (-seed), and -cleanup
// would delete that run's stream.
func (b *broker) refuseUsedRedisStream(ctx context.Context, admin redis.UniversalClient) error {
	n, err := admin.XLen(ctx, b.topic).Result()
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE") {
		// A key of another kind, no earlier run's stream: the subscriber
		// fails on it, and the run reports why the router did not start.
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for the stream of an earlier run with -run-id %s in the Redis at %s: %w", b.runID, b.addr, err)
	}
	if n == 0 {
		return nil // no stream, or an empty one: nothing of an earlier run
	}
	// What that run left unread or unacked would be delivered in this
	// one, among this run's messages of the same ids (-seed).
	return &runIDUsedError{RunID: b.runID, What: fmt.Sprintf("the Redis stream %s at %s holds its %d entries", b.topic, b.addr, n)}
}
