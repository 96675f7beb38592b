#!/bin/bash
# Qwen3-30B-A3B-style MoE (128 experts, top-8) on 2 DGX H100 nodes, argument list in the style of
# Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh. EP=8 keeps each expert
# group inside one node, on NVLink.

NNODES=2
GPUS_PER_NODE=8
EP=${EP:-8}

MOE_ARGS=(
    --num-experts 128
    --moe-router-topk 8
    --moe-ffn-hidden-size 768
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --expert-model-parallel-size $EP
    --expert-tensor-parallel-size 1
)

MODEL_ARGS=(
    --num-layers 48
    --hidden-size 2048
    --ffn-hidden-size 6144
    --num-attention-heads 32
    --kv-channels 128
    --group-query-attention
    --num-query-groups 4
    --swiglu
    --untie-embeddings-and-output-weights
    --seq-length 4096
    --max-position-embeddings 40960
    --padded-vocab-size 151936
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR --master_port 6000 \
    pretrain_gpt.py "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --micro-batch-size 1 \
    --global-batch-size 256 \
    --use-distributed-optimizer \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --bf16
