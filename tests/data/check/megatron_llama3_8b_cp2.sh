#!/bin/bash
# Llama-3-8B long-context (64K) fine-tuning on 2 DGX H100 nodes: TP=8 fills each node, so the
# CP=2 pairs (rank r and r+8) sit on different nodes and exchange K/V over InfiniBand.
GPUS_PER_NODE=8
NNODES=2
torchrun --nproc_per_node=$GPUS_PER_NODE --nnodes=$NNODES pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 \
    --swiglu --untie-embeddings-and-output-weights --vocab-size 128256 \
    --seq-length 65536 --max-position-embeddings 131072 \
    --tensor-model-parallel-size 8 \
    --context-parallel-size 2 \
    --cp-comm-type p2p \
    --sequence-parallel \
    --micro-batch-size 1 --global-batch-size 16 \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --use-distributed-optimizer --bf16
