#!/usr/bin/env bash
# The self-contained bundle (experiments/bundle.sh), as its users get it: built, unpacked at
# another path, and run from there.
#   tests/test_bundle.sh BUILD_DIR           every shared library the bundle's binaries load,
#       other than the C/C++ runtime and the CUDA toolkit and driver, resolves inside the
#       bundle; the default comparison (all four modes, shortened) trains from it on its own
#       copy of Fashion-MNIST
#   tests/test_bundle.sh BUILD_DIR --hidden  the same run in a mount namespace where Debian's
#       copies of those libraries and of the data are hidden (needs root: unshare -m), so that
#       anything the bundle lacks fails; prints "SKIPPED: why" and exits 0 where it cannot
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:?usage: test_bundle.sh BUILD_DIR [--hidden]}" && pwd)
hidden=${2:-}
fail() { echo "FAIL: $*" >&2; exit 1; }

if [[ $hidden == --hidden ]]; then
  if [[ $(id -u) != 0 ]]; then echo "SKIPPED: hiding Debian's libraries needs root (unshare -m, bind mounts)"; exit 0; fi
  if ! unshare -m true 2>/dev/null; then echo "SKIPPED: no mount namespace here (unshare -m failed)"; exit 0; fi
fi

rev=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pslab-test-bundle-XXXXXX")
trap 'pkill -KILL -f "$tmp/" 2>/dev/null || true; rm -rf "$tmp"' EXIT
# (the plain run takes the xz tarball, at xz's fastest level; --hidden the gzip one)
made="$tmp/made/pslab.tar.gz"; [[ $hidden == --hidden ]] || made="$tmp/made/pslab.tar.xz"
XZ_OPT=-0 "$root/experiments/bundle.sh" --build-dir "$build" --out "$made"
mkdir "$tmp/elsewhere"
[[ $made == *.tar.xz ]] && { xz -t "$made" || fail "$made is not xz"; }
tar xf "$made" -C "$tmp/elsewhere"
rm -rf "$tmp/made"
b=$(echo "$tmp"/elsewhere/pslab-*)
[[ -d $b/build/lib && -x $b/build/worker/pslab_worker ]] || fail "the bundle has no build/lib or build/worker/pslab_worker"
for f in "$build"/kernels/libpslab_*.so; do
  [[ ! -f $f || -f $b/build/lib/$(basename "$f") ]] || fail "the build has the CUDA plugin kernels/$(basename "$f"), the bundle's build/lib does not"
done

# Which libraries each binary loads, and from where: inside the bundle, or the runtime/toolkit.
system='/(ld-linux[^/]*|linux-vdso[^/]*|lib(c|m|dl|rt|pthread|resolv|util|stdc\+\+|gcc_s)\.so[^/]*|libcuda\.so[^/]*)$'
toolkit='^(/usr/local/cuda[^/]*|/opt/nvidia)/'
check_resolution() {
  local bad=0 f lib path
  for f in "$b"/build/worker/* "$b"/build/server/* "$b"/build/tests/* "$b"/build/lib/libpslab_*.so; do
    [[ -e $f ]] || continue  # (the CUDA plugins: only from a build with CUDA)
    while read -r lib _ path _; do
      [[ $path == "not" ]] && { echo "  $f: $lib not found"; bad=1; continue; }
      [[ $path == /* ]] || continue
      path=$(realpath "$path")
      [[ $path == "$b"/* || $path =~ $system || $path =~ $toolkit ]] && continue
      echo "  $(basename "$f"): $lib from $path, outside the bundle"; bad=1
    done < <(ldd "$f" | awk '$2 == "=>" {print $1, $2, $3, $4}')
  done
  return $bad
}
check_resolution || fail "libraries above resolve outside the bundle"
echo "ok: every library of $(ls "$b"/build/{worker,server,tests} | wc -l) binaries resolves inside the bundle (or is the C/C++ runtime or CUDA)"

run_comparison() {  # the default comparison, 60 steps per worker, from the bundle's root
  cd "$b"
  experiments/pslab run experiments/configs/default.toml --set train.steps=60 --set seed=1 \
    --set eval.every_epochs=0 --set eval.interval_s=5 --no-plots --runs-dir "$tmp/runs" --max-minutes 5
  local n=0 s
  for s in "$tmp"/runs/compare/latest/*/summary.json; do
    grep -q '"status": "ok"' "$s" || fail "$s: $(cat "$s")"
    grep -q "$b/build/worker/pslab_worker" "$(dirname "$s")/manifest.json" || fail "$(dirname "$s") did not run the bundle's binaries"
    # the manifest says which revision the bundle was made from, and the bundle's own libraries
    grep -q "\"revision\": \"$rev\"" "$(dirname "$s")/manifest.json" || fail "$(dirname "$s")/manifest.json: not revision $rev"
    grep -q '"bundled": {' "$(dirname "$s")/manifest.json" || fail "$(dirname "$s")/manifest.json: no bundled libraries"
    grep -q '"libzmq.so.5": "libzmq5' "$(dirname "$s")/manifest.json" || fail "$(dirname "$s")/manifest.json: libzmq's package not named"
    n=$((n + 1))
  done
  ((n == 4)) || fail "expected the 4 runs of the default comparison, found $n"
  echo "ok: the default comparison ran from $b (4 modes)"
}

if [[ $hidden != --hidden ]]; then
  run_comparison
  exit 0
fi

# Hide, in a namespace of our own, every system copy of what the bundle carries (each path
# the loader could find it at) and the Debian data set, then check and run again. Python's own
# libraries stay (the target has a Python; the launcher runs on it).
export b tmp system toolkit rev
export -f check_resolution run_comparison fail
unshare -m bash -euo pipefail -c '
  mount --make-rprivate /
  hidden=0
  python_libs=$(ldd /usr/bin/python3 | awk '"'"'{print $1}'"'"')
  for lib in "$b"/build/lib/*; do
    name=$(basename "$lib")
    grep -qx "$name" <<<"$python_libs" && continue
    for p in $(ldconfig -p | awk -v n="$name" '"'"'$1 == n {print $NF}'"'"') /lib/"$name" /usr/lib/"$name" \
             /usr/lib/x86_64-linux-gnu/*/"$name"; do
      [[ -e $p ]] || continue
      mount --bind /dev/null "$(realpath "$p")" && hidden=$((hidden + 1))
    done
  done
  if [[ -d /usr/share/datasets/fashion-mnist ]]; then mount -t tmpfs none /usr/share/datasets/fashion-mnist; fi
  ((hidden > 0)) || fail "found no system copy of the bundled libraries to hide"
  echo "hidden: $hidden system library files (all the bundle carries but Python'"'"'s: $(echo $python_libs | tr " " ",")) and /usr/share/datasets/fashion-mnist"
  # the hiding works: a binary of the build itself no longer starts
  if '"$build"'/worker/pslab_worker --help >/dev/null 2>&1; then fail "the build'"'"'s own binary still starts: nothing was hidden"; fi
  check_resolution || fail "with Debian'"'"'s copies hidden, libraries above resolve outside the bundle"
  run_comparison
'
