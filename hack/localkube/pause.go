// The pods' sandbox process on real nodes (hack/build-node.sh packs it as the image
// localhost/holmes-pause): it holds the pod's namespaces and waits, as Kubernetes' pause does,
// until SIGTERM or SIGINT, then exits 0. As PID 1 of a shared PID namespace it reaps orphans.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				var ws syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
