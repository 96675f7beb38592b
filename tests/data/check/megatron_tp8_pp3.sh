#!/bin/bash
# TP=8 x PP=3 = 24 GPUs per model replica, launched on 2 nodes (16 GPUs): it cannot start.
torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 3 \
    --num-layers 48 --hidden-size 8192 --num-attention-heads 64 \
    --seq-length 4096 --max-position-embeddings 4096 \
    --micro-batch-size 1 --global-batch-size 64
