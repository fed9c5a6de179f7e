// Command etcd is the etcd v3.7.3 server, built from its published module for
// the live Kubernetes test tier (envtest starts it beside kube-apiserver).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
