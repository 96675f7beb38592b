#!/bin/bash
# Derived: the TP degree is the script's first argument, so only the caller knows it.
TP=$1
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py \
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size 1 \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096
