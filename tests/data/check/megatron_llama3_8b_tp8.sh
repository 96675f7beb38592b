#!/bin/bash
# Llama-3-8B pretraining on 2 DGX H100 nodes, in the style of Megatron-LM's
# examples/llama/train_llama3_8b_h100_fp8.sh: TP=8 inside each node, DP=2 across nodes.

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-2}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=6000
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

CHECKPOINT_PATH=/checkpoints/llama3-8b
DATA_PATH=/data/llama3/dclm_text_document
TOKENIZER_MODEL=meta-llama/Meta-Llama-3-8B

TP=8
PP=1
CP=1

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --rotary-base 500000
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --vocab-size 128256
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --train-iters 500000
    --lr 3.0e-4
    --min-lr 3.0e-5
    --lr-decay-style cosine
    --lr-warmup-iters 2000
    --weight-decay 0.1
    --clip-grad 1.0
    --bf16
    --recompute-activations
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size ${PP}
    --context-parallel-size=$CP
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model $TOKENIZER_MODEL
    --split 99,1,0
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    --save $CHECKPOINT_PATH \
    --load $CHECKPOINT_PATH
