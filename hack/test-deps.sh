#!/usr/bin/env bash
# Installs what the test suite needs when it is missing, so `make test` works
# on a fresh Debian/Ubuntu machine: real libzmq for the interop publisher
# (python3-zmq, python3-msgpack), the golden-vector references (python3-cbor2,
# python3-xxhash, python3-jinja2), redis-server/redis-cli for the Redis tests,
# chromium for the status page's headless-browser test, (npm) the reference
# tokenizer plus the model tokenizer files, and (Go module proxy) grpcurl for
# the documentation's gRPC examples (internal/docexamples).
# Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need_apt=()
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || need_apt+=(python3-zmq python3-msgpack)
/usr/bin/python3 -c 'import cbor2, xxhash, jinja2' 2>/dev/null || need_apt+=(python3-cbor2 python3-xxhash python3-jinja2)
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || need_apt+=(redis-server redis-tools)
command -v npm >/dev/null || need_apt+=(nodejs npm)
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then SUDO="sudo"; else
      echo "test-deps: missing ${need_apt[*]} and not root: install them, or the tests that need them skip (and fail under CI=true)" >&2
      need_apt=()
    fi
  fi
  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "test-deps: installing ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3 "${need_apt[@]}" >/dev/null
  fi
fi
hack/tokenizers/setup.sh
# grpcurl, pinned, into GOBIN (or GOPATH/bin), where the examples test looks.
GRPCURL_VERSION=v1.9.4
command -v grpcurl >/dev/null || [ -x "$(go env GOPATH)/bin/grpcurl" ] || {
  echo "test-deps: installing grpcurl $GRPCURL_VERSION"
  GOFLAGS= go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
}
