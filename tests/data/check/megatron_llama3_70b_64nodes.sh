#!/bin/bash
# Llama-3-70B pretraining on 64 DGX H100 nodes (512 GPUs): TP=8, PP=8 interleaved (2 virtual
# stages per rank), DP=8. With Megatron's default order tp-cp-ep-dp-pp each pipeline stage holds
# 8 consecutive nodes, so stage 3 -> 4 crosses from one 32-node scalable unit to the next.
#SBATCH --nodes=64
#SBATCH --ntasks-per-node=1

GPUS_PER_NODE=8
NNODES=64
TP=8
PP=8

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES \
    --rdzv_backend static --node_rank $SLURM_NODEID \
    --master_addr $MASTER_ADDR --master_port 29500 \
    pretrain_gpt.py \
    --num-layers 80 \
    --hidden-size 8192 \
    --ffn-hidden-size 28672 \
    --num-attention-heads 64 \
    --group-query-attention \
    --num-query-groups 8 \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --vocab-size 128256 \
    --seq-length 8192 \
    --max-position-embeddings 8192 \
    --tensor-model-parallel-size $TP \
    --pipeline-model-parallel-size $PP \
    --num-layers-per-virtual-pipeline-stage 5 \
    --sequence-parallel \
    --micro-batch-size 1 \
    --global-batch-size 1024 \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --recompute-activations \
    --bf16
