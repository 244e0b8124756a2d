// Command etcd is the etcd server, built from source at the version pinned in
// go.mod (the one k8s.io/kubernetes' go.mod requires) for the test control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
