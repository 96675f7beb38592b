#!/bin/bash
# Derived from NVIDIA/Megatron-LM examples/mamba/train.sh: the same case on MODEL_SCALE, with
# the 8B branch selected; TP must come from that branch (4), not the 800M one (1).
MODEL_SCALE="8B" # or "800M"
case "${MODEL_SCALE}" in
    "800M")
        TENSOR_MODEL_PARALLEL_SIZE=1
        NUM_ATTENTION_HEADS=16
        ;;
    "8B")
        TENSOR_MODEL_PARALLEL_SIZE=16
        NUM_ATTENTION_HEADS=32
        ;;
    *)
        echo "Invalid version specified"
        exit 1
        ;;
esac
options=" \
       --tensor-model-parallel-size ${TENSOR_MODEL_PARALLEL_SIZE} \
       --num-attention-heads ${NUM_ATTENTION_HEADS} \
       --micro-batch-size 4"
torchrun --nproc_per_node 8 ../../pretrain_hybrid.py ${options}
