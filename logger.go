package dedup

import (
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// slogDefault is the default Policy.Logger: log/slog's default logger as it
// is when each line is logged, so a program that calls slog.SetDefault
// after New still gets the middleware's errors through its own handler.
type slogDefault struct {
	fields watermill.LogFields
}

func (l slogDefault) logger() watermill.LoggerAdapter {
	return watermill.NewSlogLogger(slog.Default()).With(l.fields)
}

func (l slogDefault) Error(msg string, err error, fields watermill.LogFields) {
	l.logger().Error(msg, err, fields)
}

func (l slogDefault) Info(msg string, fields watermill.LogFields) { l.logger().Info(msg, fields) }

func (l slogDefault) Debug(msg string, fields watermill.LogFields) { l.logger().Debug(msg, fields) }

func (l slogDefault) Trace(msg string, fields watermill.LogFields) { l.logger().Trace(msg, fields) }

func (l slogDefault) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return slogDefault{fields: l.fields.Add(fields)}
}

// DefaultLogger returns the default Policy.Logger, for a package that
// logs as the middleware does: log/slog's default logger as it is when
// each line is logged.
func DefaultLogger() watermill.LoggerAdapter { return slogDefault{} }
