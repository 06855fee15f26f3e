// Package jsguard keeps watermill-nats v2.1.3's JetStream subscriber from
// ending the process when it closes.
//
// That subscriber closes its output channel when it closes, or when its
// Subscribe context ends (a Watermill router's close), while nats.go may
// still be running its callback for messages it fetched: the callback's
// send on the closed channel panics (`panic: send on closed channel` in
// jetstream.(*Subscriber).handleMsg), in a goroutine of nats.go, where no
// caller can recover it. Wrap the consumer a ResourceInitializer returns
// with [Consumer].
package jsguard

import (
	"runtime"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go/jetstream"
)

// Consumer runs the subscriber's callback under a guard that recovers the
// closed-channel send and leaves that message unacknowledged: JetStream
// delivers it again after AckWait, to whichever consumer runs then. Any
// other panic goes on.
type Consumer struct {
	jetstream.Consumer
	// Logger notes each message left so. Nil logs nothing.
	Logger watermill.LoggerAdapter
}

// Consume implements jetstream.Consumer.
func (g Consumer) Consume(handler jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	return g.Consumer.Consume(func(msg jetstream.Msg) {
		defer func() {
			if r := recover(); r != nil {
				if !SendOnClosedChannel(r) {
					panic(r)
				}
				if g.Logger != nil {
					g.Logger.Info("NATS message arrived as the subscriber closed: left unacknowledged, JetStream delivers it again after AckWait",
						watermill.LogFields{"subject": msg.Subject()})
				}
			}
		}()
		handler(msg)
	}, opts...)
}

// SendOnClosedChannel reports whether a recovered value is the runtime's
// panic for a send on a closed channel.
func SendOnClosedChannel(r any) bool {
	err, ok := r.(runtime.Error)
	return ok && err.Error() == "send on closed channel"
}
