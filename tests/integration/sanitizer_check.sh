#!/usr/bin/env bash
# sanitizer_check.sh LOG_ROOT — after the integration tests of a -DKVGW_SANITIZE=ON tree: every
# stderr that sanitized_kvgw.sh copied under LOG_ROOT is searched for a sanitizer report. Exit 1,
# printing each report with the test and process it came from, when one is found; the logs of
# clean processes are removed.
set -uo pipefail
root=${1:?usage: sanitizer_check.sh LOG_ROOT}
pattern='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)'
n=0 bad=0
while IFS= read -r -d '' f; do
    n=$((n + 1))
    if grep -Eq "$pattern" "$f"; then
        bad=$((bad + 1))
        echo "==== sanitizer report: ${f#"$root"/}"
        grep -En -A40 "$pattern" "$f" | head -n 120
    else
        rm -f "$f"
    fi
done < <(find "$root" -type f -name '*.log' -print0 2>/dev/null)
echo "sanitizer_check: $n kvgw processes, $bad with a report"
[ $bad -eq 0 ]
