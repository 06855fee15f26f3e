package acceptance

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// maxReported bounds the problems an assertion lists.
const maxReported = 10

// CountEffects returns the number of effects per event.
func CountEffects(effects []string) map[string]int { return countEffects(effects) }

func countEffects(effects []string) map[string]int {
	counts := make(map[string]int, len(effects))
	for _, e := range effects {
		counts[e]++
	}
	return counts
}

// AssertEffects checks that every event of want has exactly want[event]
// effects and that no other event has any. It reports lost, doubled and
// unexpected events, at most ten of each kind, and returns whether the
// check held.
func AssertEffects(t testing.TB, effects []string, want map[string]int) bool {
	t.Helper()
	got := countEffects(effects)
	var lost, wrong, unexpected []string
	for ev, n := range want {
		switch g := got[ev]; {
		case g == 0 && n > 0:
			lost = append(lost, ev)
		case g != n:
			wrong = append(wrong, fmt.Sprintf("%s: %d effects, want %d", ev, g, n))
		}
	}
	for ev, n := range got {
		if _, ok := want[ev]; !ok {
			unexpected = append(unexpected, fmt.Sprintf("%s (%d)", ev, n))
		}
	}
	if len(lost)+len(wrong)+len(unexpected) == 0 {
		return true
	}
	t.Errorf("effects: %d events lost (no effect), %d with a wrong count, %d unexpected; %d effects for %d expected events\n  lost: %s\n  wrong count: %s\n  unexpected: %s",
		len(lost), len(wrong), len(unexpected), len(effects), len(want), first(lost), first(wrong), first(unexpected))
	return false
}

// AssertExactlyOnce checks the invariant of every scenario: each event has
// exactly one effect, none is lost and none is doubled, and nothing else
// has an effect.
func AssertExactlyOnce(t testing.TB, effects []string, events []string) bool {
	t.Helper()
	want := make(map[string]int, len(events))
	for _, e := range events {
		want[e] = 1
	}
	return AssertEffects(t, effects, want)
}

// AssertFirstEffectsInOrder checks that, within each shard, the first
// effects of events appear in the order given (the publish order). It is
// the ordering guarantee of an Ordered backend, which dedup must keep
// (a nack redelivers before the next message of the shard).
func AssertFirstEffectsInOrder(t testing.TB, effects []string, order []string, shardOf func(event string) int) bool {
	t.Helper()
	pos := make(map[string]int, len(order))
	for i, e := range order {
		pos[e] = i
	}
	seen := map[string]bool{}
	last := map[int]string{}
	var bad []string
	for _, e := range effects {
		if seen[e] {
			continue
		}
		seen[e] = true
		if _, ok := pos[e]; !ok {
			continue
		}
		sh := shardOf(e)
		if prev, ok := last[sh]; ok && pos[prev] > pos[e] {
			bad = append(bad, fmt.Sprintf("%s before %s in shard %d", prev, e, sh))
		}
		last[sh] = e
	}
	if len(bad) == 0 {
		return true
	}
	t.Errorf("first effects out of publish order in %d places: %s", len(bad), first(bad))
	return false
}

// AssertBetween checks lo <= got <= hi.
func AssertBetween(t testing.TB, what string, got, lo, hi int) bool {
	t.Helper()
	if got >= lo && got <= hi {
		return true
	}
	t.Errorf("%s = %d, want between %d and %d", what, got, lo, hi)
	return false
}

// AssertAtLeast checks got >= lo.
func AssertAtLeast(t testing.TB, what string, got, lo int) bool {
	t.Helper()
	if got >= lo {
		return true
	}
	t.Errorf("%s = %d, want at least %d", what, got, lo)
	return false
}

// extraEffects is the number of effects beyond one per event.
func extraEffects(effects []string) int {
	extra := 0
	for _, n := range countEffects(effects) {
		extra += n - 1
	}
	return extra
}

func first(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	sort.Strings(items)
	if len(items) > maxReported {
		return strings.Join(items[:maxReported], ", ") + fmt.Sprintf(", ... (%d more)", len(items)-maxReported)
	}
	return strings.Join(items, ", ")
}
