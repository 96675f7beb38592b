#!/bin/bash
# Tokenise a corpus for Megatron-LM (no training, no parallel settings).
set -euo pipefail
INPUT=${1:-/data/raw/corpus.jsonl}
python tools/preprocess_data.py \
    --input "$INPUT" \
    --output-prefix /data/llama3/dclm \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model meta-llama/Meta-Llama-3-8B \
    --workers 32 \
    --append-eod
