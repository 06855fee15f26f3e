// Package spantest records a test's spans in memory with the
// OpenTelemetry SDK.
package spantest
