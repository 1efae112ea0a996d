// CoreDNS with the plugins a cluster's DNS uses, not all of them (CoreDNS's own main package,
// github.com/coredns/coredns, links every plugin, the cloud providers' SDKs among them: about
// four times the compile). This is CoreDNS's documented way to choose the plugins: a main
// package that imports coremain and the plugins; the order they run in is CoreDNS's own
// (core/dnsserver's Directives), whatever the order here. A Corefile naming a plugin left out
// fails at start with "unknown directive". hack/build-node.sh builds it into bin/coredns.
package main

import (
	"github.com/coredns/coredns/coremain"

	// hack/localkube/realnode.py's Corefile
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"

	// the rest of a kubeadm cluster's default Corefile, and log
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics" // the `prometheus` directive
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
