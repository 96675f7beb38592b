#!/bin/bash
# Derived minimal file: the node count is the scheduler's (unknown without --nodes), but
# TP=16 over torchrun's contiguous local ranks spans two 8-GPU nodes whatever that count is.
torchrun --nnodes "${SLURM_JOB_NUM_NODES}" --nproc-per-node 8 pretrain_gpt.py \
    --tensor-model-parallel-size 16 --pipeline-model-parallel-size 1 --bf16
