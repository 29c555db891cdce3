//go:build !linux

package devstack

import "syscall"

// Elsewhere than on Linux, there is no parent-death signal: children are stopped by Run,
// and a devstack that is killed with SIGKILL leaves them running.

func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func tie(_, _, bin string) (string, error) { return bin, nil }

// RunTied does nothing here.
func RunTied() {}
