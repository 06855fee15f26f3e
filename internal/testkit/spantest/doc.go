// Package spantest records a test's spans in memory with the
// OpenTelemetry SDK, and checks the spans of the dedup claim cycle.
package spantest
