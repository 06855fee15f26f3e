package batch

// State returns the batcher's counters and whether the linger timer is
// armed (timerAt set).
func (b *Batcher[Req, Resp]) State() (inFlight, eager int, starting, timerArmed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inFlight, b.eager, b.starting, !b.timerAt.IsZero()
}
