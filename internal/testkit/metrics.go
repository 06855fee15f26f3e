package testkit

import (
	"sync"
	"time"

	"github.com/watermill-dedup/dedup"
)

// Metrics is a dedup.Metrics that counts: outcomes by scope, and store
// calls and their failures by operation. Its zero value is ready to use.
type Metrics struct {
	mu       sync.Mutex
	outcomes map[scoped]int
	ops      map[string]int
	failed   map[string]int
}

type scoped struct {
	scope   string
	outcome dedup.Outcome
}

// Observe counts o in scope.
func (m *Metrics) Observe(scope string, o dedup.Outcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.outcomes == nil {
		m.outcomes = map[scoped]int{}
	}
	m.outcomes[scoped{scope, o}]++
}

// ObserveStore counts a call of op, and its failure when err is not nil.
func (m *Metrics) ObserveStore(_, op string, _ time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ops == nil {
		m.ops, m.failed = map[string]int{}, map[string]int{}
	}
	m.ops[op]++
	if err != nil {
		m.failed[op]++
	}
}

// Outcome returns how many times o was observed, in every scope.
func (m *Metrics) Outcome(o dedup.Outcome) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, c := range m.outcomes {
		if k.outcome == o {
			n += c
		}
	}
	return n
}

// ScopeOutcome returns how many times o was observed in scope.
func (m *Metrics) ScopeOutcome(scope string, o dedup.Outcome) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.outcomes[scoped{scope, o}]
}

// Outcomes returns how many times each outcome was observed, in every
// scope.
func (m *Metrics) Outcomes() map[dedup.Outcome]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[dedup.Outcome]int{}
	for k, c := range m.outcomes {
		out[k.outcome] += c
	}
	return out
}

// Calls returns how many calls of op the store made.
func (m *Metrics) Calls(op string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ops[op]
}

// Failed returns how many calls of op failed.
func (m *Metrics) Failed(op string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed[op]
}
