#!/bin/bash
# GPT-1.7B (Narayanan et al. 2021, Table 1) on two 4-GPU PCIe nodes with TP=8: every TP group
# spans both nodes over RoCE. Arguments as in Megatron-LM's
# examples/gpt3/train_gpt3_175b_distributed.sh.

GPUS_PER_NODE=4
NNODES=2

torchrun \
    --nproc-per-node=$GPUS_PER_NODE \
    --nnodes=$NNODES \
    --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500 \
    pretrain_gpt.py \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 1 \
    --num-layers 24 \
    --hidden-size 2304 \
    --num-attention-heads 24 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --vocab-size 51200 \
    --micro-batch-size 2 \
    --global-batch-size 256 \
    --lr 0.00015 \
    --train-iters 100000 \
    --bf16 \
    --recompute-activations \
    --use-distributed-optimizer \
    --data-path /data/gpt/my-gpt_text_document \
    --vocab-file gpt2-vocab.json \
    --merge-file gpt2-merges.txt
