// Command coredns is CoreDNS v1.15.0 with only the plugins the node test tier
// (test/node) uses: the cluster's names from the API server (kubernetes), with bind,
// errors, health, ready and cache. It has no forward plugin on purpose: a
// name outside cluster.local is never resolved by asking another server, so
// nothing in the tier can make a lookup leave this machine.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
