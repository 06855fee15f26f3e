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
