//go:build unix

package main

import "syscall"

var sigKill, sigTerm = syscall.SIGKILL, syscall.SIGTERM

// signalGroup sends sig to the process group of the consumer process
// pid, which leads it (consumerSysProcAttr).
func signalGroup(pid int, sig syscall.Signal) error {
	return syscall.Kill(-pid, sig)
}
