#!/bin/bash
# GPT-3.6B on one 8x A100 PCIe server whose GPUs are NVLink-bridged in pairs: TP=4 puts each TP
# group on two bridged pairs, so half of every all-reduce goes over PCIe (TP=2 would not).
torchrun --standalone --nproc_per_node=8 pretrain_gpt.py \
    --tensor-model-parallel-size 4 \
    --num-layers 30 --hidden-size 3072 --num-attention-heads 32 \
    --seq-length 2048 --max-position-embeddings 2048 --vocab-size 51200 \
    --micro-batch-size 2 --global-batch-size 64 \
    --recompute-activations --use-distributed-optimizer --bf16
