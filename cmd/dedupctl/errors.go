package main

import (
	"errors"
	"fmt"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
)

// The errors a command fails with, and the exit status each means.

// Exit statuses.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
)

// usageError is a bad command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// notFoundError is a record or a selection that does not exist: exit 3.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }

// refusedError is a destructive command that changed nothing: exit 4.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// exitCode is the exit status of a command's error.
func exitCode(err error) int {
	var (
		usage    *usageError
		setting  *storeopen.SettingError
		notFound *notFoundError
		refused  *refusedError
	)
	switch {
	case errors.As(err, &usage), errors.As(err, &setting), errors.Is(err, stores.ErrNotSupported), errors.Is(err, stores.ErrInvalidKey), errors.Is(err, stores.ErrInvalidArgument):
		return exitUsage
	case errors.As(err, &notFound), errors.Is(err, stores.ErrNotFound):
		return exitNotFound
	case errors.As(err, &refused), errors.Is(err, stores.ErrWrongState):
		return exitRefused
	}
	return exitError
}
