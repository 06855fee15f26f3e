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
