package batch

// Queued returns how many calls wait in the queue.
func (b *Batcher[Req, Resp]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
