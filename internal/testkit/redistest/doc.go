// Package redistest starts Redis servers, replicated sets and Redis
// Clusters of a test's own (plain, TLS, with ACL users) and taps a
// go-redis client's commands. It imports go-redis and testkit only.
package redistest
