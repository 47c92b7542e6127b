#!/usr/bin/env bash
# The tokenizer's speed against Hugging Face's tokenizers (0.23 on the GPU machines), on the same
# text in the same run: Python's standard library sources (every .py file a document, ~30 MB),
# through tests/fixtures/tokenizer/{granite,gpt2}-style.json; one thread each, then all cores.
# Also checks that both give the same ids, every one.
#   run(command="bash scripts/gpu/bench_tokenizer.sh", carry=["build-gpu/carry"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/build-gpu/bundle
LOG=${OUT:-/tmp}/bench_tokenizer.log
source "$ROOT/scripts/gpu/common.sh"
HCP=$BUNDLE/bin/hybridcp
work=$(mktemp -d)

# A flat directory of documents (hybridcp tokenize lists a directory's files, not its subfolders).
python3 - "$work/corpus" <<'PY'
import glob, json, os, shutil, sys
root = os.path.dirname(os.path.dirname(json.__file__))
os.makedirs(sys.argv[1])
for i, path in enumerate(sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))):
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    if text:
        open(os.path.join(sys.argv[1], f"{i:06d}.py"), "w", encoding="utf-8").write(text)
PY
echo "corpus: $(ls "$work/corpus" | wc -l) files, $(du -sh "$work/corpus" | cut -f1)" | tee -a "$LOG"
cores=$(nproc)
for style in granite gpt2; do
  tok=$ROOT/tests/fixtures/tokenizer/$style-style.json
  run env RAYON_NUM_THREADS=1 python3 "$ROOT/scripts/gpu/bench_tokenizer.py" "$tok" "$work/corpus" "$work/hf.u16"
  run env RAYON_NUM_THREADS=$cores python3 "$ROOT/scripts/gpu/bench_tokenizer.py" "$tok" "$work/corpus" "$work/hf-batch.u16" --batch
  run "$HCP" tokenize --tokenizer "$tok" "$work/corpus" -o "$work/ours1" --threads 1
  run "$HCP" tokenize --tokenizer "$tok" "$work/corpus" -o "$work/ours" --threads "$cores"
  if cmp "$work/hf.u16" "$work/ours1.bin" && cmp "$work/ours1.bin" "$work/ours.bin"; then
    echo "== $style-style: every id equal to Hugging Face's ($(stat -c %s "$work/ours.bin") bytes)" | tee -a "$LOG"
  else
    echo "== $style-style: ids DIFFER from Hugging Face's" | tee -a "$LOG"
    status=1
  fi
done
rm -rf "$work"
exit $status
