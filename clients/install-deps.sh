#!/usr/bin/env bash
# Installs what `make clients` and `make testclients` need besides Go:
# Debian's protoc 3.21 with the well-known .proto files, the gRPC Python plugin
# and the Python runtime (python3-grpcio, python3-protobuf), what installs
# clients/python as a package into a venv without PyPI (python3-venv,
# python3-setuptools and python3-wheel, the build backend), the Ruby client's
# runtime (ruby-grpc, ruby-google-protobuf; grpc_ruby_plugin is in
# protobuf-compiler-grpc), what builds the C++ client (libgrpc++-dev, g++,
# pkg-config, make; grpc_cpp_plugin likewise), and the npm packages pinned
# in clients/typescript/package-lock.json. Node.js 20 and npm come with the
# machine. apt-get runs only when a package is missing, and needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(protobuf-compiler libprotobuf-dev protobuf-compiler-grpc python3-grpcio python3-protobuf
  python3-venv python3-setuptools python3-wheel
  ruby-grpc ruby-google-protobuf
  libgrpc++-dev g++ pkg-config make)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  sudo=()
  [[ $(id -u) == 0 ]] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v node >/dev/null || { echo "clients/install-deps.sh: node (20 or later) is needed for clients/typescript" >&2; exit 1; }
(cd clients/typescript && npm ci --no-audit --no-fund)

protoc --version
node --version
ruby --version
echo "grpc++ $(pkg-config --modversion grpc++), $(g++ --version | head -1)"
