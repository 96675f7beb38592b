#!/bin/bash
# GPT-3.6B (Narayanan et al. 2021, Table 1: 30 layers, 32 heads) on 2 DGX H100 nodes with PP=4:
# 30 layers do not split into 4 equal stages, which Megatron rejects at startup.
NNODES=2
GPUS_PER_NODE=8
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 4 \
    --num-layers 30 \
    --hidden-size 3072 \
    --num-attention-heads 32 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --vocab-size 51200 \
    --micro-batch-size 4 \
    --global-batch-size 512 \
    --bf16
