package acceptance_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-dedup/dedup/acceptance"
)

// RabbitMQ's consumer timeout, for the subscriber-deadline scenario.
//
// When a consumer holds a delivery unacked longer than its consumer
// timeout, RabbitMQ closes the consumer's channel with
// PRECONDITION_FAILED and requeues what the channel held unacked: the
// message goes to another consumer while the first one's handler still
// runs. RabbitMQ 3.12 and later take the timeout per queue (the
// x-consumer-timeout argument). Earlier servers have only the
// server-wide consumer_timeout of rabbitmq.conf (30 minutes by default),
// which is not the suite's to change on a shared server, and ignore the
// argument. There the scenario makes the broker do what the timeout does,
// the way the broker does it: the consumers' connections go through a
// test-owned proxy that reads the AMQP frames, and expire injects, on
// every channel the broker delivered on, an acknowledgement of a delivery
// tag the broker never issued. The broker answers it as it answers a
// timed-out consumer: it closes that channel with PRECONDITION_FAILED and
// requeues its unacked deliveries. The connection stays up, as it does
// when the timeout passes (cutting it instead would also make
// watermill-amqp reconnect, whose reconnect has a data race of its own:
// ConnectionWrapper.connected is written by handleConnectionClose and read
// by IsConnected without synchronisation, in v2.1.3 and v3.0.2).

// envConsumerTimeout is the Env key of the x-consumer-timeout, in
// milliseconds, of the queues the subscribers declare (see amqpDeadline).
const envConsumerTimeout = "consumer_timeout_ms"

// amqpConsumerTimeout is the consumer timeout of the subscriber-deadline
// scenario's queues, on a server that has one per queue.
const amqpConsumerTimeout = 2 * time.Second

func consumerTimeoutOf(env acceptance.Env) time.Duration {
	ms, _ := strconv.Atoi(env[envConsumerTimeout])
	return time.Duration(ms) * time.Millisecond
}

// amqpDeadline prepares RabbitMQ's consumer timeout (see above).
func amqpDeadline(t *testing.T, env acceptance.Env) (acceptance.Env, string, func(), error) {
	version, err := amqpServerVersion(env["url"])
	if err != nil {
		return nil, "", nil, err
	}
	if amqpVersionAtLeast(version, 3, 12) {
		e := env.Clone()
		e[envConsumerTimeout] = strconv.FormatInt(amqpConsumerTimeout.Milliseconds(), 10)
		return e, fmt.Sprintf("RabbitMQ %s consumer timeout %s (x-consumer-timeout on the queue): the broker closes the channel with PRECONDITION_FAILED and requeues", version, amqpConsumerTimeout), nil, nil
	}
	u, err := url.Parse(env["url"])
	if err != nil {
		return nil, "", nil, err
	}
	p, err := newAMQPChannelCloser(u.Host)
	if err != nil {
		return nil, "", nil, err
	}
	t.Cleanup(p.close)
	u.Host = p.addr()
	e := env.Clone()
	e["url"] = u.String()
	name := fmt.Sprintf("RabbitMQ %s: no consumer timeout per queue (x-consumer-timeout needs 3.12), the server-wide one not the suite's to change; "+
		"the broker made to close the holding consumer's channel (PRECONDITION_FAILED) and requeue, as when it passes, by an ack of an unknown delivery tag a test-owned proxy injects", version)
	return e, name, p.expire, nil
}

// amqpServerVersion is the version the server announces ("3.10.8").
func amqpServerVersion(url string) (string, error) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	v, _ := conn.Properties["version"].(string)
	if v == "" {
		return "", errors.New("rabbitmq: the server announced no version")
	}
	return v, nil
}

// amqpVersionAtLeast reports whether version is major.minor or later.
func amqpVersionAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// AMQP 0-9-1 framing: a frame is type (1 byte), channel (2), payload size
// (4), the payload, and frameEnd. A method frame's payload starts with
// its class and method ids (2 bytes each), then its arguments: for
// basic.ack and basic.nack a delivery tag (8) and bits (multiple first),
// for basic.reject a delivery tag and the requeue bit.
const (
	amqpFrameMethod  = 1
	amqpFrameEnd     = 0xCE
	amqpClassChannel = 20
	amqpChannelClose = 40
	amqpCloseOK      = 41
	amqpClassBasic   = 60
	amqpBasicDeliver = 60
	amqpBasicAck     = 80
	amqpBasicReject  = 90
	amqpBasicNack    = 120
	// amqpUnknownTag is a delivery tag no channel reaches.
	amqpUnknownTag = 1 << 62
)

// amqpChannelCloser is a TCP proxy in front of RabbitMQ that forwards
// whole AMQP frames both ways and counts, per channel of each connection,
// the deliveries the broker made that the client has not acked, nacked
// or rejected yet; expire makes the broker close the channels that hold
// some (see above).
type amqpChannelCloser struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[*amqpProxyConn]struct{}
}

type amqpProxyConn struct {
	client, server net.Conn
	// wmu is held while a whole frame goes to the server, forwarded or
	// injected, and while the client's frame updates unacked: an
	// injection sees the channels as the server will when it reads it.
	wmu sync.Mutex

	mu      sync.Mutex
	unacked map[uint16]int  // open channel -> deliveries not settled by the client
	expired map[uint16]bool // channels expire made the broker close (until it did)
}

func newAMQPChannelCloser(target string) (*amqpChannelCloser, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &amqpChannelCloser{target: target, ln: ln, conns: map[*amqpProxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *amqpChannelCloser) addr() string { return p.ln.Addr().String() }

func (p *amqpChannelCloser) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.client.Close()
		_ = c.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *amqpChannelCloser) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &amqpProxyConn{client: client, server: server, unacked: map[uint16]int{}, expired: map[uint16]bool{}}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			c.toServer()
			p.drop(c)
		}()
		go func() {
			defer p.wg.Done()
			c.toClient()
			p.drop(c)
		}()
	}
}

func (p *amqpChannelCloser) drop(c *amqpProxyConn) {
	_ = c.client.Close()
	_ = c.server.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// expire acks an unknown delivery tag on every channel holding an
// unsettled delivery: the broker closes each with PRECONDITION_FAILED
// and requeues what it held.
func (p *amqpChannelCloser) expire() {
	p.mu.Lock()
	conns := make([]*amqpProxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.wmu.Lock()
		c.mu.Lock()
		var channels []uint16
		for ch, n := range c.unacked {
			if n > 0 && !c.expired[ch] {
				channels = append(channels, ch)
				c.expired[ch] = true
			}
		}
		c.mu.Unlock()
		for _, ch := range channels {
			args := make([]byte, 9) // delivery tag, bits: not multiple
			binary.BigEndian.PutUint64(args, amqpUnknownTag)
			_, _ = c.server.Write(amqpMethodFrame(ch, amqpClassBasic, amqpBasicAck, args))
		}
		c.wmu.Unlock()
	}
}

func amqpMethodFrame(channel, class, method uint16, args []byte) []byte {
	frame := make([]byte, 0, 7+4+len(args)+1)
	frame = append(frame, amqpFrameMethod)
	frame = binary.BigEndian.AppendUint16(frame, channel)
	frame = binary.BigEndian.AppendUint32(frame, uint32(4+len(args)))
	frame = binary.BigEndian.AppendUint16(frame, class)
	frame = binary.BigEndian.AppendUint16(frame, method)
	frame = append(frame, args...)
	return append(frame, amqpFrameEnd)
}

// readFrame reads one whole frame.
func readFrame(r io.Reader) ([]byte, error) {
	head := make([]byte, 7)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	frame := make([]byte, 7+int(binary.BigEndian.Uint32(head[3:]))+1)
	copy(frame, head)
	_, err := io.ReadFull(r, frame[7:])
	return frame, err
}

// method returns the channel, class and method ids and the arguments of
// a method frame (ok false for another kind of frame).
func method(frame []byte) (channel, class, method uint16, args []byte, ok bool) {
	if frame[0] != amqpFrameMethod || len(frame) < 7+4+1 {
		return 0, 0, 0, nil, false
	}
	return binary.BigEndian.Uint16(frame[1:]), binary.BigEndian.Uint16(frame[7:]), binary.BigEndian.Uint16(frame[9:]), frame[11 : len(frame)-1], true
}

// toServer forwards the client's protocol header and frames, settling
// the deliveries it acks, nacks or rejects and forgetting the channels
// it closes.
func (c *amqpProxyConn) toServer() {
	header := make([]byte, 8) // "AMQP" and the version
	if _, err := io.ReadFull(c.client, header); err != nil {
		return
	}
	if _, err := c.server.Write(header); err != nil {
		return
	}
	for {
		frame, err := readFrame(c.client)
		if err != nil {
			return
		}
		c.wmu.Lock()
		if ch, class, m, args, ok := method(frame); ok {
			c.mu.Lock()
			switch {
			case class == amqpClassBasic && (m == amqpBasicAck || m == amqpBasicNack) && len(args) >= 9 && args[8]&1 == 1:
				c.unacked[ch] = 0 // multiple: every delivery up to the tag (the suite's subscribers settle one at a time)
			case class == amqpClassBasic && (m == amqpBasicAck || m == amqpBasicNack || m == amqpBasicReject):
				if c.unacked[ch] > 0 {
					c.unacked[ch]--
				}
			case class == amqpClassChannel && (m == amqpChannelClose || m == amqpCloseOK):
				delete(c.unacked, ch)
				delete(c.expired, ch)
			}
			c.mu.Unlock()
		}
		_, err = c.server.Write(frame)
		c.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// toClient forwards the broker's frames, counting its deliveries and
// forgetting the channels it closes.
func (c *amqpProxyConn) toClient() {
	for {
		frame, err := readFrame(c.server)
		if err != nil {
			return
		}
		if ch, class, m, _, ok := method(frame); ok {
			c.mu.Lock()
			switch {
			case class == amqpClassBasic && m == amqpBasicDeliver:
				c.unacked[ch]++
			case class == amqpClassChannel && (m == amqpChannelClose || m == amqpCloseOK):
				delete(c.unacked, ch)
				delete(c.expired, ch)
			}
			c.mu.Unlock()
		}
		if _, err := c.client.Write(frame); err != nil {
			return
		}
	}
}
