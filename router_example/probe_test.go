package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit/base"
)

// garbageServer answers every connection's first bytes with an HTTP
// error and keeps it open: a server, but not the one the client expects.
func garbageServer(t *testing.T) string {
	t.Helper()
	done := make(chan struct{})
	addr := base.Serve(t, func(c net.Conn) {
		var b [64]byte
		if _, err := c.Read(b[:]); err != nil {
			return
		}
		_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		<-done
	})
	t.Cleanup(func() { close(done) }) // runs before Serve's, which waits for the connections
	return addr
}

// TestProbeRefusesAnotherProtocol: an address that answers, but not as
// Kafka or RabbitMQ do, fails the probe at once, saying so; before, any
// first byte passed it and the client library waited out its step (30s),
// reporting "no answer".
func TestProbeRefusesAnotherProtocol(t *testing.T) {
	addr := garbageServer(t)
	for _, c := range []struct {
		service string
		hello   []byte
		answer  func([]byte) bool
	}{
		{"Kafka", kafkaHello(), kafkaAnswer},
		{"RabbitMQ", amqpHello, amqpAnswer},
	} {
		err := probeAnswer(context.Background(), c.service, addr, "-x", c.hello, c.answer)
		var ue *storeopen.UnreachableError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "not as a "+c.service+" server") {
			t.Errorf("%s probe of an HTTP-speaking address: %v, want an UnreachableError saying it is not %s", c.service, err, c.service)
		}
	}
}

// The answers a real server gives pass.
func TestProbeAnswers(t *testing.T) {
	kafka := []byte{0, 0, 0, 10, 0, 0, 0, 1}
	for _, c := range []struct {
		name   string
		answer func([]byte) bool
		b      []byte
		want   bool
	}{
		{"kafka ApiVersions", kafkaAnswer, kafka, true},
		{"kafka other correlation id", kafkaAnswer, []byte{0, 0, 0, 10, 0, 0, 0, 2}, false},
		{"kafka empty size", kafkaAnswer, []byte{0, 0, 0, 0, 0, 0, 0, 1}, false},
		{"kafka short", kafkaAnswer, kafka[:7], false},
		{"http", kafkaAnswer, []byte("HTTP/1.1"), false},
		{"amqp Connection.Start", amqpAnswer, []byte{1, 0, 0}, true},
		{"amqp version mismatch", amqpAnswer, []byte("AMQP\x00\x00\x09\x01"), true},
		{"amqp http", amqpAnswer, []byte("HTTP/1.1"), false},
		{"amqp empty", amqpAnswer, nil, false},
	} {
		if got := c.answer(c.b); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
