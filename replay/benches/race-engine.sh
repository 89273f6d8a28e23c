# Sourced by the speed scripts (targets.sh, scaling.sh): the engine settings
# the race cases of ../shared/bench ran with on both simulators (its
# README): Qwen2.5-7B on an H100, TP 1, 61,048 KV blocks, max_num_seqs 256,
# max_num_batched_tokens 2048, max_model_len 32768, block_size 16, no async
# scheduling, round-robin routing.
# shellcheck disable=SC2034
RACE_ENGINE=(--model qwen/qwen2.5-7b-instruct --hardware H100 --tp 1 --total-kv-blocks 61048
    --max-num-seqs 256 --max-num-batched-tokens 2048 --max-model-len 32768 --block-size 16
    --async-scheduling false --routing round-robin)
