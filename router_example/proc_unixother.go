//go:build unix && !linux

package main

import "syscall"

// consumerSysProcAttr puts a consumer process of -processes in a process
// group of its own (a terminal's Ctrl-C reaches this process only, which
// stops them). Only Linux has a parent-death signal: here a consumer
// process outlives this one if this one is SIGKILLed; on any other end it
// stops them.
func consumerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
