# shellcheck shell=bash
# The machine-wide binary cache shared by hack/tools/build.sh and
# hack/controlplane/build.sh; sourced, not run. A build lives in
# ${CDS_GUARD_CACHE:-~/.cache/cds-secret-guard}/<kind>/<key>/bin, the key hashing
# everything that decides the binaries' content, so any clone on the machine with
# the same pins only links them.

cache_root="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}"

# cache_key LINE FILE...: 16 hex digits of the sha256 of the FILEs, then LINE (the
# flags) and `go env GOVERSION GOOS GOARCH`, each on its own line.
cache_key() {
	local line="$1"
	shift
	{
		cat "$@"
		echo "$line"
		go env GOVERSION GOOS GOARCH
	} | sha256sum | cut -c1-16
}

# cached_build DIR OUT BINARIES BUILD [ARG...]: unless DIR/bin holds every one of
# BINARIES (names separated by spaces), runs `BUILD TMP ARG...`, which builds them
# into the empty directory TMP, and publishes TMP as DIR/bin; then links them into OUT.
cached_build() {
	local cache="$1" out="$2" build="$4" b missing="" tmp
	local -a binaries
	read -ra binaries <<<"$3"
	shift 4
	mkdir -p "$cache"
	# One build at a time per key (two clones building at once share the result).
	exec 9>"$cache/.lock"
	flock 9
	for b in "${binaries[@]}"; do [[ -x "$cache/bin/$b" ]] || missing=1; done
	if [[ -z "$missing" ]]; then
		echo "build.sh: cached ${binaries[*]} $cache/bin"
	else
		echo "build.sh: building ${binaries[*]} into $cache/bin (cold: minutes, see $0's header)"
		tmp="$cache/bin.tmp.$$"
		rm -rf "$tmp" "$cache"/bin.tmp.*
		mkdir -p "$tmp"
		"$build" "$tmp" "$@"
		# Publish atomically: a half-finished build is never taken for a cached one.
		rm -rf "$cache/bin"
		mv "$tmp" "$cache/bin"
	fi
	exec 9>&-
	# Hard links when the cache is on the same file system, else copies. Replacing
	# the directory entry (never writing into the old file) is safe while an old
	# binary is running.
	mkdir -p "$out"
	for b in "${binaries[@]}"; do
		if [[ "$cache/bin/$b" -ef "$out/$b" ]]; then continue; fi
		ln -f "$cache/bin/$b" "$out/$b" 2>/dev/null || {
			cp "$cache/bin/$b" "$out/.$b.tmp" && mv -f "$out/.$b.tmp" "$out/$b"
		}
	done
}
