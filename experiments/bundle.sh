#!/usr/bin/env bash
# A self-contained, relocatable pslab: for machines where nothing can be installed (a cluster
# node without root; a GPU machine with only a driver, a CUDA toolkit and Python).
#
#   experiments/bundle.sh [--out FILE.tar.gz | FILE.tar.xz] [--build-dir DIR] [--no-data] [--with-nccl]
#
# FILE.tar.xz: compressed by xz ($XZ_OPT, default -6 -T0), a third smaller (61 MB -> 48 MB with
# the data set), e.g. to travel where a transfer's size is capped.
#
# The tarball unpacks to pslab-<revision>/, laid out like the repository, so the launcher and
# every script work there as here:
#   build/worker/pslab_worker  build/server/pslab_server
#   build/worker/libpslab_client.so, worker/python/   the worker side for other languages
#   build/tests/               the GPU tests and the benchmarks (tests/gpu.sh runs them)
#   build/lib/                 every shared library those load that is not the C/C++ runtime
#                              or the CUDA toolkit (ZeroMQ, OpenBLAS, Gloo, toml++, ...); the
#                              binaries find it by their RPATH $ORIGIN/../lib, wherever unpacked;
#                              and the CUDA plugins libpslab_cuda.so, libpslab_nccl.so
#                              (kernels/cuda_plugin.h)
#   experiments/ README.md
#   BUNDLE.json                the git revision it was made from and its libraries' Debian
#                              packages and versions (a run's manifest.json records them)
#   tests/gpu.sh tests/bench/torch_train.py   the GPU check (one command) and its PyTorch peer
#   data/fashion-mnist/        unless --no-data; the bundle's configs point at it (relative to
#                              the bundle's root, where the launcher runs every process)
# Left to the target: glibc >= 2.36 and libstdc++ of GCC >= 12 (Debian 12's), python3 (with
# matplotlib for plots), and for GPUs the driver and the CUDA 13 toolkit (cudart, cuBLAS).
# NCCL is not part of the toolkit: --with-nccl copies it in (about 200 MB); without it, GPU
# machines must have libnccl.so.2 where the loader finds it (tests/gpu.sh also looks in
# Python's nvidia-nccl package, which PyTorch installs).
#
# Then, on the target:  tar xzf pslab-*.tar.gz && cd pslab-*/ &&
#   experiments/pslab run experiments/configs/default.toml
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
out="" build="$root/build" data=1 nccl=0
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --no-data) data=0; shift ;;
    --with-nccl) nccl=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "bundle.sh: no build directory at $build (experiments/setup.sh makes build/)" >&2; exit 2; }
for b in worker/pslab_worker server/pslab_server; do
  [[ -x $build/$b ]] || { echo "bundle.sh: $build/$b is missing; build first (experiments/setup.sh)" >&2; exit 2; }
done
command -v patchelf >/dev/null || { echo "bundle.sh: patchelf is needed (Debian: apt-get install patchelf; experiments/setup.sh installs it)" >&2; exit 2; }
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
name="pslab-$rev"
[[ -n $out ]] || out="$root/$name.tar.gz"
mkdir -p "$(dirname "$out")" && out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
datadir=/usr/share/datasets/fashion-mnist
if ((data)) && ! ls "$datadir"/*-ubyte.gz >/dev/null 2>&1; then
  echo "bundle.sh: no Fashion-MNIST in $datadir (Debian: dataset-fashion-mnist); or use --no-data" >&2; exit 2
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/pslab-bundle-XXXXXX")
trap 'rm -rf "$stage"' EXIT
dst="$stage/$name"
mkdir -p "$dst/build/worker" "$dst/build/server" "$dst/build/tests" "$dst/build/lib" "$dst/tests"
cp "$build/worker/pslab_worker" "$dst/build/worker/"
[[ -f $build/worker/libpslab_client.so ]] && cp "$build/worker/libpslab_client.so" "$dst/build/worker/"  # (worker/pslab_client.h)
cp "$build/server/pslab_server" "$dst/build/server/"
for t in test_gpu bench_train bench_ps bench_allreduce; do
  [[ -x $build/tests/$t ]] && cp "$build/tests/$t" "$dst/build/tests/"
done
(cd "$root" && tar cf - --exclude=__pycache__ experiments worker/python README.md) | tar xf - -C "$dst"
rm -f "$dst/experiments/bundle.sh" "$dst/experiments/quickstart.sh" "$dst/experiments/setup.sh"  # they build from source
mkdir -p "$dst/tests/bench"
cp "$root/tests/gpu.sh" "$dst/tests/"
cp "$root/tests/bench/torch_train.py" "$dst/tests/bench/"

# The C/C++ runtime and the CUDA toolkit (and the driver) stay the target's.
system='/(ld-linux[^/]*|linux-vdso[^/]*|lib(c|m|dl|rt|pthread|resolv|util|stdc\+\+|gcc_s)\.so[^/]*|libcuda\.so[^/]*)$'
toolkit='^(/usr/local/cuda[^/]*|/opt/nvidia|'"${CUDA_HOME:-/nonexistent}"')/'
elves=("$dst"/build/worker/* "$dst"/build/server/* "$dst"/build/tests/*)
# The CUDA plugins (where CUDA was built): the binaries load them from ../lib on first use of a GPU.
plugin=()
for f in "$build"/kernels/libpslab_cuda.so "$build"/kernels/libpslab_nccl.so; do [[ -f $f ]] && plugin+=("$f"); done
ldd "${elves[@]}" "${plugin[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  [[ $lib =~ $system ]] && continue
  if [[ $lib =~ $toolkit ]]; then
    [[ $nccl == 1 && $(basename "$lib") == libnccl.so* ]] || continue
  fi
  cp -L "$lib" "$dst/build/lib/"
done
if ldd "${elves[@]}" "${plugin[@]}" 2>/dev/null | grep -q "not found"; then
  echo "bundle.sh: some libraries of the build are not found here:" >&2
  ldd "${elves[@]}" "${plugin[@]}" 2>/dev/null | grep "not found" | sort -u >&2
  exit 1
fi
# RPATH (not RUNPATH): it also serves the libraries' own dependencies (libzmq -> libsodium);
# the toolkit's usual directories after it, then LD_LIBRARY_PATH and the system's.
for f in "${elves[@]}"; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64:/usr/local/cuda/lib' "$f"
done
for f in "$dst"/build/lib/*; do
  patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
done
for f in "${plugin[@]}"; do  # beside the libraries; they load the toolkit's (cudart, cuBLAS) and NCCL
  cp "$f" "$dst/build/lib/"
  patchelf --force-rpath --set-rpath '$ORIGIN:/usr/local/cuda/lib64:/usr/local/cuda/lib' "$dst/build/lib/$(basename "$f")"
  elves+=("$dst/build/lib/$(basename "$f")")
done
strip --strip-unneeded "${elves[@]}" 2>/dev/null || true

if ((data)); then
  mkdir -p "$dst/data/fashion-mnist"
  cp "$datadir"/*-ubyte.gz "$dst/data/fashion-mnist/"
  # The bundle's configs read its own copy (relative: the launcher runs processes in the root).
  for c in "$dst"/experiments/configs/*.toml; do
    sed -i 's|^kind = "fashion-mnist"\(.*\)$|kind = "fashion-mnist"\1\npath = "data/fashion-mnist"   # the bundle'"'"'s copy|' "$c"
  done
  # (a config reading Fashion-MNIST by default, with no data.kind line, would read the target's
  # /usr/share/datasets: refused here, naming it)
  /usr/bin/python3 - "$dst"/experiments/configs/*.toml <<'PY' || exit 1
import os, sys, tomllib
for c in sys.argv[1:]:
    data = tomllib.load(open(c, "rb")).get("data", {})
    if data.get("kind", "fashion-mnist") == "fashion-mnist" and data.get("path") != "data/fashion-mnist":
        sys.exit(f"bundle.sh: experiments/configs/{os.path.basename(c)}: reads Fashion-MNIST but not the bundle's copy (give it a "
                 f"[data] table with kind = \"fashion-mnist\")")
PY
fi
# What the bundle is, for the manifests of the runs made from it (no git there; the libraries
# in build/lib are the bundle's, not the target's): revision, and each library's Debian package.
{
  full=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
  dirty=false; [[ -n $(git -C "$root" status --porcelain 2>/dev/null) ]] && dirty=true
  printf '{\n  "revision": "%s",\n  "dirty": %s,\n  "made": "%s",\n  "libraries": {' "$full" "$dirty" "$(date -Iseconds)"
  sep=""
  for f in "$dst"/build/lib/*; do
    [[ -e $f ]] || continue
    lib=$(basename "$f")
    [[ $lib == libpslab_* ]] && continue  # the CUDA plugins: the bundle's revision
    pkg=$(dpkg -S "*/$lib" 2>/dev/null | head -1 | cut -d: -f1 || true)  # (none: unpackaged, e.g. CUDA's NCCL)
    ver=$([[ -n $pkg ]] && dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || echo unknown)
    printf '%s\n    "%s": "%s %s"' "$sep" "$lib" "${pkg:-unpackaged}" "$ver"
    sep=","
  done
  printf '\n  }\n}\n'
} > "$dst/BUNDLE.json"
case $out in  # .tar.xz: a third smaller than gzip (Fashion-MNIST is gzip already: 61 -> 48 MB with it)
  *.tar.xz) XZ_OPT=${XZ_OPT:--6 -T0} tar cJf "$out" -C "$stage" "$name" ;;
  *) tar czf "$out" -C "$stage" "$name" ;;
esac
echo "bundle.sh: $out ($(du -h "$out" | cut -f1)): $(ls "$dst/build/lib" | wc -l) libraries in build/lib$( ((data)) && echo ", Fashion-MNIST in data/")"
unpack=xzf; [[ $out == *.tar.xz ]] && unpack=xJf
echo "bundle.sh: on the target: tar $unpack $(basename "$out") && cd $name && /usr/bin/python3 experiments/launch.py run experiments/configs/default.toml"
