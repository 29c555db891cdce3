#!/usr/bin/env bash
# Builds the project's pinned tools from the Go module proxy and links them into bin/.
#
# Each tool is a small wrapper module under hack/tools/<name> (go.mod + go.sum pin every
# version). Binaries are cached outside the checkout, keyed by a hash of the wrapper module
# and the build flags, so a fresh clone on a warm machine reuses them and a cold machine
# builds each one once. `go install pkg@version` cannot be used for k8s.io/kubernetes: its
# go.mod points the staging modules at local paths, which the wrapper replaces with their
# published releases.
#
# Usage: hack/tools/install.sh [tool ...]   (default: all)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${PROXYFLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxyfleet-tools}
bin=$root/bin

K8S_VERSION=1.36.3

# tool name -> "wrapper-dir output-name package ldflags"
build_spec() {
	local kv="k8s.io/component-base/version k8s.io/client-go/pkg/version" ld="-s -w"
	case $1 in
	temporal) echo "temporal temporal github.com/temporalio/cli/cmd/temporal -X github.com/temporalio/cli/temporalcli.Version=1.5.1" ;;
	etcd) echo "etcd etcd go.etcd.io/etcd/server/v3" ;;
	kube-apiserver | kubectl)
		for p in $kv; do
			ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$(echo $K8S_VERSION | cut -d. -f2) -X $p.gitTreeState=clean"
		done
		echo "kube $1 k8s.io/kubernetes/cmd/$1 $ld" ;;
	controller-gen) echo "controller-gen controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen" ;;
	workflowcheck) echo "workflowcheck workflowcheck go.temporal.io/sdk/contrib/tools/workflowcheck" ;;
	staticcheck) echo "staticcheck staticcheck honnef.co/go/tools/cmd/staticcheck" ;;
	*) echo "unknown tool: $1" >&2; return 1 ;;
	esac
}

# Where each tool is linked: envtest wants kube-apiserver, etcd and kubectl in one folder.
link_dir() {
	case $1 in
	etcd | kube-apiserver | kubectl) echo "$bin/k8s" ;;
	*) echo "$bin" ;;
	esac
}

install_tool() {
	local name=$1 spec dir out pkg ld key dest
	spec=$(build_spec "$name")
	read -r dir out pkg ld <<<"$spec"
	key=$( { cat "$here/$dir/go.mod" "$here/$dir/go.sum"; echo "$pkg $ld"; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -c1-16)
	dest=$cache/$name-$key
	if [ ! -x "$dest/$out" ]; then
		echo ">> building $name (cache: $dest)" >&2
		local t0=$SECONDS
		mkdir -p "$dest.tmp"
		(cd "$here/$dir" && CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "$ld" -o "$dest.tmp/$out" "$pkg")
		rm -rf "$dest" && mv "$dest.tmp" "$dest"
		echo ">> built $name in $((SECONDS - t0))s" >&2
	fi
	mkdir -p "$(link_dir "$name")"
	# A new link renamed over the old one: the tool's path never goes missing for a test
	# that starts it meanwhile (ln -sf removes the old link first).
	local link
	link=$(link_dir "$name")/$out
	if [ "$(readlink "$link" 2>/dev/null)" != "$dest/$out" ]; then
		ln -sfn "$dest/$out" "$link.tmp.$$" && mv -fT "$link.tmp.$$" "$link"
	fi
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(temporal etcd kube-apiserver kubectl controller-gen workflowcheck staticcheck)
for t in "${tools[@]}"; do install_tool "$t"; done
