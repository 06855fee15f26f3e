package natsstore

// SetAfterWrite makes s call fn after each write of a multi-key Claim,
// Complete, Release or Extend but the last, with the call ("claim",
// "complete", ...) and the write's index in the fixed order.
func (s *Store) SetAfterWrite(fn func(op string, i int)) { s.testAfterWrite = fn }

// RecordKey is the KV key of (scope, key).
func RecordKey(scope, key string) string { return recordKey(scope, key) }

// Subject is the subject (scope, key) is written under.
func (s *Store) Subject(scope, key string) string { return s.records(scope, []string{key})[0].subj }

// SetLeaderReads makes s read every bucket from its stream leader, as it
// does a replicated one, instead of by direct gets.
func (s *Store) SetLeaderReads(on bool) {
	for _, sh := range s.shards {
		sh.leaderReads = on
	}
}

// SetBeforeDelete makes s call fn between Delete's read of the record
// and its write.
func (s *Store) SetBeforeDelete(fn func()) { s.testBeforeDelete = fn }

// ScanBatch is the most messages one pull of an admin scan asks for.
const ScanBatch = scanBatch

// Buckets are the names of the store's buckets.
func (s *Store) Buckets() []string { return s.cfg.Buckets() }
