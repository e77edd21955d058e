#!/usr/bin/env bash
# Fill the source cache (.rlbox-sources/git/) from local clones instead of the network, for
# machines that cannot reach GitHub but hold full clones (here: repositories brought by the
# search tool's `fetch`, laid out as MIRRORS/<owner>+<name>/repo). Each pinned commit of the
# matrix's git components becomes a bare repository with the clone's whole history and tags
# (`rlbox lock` runs `git describe` on it) and refs/rlbox/pin at the commit (builds fetch that,
# one commit deep). Components whose clone is missing are listed; `rlbox lock` then reads the
# stand-in the manifest names for them, recorded as a substitution.
#   tools/sources-from-mirrors.sh MIRRORS [DEST]     (DEST defaults to .rlbox-sources)
set -euo pipefail
mirrors=${1:?usage: tools/sources-from-mirrors.sh MIRRORS [DEST]}
dest=${2:-.rlbox-sources}
py=python3; [ ! -x .venv/bin/python ] || py=.venv/bin/python
mkdir -p "$dest/git"
"$py" -m rlbox.cli images list --json | "$py" -c '
import json, sys
seen = set()
for row in json.load(sys.stdin):
    for name, pin in row["components"].items():
        if pin.startswith("git+") and "@" in pin:
            url, commit = pin[4:].rsplit("@", 1)
            if (name, commit) not in seen:
                seen.add((name, commit))
                print(name, url, commit)
' | while read -r name url commit; do
    target=$dest/git/$name-$commit.git
    slug=$(echo "$url" | sed -E 's#^https?://[^/]+/##; s#\.git$##; s#/#+#')
    clone=$mirrors/$slug/repo
    if [ -d "$target" ]; then echo "cached   $name@${commit:0:12}"; continue; fi
    if [ ! -d "$clone" ] || ! git --git-dir="$clone" cat-file -e "$commit^{commit}" 2>/dev/null; then
        echo "missing  $name@${commit:0:12} (no clone holding it at $clone)"
        continue
    fi
    tmp=$(mktemp -d "$dest/git/.filling-XXXXXX")
    git clone -q --bare --no-hardlinks "$clone" "$tmp/r.git"
    git --git-dir="$tmp/r.git" update-ref refs/rlbox/pin "$commit"
    mv "$tmp/r.git" "$target"; rmdir "$tmp"
    echo "filled   $name@${commit:0:12} from $clone"
done
