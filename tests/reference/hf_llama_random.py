#!/usr/bin/env python3
"""Writes a random LLaMA checkpoint with transformers (seeded, bf16 safetensors, LLaMA-2-7B shape by
default) and the logits transformers computes for a fixed prompt, for the tests
CudaEngine.RandomSevenBCheckpointMatchesTransformers (gpu) and
CpuModel.RandomSevenBCheckpointMatchesTransformers (cpu, 38 GiB of host memory). Run on the GPU
machine, with test_llm_gpu and test_llm_cpu built:

    python3 tests/reference/hf_llama_random.py --out /tmp/llama7b-random
    GPULAB_HF_REFERENCE_DIR=/tmp/llama7b-random ctest --test-dir build-device -R RandomSevenB --output-on-failure

DIR gets config.json, model-*.safetensors (+ index) and reference.safetensors holding `ids`
(int32 [T]), `logits` (float32 [T, vocab]) of every position, computed by transformers in float64
on the CPU from the bf16 weights as written, `logits_bf16_rope`, the same with the RoPE frequencies
rounded to bf16 (the fixtures' convention, which the engines follow; see below), `logits_fp32`,
transformers' own float32 forward (how far float32 arithmetic alone lands from float64), and
`logits_bf16`, transformers' own bf16 forward on the GPU.

The init std (transformers' initializer_range) is 0.01, not transformers' 0.02: at 0.02 a random
model of this depth is chaotic (hf_llama_sensitivity.py measures it; session 7 on the H200: a 1e-6
relative input change grows 16.8x at 0.02, 3.4x at 0.01, and transformers' own bf16 forward lands
5.9 % and 1.55 % from float32). A trained model is not chaotic; at 0.02 even two float32
implementations differ by several percent, so the comparison would measure the chaos, not the code.
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import save_file

ROPE_THETA = 10000.0
# LLaMA-2-7B's shape (also what hf_llama_sensitivity.py probes).
SHAPE = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
             rope_theta=ROPE_THETA, tie_word_embeddings=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.01, help="transformers' initializer_range")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(**SHAPE, bos_token_id=1, eos_token_id=2, initializer_range=args.init_std)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="5GB")
    # Loaded back as users load a checkpoint (from_pretrained in bf16).
    del model
    model = transformers.LlamaForCausalLM.from_pretrained(args.out, dtype=torch.bfloat16, device_map="cuda").eval()

    g = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    ids = torch.randint(3, config.vocab_size, (1, args.tokens), generator=g, device="cuda")
    with torch.inference_mode():  # transformers' own bf16 forward: what bf16 rounding costs it
        logits_bf16 = model(input_ids=ids).logits[0].float().cpu().contiguous()
    # transformers 5's from_pretrained keeps the RoPE frequencies in float32; a model cast with
    # .to(bf16), as the fixtures were made, holds them rounded to bf16. The engines follow the
    # fixtures, so the float64 logits are also written with the rounded frequencies: the CPU test
    # compares against those (a model-definition check), the CUDA test against the as-loaded ones.
    rotary = model.model.rotary_emb
    exact = 1.0 / (ROPE_THETA ** (torch.arange(0, rotary.inv_freq.numel() * 2, 2, dtype=torch.float32) / (rotary.inv_freq.numel() * 2)))
    held = rotary.inv_freq.detach().float().cpu()
    print(f"rotary inv_freq as loaded: dtype {rotary.inv_freq.dtype}, max rel diff from float32 "
          f"{((held - exact).abs() / exact).max():.3e}, from bf16-rounded "
          f"{((held - exact.bfloat16().float()).abs() / exact).max():.3e}")
    logits = {}
    for name, dtype in (("logits_fp32", torch.float32), ("logits", torch.float64)):  # over the bf16 values written
        model = model.to("cpu", dtype)
        with torch.inference_mode():
            logits[name] = model(input_ids=ids.cpu()).logits[0].float().contiguous()
    rotary = model.model.rotary_emb
    rotary.inv_freq.copy_(rotary.inv_freq.to(torch.bfloat16).to(rotary.inv_freq.dtype))
    with torch.inference_mode():
        logits["logits_bf16_rope"] = model(input_ids=ids.cpu()).logits[0].float().contiguous()
    save_file({"ids": ids[0].to(torch.int32).cpu().contiguous(), "logits_bf16": logits_bf16, **logits},
              os.path.join(args.out, "reference.safetensors"))
    print(f"wrote {args.out}: {args.tokens} tokens, logits {tuple(logits['logits'].shape)}, init std {args.init_std}")


if __name__ == "__main__":
    main()
