package main

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/keyfuncs/amqpkeys"
)

// What the consumer receives from each producer, through the broker the
// example opens: a foreign message has no Watermill UUID (Kafka) or takes
// it from the broker's own id (the AMQP message_id, the SQL uuid column),
// keeps its publication time where the broker's keyfuncs read it, and is
// keyed by the documented key plus the payment id. The Watermill
// producer's messages keep their keys on the same subscribers (amqpkeys.
// Marshaler is harmless for them).
func TestProducerMessagesAsConsumed(t *testing.T) {
	if testing.Short() {
		t.Skip("opens the brokers")
	}
	for _, tc := range []struct {
		broker, producer string
		needs            func(t *testing.T) func(*Config)
		precision        time.Duration // of the publication time the consumer reads
	}{
		{brokerKafkaEmbedded, producerForeign, nil, time.Millisecond},
		{brokerKafkaEmbedded, producerWatermill, nil, 0},
		{brokerAMQP, producerForeign, func(t *testing.T) func(*Config) {
			u := testkit.RequireAMQP(t)
			return func(c *Config) { c.AMQPURL = u }
		}, time.Second},
		{brokerAMQP, producerWatermill, func(t *testing.T) func(*Config) {
			u := testkit.RequireAMQP(t)
			return func(c *Config) { c.AMQPURL = u }
		}, 0},
		{brokerPostgres, producerForeign, func(t *testing.T) func(*Config) {
			dsn := testkit.RequirePostgres(t)
			return func(c *Config) { c.PostgresDSN = dsn }
		}, 0},
		{brokerMySQL, producerForeign, func(t *testing.T) func(*Config) {
			dsn := testkit.RequireMySQL(t)
			return func(c *Config) { c.MySQLDSN = dsn }
		}, 0},
	} {
		t.Run(tc.broker+"/"+tc.producer, func(t *testing.T) {
			t.Parallel()
			cfg := defaultConfig()
			cfg.Broker, cfg.Producer, cfg.Events, cfg.StaleEvents = tc.broker, tc.producer, 1, 1
			if tc.needs != nil {
				tc.needs(t)(&cfg)
			}
			runID := newTestRunID()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var closers, removers teardown
			t.Cleanup(func() {
				if err := removers.run(context.Background(), 10*time.Second); err != nil {
					t.Errorf("remove: %v", err)
				}
				if err := closers.run(context.Background(), 10*time.Second); err != nil {
					t.Errorf("close: %v", err)
				}
			})
			b, err := openBroker(ctx, cfg, runID, watermill.NopLogger{}, &closers, &removers)
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := b.sub.Subscribe(ctx, b.topic)
			if err != nil {
				t.Fatal(err)
			}
			// The stale event: published before the retention window, so
			// the publication time the consumer reads matters.
			var pm plannedMessage
			for _, m := range makePlan(cfg, runID, time.Now()).messages {
				if m.stale {
					pm = m
				}
			}
			ref, err := b.producer.publish(ctx, b.topic, pm)
			if err != nil {
				t.Fatal(err)
			}

			var msg *message.Message
			select {
			case msg = <-msgs:
			case <-ctx.Done():
				t.Fatal("the published message never arrived")
			}
			msg.Ack()

			key, publishedAt := consumerKeys(cfg)
			wantUUID, wantFirstKey := pm.uuid, "msg:"+pm.uuid
			if tc.producer == producerForeign && isKafkaBroker(tc.broker) {
				wantUUID, wantFirstKey = "", "record:"+pm.event.EventID
			}
			if msg.UUID != wantUUID {
				t.Errorf("UUID = %q, want %q", msg.UUID, wantUUID)
			}
			if got := messageRef(msg); got != ref || got == "" {
				t.Errorf("messageRef = %q, want the producer's %q", got, ref)
			}
			keys, err := key(msg)
			if want := []string{wantFirstKey, "payment:" + pm.event.PaymentID}; err != nil || !slices.Equal(keys, want) {
				t.Errorf("keys = %q, %v; want %q", keys, err, want)
			}
			at, ok := publishedAt(msg)
			if want := pm.publishedAt.Truncate(max(tc.precision, 1)); !ok || !at.Equal(want) {
				t.Errorf("published at %v (%v), want %v", at, ok, want)
			}
			var ev paymentCompleted
			if err := json.Unmarshal(msg.Payload, &ev); err != nil || ev != pm.event {
				t.Errorf("payload %s (%v), want the event %+v", msg.Payload, err, pm.event)
			}
			// The attempt: a Kafka header and SQL metadata are strings; an
			// AMQP integer header was made a string by amqpkeys.Marshaler.
			if got := msg.Metadata.Get(metaAttempt); got != "1" {
				t.Errorf("metadata %s = %q, want 1", metaAttempt, got)
			}
			if tc.producer == producerForeign && tc.broker == brokerAMQP {
				if got := msg.Metadata.Get(amqpkeys.MetadataMessageID); got != pm.uuid {
					t.Errorf("message_id property = %q, want %q", got, pm.uuid)
				}
			}
		})
	}
}
