package main

import "syscall"

// consumerSysProcAttr puts a consumer process of -processes in a process
// group of its own (a terminal's Ctrl-C reaches this process only, which
// stops them) and has the kernel SIGKILL it when the thread that started
// it ends: when this process dies, however it dies (see spawner).
func consumerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
