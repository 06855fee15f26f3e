package acceptance_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
)

// Claim settings of every Redis Streams subscriber: an entry pending
// (delivered, not acked) for redisClaimIdle is claimed (XCLAIM) by
// whichever member of the group looks first; they look every
// redisClaimInterval. That is how a closed or killed consumer's entries
// reach the rest of the group, and also what a handler slower than
// redisClaimIdle sees: its entry delivered a second time, which the
// middleware drops or holds as in progress.
const (
	redisClaimIdle     = 3 * time.Second
	redisClaimInterval = 500 * time.Millisecond
)

// Fields of the native producer's entries (see redisProducer).
const (
	redisIDField     = "message_id"
	redisSentAtField = "sent_at"
)

// redisStreams is Redis Streams through watermill-redisstream: a stream
// per topic (the key is the topic, unique to the scenario, deleted at
// its end) and a consumer group per group (XREADGROUP, one entry at a
// time), whose members compete. A nack resends the entry to the same
// member after NackResendSleep (it stays pending meanwhile); an entry
// pending longer than redisClaimIdle (a closed or killed member's) is
// claimed by another member. The stream lives on the Redis of the redis
// stores, so the outage scenario cuts both.
func redisStreams() acceptance.Backend {
	client := func(env acceptance.Env) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: env[acceptance.EnvAddr], DialTimeout: time.Second})
	}
	admin := func(env acceptance.Env, f func(context.Context, *redis.Client) error) error {
		c := client(env)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return f(ctx, c)
	}
	newSubscriber := func(env acceptance.Env, group string, u redisstream.Unmarshaller) (message.Subscriber, error) {
		return redisstream.NewSubscriber(redisstream.SubscriberConfig{
			// Its own client: Close closes it.
			Client:          client(env),
			Unmarshaller:    u,
			Consumer:        group + "_" + watermill.NewShortUUID(),
			ConsumerGroup:   group,
			NackResendSleep: 20 * time.Millisecond,
			BlockTime:       100 * time.Millisecond,
			ClaimInterval:   redisClaimInterval,
			MaxIdleTime:     redisClaimIdle,
			OldestId:        "0",
			// Block for BlockTime from the first read on: a read
			// blocked for ever would outlive Close.
			DisableIndefiniteInitialBlock: true,
			// Stop reading once the subscriber is closing (its context
			// cancelled, its client closed) rather than retrying after a
			// pause; keep reading through any other error (an outage).
			ShouldStopOnReadErrors: func(err error) bool {
				return errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
			},
		}, testLogger())
	}
	return acceptance.Backend{
		Name: "redis-streams",
		Features: acceptance.Features{
			ConsumerGroups: true,
			Persistent:     true,
			Restartable:    true,
			// Not Ordered: a claimed entry comes back after later ones,
			// and the members of a group interleave. No shards: a
			// stream is read as a whole.
		},
		Setup: func(t *testing.T) (acceptance.Env, error) {
			return acceptance.Env{acceptance.EnvAddr: testkit.RequireRedis(t)}, nil
		},
		CreateTopic: func(t *testing.T, env acceptance.Env, topic string) error {
			// The subscribers create the stream and their groups
			// (XGROUP CREATE MKSTREAM); deleting the key deletes both.
			t.Cleanup(func() {
				err := admin(env, func(ctx context.Context, c *redis.Client) error {
					return c.Del(ctx, topic).Err()
				})
				if err != nil {
					t.Logf("redis-streams cleanup: delete stream %s: %v", topic, err)
				}
			})
			return nil
		},
		NewPublisher: func(_ testing.TB, env acceptance.Env) (message.Publisher, error) {
			return redisstream.NewPublisher(redisstream.PublisherConfig{Client: client(env)}, testLogger())
		},
		NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
			return newSubscriber(env, group, nil)
		},
		RemoveGroup: func(_ testing.TB, env acceptance.Env, topic, group string) error {
			return admin(env, func(ctx context.Context, c *redis.Client) error {
				n, err := c.Exists(ctx, topic).Result()
				if err != nil || n == 0 {
					return err
				}
				return c.XGroupDestroy(ctx, topic, group).Err()
			})
		},
		Deadline: &acceptance.Deadline{Name: fmt.Sprintf("Redis Streams claim idle time %s (a member XCLAIMs the pending entry)", redisClaimIdle)},
		Native: &acceptance.Native{
			Client:       "go-redis XADD",
			NewPublisher: newRedisProducer,
			NewSubscriber: func(_ testing.TB, env acceptance.Env, group string) (message.Subscriber, error) {
				return newSubscriber(env, group, redisUnmarshaller{})
			},
			// redisUnmarshaller: the message_id field becomes the UUID of
			// an entry without a Watermill UUID. No CopyKey: the
			// subscriber hands the unmarshaller the fields, not the
			// entry id.
			Key:         keyfuncs.MessageID(),
			KeyName:     "keyfuncs.MessageID() (message_id field)",
			OtherKeys:   map[string]keyfuncs.KeyFunc{`keyfuncs.Metadata("` + redisIDField + `")`: keyfuncs.Metadata(redisIDField)},
			PublishedAt: middleware.MetadataTime(redisSentAtField),
		},
	}
}

// redisProducer is a producer that is not Watermill: go-redis XADD of an
// entry with the fields message_id (its id), payload, content_type and,
// when it has one, sent_at (RFC 3339). No Watermill UUID field.
type redisProducer struct{ c *redis.Client }

func newRedisProducer(_ testing.TB, env acceptance.Env) (acceptance.NativePublisher, error) {
	return redisProducer{redis.NewClient(&redis.Options{Addr: env[acceptance.EnvAddr]})}, nil
}

func (p redisProducer) Publish(topic string, m acceptance.NativeMessage) error {
	values := map[string]any{
		redisIDField:   m.ID,
		"payload":      m.Payload,
		"content_type": "application/json",
	}
	if !m.At.IsZero() {
		values[redisSentAtField] = m.At.Format(time.RFC3339Nano)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.c.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values}).Err()
}

func (p redisProducer) Close() error { return p.c.Close() }

// redisUnmarshaller reads watermill-redisstream's entries as the default
// unmarshaller does, and other producers' entries (no Watermill UUID
// field) with the message_id field as UUID and every field but the
// payload as metadata.
type redisUnmarshaller struct{}

func (redisUnmarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	if _, ok := values[redisstream.UUIDHeaderKey]; ok {
		return redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(values)
	}
	id, ok := values[redisIDField].(string)
	if !ok || id == "" {
		return nil, fmt.Errorf("entry without %s or a Watermill UUID", redisIDField)
	}
	payload, _ := values["payload"].(string)
	msg := message.NewMessage(id, []byte(payload))
	for k, v := range values {
		if s, ok := v.(string); ok && k != "payload" {
			msg.Metadata.Set(k, s)
		}
	}
	return msg, nil
}
